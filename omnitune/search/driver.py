"""The search driver: one Optuna study per kernel × problem × dtype × device, driven through
Optuna's ask/tell interface so that omnitune owns the measuring loop.

Each iteration: a chain of strategies proposes a config (omnitune.search.strategies: the
kernel's default first, then its known-good configs and the warm start, then an enumeration or
the sampler, with a random unmeasured config when the sampler stalls) → the trial claims it
(omnitune.search.study: never measured twice, the budget shared by every process on the study)
→ it is pruned if a constraint rejects it (no GPU time) or measured by the runner → stored (trial
user attrs, tell, catalogue row through the sink) before the next begins, and every strategy is
told the outcome.

So a search can always be resumed: rerunning it reopens the study, marks trials abandoned by a
killed process as failed (their configs become measurable again), and goes on until the study
holds `trials` measured configs. The budget is the total for the study, not for one run.

After the loop, the finalists are re-timed against each other and the winner is the best
re-timed median (omnitune.search.finalists, which stores each re-timing as a trial).
"""

from __future__ import annotations

import collections
import json
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import optuna
import sqlite_utils
import torch

from omnitune.search.ahead_queue import AheadQueue, Claimed
from omnitune.search.finalists import RetimeStatus, Retiming, StudyFinalists
from omnitune.search.options import SearchOptions
from omnitune.search.outcome import (
    MeasuresConfigs,
    SearchError,
    SearchInterrupted,
    SearchOutcome,
    SearchProgress,
    StopReason,
)
from omnitune.search.slots import HomeSink, run_slots
from omnitune.search.space import ConfigSpace
from omnitune.search.strategies import (
    SamplerName,
    Setting,
    build_chain,
    default_chain,
    make_sampler,
    parse_sampler,
    tried_configs,
    warm_start_configs,
)
from omnitune.search.strategies.base import Proposal, Told
from omnitune.search.strategies.fallback import SAMPLER_PATIENCE
from omnitune.search.strategies.planned import WARM_START_CONFIGS
from omnitune.search.strategies.valid_only import TPE_STARTUP_TRIALS, ValidOnly
from omnitune.search.study import PENALTY_BEFORE_ANY_OK_MS, PENALTY_FACTOR, Ledger, SharedStudy, open_study
from omnitune.spec import Config, KernelSpec, dtype_name
from omnitune.store import (
    Provenance,
    StudyFacts,
    TrialSink,
    catalogue_record,
    catalogue_sink,
    finished_trial_attrs,
    journal_unmade_on_error,
    open_optuna_storage,
    require_catalogue_held,
    storage_description,
    study_records,
    utc_now,
)
from omnitune.trial import INTERPRETER_DEVICE, TrialResult, TrialStatus

if TYPE_CHECKING:
    from omnitune.measure.ahead import CompilesAhead

__all__ = [
    "ENUMERABLE_SPACE", "PENALTY_BEFORE_ANY_OK_MS", "PENALTY_FACTOR", "SAMPLER_PATIENCE", "WARM_START_CONFIGS",
    "MeasuresConfigs", "RetimeStatus", "SamplerName", "SearchError", "SearchInterrupted", "SearchOptions",
    "SearchOutcome", "SearchProgress", "StopReason", "make_sampler", "parse_sampler", "run_search",
    "warm_start_configs",
]

# Past this many configs the valid ones are not listed up front (the check is per config).
ENUMERABLE_SPACE = 200_000
# How long a slot waits before looking again when a trial another process has asked (and not yet
# claimed) may take the budget's last place.
WAIT_FOR_CLAIMS_S = 0.05


def run_search(
    spec: KernelSpec,
    problem: Any,
    dtype: torch.dtype,
    options: SearchOptions | None = None,
    *,
    runner_factory: Callable[[], MeasuresConfigs] | None = None,
    runner_factories: Sequence[Callable[[], MeasuresConfigs]] | None = None,
    sink: TrialSink | None = None,
    db: sqlite_utils.Database | None = None,
    storage: optuna.storages.BaseStorage | None = None,
    progress: Callable[[SearchProgress], None] | None = None,
    precompile: Callable[[Sequence[Config]], None] | None = None,
    compile_ahead: CompilesAhead | None = None,
    stop_when: Callable[[SearchProgress], bool] | None = None,
    on_trials_claimed: Callable[[], None] | None = None,
    **option_fields: Any,
) -> SearchOutcome:
    """Search `spec`'s config space for `problem` in `dtype` as `options` (SearchOptions, or its
    fields as keyword arguments) say: until the study holds `trials` measured configs, every
    valid config is measured, or the timeout has passed; then re-time the finalists interleaved
    and declare the best re-timed median the winner (finalists=0: the search's fastest wins).

    `runner_factory` is called once, when the first config needs measuring (a resumed search
    that has nothing left to do never builds inputs). `runner_factories` (instead): one runner per
    entry, each driven by a thread of its own (one isolated worker per GPU), all sharing the
    study trial by trial; the finalists are re-timed on the first.

    Every finished trial's catalogue row goes to `sink` (or, with `db`, to that results
    database), from the calling thread. `storage`: an Optuna storage object in place of
    options.storage_url (e.g. an in-memory one). `progress` is called after every trial that
    measured or pruned a config; `stop_when`, given the same report, ends the search when it
    says so (StopReason.TARGET). `precompile` (omnitune.measure.precompile), when given, is
    called once before the first trial with the configs certain to come next (_Search.upcoming);
    `compile_ahead` (omnitune.measure.ahead) is handed the next proposals while one is measured
    (omnitune.search.ahead_queue; TPE's constant liar on). `on_trials_claimed` is called once, from
    a measuring thread between two measurements, when this search will claim no more trials: the
    budget's last place is claimed (its last trials still to measure), or else the trial loop has
    ended; the finalists are re-timed after it. Not after a lost GPU context or an interrupt.
    `omnitune search` prepares the next problem then (omnitune.search.prepare_next). For a spec
    whose timed call syncs the host (KernelSpec.syncs_host) the finalists are re-timed on a quiet
    host instead: `on_trials_claimed` is called after the re-timing (once, and not after a lost
    GPU context or an interrupt, as before), and right before the re-timing `compile_ahead`'s
    optional settle() drops the configs no worker has started and waits for those being
    compiled (the wait is SearchOutcome.phase_s["settling"], within retime_s).

    With `db`, a storage that lacks trials the database has rows of (a journal lost, emptied or
    swapped) is a StoreError before anything is written: the storage would number new trials
    from 0 again, over those rows. Raises SearchInterrupted on Ctrl-C, after storing everything
    finished.
    """
    if options is None:
        options = SearchOptions(**option_fields)
    elif option_fields:
        raise SearchError(f"give run_search its options or their fields, not both: {sorted(option_fields)}")
    if runner_factories is None:
        if runner_factory is None:
            raise SearchError("run_search needs a runner_factory or runner_factories")
        runner_factories = [runner_factory]
    elif runner_factory is not None or not runner_factories:
        raise SearchError("give run_search one of runner_factory or a non-empty runner_factories")
    if db is not None:
        if sink is not None:
            raise SearchError("give run_search a sink or a db, not both")
        sink = catalogue_sink(db)
    if storage is None and options.storage_url is None:
        raise SearchError("run_search needs a storage_url or a storage")
    search = _Search(spec, problem, dtype, options, runner_factories=list(runner_factories), sink=sink,
                     storage=storage, progress=progress, precompile=precompile, stop_when=stop_when,
                     compile_ahead=compile_ahead, on_trials_claimed=on_trials_claimed, catalogue=db)
    return search.run()


class _Search:
    def __init__(
        self, spec: KernelSpec, problem: Any, dtype: torch.dtype, options: SearchOptions, *,
        runner_factories: list[Callable[[], MeasuresConfigs]], sink: TrialSink | None,
        storage: optuna.storages.BaseStorage | None, progress: Callable[[SearchProgress], None] | None,
        precompile: Callable[[Sequence[Config]], None] | None, stop_when: Callable[[SearchProgress], bool] | None,
        compile_ahead: CompilesAhead | None = None, on_trials_claimed: Callable[[], None] | None = None,
        catalogue: sqlite_utils.Database | None = None,
    ):
        self.spec, self.problem, self.dtype, self.options = spec, problem, dtype, options
        self.runner_factories, self.storage, self.catalogue = runner_factories, storage, catalogue
        self.progress, self.precompile, self.stop_when = progress, precompile, stop_when
        self.on_trials_claimed = on_trials_claimed
        self.trials_claimed_told = False  # on_trials_claimed is called once
        # The sink belongs to the thread that called run_search (omnitune.search.slots).
        self.sink = HomeSink(sink) if sink is not None else None
        self.setup_s = 0.0  # building runners (inputs, reference): the fixed cost `omnitune plan` reads
        self.phase_s: collections.Counter[str] = collections.Counter()  # SearchOutcome.phase_s
        self.runners: dict[int, MeasuresConfigs] = {}  # by slot (one per GPU), built when first needed
        # Several slots share this search: everything but the measuring itself (choosing, asking,
        # telling, the ledger, the catalogue, progress) happens under this lock.
        self.lock = threading.RLock()
        self.stopping = threading.Event()  # Ctrl-C or a slot's error: the other slots stop asking
        self.target_met = False  # stop_when said so: every slot stops asking
        self.failed_in_flight: set[int] = set()  # trials failed by the main thread on Ctrl-C
        device = options.device
        self.facts = StudyFacts(
            kernel=spec.name, problem_key=spec.problem_key(problem),
            problem_json=json.dumps(spec.problem_dict(problem), sort_keys=True),
            dtype=dtype_name(dtype), device_key=device.key, device_name=device.name,
        )
        self.provenance = Provenance(spec.source_hash(), device.torch, device.triton, device.omnitune, device.name)
        self.representative = device.name != INTERPRETER_DEVICE
        self.space = ConfigSpace(spec)
        self.ledger = Ledger()
        self.queue = AheadQueue(compile_ahead, self.ledger) if compile_ahead is not None else None
        self.default_config = spec.default_config(problem, dtype)
        limits = options.limits
        valid = spec.valid_configs(problem, dtype, limits) if spec.space_size() <= ENUMERABLE_SPACE else None
        self.valid = tuple(valid) if valid is not None else None
        enumerate_all = options.sampler is SamplerName.GRID or (valid is not None and len(valid) <= options.trials)
        self.chain_names = options.strategies or default_chain(options.sampler, enumerate_all)
        # Each list as it comes; the planned strategy measures a config named twice once
        # (first_proposals).
        self.tried = tuple(tried_configs(spec, problem, dtype, options.tries))
        self.known_good = tuple(spec.known_good_configs(problem, dtype, limits))
        warm = options.warm_start
        if warm is None:
            warm = warm_start_configs(spec, problem, dtype, device.key, limits)
        self.warm_start = tuple(warm)
        self.measured_now = 0
        self.started = time.monotonic()

    # --- the loop -----------------------------------------------------------------------------

    def run(self) -> SearchOutcome:
        o = self.options
        valid_only = self.valid is not None and o.sampler is not SamplerName.GRID
        sampler = make_sampler(o.sampler, o.seed, constant_liar=self.queue is not None,
                               startup_trials=TPE_STARTUP_TRIALS if valid_only else None)
        if valid_only:
            # Proposals made valid and new before they become trials, not pruned after (valid_only).
            sampler = ValidOnly(sampler, self.space, self.valid, o.seed, taken=lambda: self.ledger.busy)
        study = open_study(self._storage_holding_the_catalogue(), self.facts, sampler)
        self.shared = SharedStudy(study, heartbeats=o.heartbeat_interval_s is not None,
                                  slots=len(self.runner_factories))
        self.ledger.refresh(study)
        if self.shared.fail_abandoned(self.ledger, starting=True):
            self.ledger.refresh(study)
        if self.sink is not None:
            # Catch up rows that a killed run stored in Optuna but not yet in the catalogue.
            self.sink(study_records(self.facts, study.get_trials(deepcopy=False)))
        self.chain = build_chain(self.chain_names, Setting(
            spec=self.spec, problem=self.problem, dtype=self.dtype, limits=o.limits, space=self.space,
            valid=self.valid, default=self.default_config, known_good=self.known_good, warm_start=self.warm_start,
            seed=o.seed, sampler=o.sampler.value, ask=lambda: self.shared.ask(self.space.distributions),
            tried=self.tried,
        ))
        if self.precompile is not None:
            upcoming = self.upcoming()
            if upcoming:
                self.precompile(upcoming)
        try:
            try:
                reason = self._loop(0) if len(self.runner_factories) == 1 else self._run_slots()
            finally:
                if self.queue is not None:
                    with self.lock:
                        self.queue.drop(self.shared.tell_failed)
            stopped_cleanly = reason not in (StopReason.CONTEXT_LOST, StopReason.INTERRUPTED)
            # An op whose timed call syncs the host is re-timed on a quiet host: the next problem is
            # prepared (on_trials_claimed) after its finalists' re-timing, not while the loop ends.
            if stopped_cleanly and not self.spec.syncs_host:
                self._tell_trials_claimed()
            self.loop_s = time.monotonic() - self.started
            retiming = self._retime(reason)
            if stopped_cleanly and self.spec.syncs_host:
                self._tell_trials_claimed()
        except KeyboardInterrupt:
            raise SearchInterrupted(self._outcome(StopReason.INTERRUPTED)) from None
        finally:
            self._flush_pending_records()
        return self._outcome(reason, retiming)

    def _storage_holding_the_catalogue(self) -> optuna.storages.BaseStorage:
        """The Optuna storage, once it is known to hold every trial of this study that the results
        database has a row of: its rows are keyed by trial number, which a storage that lost them
        would hand out again (require_catalogue_held)."""
        o = self.options
        if self.storage is not None:
            if self.catalogue is not None:
                require_catalogue_held(self.catalogue, self.facts.name, self.storage, "the Optuna storage given")
            return self.storage
        with journal_unmade_on_error(o.storage_url):
            storage = open_optuna_storage(o.storage_url, heartbeat_interval_s=o.heartbeat_interval_s)
            if self.catalogue is not None:
                require_catalogue_held(self.catalogue, self.facts.name, storage, storage_description(o.storage_url))
        return storage

    def upcoming(self) -> list[Config]:
        """The configs the strategies will certainly propose next (the planned ones; with an
        enumeration, the valid configs in order), valid here, at most the budget left, none
        measured yet: compiled in parallel before the first trial, they leave each trial its
        measurement."""
        left = self.options.trials - self.ledger.measured_total
        upcoming = [c for c in self.chain.lookahead(self.ledger)
                    if not self.spec.violations(self.problem, c, self.dtype, self.options.limits)]
        return upcoming[:max(0, left)]

    def _runner_of(self, slot: int) -> MeasuresConfigs:
        if slot not in self.runners:
            began = time.monotonic()
            self.runners[slot] = self.runner_factories[slot]()
            self.setup_s += time.monotonic() - began
        return self.runners[slot]

    def _run_slots(self) -> StopReason:
        """One thread per runner, each running the loop (omnitune.search.slots); the main thread
        waits, and on Ctrl-C fails the trials in flight before the interrupt goes on."""
        reasons = run_slots(self._loop, len(self.runner_factories), stopping=self.stopping,
                            waiting=self._flush_pending_records, interrupted=self._fail_in_flight)
        with self.lock:
            self.ledger.refresh(self.shared.study)
            if self.ledger.measured_total >= self.options.trials:
                return StopReason.BUDGET
            if self._all_valid_measured():
                return StopReason.EXHAUSTED
            for reason in (StopReason.CONTEXT_LOST, StopReason.TARGET, StopReason.TIMEOUT, StopReason.EXHAUSTED):
                if reason in reasons.values():
                    return reason
            return StopReason.BUDGET

    def _fail_in_flight(self) -> None:
        """Ctrl-C: fail the trials the slots are measuring; their results, when they come, are
        dropped (see _measure_and_store)."""
        with self.lock:
            for number, _ in self.ledger.in_flight.values():
                self.shared.tell_failed(number)
                self.failed_in_flight.add(number)
            self.ledger.in_flight.clear()

    def _flush_pending_records(self) -> None:
        if self.sink is not None:
            self.sink.flush()

    def _loop(self, slot: int) -> StopReason:
        while True:
            with self.lock:
                if self.stopping.is_set():
                    return StopReason.INTERRUPTED
                choosing = time.perf_counter()
                step = self._next_trial()
                if isinstance(step, StopReason):
                    return step
                claimed = False
                budget_claimed = False
                if step is not None:
                    trial, config, chosen_by = step
                    if self.queue is not None and self.queue.take(trial):
                        claimed = True  # claimed when it was queued
                    else:
                        claimed = self.shared.claim(trial, config, self.ledger, budget=self.options.trials,
                                                    slot=slot)
                    if claimed:
                        self.ledger.in_flight[slot] = (trial.number, config)
                        if self.queue is not None:
                            self.queue.fill(self._claims_ahead(slot))
                        budget_claimed = self._budget_claimed()
                self.phase_s["choosing"] += time.perf_counter() - choosing
            if step is None:
                time.sleep(WAIT_FOR_CLAIMS_S)
                continue
            if budget_claimed and not self.spec.syncs_host:
                self._tell_trials_claimed()
            result = self._measure_and_store(trial, config, chosen_by, slot) if claimed else None
            with self.lock:
                telling = time.perf_counter()
                self.chain.tell(Told(config, chosen_by, result))
                self.phase_s["choosing"] += time.perf_counter() - telling
            if getattr(self.runners.get(slot), "context_lost", False):
                return StopReason.CONTEXT_LOST

    def _budget_claimed(self) -> bool:
        """Whether every place of the budget is measured or claimed (here, queued, or by another
        process): no further trial will be claimed unless one of those fails. Under the lock."""
        ledger = self.ledger
        return ledger.measured_total + ledger.in_flight_total + len(ledger.unclaimed_since) >= self.options.trials

    def _tell_trials_claimed(self) -> None:
        """Call on_trials_claimed, once, outside the lock (what it does must not hold the other slots)."""
        with self.lock:
            if self.on_trials_claimed is None or self.trials_claimed_told:
                return
            self.trials_claimed_told = True
        self.on_trials_claimed()

    def _next_trial(self) -> StopReason | Claimed | None:
        """Why to stop, or the next asked trial, its config and who chose it; None to wait for
        another process's claim. Under the lock."""
        if self.target_met:
            return StopReason.TARGET
        # Trials of workers whose heartbeat stopped are failed and retried (the storage's
        # callback enqueues their config again), before the ledger counts them as claimed.
        self.shared.fail_stale()
        self.ledger.refresh(self.shared.study)
        if self.shared.fail_abandoned(self.ledger):
            self.ledger.refresh(self.shared.study)
        # Configs being measured count against the budget, here and in other processes.
        committed = self.ledger.measured_total + self.ledger.in_flight_total
        if self.queue and not self._timed_out():
            return self.queue.pop()  # claimed already (counted in `committed`): measured before anything new
        if committed >= self.options.trials:
            return StopReason.BUDGET
        if self._all_valid_measured():
            return StopReason.EXHAUSTED
        if self._timed_out():
            return StopReason.TIMEOUT
        if committed + len(self.ledger.unclaimed_since) >= self.options.trials:
            # Trials that other processes asked and have not claimed yet may take the last
            # places: wait until they are claimed, or failed as abandoned.
            return None
        proposal = self.chain.propose(self.ledger)
        if proposal is None:
            return StopReason.EXHAUSTED  # what is left is being measured by another process or slot
        return self._trial_for(proposal)

    def _trial_for(self, proposal: Proposal) -> Claimed:
        """The asked trial of a proposal, its config and who chose it. Under the lock."""
        trial = proposal.trial
        if trial is None:
            trial = self.shared.ask(self.space.distributions, enqueue=self.space.encode(proposal.config))
        config = self.space.decode(trial.params)
        # An ask may pop a config another process enqueued (a retried trial): the sampler's then.
        chosen_by = proposal.chosen_by if config == proposal.config else self.options.sampler.value
        return trial, config, chosen_by

    def _claims_ahead(self, slot: int) -> Iterator[Claimed | None]:
        """Trials proposed, asked and claimed for the compile-ahead queue while the budget has a
        place left (omnitune.search.ahead_queue); None for a proposal not claimed, or one a
        constraint rejects, stored as pruned at once (nothing to compile or time). Under the lock."""
        while True:
            committed = self.ledger.measured_total + self.ledger.in_flight_total
            if committed + len(self.ledger.unclaimed_since) >= self.options.trials or self.target_met:
                return
            proposal = self.chain.propose(self.ledger)
            if proposal is None:
                return
            trial, config, chosen_by = self._trial_for(proposal)
            claimed = self.shared.claim(trial, config, self.ledger, budget=self.options.trials, slot=slot)
            if claimed and not self.spec.violations(self.problem, config, self.dtype, self.options.limits):
                yield trial, config, chosen_by
                continue
            # Pruned at once under a slot number no thread has, leaving this slot's own trial in flight.
            result = self._measure_and_store(trial, config, chosen_by, slot=-1 - trial.number) if claimed else None
            self.chain.tell(Told(config, chosen_by, result))
            yield None

    def _timed_out(self) -> bool:
        return self.options.timeout_s is not None and time.monotonic() - self.started >= self.options.timeout_s

    def _all_valid_measured(self) -> bool:
        return self.valid is not None and all(c in self.ledger.finished for c in self.valid)

    # --- one trial ----------------------------------------------------------------------------

    def _measure_and_store(self, trial: optuna.Trial, config: Config, chosen_by: str, slot: int) -> TrialResult | None:
        """Measure a claimed trial's config (outside the lock) and store it before the slot asks
        again. The result, or None when it was dropped (failed under this process)."""
        told = False
        try:
            with self.shared.heartbeat(trial):
                result = self._measure(config, slot)
            with self.lock:
                storing = time.perf_counter()
                self.ledger.in_flight.pop(slot, None)
                if trial.number in self.failed_in_flight:
                    return None  # Ctrl-C: the main thread has failed this trial already
                value = result.time_ms if result.status is TrialStatus.OK else self.ledger.penalty_ms()
                # Failed configs (pruned, compile error, mismatch, ...) are told as COMPLETE with a
                # penalty, not as FAIL: Optuna's TPE and CMA-ES ignore FAIL trials, so they would keep
                # proposing the same broken region. The penalty teaches them to stay away, and our
                # own best (and the catalogue's) only ever considers status ok, so a config that
                # disagrees with the reference can never be the best.
                attrs = self._attrs(result, chosen_by)
                stored = self.shared.tell_measured(trial, value, attrs)
                told = True
                if not stored:
                    return None
                self.ledger.add(trial.number, result, value)
                if result.status is not TrialStatus.PRUNED:
                    self.measured_now += 1
                self._record(trial.number, attrs)
                self._report(trial.number, result, chosen_by)
                self.phase_s["storing"] += time.perf_counter() - storing
        except BaseException:
            with self.lock:
                self.ledger.in_flight.pop(slot, None)
                if not told:
                    self.shared.tell_failed(trial.number)
            raise
        return result

    def _measure(self, config: Config, slot: int = 0) -> TrialResult:
        violations = self.spec.violations(self.problem, config, self.dtype, self.options.limits)
        if violations:
            name, reason = violations[0]
            return TrialResult(config, TrialStatus.PRUNED, detail=f"{name}: {reason}",
                               representative=self.representative)
        runner = self._runner_of(slot)
        began = time.perf_counter()
        if self.queue is not None:
            self.queue.ready(config)
        measuring = time.perf_counter()
        result = runner.measure(config)
        ended = time.perf_counter()
        with self.lock:
            self.phase_s["compile_wait"] += measuring - began
            self.phase_s["measuring"] += ended - measuring
        return result

    def _attrs(self, result: TrialResult, chosen_by: str) -> dict[str, Any]:
        return finished_trial_attrs(
            result, is_default=result.config == self.default_config, sampler=self.options.sampler.value,
            provenance=self.provenance, measured_at=utc_now(), chosen_by=chosen_by,
        )

    def _record(self, number: int, attrs: dict[str, Any]) -> None:
        """The trial's catalogue row to the sink, now or (from a slot's thread) when the thread
        that owns the sink next flushes."""
        record = catalogue_record(self.facts, number, attrs) if self.sink is not None else None
        if record is not None:
            self.sink([record])

    def _report(self, number: int, result: TrialResult, chosen_by: str) -> None:
        if self.progress is None and self.stop_when is None:
            return
        report = SearchProgress(
            study_name=self.facts.name, trial_number=number, result=result, chosen_by=chosen_by,
            measured_total=self.ledger.measured_total, measured_now=self.measured_now,
            budget=self.options.trials, best=self.ledger.best, default=self._default_result(),
            failures=self.ledger.failures, elapsed_s=time.monotonic() - self.started,
        )
        if self.progress is not None:
            self.progress(report)
        if self.stop_when is not None and self.stop_when(report):
            self.target_met = True

    # --- after the loop -----------------------------------------------------------------------

    def _retime(self, reason: StopReason) -> Retiming:
        """Re-time the finalists (omnitune.search.finalists), or say why not."""
        if self.options.finalists == 0:
            return Retiming(RetimeStatus.DISABLED)
        if not self.representative:
            return Retiming(RetimeStatus.INTERPRETER)
        if reason is StopReason.CONTEXT_LOST:
            return Retiming(RetimeStatus.CONTEXT_LOST)
        finalists = StudyFinalists(self.shared.study, self.space, lambda r: self._attrs(r, "finalist"), self._record)
        runner = self._runner_of(0)
        if self.spec.syncs_host:
            self._settle_compiles()
        return finalists.retime(runner, self.ledger.ranked_ok(), self.default_config,
                                count=self.options.finalists, rounds=self.options.finalist_rounds,
                                always=self._backend_configs())

    def _settle_compiles(self) -> None:
        """Quiet this search's compile-ahead pool before the finalists of an op whose timing
        includes host work are re-timed: what no worker has started is dropped (the loop has
        ended), what a worker is compiling is waited for. Compiles of other processes (other
        lanes) are not this search's to wait for."""
        settle = getattr(self.queue.pool, "settle", None) if self.queue is not None else None
        if settle is None:
            return
        began = time.perf_counter()
        settle()
        self.phase_s["settling"] += time.perf_counter() - began

    def _backend_configs(self) -> list[Config]:
        """The spec's other backends (SDPA for attention) completed for this problem: re-timed
        beside the finalists whenever they ran ok."""
        spec, problem, dtype = self.spec, self.problem, self.dtype
        return [spec.complete_config(values, problem, dtype) for values in spec.backends]

    def _default_result(self) -> TrialResult | None:
        finished = self.ledger.finished.get(self.default_config)
        return finished.result if finished else None

    def _outcome(self, reason: StopReason, retiming: Retiming | None = None) -> SearchOutcome:
        retiming = retiming or Retiming(RetimeStatus.DISABLED)
        searched = [f.result.config for f in self.ledger.ranked_ok()]
        finalists = [t.config for t in retiming.timings]
        ranking = tuple(finalists + [c for c in searched if c not in finalists])
        best = retiming.results[finalists[0]] if finalists else self.ledger.best
        wall_s = time.monotonic() - self.started
        loop_s = getattr(self, "loop_s", wall_s)
        default = retiming.results.get(self.default_config) or self._default_result()
        return SearchOutcome(
            study_name=self.facts.name, best=best, default=default,
            measured_now=self.measured_now, measured_total=self.ledger.measured_total,
            failures=self.ledger.failures, wall_s=wall_s, stop_reason=reason,
            setup_s=self.setup_s, retime_s=wall_s - loop_s, phase_s=dict(self.phase_s),
            finalists=retiming.timings, retime_status=retiming.status, retime_detail=retiming.detail,
            ranking=ranking,
        )

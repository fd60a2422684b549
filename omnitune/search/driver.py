"""The search driver: one Optuna study per kernel × problem × dtype × device, driven through
Optuna's ask/tell interface so that omnitune owns the measuring loop.

Each iteration: choose a config (the kernel's default first; then its known-good configs and the
winners of the nearest tuned problems in the exported tables (warm start); then the enumeration,
the sampler, or — when the sampler keeps proposing configs already measured — a random unmeasured
one) →
skip it if it was measured before → prune it if a constraint rejects it (no GPU time) → measure
it with the runner → store it (trial user attrs, tell, catalogue row) before the next begins.

So a search can always be resumed: rerunning it reopens the study, marks trials abandoned by a
killed process as failed (their configs become measurable again), and goes on until the study
holds `trials` measured configs. The budget is the total for the study, not for one run.

After the loop, the finalists (omnitune.search.finalists) are re-timed against each other and the
winner is the best re-timed median. Optuna cannot change a finished trial, so each re-timing is
a trial of its own: the same config, chosen_by "finalist", its figures under extra["finalist"]
(session, the trial it re-times, median, CV, noisy) — stored, rebuilt and catalogued like every
other trial. A rerun that would re-time the same finalists reuses the stored re-timing.
"""

from __future__ import annotations

import enum
import importlib.util
import json
import logging
import os
import random
import socket
import threading
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import optuna
import sqlite_utils
import torch
from optuna.trial import TrialState

from omnitune.errors import OmnituneError
from omnitune.profile.device import INTERPRETER_DEVICE, DeviceFacts
from omnitune.search.finalists import (
    DEFAULT_FINALISTS,
    DEFAULT_ROUNDS,
    FINALIST_KEY,
    FinalistTiming,
    finalist_facts,
    pick_finalists,
    ranked,
    retime_finalists,
)
from omnitune.search.space import ConfigSpace
from omnitune.trial import TrialResult, TrialStatus
from omnitune.spec import Config, DeviceLimits, KernelSpec, dtype_name
from omnitune.store import (
    STUDY_ATTR,
    Provenance,
    StudyFacts,
    catalogue_record,
    config_from_attrs,
    config_json,
    finished_trial_attrs,
    open_optuna_storage,
    record_trial,
    record_trials,
    result_from_attrs,
    study_records,
    utc_now,
)

log = logging.getLogger(__name__)

# A failed config is told to the sampler as this many times the slowest correct config so far:
# clearly worse than anything that works, yet on the same scale, so that CMA-ES's steps stay sane.
PENALTY_FACTOR = 10.0
# Before any config has worked there is no scale: a thousand seconds is slower than any kernel.
PENALTY_BEFORE_ANY_OK_MS = 1e6
# Consecutive sampler proposals that measured nothing (repeats, constraint violations) after which
# the driver picks a random unmeasured valid config itself: the loop must always make progress.
SAMPLER_PATIENCE = 8
# Past this many configs the valid ones are not listed up front (the check is per config).
ENUMERABLE_SPACE = 200_000
# Tuned configs of nearby problems measured right after the known-good ones (a warm start).
WARM_START_CONFIGS = 3


class SearchError(OmnituneError):
    """A search that cannot start as asked (bad sampler, bad budget, missing package)."""


class SamplerName(str, enum.Enum):
    TPE = "tpe"
    RANDOM = "random"
    GRID = "grid"
    CMAES = "cmaes"


class StopReason(str, enum.Enum):
    BUDGET = "budget"              # the study holds the requested number of measured configs
    EXHAUSTED = "exhausted"        # every valid config has been measured
    TIMEOUT = "timeout"
    INTERRUPTED = "interrupted"    # Ctrl-C
    CONTEXT_LOST = "context_lost"  # a config poisoned the CUDA context; rerun to resume


class RetimeStatus(str, enum.Enum):
    """What became of the finalists' re-timing after the search loop."""

    RETIMED = "retimed"            # timed against each other now
    REUSED = "reused"              # the same finalists were re-timed by an earlier run: kept
    DISABLED = "disabled"          # finalists=0
    INTERPRETER = "interpreter"    # times under Triton's interpreter mean nothing
    NO_OK_CONFIG = "no_ok_config"  # nothing to re-time
    CONTEXT_LOST = "context_lost"  # the GPU is unusable in this process
    FAILED = "failed"              # timing raised; the search's own times stand (see detail)


class MeasuresConfigs(Protocol):
    """What the driver needs of a runner (omnitune.measure.runner.Runner is one). A runner may
    also set `context_lost = True` once its process can no longer use the GPU. Re-timing the
    finalists also needs its `time_interleaved` (omnitune.search.finalists.TimesInterleaved)."""

    def measure(self, config: Config) -> TrialResult: ...


@dataclass(frozen=True)
class SearchProgress:
    """Where a search stands, reported after every trial that measured or pruned a config."""

    study_name: str
    trial_number: int
    result: TrialResult
    chosen_by: str
    measured_total: int
    measured_now: int
    budget: int
    best: TrialResult | None
    default: TrialResult | None
    failures: Mapping[TrialStatus, int]
    elapsed_s: float


@dataclass(frozen=True)
class SearchOutcome:
    study_name: str
    best: TrialResult | None           # the fastest correct config (re-timed when finalists were), None if none worked
    default: TrialResult | None        # the kernel's default config (None if never measured)
    measured_now: int                  # configs measured by this run
    measured_total: int                # configs measured in the study, this run included
    failures: Mapping[TrialStatus, int]  # over the whole study, constraint prunes included
    wall_s: float
    stop_reason: StopReason
    finalists: tuple[FinalistTiming, ...] = ()  # re-timed (or reused), fastest median first
    retime_status: RetimeStatus = RetimeStatus.DISABLED
    retime_detail: str = ""            # why re-timing failed
    ranking: tuple[Config, ...] = ()   # every ok config, best first: the finalists by re-timed median, then the rest

    @property
    def speedup_over_default(self) -> float | None:
        if self.best is None or self.default is None or self.default.status is not TrialStatus.OK:
            return None
        return self.default.time_ms / self.best.time_ms if self.best.time_ms > 0 else None


class SearchInterrupted(KeyboardInterrupt):
    """Ctrl-C during a search, after the trial in flight was marked failed. Every finished
    trial is stored; `outcome` says where the search stood. Rerun the search to resume."""

    def __init__(self, outcome: SearchOutcome):
        super().__init__("search interrupted")
        self.outcome = outcome


def run_search(
    spec: KernelSpec,
    problem: Any,
    dtype: torch.dtype,
    *,
    runner_factory: Callable[[], MeasuresConfigs] | None = None,
    runner_factories: Sequence[Callable[[], MeasuresConfigs]] | None = None,
    device: DeviceFacts,
    trials: int,
    storage_url: str,
    db: sqlite_utils.Database | None = None,
    sampler: SamplerName | str = SamplerName.TPE,
    seed: int = 0,
    timeout_s: float | None = None,
    limits: DeviceLimits | None = None,
    progress: Callable[[SearchProgress], None] | None = None,
    finalists: int = DEFAULT_FINALISTS,
    finalist_rounds: int = DEFAULT_ROUNDS,
    heartbeat_interval_s: int | None = None,
    precompile: Callable[[Sequence[Config]], None] | None = None,
) -> SearchOutcome:
    """Search `spec`'s config space for `problem` in `dtype` until the study holds `trials`
    measured configs, every valid config is measured, or `timeout_s` has passed; then re-time the
    `finalists` fastest ok configs (and the default) interleaved, `finalist_rounds` rounds, and
    declare the best re-timed median the winner (finalists=0: the search's fastest wins).

    `runner_factory` is called once, when the first config needs measuring (a resumed search
    that has nothing left to do never builds inputs). `device` names the study's device and
    goes into every trial's provenance; `limits` are the device limits constraints check
    (H100-like defaults when None). With `db`, every finished trial also gets its catalogue row.
    Raises SearchInterrupted on Ctrl-C, after storing everything finished.

    `runner_factories` (instead of `runner_factory`): one runner per entry, each driven by a
    thread of its own (one isolated worker per GPU), all sharing the study trial by trial; the
    finalists are re-timed on the first. `heartbeat_interval_s`: the trials record heartbeats in
    the storage, and trials of workers whose heartbeat stopped (a dead host) are failed and
    retried once (see docs/distributed.md).

    `precompile`, when given, is called once before the first trial with the configs the driver
    will measure itself next (default, known-good, warm start; with an enumeration, the valid
    configs in order), at most the budget left, none measured yet: compiling them in parallel
    (omnitune.measure.precompile) leaves each trial only its measurement.
    """
    if runner_factories is None:
        if runner_factory is None:
            raise SearchError("run_search needs a runner_factory or runner_factories")
        runner_factories = [runner_factory]
    elif runner_factory is not None or not runner_factories:
        raise SearchError("give run_search one of runner_factory or a non-empty runner_factories")
    search = _Search(
        spec, problem, dtype,
        runner_factories=list(runner_factories), heartbeat_interval_s=heartbeat_interval_s, device=device, trials=trials, storage_url=storage_url, db=db,
        sampler=parse_sampler(sampler), seed=seed, timeout_s=timeout_s,
        limits=limits or DeviceLimits(), progress=progress, finalists=finalists, finalist_rounds=finalist_rounds,
        precompile=precompile,
    )
    return search.run()


def make_sampler(name: SamplerName | str, seed: int) -> optuna.samplers.BaseSampler:
    """The Optuna sampler behind --sampler. Grid gets a random sampler that is never consulted:
    every grid trial has its params fixed by the driver."""
    name = parse_sampler(name)
    if name is SamplerName.TPE:
        # Multivariate TPE models the parameters jointly: BLOCK_M and num_warps matter together.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.TPESampler(seed=seed, multivariate=True)
    if name is SamplerName.CMAES:
        if importlib.util.find_spec("cmaes") is None:
            raise SearchError("--sampler cmaes needs the 'cmaes' package (pip install cmaes); or use tpe, random, grid")
        return optuna.samplers.CmaEsSampler(seed=seed, warn_independent_sampling=False)
    return optuna.samplers.RandomSampler(seed=seed)


def warm_start_configs(
    spec: KernelSpec, problem: Any, dtype: torch.dtype, device_key: str, limits: DeviceLimits | None = None,
    *, most: int = WARM_START_CONFIGS,
) -> list[Config]:
    """The winners of the tuned problems nearest to `problem` in the exported tables that
    omnitune.runtime reads, nearest first (see omnitune.runtime.nearest_configs); none when a
    table cannot be read: a warm start is a hint, and a hostile table must not stop the search."""
    from omnitune.runtime import nearest_configs

    try:
        return nearest_configs(spec, problem, dtype, device_key, limits, most=most)
    except Exception as exc:  # noqa: BLE001 — whatever a table can make the reader raise
        log.warning("no warm start for %s: a tuned table could not be read (%s: %s)", spec.name,
                    type(exc).__name__, exc)
        return []


def parse_sampler(name: SamplerName | str) -> SamplerName:
    """The sampler a name (as given to --sampler) stands for; SearchError listing the choices."""
    try:
        return SamplerName(name.lower() if isinstance(name, str) else name)
    except ValueError:
        raise SearchError(
            f"unknown sampler {name!r}; choose one of {', '.join(s.value for s in SamplerName)}"
        ) from None


@dataclass(frozen=True)
class _Finished:
    number: int
    result: TrialResult
    value: float  # what the sampler was told


class _Ledger:
    """What the study holds, read incrementally from Optuna's storage: the finished result of
    every measured config, and the configs other processes are measuring right now."""

    def __init__(self) -> None:
        self.finished: dict[Config, _Finished] = {}
        self.claimed: set[Config] = set()
        self._read: set[int] = set()

    def refresh(self, study: optuna.Study) -> None:
        self.claimed = set()
        for trial in study.get_trials(deepcopy=False):
            if trial.number in self._read:
                continue
            if trial.state is TrialState.RUNNING:
                config = config_from_attrs(trial.user_attrs)
                if config is not None:
                    self.claimed.add(config)
                continue
            if not trial.state.is_finished():
                continue  # WAITING: an enqueued config the next ask pops
            self._read.add(trial.number)
            result = result_from_attrs(trial.user_attrs) if trial.state is TrialState.COMPLETE else None
            if result is not None and result.config not in self.finished:
                self.add(trial.number, result, float(trial.value))

    def add(self, number: int, result: TrialResult, value: float) -> None:
        self._read.add(number)
        self.finished[result.config] = _Finished(number, result, value)

    @property
    def measured_total(self) -> int:
        return sum(1 for f in self.finished.values() if f.result.status is not TrialStatus.PRUNED)

    @property
    def best(self) -> TrialResult | None:
        ok = self.ranked_ok()
        return ok[0].result if ok else None

    def ranked_ok(self) -> list[_Finished]:
        """The ok configs, fastest search time first (ties: the earlier trial)."""
        ok = [f for f in self.finished.values() if f.result.status is TrialStatus.OK]
        return sorted(ok, key=lambda f: (f.result.time_ms, f.number))

    @property
    def failures(self) -> dict[TrialStatus, int]:
        return dict(Counter(f.result.status for f in self.finished.values() if f.result.status.failed))

    def penalty_ms(self) -> float:
        ok_times = [f.result.time_ms for f in self.finished.values() if f.result.status is TrialStatus.OK]
        return PENALTY_FACTOR * max(ok_times) if ok_times else PENALTY_BEFORE_ANY_OK_MS


@dataclass(frozen=True)
class _Retiming:
    """The finalists' re-timing as the outcome reports it: the timings (fastest first) and the
    re-timing trials' results by config."""

    status: RetimeStatus
    timings: tuple[FinalistTiming, ...] = ()
    results: Mapping[Config, TrialResult] = field(default_factory=dict)
    session: int = 0
    detail: str = ""


class _Search:
    def __init__(
        self, spec: KernelSpec, problem: Any, dtype: torch.dtype, *,
        runner_factories: list[Callable[[], MeasuresConfigs]], device: DeviceFacts, trials: int,
        storage_url: str, db: sqlite_utils.Database | None, sampler: SamplerName, seed: int,
        timeout_s: float | None, limits: DeviceLimits, progress: Callable[[SearchProgress], None] | None,
        finalists: int = DEFAULT_FINALISTS, finalist_rounds: int = DEFAULT_ROUNDS,
        heartbeat_interval_s: int | None = None,
        precompile: Callable[[Sequence[Config]], None] | None = None,
    ):
        if trials < 1:
            raise SearchError(f"the trial budget must be at least 1, got {trials}")
        if timeout_s is not None and timeout_s <= 0:
            raise SearchError(f"the timeout must be positive, got {timeout_s} s")
        if finalists < 0:
            raise SearchError(f"the number of finalists must be 0 (no re-timing) or more, got {finalists}")
        if finalist_rounds < 2:
            raise SearchError(f"re-timing needs at least 2 rounds, got {finalist_rounds}")
        self.finalists, self.finalist_rounds = finalists, finalist_rounds
        self.precompile = precompile
        self.spec, self.problem, self.dtype = spec, problem, dtype
        self.runner_factories = runner_factories
        self.runners: dict[int, MeasuresConfigs] = {}  # by slot (one per GPU), built when first needed
        self.heartbeat_interval_s = heartbeat_interval_s
        # Several slots share this search: everything but the measuring itself (choosing, asking,
        # telling, the ledger, the catalogue, progress) happens under this lock.
        self.lock = threading.RLock()
        self.in_flight: dict[int, tuple[int, Config]] = {}  # slot -> (trial number, config) being measured
        self.stopping = threading.Event()  # Ctrl-C or a slot's error: the other slots stop asking
        self.failed_in_flight: set[int] = set()  # trials failed by the main thread on Ctrl-C
        # The catalogue's SQLite connection belongs to the main thread: with several slots their
        # rows wait here for it (they are in Optuna's storage already; a rerun catches up anyway).
        self.pending_records: list = []
        self.trials, self.db, self.sampler, self.seed = trials, db, sampler, seed
        self.timeout_s, self.limits, self.progress = timeout_s, limits, progress
        self.facts = StudyFacts(
            kernel=spec.name,
            problem_key=spec.problem_key(problem),
            problem_json=json.dumps(spec.problem_dict(problem), sort_keys=True),
            dtype=dtype_name(dtype),
            device_key=device.key,
            device_name=device.name,
        )
        self.provenance = Provenance(spec.source_hash(), device.torch, device.triton, device.omnitune, device.name)
        self.representative = device.name != INTERPRETER_DEVICE
        self.space = ConfigSpace(spec)
        self.storage_url = storage_url
        self.owner = f"{socket.gethostname()}:{os.getpid()}"
        self.study: optuna.Study | None = None  # opened by run()
        self.ledger = _Ledger()
        self.rng = random.Random(seed)
        self.default_config = spec.default_config(problem, dtype)
        self.valid: list[Config] | None = (
            spec.valid_configs(problem, dtype, limits) if spec.space_size() <= ENUMERABLE_SPACE else None
        )
        self.enumerate_all = sampler is SamplerName.GRID or (self.valid is not None and len(self.valid) <= trials)
        # Configs the driver proposes itself, in order: the default always first, then the spec's
        # known-good configs, then the winners of the nearest tuned problems (warm start); with an
        # enumeration, every valid config after them (grid: in the spec's deterministic order).
        self.planned = [self.default_config]
        self.known_good = [c for c in spec.known_good_configs(problem, dtype, limits) if c != self.default_config]
        self.planned += self.known_good
        self.warm_start = [
            c for c in warm_start_configs(spec, problem, dtype, device.key, limits)
            if c not in self.planned
        ]
        self.planned += self.warm_start
        if self.enumerate_all:
            self.planned += [c for c in self.valid or () if c != self.default_config]
        self.measured_now = 0
        self.fruitless_proposals = 0
        self.started = time.monotonic()

    # --- the loop -----------------------------------------------------------------------------

    def run(self) -> SearchOutcome:
        self.study = self._open_study()
        self._fail_abandoned_trials()
        self.ledger.refresh(self.study)
        if self.db is not None:
            # Catch up rows that a killed run stored in Optuna but not yet in the catalogue.
            record_trials(self.db, study_records(self.facts, self.study.get_trials(deepcopy=False)))
        if self.precompile is not None:
            upcoming = self.upcoming_planned()
            if upcoming:
                self.precompile(upcoming)
        try:
            reason = self._loop(0) if len(self.runner_factories) == 1 else self._run_slots()
            retiming = self._retime_finalists(reason)
        except KeyboardInterrupt:
            raise SearchInterrupted(self._outcome(StopReason.INTERRUPTED)) from None
        return self._outcome(reason, retiming)

    def upcoming_planned(self) -> list[Config]:
        """The planned configs not measured yet, valid here, at most the budget left."""
        left = self.trials - self.ledger.measured_total
        busy = self._busy()
        upcoming = [c for c in self.planned if c not in busy
                    and not self.spec.violations(self.problem, c, self.dtype, self.limits)]
        return upcoming[:max(0, left)]

    def _runner_of(self, slot: int) -> MeasuresConfigs:
        if slot not in self.runners:
            self.runners[slot] = self.runner_factories[slot]()
        return self.runners[slot]

    def _run_slots(self) -> StopReason:
        """One thread per runner, each running the loop; the main thread waits (so that Ctrl-C
        reaches it), and on Ctrl-C fails the trials in flight before the interrupt goes on."""
        reasons: dict[int, StopReason] = {}
        errors: list[BaseException] = []

        def work(slot: int) -> None:
            try:
                reasons[slot] = self._loop(slot)
            except BaseException as exc:  # noqa: BLE001 — raised again by the main thread
                errors.append(exc)
                self.stopping.set()

        threads = [threading.Thread(target=work, args=(slot,), name=f"omnitune-slot-{slot}", daemon=True)
                   for slot in range(len(self.runner_factories))]
        for thread in threads:
            thread.start()
        try:
            for thread in threads:
                while thread.is_alive():
                    thread.join(0.2)
                    self._flush_pending_records()
        except KeyboardInterrupt:
            self.stopping.set()
            with self.lock:
                # Their results, when they come, are dropped (see _measure_and_store).
                for number, _ in self.in_flight.values():
                    self._tell_failed(number)
                    self.failed_in_flight.add(number)
                self.in_flight.clear()
            raise
        finally:
            self._flush_pending_records()
        if errors:
            raise errors[0]
        with self.lock:
            self.ledger.refresh(self.study)
            if self.ledger.measured_total >= self.trials:
                return StopReason.BUDGET
            if self._all_valid_measured():
                return StopReason.EXHAUSTED
            for reason in (StopReason.CONTEXT_LOST, StopReason.TIMEOUT, StopReason.EXHAUSTED):
                if reason in reasons.values():
                    return reason
            return StopReason.BUDGET

    def _flush_pending_records(self) -> None:
        with self.lock:
            records, self.pending_records = self.pending_records, []
        if records and self.db is not None:
            record_trials(self.db, records)

    def _loop(self, slot: int) -> StopReason:
        while True:
            with self.lock:
                if self.stopping.is_set():
                    return StopReason.INTERRUPTED
                step = self._next_trial()
                if isinstance(step, StopReason):
                    return step
                trial, config, chosen_by = step
                claimed = self._claim(trial, config, slot)
                if claimed:
                    self.in_flight[slot] = (trial.number, config)
            measured = self._measure_and_store(trial, config, chosen_by, slot) if claimed else False
            with self.lock:
                if chosen_by == "fallback":
                    # Give the sampler a couple of chances again before the next fallback.
                    self.fruitless_proposals = SAMPLER_PATIENCE - 2
                elif chosen_by == self.sampler.value:
                    self.fruitless_proposals = 0 if measured else self.fruitless_proposals + 1
            if getattr(self.runners.get(slot), "context_lost", False):
                return StopReason.CONTEXT_LOST

    def _busy(self) -> set[Config]:
        """Configs measured, or being measured here or by another process."""
        return self.ledger.finished.keys() | self.ledger.claimed | {c for _, c in self.in_flight.values()}

    def _next_trial(self) -> StopReason | tuple[optuna.Trial, Config, str]:
        """Why to stop, or the next asked trial, its config and who chose it. Under the lock."""
        if self.heartbeat_interval_s is not None:
            # Trials of workers whose heartbeat stopped are failed and retried (the storage's
            # callback enqueues their config again), before the ledger counts them as claimed.
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                optuna.storages.fail_stale_trials(self.study)
        self.ledger.refresh(self.study)
        in_flight = self.ledger.claimed | {c for _, c in self.in_flight.values()}
        # Configs being measured count against the budget (here and in other processes): the
        # budget is the study's, whoever measures it.
        if self.ledger.measured_total + len(in_flight - self.ledger.finished.keys()) >= self.trials:
            return StopReason.BUDGET
        if self._all_valid_measured():
            return StopReason.EXHAUSTED
        if self.timeout_s is not None and time.monotonic() - self.started >= self.timeout_s:
            return StopReason.TIMEOUT
        proposal = self._driver_proposal()
        if proposal is None and self.enumerate_all:
            return StopReason.EXHAUSTED  # what is left is being measured by another process or slot
        if proposal is not None:
            self.study.enqueue_trial(self.space.encode(proposal[0]))
        with warnings.catch_warnings():
            # Optuna warns that heartbeats are meant for Study.optimize; the driver beats itself.
            warnings.filterwarnings("ignore", "Heartbeat of storage")
            trial = self.study.ask(self.space.distributions)
        config = self.space.decode(trial.params)
        chosen_by = proposal[1] if proposal and proposal[0] == config else self.sampler.value
        return trial, config, chosen_by

    def _driver_proposal(self) -> tuple[Config, str] | None:
        """The config the driver picks itself this time (and why), or None to ask the sampler."""
        busy = self._busy()
        for config in self.planned:
            if config not in busy:
                if config == self.default_config:
                    return config, "default"
                if config in self.known_good:
                    return config, "known-good"
                if config in self.warm_start:
                    return config, "warm-start"
                return config, "grid" if self.sampler is SamplerName.GRID else "enumeration"
        if self.fruitless_proposals >= SAMPLER_PATIENCE:
            config = self._random_unmeasured(busy)
            if config is not None:
                return config, "fallback"
        return None

    def _random_unmeasured(self, busy: set[Config]) -> Config | None:
        if self.valid is not None:
            candidates = [c for c in self.valid if c not in busy]
            return self.rng.choice(candidates) if candidates else None
        for _ in range(10_000):  # a space too large to list: draw until a valid, new config
            config = self.space.random_config(self.rng)
            if config not in busy and not self.spec.violations(self.problem, config, self.dtype, self.limits):
                return config
        return None

    def _all_valid_measured(self) -> bool:
        if self.valid is None:
            return False
        return all(c in self.ledger.finished for c in self.valid)

    # --- one trial ----------------------------------------------------------------------------

    def _claim(self, trial: optuna.Trial, config: Config, slot: int = 0) -> bool:
        """Make the asked trial this process's claim on `config`, or tell it at once (and return
        False) when the config is measured or being measured elsewhere. Under the lock."""
        told = False
        try:
            previous = self.ledger.finished.get(config)
            if previous is not None:
                # Never measure a config twice: the sampler hears the stored value again.
                trial.set_user_attr("duplicate_of", previous.number)
                self.study.tell(trial, previous.value)
                told = True
                return False
            if config in self.ledger.claimed or any(c == config for _, c in self.in_flight.values()):
                self.study.tell(trial, state=TrialState.FAIL)  # another process or slot is measuring it
                told = True
                return False
            if self.heartbeat_interval_s is not None:
                # A first beat now: a worker that dies before measuring leaves a trial that goes stale.
                self.study._storage.record_heartbeat(trial._trial_id)
            # Recorded now so that a trial abandoned by a killed process still names its config,
            # and so that other processes see the claim.
            trial.set_user_attr("owner", self.owner)
            trial.set_user_attr("config_json", config_json(config))
            if len(self.runner_factories) > 1:
                trial.set_user_attr("slot", slot)
            conflict = self._claim_conflict(trial.number, config)
            if conflict is not None:
                # Another process asked the same config, or took the budget's last place, since
                # the ledger was read. Each writes its claim before it looks, so of two claims at
                # the same instant at least one sees the other: it steps back (both may).
                trial.set_user_attr("stepped_back", conflict)
                self.study.tell(trial, state=TrialState.FAIL)
                told = True
                return False
            return True
        except optuna.exceptions.UpdateFinishedTrialError:
            # Another process starting up took the trial, still without an owner, for one that a
            # killed process abandoned, and failed it: let it go and ask again.
            log.info("trial %d of %s was failed by another process before it was claimed", trial.number,
                     self.facts.name)
            return False
        except BaseException:
            if not told:
                self._tell_failed(trial.number)
            raise

    def _claim_conflict(self, number: int, config: Config) -> str | None:
        """Why trial `number` must not measure `config` after all, read afresh from the storage:
        another running or finished trial holds the config, or the measured configs and the
        earlier trials still running already make up the budget. None: go ahead."""
        measured: set[Config] = set()
        earlier_running = 0
        for other in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING, TrialState.COMPLETE)):
            if other.number == number:
                continue
            if config_from_attrs(other.user_attrs) == config:
                return f"config claimed by trial {other.number}"
            if other.state is TrialState.RUNNING:
                earlier_running += other.number < number
                continue
            result = result_from_attrs(other.user_attrs)
            if result is not None and result.status is not TrialStatus.PRUNED:
                measured.add(result.config)
        if len(measured) + earlier_running >= self.trials:
            return f"budget of {self.trials} taken by measured and running trials"
        return None

    def _measure_and_store(self, trial: optuna.Trial, config: Config, chosen_by: str, slot: int) -> bool:
        """Measure a claimed trial's config (outside the lock) and store it before the slot asks
        again. True if it measured a config (not a prune)."""
        told = False
        try:
            with self._heartbeat(trial):
                result = self._measure(config, slot)
            with self.lock:
                self.in_flight.pop(slot, None)
                if trial.number in self.failed_in_flight:
                    return False  # Ctrl-C: the main thread has failed this trial already
                value = result.time_ms if result.status is TrialStatus.OK else self.ledger.penalty_ms()
                # Failed configs (pruned, compile error, mismatch, ...) are told as COMPLETE with a
                # penalty, not as FAIL: Optuna's TPE and CMA-ES ignore FAIL trials, so they would keep
                # proposing the same broken region. The penalty teaches them to stay away, and our
                # own best (and the catalogue's) only ever considers status ok, so a config that
                # disagrees with the reference can never be the best.
                attrs = finished_trial_attrs(
                    result, is_default=config == self.default_config, sampler=self.sampler.value,
                    provenance=self.provenance, measured_at=utc_now(), chosen_by=chosen_by,
                )
                try:
                    for key, attr in attrs.items():
                        if key != "config_json":  # already set
                            trial.set_user_attr(key, attr)
                    self.study.tell(trial, value)
                except optuna.exceptions.UpdateFinishedTrialError:
                    # Another worker found this trial's heartbeat stale (this process stalled past
                    # the grace period) and failed it; its config is being retried there.
                    told = True
                    log.warning("trial %d of %s was failed by another worker while it was measured "
                                "(a stale heartbeat); its result is dropped", trial.number, self.facts.name)
                    return False
                told = True
                self.ledger.add(trial.number, result, value)
                if result.status is not TrialStatus.PRUNED:
                    self.measured_now += 1
                if self.db is not None:
                    record = catalogue_record(self.facts, trial.number, attrs)
                    if record is not None:
                        if threading.current_thread() is threading.main_thread():
                            record_trial(self.db, record)
                        else:
                            self.pending_records.append(record)
                if self.progress is not None:
                    self.progress(self._progress(trial.number, result, chosen_by))
        except BaseException:
            with self.lock:
                self.in_flight.pop(slot, None)
                if not told:
                    self._tell_failed(trial.number)
            raise
        return result.status is not TrialStatus.PRUNED

    @contextmanager
    def _heartbeat(self, trial: optuna.Trial) -> Iterator[None]:
        """While measuring: the trial's heartbeat in the storage, when the storage keeps them."""
        if self.heartbeat_interval_s is None:
            yield
            return
        from optuna.storages._heartbeat import get_heartbeat_thread

        with get_heartbeat_thread(trial._trial_id, self.study._storage):
            yield

    def _measure(self, config: Config, slot: int = 0) -> TrialResult:
        violations = self.spec.violations(self.problem, config, self.dtype, self.limits)
        if violations:
            name, reason = violations[0]
            return TrialResult(config, TrialStatus.PRUNED, detail=f"{name}: {reason}",
                               representative=self.representative)
        return self._runner_of(slot).measure(config)

    def _tell_failed(self, number: int) -> None:
        try:
            self.study.tell(number, state=TrialState.FAIL, skip_if_finished=True)
        except Exception:  # noqa: BLE001 — never mask the exception that got us here
            log.warning("could not mark trial %d of %s failed", number, self.facts.name, exc_info=True)

    # --- the finalists --------------------------------------------------------------------------

    def _retime_finalists(self, reason: StopReason) -> _Retiming:
        """Re-time the finalists against each other and store each re-timing as a trial; or say
        why not. A re-timing that raises leaves the search's own times standing."""
        if self.finalists == 0:
            return _Retiming(RetimeStatus.DISABLED)
        if not self.representative:
            return _Retiming(RetimeStatus.INTERPRETER)
        if reason is StopReason.CONTEXT_LOST:
            return _Retiming(RetimeStatus.CONTEXT_LOST)
        ranked_ok = [f.result.config for f in self.ledger.ranked_ok()]
        if not ranked_ok:
            return _Retiming(RetimeStatus.NO_OK_CONFIG)
        configs = pick_finalists(ranked_ok, self.finalists, self.default_config)
        stored = self._latest_retiming()
        if stored is not None and set(stored.results) == set(configs):
            return stored
        try:
            timings = retime_finalists(self._runner_of(0), configs, rounds=self.finalist_rounds)
        except OmnituneError:
            raise
        except Exception as exc:  # noqa: BLE001 — the search's results stand without the re-timing
            detail = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
            log.warning("re-timing the finalists of %s failed: %s", self.facts.name, detail)
            return _Retiming(RetimeStatus.FAILED, detail=detail[:300])
        session = (stored.session if stored is not None else 0) + 1
        results = {t.config: self._store_retiming(t, session) for t in timings}
        return _Retiming(RetimeStatus.RETIMED, tuple(ranked(timings)), results, session)

    def _store_retiming(self, timing: FinalistTiming, session: int) -> TrialResult:
        """Add one finalist's re-timing to the study as a finished trial (and to the catalogue)."""
        original = self.ledger.finished[timing.config]
        searched = original.result
        scale = searched.time_ms / timing.median_ms  # the rates follow the re-timed median
        result = TrialResult(
            timing.config, TrialStatus.OK, time_ms=timing.median_ms, p20_ms=timing.p20_ms,
            p80_ms=timing.p80_ms, rel_error=searched.rel_error, tflops=searched.tflops * scale,
            tbps=searched.tbps * scale, representative=searched.representative,
            extra={FINALIST_KEY: timing.as_extra(session=session, retime_of=original.number,
                                                 search_time_ms=searched.time_ms)},
        )
        attrs = finished_trial_attrs(
            result, is_default=timing.config == self.default_config, sampler=self.sampler.value,
            provenance=self.provenance, measured_at=utc_now(), chosen_by="finalist",
        )
        self.study.add_trial(optuna.trial.create_trial(
            params=self.space.encode(timing.config), distributions=self.space.distributions,
            value=timing.median_ms, user_attrs=attrs,
        ))
        if self.db is not None:
            # add_trial does not return the trial; find it (newest first: it is at the end).
            for trial in reversed(self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))):
                stored = result_from_attrs(trial.user_attrs)
                facts = finalist_facts(stored.extra) if stored is not None else None
                if facts is not None and facts["session"] == session and stored.config == timing.config:
                    record = catalogue_record(self.facts, trial.number, trial.user_attrs)
                    if record is not None:
                        record_trial(self.db, record)
                    break
        return result

    def _latest_retiming(self) -> _Retiming | None:
        """The study's most recent re-timing (the highest session), as stored; None if none."""
        sessions: dict[int, dict[Config, tuple[TrialResult, FinalistTiming]]] = {}
        for trial in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            result = result_from_attrs(trial.user_attrs)
            facts = finalist_facts(result.extra) if result is not None else None
            if facts is None:
                continue
            timing = FinalistTiming.from_extra(result.config, result.p20_ms, result.p80_ms, facts)
            sessions.setdefault(int(facts["session"]), {})[result.config] = (result, timing)
        if not sessions:
            return None
        session = max(sessions)
        latest = sessions[session]
        return _Retiming(
            RetimeStatus.REUSED, tuple(ranked([timing for _, timing in latest.values()])),
            {config: result for config, (result, _) in latest.items()}, session,
        )

    # --- the study ------------------------------------------------------------------------------

    def _open_study(self) -> optuna.Study:
        storage = open_optuna_storage(self.storage_url, heartbeat_interval_s=self.heartbeat_interval_s)
        study = optuna.create_study(
            study_name=self.facts.name,
            storage=storage,
            sampler=make_sampler(self.sampler, self.seed),
            direction="minimize",
            load_if_exists=True,
        )
        stored = StudyFacts.from_user_attr(study.user_attrs.get(STUDY_ATTR))
        if stored is None:
            study.set_user_attr(STUDY_ATTR, self.facts.as_user_attr())
        return study

    def _fail_abandoned_trials(self) -> None:
        """A trial left RUNNING by a process that no longer exists will never finish: mark it
        failed, so that its config can be measured again."""
        for trial in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            if _owner_is_gone(trial.user_attrs.get("owner")):
                log.warning("trial %d of %s was abandoned by a killed process; marking it failed",
                            trial.number, self.facts.name)
                self._tell_failed(trial.number)

    # --- reports ----------------------------------------------------------------------------------

    def _default_result(self) -> TrialResult | None:
        finished = self.ledger.finished.get(self.default_config)
        return finished.result if finished else None

    def _progress(self, number: int, result: TrialResult, chosen_by: str) -> SearchProgress:
        return SearchProgress(
            study_name=self.facts.name, trial_number=number, result=result, chosen_by=chosen_by,
            measured_total=self.ledger.measured_total, measured_now=self.measured_now,
            budget=self.trials, best=self.ledger.best, default=self._default_result(),
            failures=self.ledger.failures, elapsed_s=time.monotonic() - self.started,
        )

    def _outcome(self, reason: StopReason, retiming: _Retiming | None = None) -> SearchOutcome:
        retiming = retiming or _Retiming(RetimeStatus.DISABLED)
        searched = [f.result.config for f in self.ledger.ranked_ok()]
        finalists = [t.config for t in retiming.timings]
        ranking = tuple(finalists + [c for c in searched if c not in finalists])
        best = retiming.results[finalists[0]] if finalists else self.ledger.best
        default = retiming.results.get(self.default_config) or self._default_result()
        return SearchOutcome(
            study_name=self.facts.name, best=best, default=default,
            measured_now=self.measured_now, measured_total=self.ledger.measured_total,
            failures=self.ledger.failures, wall_s=time.monotonic() - self.started, stop_reason=reason,
            finalists=retiming.timings, retime_status=retiming.status, retime_detail=retiming.detail,
            ranking=ranking,
        )


def _owner_is_gone(owner: Any) -> bool:
    """Whether the process that owns a RUNNING trial is dead. Only processes on this host can be
    checked; a trial of another host is presumed alive (several hosts may share one storage)."""
    if not isinstance(owner, str) or ":" not in owner:
        return True
    host, _, pid_text = owner.rpartition(":")
    if host != socket.gethostname():
        return False
    try:
        pid = int(pid_text)
    except ValueError:
        return True
    if pid == os.getpid():
        return True  # this process starts a search: nothing of its own can be in flight
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False

"""Sharing one Optuna study between the threads of a search (one per GPU) and between processes
(searches and workers on one or several hosts): what the study holds, claims on configs,
heartbeats, and trials abandoned by processes that died.

The rules, all read from the storage (never from what a process says of itself):
- a config is measured once per study: a trial claims its config (user attrs `owner` and
  `config_json`) before measuring it, and steps back when another running or finished trial
  holds the config, or when the measured configs and the earlier running trials already make up
  the budget (each claim is written before it looks, so of two simultaneous claims at least one
  sees the other);
- a RUNNING trial whose owner is a dead process of this host, or that has had no owner for
  OWNERLESS_GRACE_S (its process died between asking and claiming), is failed, so that its
  config can be measured again. A trial without an owner that is younger than that was most
  likely just asked by a live process: it is left alone, and a search waits for its claim
  before taking the budget's last places;
- a trial failed under a live process (by a process that judged it abandoned, or found its
  heartbeat stale) costs that process nothing but the trial: it asks again.
"""

from __future__ import annotations

import datetime
import logging
import math
import os
import socket
import time
import warnings
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from omnitune.spec import Config
from omnitune.store import STUDY_ATTR, StudyFacts, config_from_attrs, config_json, open_optuna_storage, result_from_attrs
from omnitune.trial import TrialResult, TrialStatus

log = logging.getLogger(__name__)

# A failed config is told to the sampler as this many times the slowest correct config so far:
# clearly worse than anything that works, yet on the same scale, so that CMA-ES's steps stay sane.
PENALTY_FACTOR = 10.0
# Before any config has worked there is no scale: a thousand seconds is slower than any kernel.
PENALTY_BEFORE_ANY_OK_MS = 1e6
# How long a RUNNING trial may go without an owner before it counts as abandoned: a live process
# claims the trial it asked within milliseconds (seconds when the sampler's model is large or the
# storage busy). Judged by the trial's start in the storage and by how long this process has seen
# it ownerless, whichever is longer, so that a host whose clock runs ahead cannot keep it alive.
OWNERLESS_GRACE_S = 10.0
# Asks in a row whose trial another process failed before the ask returned, before giving up.
ASK_ATTEMPTS = 5


@dataclass(frozen=True)
class Finished:
    number: int
    result: TrialResult
    value: float  # what the sampler was told


class Ledger:
    """What the study holds, read incrementally from Optuna's storage: the finished result of
    every measured config, the configs other processes are measuring right now, the configs this
    process's slots are measuring, and the trials other processes asked but have not claimed."""

    def __init__(self) -> None:
        self.finished: dict[Config, Finished] = {}
        self.claimed: set[Config] = set()
        self.in_flight: dict[int, tuple[int, Config]] = {}  # slot -> (trial number, config) measured here
        self.queued: dict[int, Config] = {}  # trial number -> config, claimed here and waiting to be measured
        self.running: list[FrozenTrial] = []  # every RUNNING trial of the last refresh
        self.unclaimed_since: dict[int, float] = {}  # trial number -> when first seen naming no config (monotonic)
        self._read: set[int] = set()

    def refresh(self, study: optuna.Study) -> None:
        self.claimed = set()
        self.running = []
        unclaimed = set()
        for trial in study.get_trials(deepcopy=False):
            if trial.number in self._read:
                continue
            if trial.state is TrialState.RUNNING:
                self.running.append(trial)
                config = config_from_attrs(trial.user_attrs)
                if config is not None:
                    self.claimed.add(config)
                else:
                    unclaimed.add(trial.number)
                    self.unclaimed_since.setdefault(trial.number, time.monotonic())
                continue
            if not trial.state.is_finished():
                continue  # WAITING: an enqueued config the next ask pops
            self._read.add(trial.number)
            result = result_from_attrs(trial.user_attrs) if trial.state is TrialState.COMPLETE else None
            if result is not None and result.config not in self.finished:
                self.add(trial.number, result, float(trial.value))
        self.unclaimed_since = {n: t for n, t in self.unclaimed_since.items() if n in unclaimed}

    def add(self, number: int, result: TrialResult, value: float) -> None:
        self._read.add(number)
        self.finished[result.config] = Finished(number, result, value)

    @property
    def busy(self) -> set[Config]:
        """Configs measured, or being measured here or by another process."""
        return self.finished.keys() | self.claimed | self.measuring_here

    @property
    def measuring_here(self) -> set[Config]:
        """Configs this process's slots are measuring, or have claimed and queued to measure next."""
        return {c for _, c in self.in_flight.values()} | set(self.queued.values())

    @property
    def in_flight_total(self) -> int:
        """Configs being measured, here or elsewhere, that are not measured yet: they count
        against the budget, which is the study's, whoever measures it."""
        return len((self.claimed | self.measuring_here) - self.finished.keys())

    @property
    def measured_total(self) -> int:
        return sum(1 for f in self.finished.values() if f.result.status is not TrialStatus.PRUNED)

    @property
    def best(self) -> TrialResult | None:
        ok = self.ranked_ok()
        return ok[0].result if ok else None

    def ranked_ok(self) -> list[Finished]:
        """The ok configs, fastest search time first (ties: the earlier trial)."""
        ok = [f for f in self.finished.values() if f.result.status is TrialStatus.OK]
        return sorted(ok, key=lambda f: (f.result.time_ms, f.number))

    @property
    def failures(self) -> dict[TrialStatus, int]:
        return dict(Counter(f.result.status for f in self.finished.values() if f.result.status.failed))

    def penalty_ms(self) -> float:
        ok_times = [f.result.time_ms for f in self.finished.values() if f.result.status is TrialStatus.OK]
        return PENALTY_FACTOR * max(ok_times) if ok_times else PENALTY_BEFORE_ANY_OK_MS


def open_study(storage: str | optuna.storages.BaseStorage, facts: StudyFacts,
               sampler: optuna.samplers.BaseSampler, heartbeat_interval_s: int | None = None) -> optuna.Study:
    """The study of `facts` in `storage` (a URL, or a storage object such as an in-memory one),
    created if it does not exist, with what it searches recorded on it."""
    if isinstance(storage, str):
        storage = open_optuna_storage(storage, heartbeat_interval_s=heartbeat_interval_s)
    study = optuna.create_study(study_name=facts.name, storage=storage, sampler=sampler, direction="minimize",
                                load_if_exists=True)
    if StudyFacts.from_user_attr(study.user_attrs.get(STUDY_ATTR)) is None:
        study.set_user_attr(STUDY_ATTR, facts.as_user_attr())
    return study


class SharedStudy:
    """One process's side of a shared study: asking, claiming, telling and cleaning up after
    dead processes, each tolerant of the other processes doing the same at the same time."""

    def __init__(self, study: optuna.Study, *, heartbeats: bool = False, slots: int = 1):
        self.study = study
        self.name = study.study_name
        self.heartbeats = heartbeats
        self.slots = slots
        self.owner = f"{socket.gethostname()}:{os.getpid()}"

    # --- asking and claiming ----------------------------------------------------------------

    def ask(self, distributions: Mapping[str, Any], enqueue: Mapping[str, int] | None = None) -> optuna.Trial:
        """A new trial: with `enqueue`'s params (unless the storage holds an older enqueued trial
        that this ask pops), else of the study's sampler's choosing. A trial that another process
        fails while it is being asked is let go, and another asked."""
        for attempt in range(ASK_ATTEMPTS):
            if enqueue is not None:
                self.study.enqueue_trial(dict(enqueue))
            try:
                with warnings.catch_warnings():
                    # Optuna warns that heartbeats are meant for Study.optimize; the driver beats itself.
                    warnings.filterwarnings("ignore", "Heartbeat of storage")
                    return self.study.ask(dict(distributions))
            except optuna.exceptions.UpdateFinishedTrialError:
                if attempt + 1 == ASK_ATTEMPTS:
                    raise
                log.info("a trial of %s was failed by another process while it was asked; asking again", self.name)
        raise AssertionError("unreachable")

    def claim(self, trial: optuna.Trial, config: Config, ledger: Ledger, *, budget: int, slot: int = 0) -> bool:
        """Make the asked trial this process's claim on `config`, or tell it at once (and return
        False) when the config is measured or being measured elsewhere, or when another process
        failed the trial meanwhile. Called with the ledger just refreshed."""
        told = False
        try:
            previous = ledger.finished.get(config)
            if previous is not None:
                # Never measure a config twice: the sampler hears the stored value again.
                trial.set_user_attr("duplicate_of", previous.number)
                self.study.tell(trial, previous.value, skip_if_finished=True)
                told = True
                return False
            if config in ledger.claimed or config in ledger.measuring_here:
                self.study.tell(trial, state=TrialState.FAIL, skip_if_finished=True)  # measured elsewhere now
                told = True
                return False
            if self.heartbeats:
                # A first beat now: a worker that dies before measuring leaves a trial that goes stale.
                self.study._storage.record_heartbeat(trial._trial_id)
            # Recorded now so that a trial abandoned by a killed process still names its config,
            # and so that other processes see the claim.
            trial.set_user_attr("owner", self.owner)
            trial.set_user_attr("config_json", config_json(config))
            if self.slots > 1:
                trial.set_user_attr("slot", slot)
            conflict = self.conflict(trial.number, config, budget)
            if conflict is not None:
                # Another process asked the same config, or took the budget's last place, since
                # the ledger was read: step back (both may).
                trial.set_user_attr("stepped_back", conflict)
                self.study.tell(trial, state=TrialState.FAIL, skip_if_finished=True)
                told = True
                return False
            return True
        except optuna.exceptions.UpdateFinishedTrialError:
            # Another process took the trial, still without an owner, for one that a killed
            # process abandoned, and failed it: let it go and ask again.
            log.info("trial %d of %s was failed by another process before it was claimed", trial.number, self.name)
            return False
        except BaseException:
            if not told:
                self.tell_failed(trial.number)
            raise

    def conflict(self, number: int, config: Config, budget: int) -> str | None:
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
        if len(measured) + earlier_running >= budget:
            return f"budget of {budget} taken by measured and running trials"
        return None

    # --- telling ------------------------------------------------------------------------------

    def tell_measured(self, trial: optuna.Trial, value: float, attrs: Mapping[str, Any]) -> bool:
        """Store a measured trial: its attrs (config_json is set already), then its value.
        False when another process failed the trial meanwhile (it found this process's heartbeat
        stale): the result is dropped, and its config is being retried there."""
        try:
            for key, attr in attrs.items():
                if key != "config_json":
                    trial.set_user_attr(key, attr)
            told = self.study.tell(trial, value, skip_if_finished=True)
        except optuna.exceptions.UpdateFinishedTrialError:
            told = None
        if told is None or told.state is not TrialState.COMPLETE:
            log.warning("trial %d of %s was failed by another worker while it was measured (a stale heartbeat); "
                        "its result is dropped", trial.number, self.name)
            return False
        return True

    def tell_failed(self, number: int, value: float | None = None) -> None:
        """Mark trial `number` failed; or, given the value its stored measurement says, complete it."""
        try:
            if value is None:
                self.study.tell(number, state=TrialState.FAIL, skip_if_finished=True)
            else:
                self.study.tell(number, value, skip_if_finished=True)
        except Exception:  # noqa: BLE001 — never mask the exception that got us here
            log.warning("could not mark trial %d of %s %s", number, self.name,
                        "failed" if value is None else "complete", exc_info=True)

    # --- liveness -----------------------------------------------------------------------------

    @contextmanager
    def heartbeat(self, trial: optuna.Trial) -> Iterator[None]:
        """While measuring: the trial's heartbeat in the storage, when the storage keeps them."""
        if not self.heartbeats:
            yield
            return
        from optuna.storages._heartbeat import get_heartbeat_thread

        with get_heartbeat_thread(trial._trial_id, self.study._storage):
            yield

    def fail_stale(self) -> None:
        """Fail the trials of workers whose heartbeat stopped; the storage's callback enqueues
        their configs again."""
        if self.heartbeats:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                optuna.storages.fail_stale_trials(self.study)

    def fail_abandoned(self, ledger: Ledger, *, starting: bool = False) -> int:
        """Fail the RUNNING trials of the last refresh that will never finish: owned by a dead
        process of this host, or without an owner for OWNERLESS_GRACE_S. `starting`: this
        process has nothing in flight yet, so a trial naming it is abandoned too (a reused pid).
        One whose measurement was stored whole before its process stopped (its attrs written,
        the tell not: a kill between them, or a journal cut after them) is completed with it
        instead: failed, its config would be measured again, and a results database that already
        holds its row would count one trial more than the search's budget.
        Returns how many were failed or completed."""
        ended = 0
        for trial in abandoned(ledger.running, ledger.unclaimed_since, self_is_gone=starting):
            value = _stored_value(trial.user_attrs, ledger)
            if value is None:
                log.warning("trial %d of %s was abandoned by a process that is gone; marking it failed",
                            trial.number, self.name)
            else:
                log.warning("trial %d of %s was measured by a process that stopped before telling it; "
                            "completing it with its stored measurement", trial.number, self.name)
            self.tell_failed(trial.number, value)
            ended += 1
        return ended


def _stored_value(attrs: Mapping[str, Any], ledger: Ledger) -> float | None:
    """The value tell_measured would have told for a trial whose attrs hold its whole measurement
    (`measurement`, the last written), None for one that stopped before: its time if it ran ok,
    else the penalty every failed config is told with."""
    if "measurement" not in attrs or "status" not in attrs:
        return None
    time_ms = attrs.get("time_ms")
    if attrs["status"] == TrialStatus.OK.value and isinstance(time_ms, (int, float)) and math.isfinite(time_ms):
        return float(time_ms)
    return ledger.penalty_ms()


def abandoned(running: Iterable[FrozenTrial], unclaimed_since: Mapping[int, float], *, self_is_gone: bool,
              now: datetime.datetime | None = None, monotonic_now: float | None = None) -> list[FrozenTrial]:
    """The RUNNING trials that no live process will finish (see SharedStudy.fail_abandoned)."""
    now = now or datetime.datetime.now()  # Optuna stores datetime_start as this host's naive local time
    monotonic_now = time.monotonic() if monotonic_now is None else monotonic_now
    found = []
    for trial in running:
        owner = trial.user_attrs.get("owner")
        if owner is not None:
            if owner_is_gone(owner, self_is_gone=self_is_gone):
                found.append(trial)
            continue
        started = trial.datetime_start
        age_s = (now - started).total_seconds() if started is not None else 0.0
        seen_s = monotonic_now - unclaimed_since.get(trial.number, monotonic_now)
        if max(age_s, seen_s) > OWNERLESS_GRACE_S:
            found.append(trial)
    return found


def owner_is_gone(owner: Any, *, self_is_gone: bool = False) -> bool:
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
        return self_is_gone
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False

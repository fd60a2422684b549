"""Preparing the next problem of a many-problem search while this one is on the GPU (`--precompile`).

A search of many problems (`omnitune search --model`, a repeated --shape) started each problem
cold: its first trial compiled the default config in the measuring process, and its second waited
for the precompile workers to switch problems and compile their first batch. Yet the configs a
search measures first are known before any result: the kernel's default, its known-good configs
and the warm start (omnitune.search.strategies.planned). So once problem N has claimed its last
trial (the driver's `on_trials_claimed`: N's last trials and its finalists' re-timing are still to
run), ProblemsAhead opens the next problem's pool on the shared worker processes
(omnitune.measure.ahead) and submits those configs behind N's; the next search takes that pool
over (`take`) and its first trials find their binaries in Triton's disk cache.

Only host work happens here, in the thread that calls it, between two measurements; the GPU of the
measuring process is left alone (the next problem's inputs and reference are still built when its
search starts). A problem the catalogue shows finished (a resumed search) is passed over, so that
nothing is compiled for it; configs it has measured are not compiled again. An optimisation only:
whatever goes wrong while preparing is logged, and the next problem starts cold, as before.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from omnitune.search.strategies import (
    first_proposals,
    tried_configs,
    warm_start_configs,
)
from omnitune.spec import Config, DeviceLimits, KernelSpec, dtype_name

if TYPE_CHECKING:
    from omnitune.measure.ahead import PrecompilePool

log = logging.getLogger(__name__)

# A problem of the session, as (spec, problem, dtype).
ProblemOf = tuple[KernelSpec, Any, torch.dtype]
# How a pool is opened: PrecompilePool's signature (tests give a fake).
PoolFactory = Callable[[KernelSpec, Any, torch.dtype], "PrecompilePool"]


@dataclass
class Prepared:
    """A problem's pool opened ahead of its search, the configs submitted to it, and the warm
    start looked up for them (its search is given the same, so that what was compiled is what it
    measures first)."""

    key: tuple[str, str, str]
    pool: PrecompilePool
    configs: list[Config]
    warm_start: tuple[Config, ...]


def first_configs(spec: KernelSpec, problem: Any, dtype: torch.dtype, limits: DeviceLimits,
                  warm_start: Sequence[Config], tries: Sequence[Mapping[str, Any]] = ()) -> list[Config]:
    """The configs a search of `problem` measures first, before any result, in the order the
    planned strategy proposes them (first_proposals), without those a constraint rejects (pruned,
    never compiled)."""
    ordered = first_proposals(spec.default_config(problem, dtype), tried_configs(spec, problem, dtype, tries),
                              spec.known_good_configs(problem, dtype, limits), warm_start)
    return [c for c, _ in ordered if not spec.violations(problem, c, dtype, limits)]


class ProblemsAhead:
    """The problems of one session in the order they are searched; prepares the one after the
    problem being measured, and hands its pool to that problem's search. One problem is prepared
    at a time."""

    def __init__(self, order: Sequence[ProblemOf], *, workers: int, trials: int,
                 make_pool: PoolFactory | None = None, claim: Callable[[tuple[str, str, str]], bool] | None = None,
                 tries: Sequence[Mapping[str, Any]] = ()):
        """tries: the session's search --try configs, compiled ahead with the default.
        claim: make a problem this process's before preparing it (a lane's claim,
        omnitune.search.lanes); False when another process of the session claimed it first, and
        it is passed over, as a finished one is. Claiming before compiling matters: each lane
        looks ahead at the same next problem, and three lanes compiling its configs at once had
        compiled them three times, for one search."""
        self.order = list(order)
        self.claim = claim
        self.keys = [_key(spec, problem, dtype) for spec, problem, dtype in self.order]
        self.workers, self.trials, self.tries = workers, trials, tuple(tries)
        self.make_pool = make_pool or self._precompile_pool
        self.prepared: Prepared | None = None
        self.cursor = 0  # where the last problem taken stands in `order` (a shape may come twice)

    def _precompile_pool(self, spec: KernelSpec, problem: Any, dtype: torch.dtype) -> PrecompilePool:
        from omnitune.measure.ahead import PrecompilePool

        return PrecompilePool(spec, problem, dtype, workers=self.workers)

    def take(self, spec: KernelSpec, problem: Any, dtype: torch.dtype) -> tuple[PrecompilePool, tuple[Config, ...] | None]:
        """The pool for the search of `problem` about to start, and the warm start to give it:
        the prepared ones when it was prepared (configs a lost worker never compiled submitted
        again), else a fresh pool and None (the search looks the warm start up itself)."""
        key = _key(spec, problem, dtype)
        if key in self.keys[self.cursor:]:
            self.cursor = self.keys.index(key, self.cursor)
        prepared, self.prepared = self.prepared, None
        if prepared is not None and prepared.key == key:
            revive = getattr(prepared.pool, "revive", None)
            if revive is not None:
                revive()
            return prepared.pool, prepared.warm_start
        if prepared is not None:  # prepared for a problem the session did not reach next
            prepared.pool.close()
        return self.make_pool(spec, problem, dtype), None

    def prepare_after(self, spec: KernelSpec, problem: Any, dtype: torch.dtype, *, limits: DeviceLimits,
                      device_key: str, deadline: float | None = None, catalogue: str | Path | None = None) -> None:
        """Prepare the first problem after `problem` that is not finished: open its pool and
        submit its first configs. Nothing when `problem` is the last, when the deadline (a
        time.monotonic() value) has passed (the next problem would not be started), or when it is
        prepared already. Never raises: preparing is an optimisation."""
        try:
            self._prepare_after(_key(spec, problem, dtype), limits, device_key, deadline, catalogue)
        except Exception as exc:  # noqa: BLE001 — the next problem then starts cold, as it used to
            log.warning("the next problem could not be prepared ahead (%s: %s); it starts cold",
                        type(exc).__name__, exc)

    def _prepare_after(self, key: tuple[str, str, str], limits: DeviceLimits, device_key: str,
                       deadline: float | None, catalogue: str | Path | None) -> None:
        if deadline is not None and time.monotonic() >= deadline:
            return
        here = self.keys.index(key, self.cursor) if key in self.keys[self.cursor:] else None
        if here is None:
            return
        for place in range(here + 1, len(self.order)):
            spec, problem, dtype = self.order[place]
            if self.keys[place] == key:
                continue  # the same problem again: nothing new to compile
            measured = _measured_configs(catalogue, spec, problem, dtype, device_key)
            if sum(1 for status in measured.values() if status != "pruned") >= self.trials:
                continue  # finished by an earlier run: its search measures nothing
            if self.prepared is not None and self.prepared.key == self.keys[place]:
                return
            if self.claim is not None and not self.claim(self.keys[place]):
                continue  # another lane searches it
            self._prepare(place, limits, device_key, measured)
            return

    def _prepare(self, place: int, limits: DeviceLimits, device_key: str, measured: dict[str, str]) -> None:
        from omnitune.store import config_json

        spec, problem, dtype = self.order[place]
        warm = tuple(warm_start_configs(spec, problem, dtype, device_key, limits))
        left = self.trials - sum(1 for status in measured.values() if status != "pruned")
        configs = [c for c in first_configs(spec, problem, dtype, limits, warm, self.tries)
                   if config_json(c) not in measured][:max(0, left)]
        if self.prepared is not None:  # one prepared problem at a time: the newer one is nearer
            self.prepared.pool.close()
            self.prepared = None
        pool = self.make_pool(spec, problem, dtype)
        try:
            if configs:
                pool.submit(configs)
        except BaseException:
            pool.close()  # a pool that failed here is not handed on: the next problem opens its own
            raise
        self.prepared = Prepared(self.keys[place], pool, configs, warm)

    def close(self) -> None:
        """Close a pool prepared for a problem the session never started (interrupted, or past
        its timeout): its unstarted configs are cancelled."""
        prepared, self.prepared = self.prepared, None
        if prepared is not None:
            prepared.pool.close()

    def __enter__(self) -> ProblemsAhead:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _key(spec: KernelSpec, problem: Any, dtype: torch.dtype) -> tuple[str, str, str]:
    return spec.name, spec.problem_key(problem), dtype_name(dtype)


def _measured_configs(catalogue: str | Path | None, spec: KernelSpec, problem: Any, dtype: torch.dtype,
                      device_key: str) -> dict[str, str]:
    """What the catalogue holds of the problem's study (config_json → status); none without one."""
    if catalogue is None:
        return {}
    from omnitune.store import read_study_configs, study_name

    return read_study_configs(catalogue, study_name(spec.name, spec.problem_key(problem), dtype_name(dtype),
                                                    device_key))

"""A precompile pool that takes configs as the search proposes them (`--precompile`).

omnitune.measure.precompile compiles a list known before the search starts; a sampler (TPE)
proposes one config at a time, so that list is only the planned configs. This pool stays open for
one problem's search instead: the driver hands it the next K proposals (K = its workers) while the
GPU measures the current one, and before measuring a config asks `ready` to wait for the worker
already compiling it — never slower than compiling it again here, since the worker began first.

As with precompile(), nothing a worker does is an error of the search: a config that did not
compile is measured, and fails, in the measuring process.

The worker processes outlive one problem: a search of many problems (`--shape` repeated, `--model`)
hands each problem's pool the same processes, so each problem no longer pays for starting 14 fresh
interpreters that import torch and Triton and open a CUDA context; a worker switches problems on
its first config of the next one (omnitune.measure.precompile._launch_for). They are started again
only when one died (a broken pool) or when a problem ended with a worker still busy (hung, as far
as the next problem can tell). close_shared_workers() ends them; `omnitune search` calls it when
it is done with every kernel and problem it was given.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Sequence
from typing import Any, Protocol

import torch

from omnitune.measure.precompile import (PrecompileReport, _launch_for, compile_processes, end_workers, launched,
                                         problem_identity)
from omnitune.measure.worker_server import default_workers
from omnitune.spec import Config, KernelSpec


class CompilesAhead(Protocol):
    """What the search driver needs of a pool (tests give it a fake)."""

    workers: int

    def submit(self, configs: Sequence[Config]) -> None:
        """Start compiling `configs` (not waited for)."""

    def ready(self, config: Config) -> None:
        """Return once `config` is compiled, if a worker has started it; else at once."""

    # Optional: compiled(config) -> bool, whether a worker has finished compiling `config`
    # (the queue then measures compiled configs first).
    # Optional: settle() -> None, once nothing more will be submitted: withdraw the configs no
    # worker has started and wait for those being compiled (the driver calls it before re-timing
    # the finalists of an op whose timings include host work: KernelSpec.syncs_host).


class _SharedWorkers:
    """The one process pool the problems of this process's searches share."""

    def __init__(self):
        self.executor: concurrent.futures.ProcessPoolExecutor | None = None
        self.workers = 0

    def get(self, workers: int) -> concurrent.futures.ProcessPoolExecutor:
        if self.executor is None or self.workers != workers or getattr(self.executor, "_broken", False):
            self.discard()
            self.executor = compile_processes(workers)
            self.workers = workers
        return self.executor

    def discard(self) -> None:
        """End the processes without waiting (precompile.end_workers)."""
        if self.executor is not None:
            end_workers(self.executor)
        self.executor, self.workers = None, 0


_SHARED = _SharedWorkers()


def close_shared_workers() -> None:
    """End the precompile worker processes (a search's pools share them across problems)."""
    _SHARED.discard()


class PrecompilePool:
    """Worker processes compiling configs of one spec × problem × dtype as they are submitted
    (the processes themselves are shared with the other problems' pools: see the module's doc)."""

    def __init__(self, spec: KernelSpec, problem: Any, dtype: torch.dtype, *, workers: int | None = None,
                 device: str = "cuda", wait_s: float = 120.0):
        self.workers = max(1, workers or default_workers())
        self.wait_s = wait_s
        self.started = time.perf_counter()
        self.waited_s = 0.0  # in ready(), for configs a worker was still compiling
        self.futures: dict[Config, concurrent.futures.Future] = {}
        self.identity = problem_identity(spec, problem, dtype, device)
        self.pool = _SHARED.get(self.workers)

    def submit(self, configs: Sequence[Config]) -> None:
        for config in configs:
            if config not in self.futures:
                try:
                    future = self.pool.submit(_launch_for, self.identity, config.as_dict())
                except (concurrent.futures.BrokenExecutor, RuntimeError):
                    # A worker died (a config crashed it), or another problem's pool ended the
                    # processes: start them again.
                    self.pool = _SHARED.get(self.workers)
                    future = self.pool.submit(_launch_for, self.identity, config.as_dict())
                self.futures[config] = future

    def revive(self) -> None:
        """Submit again the configs whose worker went before compiling them: a pool prepared
        ahead of its problem (omnitune.search.prepare_next) shares the processes with the problem
        before it, whose end may have killed them (a hung worker) or a crash broken them."""
        replaced = self.pool is not _SHARED.executor or getattr(self.pool, "_broken", False)
        lost = [config for config, future in self.futures.items()
                if future.cancelled() or (future.done() and future.exception(timeout=0) is not None)
                or (replaced and not future.done())]
        for config in lost:
            del self.futures[config]
        if replaced:
            self.pool = _SHARED.get(self.workers)
        self.submit(lost)

    def compiled(self, config: Config) -> bool:
        """Whether a worker has finished with `config` (compiled, or failed to: either way
        measuring it waits for nothing)."""
        future = self.futures.get(config)
        return future is not None and future.done() and not future.cancelled()

    def ready(self, config: Config) -> None:
        future = self.futures.get(config)
        if future is None or future.cancel():
            return  # not started by any worker: the measuring process compiles it now
        if future.done():
            return
        waiting = time.perf_counter()
        try:
            future.result(timeout=self.wait_s)
        except Exception:  # noqa: BLE001 — a hung or lost worker: measure (and fail) here instead
            pass
        self.waited_s += time.perf_counter() - waiting

    def finish(self) -> None:
        """Return once the workers are done with every config submitted (compiled, failed, or
        given up on after wait_s each), none withdrawn: for a timing that wants a quiet host."""
        self.waited_s += self._wait_for_workers()

    def settle(self) -> None:
        """Return once no worker is compiling for this pool, when nothing more will be submitted
        (the search's loop has ended): the configs no worker has started are withdrawn, no
        longer wanted, and those a worker is compiling are waited for (wait_s each), for a timing
        that wants a quiet host. Not counted in waited_s, which is measuring's wait."""
        for future in self.futures.values():
            future.cancel()  # refused for a config a worker has: waited for below
        self._wait_for_workers()

    def _wait_for_workers(self) -> float:
        """Wait for every config submitted that is neither done nor withdrawn, wait_s at most
        each; the seconds waited."""
        waited = 0.0
        for future in self.futures.values():
            if future.done():
                continue
            waiting = time.perf_counter()
            try:
                future.result(timeout=self.wait_s)
            except Exception:  # noqa: BLE001 — a hung or lost worker: whoever launches it fails there
                pass
            waited += time.perf_counter() - waiting
        return waited

    def report(self) -> PrecompileReport:
        done = {c: launched(f) for c, f in self.futures.items() if f.done() and not f.cancelled()}
        failed = {c: outcome.error for c, outcome in done.items() if outcome.error}
        return PrecompileReport(len(done) - len(failed), failed, time.perf_counter() - self.started, self.workers,
                                self.waited_s, cpu_s=sum(outcome.cpu_s for outcome in done.values()))

    def close(self) -> None:
        """Cancel this problem's configs no worker has started; a worker still compiling one of
        them (hung, or slow past the search's end) would hold the next problem, so then the
        processes are ended and the next problem starts fresh ones."""
        for future in self.futures.values():
            future.cancel()
        if any(not future.done() for future in self.futures.values()):
            _SHARED.discard()

    def __enter__(self) -> PrecompilePool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

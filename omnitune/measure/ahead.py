"""A precompile pool that takes configs as the search proposes them (`--precompile`).

omnitune.measure.precompile compiles a list known before the search starts; a sampler (TPE)
proposes one config at a time, so that list is only the planned configs. This pool stays open for
one problem's search instead: the driver hands it the next K proposals (K = its workers) while the
GPU measures the current one, and before measuring a config asks `ready` to wait for the worker
already compiling it — never slower than compiling it again here, since the worker began first.

As with precompile(), nothing a worker does is an error of the search: a config that did not
compile is measured, and fails, in the measuring process.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import time
from collections.abc import Sequence
from typing import Any, Protocol

import torch

from omnitune.measure.precompile import PrecompileReport, _importable_name, _launch_once, _set_problem, default_workers
from omnitune.spec import Config, KernelSpec


class CompilesAhead(Protocol):
    """What the search driver needs of a pool (tests give it a fake)."""

    workers: int

    def submit(self, configs: Sequence[Config]) -> None:
        """Start compiling `configs` (not waited for)."""

    def ready(self, config: Config) -> None:
        """Return once `config` is compiled, if a worker has started it; else at once."""


class PrecompilePool:
    """Worker processes for one spec × problem × dtype, compiling configs as they are submitted."""

    def __init__(self, spec: KernelSpec, problem: Any, dtype: torch.dtype, *, workers: int | None = None,
                 device: str = "cuda", wait_s: float = 120.0):
        self.workers = max(1, workers or default_workers())
        self.wait_s = wait_s
        self.started = time.perf_counter()
        self.futures: dict[Config, concurrent.futures.Future] = {}
        self.pool = concurrent.futures.ProcessPoolExecutor(
            max_workers=self.workers, mp_context=multiprocessing.get_context("spawn"), initializer=_set_problem,
            initargs=(_importable_name(spec), spec.problem_key(problem), dtype, device),
        )

    def submit(self, configs: Sequence[Config]) -> None:
        for config in configs:
            if config not in self.futures:
                self.futures[config] = self.pool.submit(_launch_once, config.as_dict())

    def ready(self, config: Config) -> None:
        future = self.futures.get(config)
        if future is None or future.cancel():
            return  # not started by any worker: the measuring process compiles it now
        try:
            future.result(timeout=self.wait_s)
        except Exception:  # noqa: BLE001 — a hung or lost worker: measure (and fail) here instead
            pass

    def report(self) -> PrecompileReport:
        done = [f for f in self.futures.values() if f.done() and not f.cancelled()]
        failed = {c: f.result() for c, f in self.futures.items()
                  if f in done and f.exception() is None and f.result()}
        failed |= {c: "worker lost" for c, f in self.futures.items() if f in done and f.exception() is not None}
        return PrecompileReport(len(done) - len(failed), failed, time.perf_counter() - self.started, self.workers)

    def close(self) -> None:
        # A hung worker must not hold the search: cancel what has not started, do not wait.
        processes = list((getattr(self.pool, "_processes", None) or {}).values())
        self.pool.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            if process.is_alive():
                process.kill()

    def __enter__(self) -> PrecompilePool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

"""Compile many candidate configs in parallel before they are measured one at a time.

A search spends most of its time compiling: about 1.2 s per trial on the H200 when one process
compiled and measured, of which the timing itself is a small part, while every CPU core but one sat
idle (0.22 s per trial with the workers here, round 9). Triton keeps each compiled
kernel in its on-disk cache (TRITON_CACHE_DIR, ~/.triton/cache by default), keyed by source,
constexprs, specialization and options — not by process. So worker processes that launch each
config once on the same problem fill the cache, and the measuring process then loads each binary
from disk (milliseconds) instead of compiling it.

Precompiling is only an optimisation: whatever goes wrong in a worker (a compile error, a crash
that takes the worker down, a hang past the deadline) is reported and otherwise ignored — the
measuring process meets the same config later and records the failure as a trial status there.
Workers are forked from a fork server that has imported torch, Triton and the kernels once (CUDA
cannot be forked from the measuring process, and a fresh interpreter per worker imports them all
again: worker_start_method) and inherit the environment, so TRITON_INTERPRET and TRITON_CACHE_DIR
agree with the parent's.
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import os
import resource
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from omnitune.errors import one_line
from omnitune.measure.capture_load import CaptureLoader
from omnitune.measure.gpu_lock import gpu_lock_from_env
from omnitune.measure.worker_server import default_workers, worker_start_method
from omnitune.spec import Config, KernelSpec

log = logging.getLogger(__name__)

# How much lower than the measuring process the workers run (os.nice): compiling is throughput,
# measuring is latency — a measuring process kept waiting for a core leaves the GPU idle.
COMPILE_NICENESS = 5


class Launched(NamedTuple):
    """What a worker reports for one config: why it did not compile (None: it did), and the CPU
    time it took, its own and its child processes' (ptxas)."""

    error: str | None
    cpu_s: float


def launched(future: concurrent.futures.Future) -> Launched:
    """A finished worker future's report (a worker that died: its error)."""
    try:
        result = future.result(timeout=0)
    except Exception as exc:  # noqa: BLE001 — the worker died (e.g. an illegal address): the pool is broken
        return Launched(f"worker lost: {type(exc).__name__}", 0.0)
    return result if isinstance(result, Launched) else Launched(result, 0.0)


@dataclass(frozen=True)
class PrecompileReport:
    compiled: int
    failed: dict[Config, str]
    seconds: float
    """The pool's life: for a pool that compiles while a search measures, the problem's search."""
    workers: int
    waited_s: float | None = None
    """How long the measuring process waited for workers still compiling a config it was about to
    measure (PrecompilePool.ready): the part of `seconds` that compiling held the GPU idle. None
    where nothing measured alongside (precompile(), which compiles a list before the search)."""
    cpu_s: float = 0.0
    """The workers' CPU time for the configs they finished (Triton's compiler and ptxas): what
    compiling cost the host, whatever it overlapped."""

    def summary(self) -> str:
        text = f"precompiled {self.compiled} configs in {self.seconds:.1f} s with {self.workers} workers"
        if self.cpu_s:
            text += f" ({self.cpu_s:.1f} s of their CPU)"
        if self.waited_s is not None:
            text += f"; measuring waited {self.waited_s:.1f} s of it for compiles"
        if self.failed:
            text += f"; {len(self.failed)} did not compile or launch (they are measured, and fail, later)"
            reasons = collections.Counter(self.failed.values())
            reason, count = reasons.most_common(1)[0]
            text += f", {'all' if count == len(self.failed) else count} with {reason[:160]}"
        return text


def precompile(
    spec: KernelSpec,
    problem: Any,
    dtype: torch.dtype,
    configs: Sequence[Config],
    *,
    device: str = "cuda",
    workers: int | None = None,
    deadline_s: float = 600.0,
    on_done: Callable[[int, int], None] | None = None,
) -> PrecompileReport:
    """Launch every config once in a pool of worker processes so that Triton's disk cache holds
    its binary. `on_done(done, total)` reports progress."""
    start = time.perf_counter()
    configs = list(dict.fromkeys(configs))
    workers = max(1, min(workers or default_workers(), len(configs) or 1))
    failed: dict[Config, str] = {}
    if not configs:
        return PrecompileReport(0, failed, 0.0, 0)
    pool = compile_processes(workers)
    identity = problem_identity(spec, problem, dtype, device)
    futures = {pool.submit(_launch_for, identity, cfg.as_dict()): cfg for cfg in configs}
    done_count, cpu_s = 0, 0.0
    try:
        for future in concurrent.futures.as_completed(futures, timeout=deadline_s):
            cfg = futures[future]
            outcome = launched(future)
            cpu_s += outcome.cpu_s
            if outcome.error:
                failed[cfg] = outcome.error
            done_count += 1
            if on_done:
                on_done(done_count, len(configs))
    except concurrent.futures.TimeoutError:
        for future, cfg in futures.items():
            if not future.done():
                failed[cfg] = f"not compiled within {deadline_s:.0f} s"
    finally:
        end_workers(pool)
    return PrecompileReport(len(configs) - len(failed), failed, time.perf_counter() - start, workers, cpu_s=cpu_s)


def compile_processes(workers: int) -> concurrent.futures.ProcessPoolExecutor:
    """A pool of `workers` processes that compile at a lower priority than this process
    (COMPILE_NICENESS), started by worker_start_method()."""
    return concurrent.futures.ProcessPoolExecutor(max_workers=workers, mp_context=worker_start_method(),
                                                  initializer=_start_worker, initargs=(dict(os.environ),))


def _start_worker(environ: dict[str, str]) -> None:
    """A worker takes this process's environment as it is now, not as it was when the fork server
    started (e.g. TRITON_CACHE_DIR), and runs at a lower priority."""
    for name in set(os.environ) - set(environ):
        del os.environ[name]
    os.environ.update(environ)
    try:
        os.nice(COMPILE_NICENESS)
    except OSError:  # not permitted here: compile at the same priority, as before
        pass


def problem_identity(spec: KernelSpec, problem: Any, dtype: torch.dtype, device: str) -> tuple:
    """What a worker needs to make the problem's inputs: (kernel, problem key, dtype, device). The
    problem travels as its key: a user kernel's problem class cannot be unpickled by name."""
    return (_importable_name(spec), spec.problem_key(problem), dtype, device)


def end_workers(pool: concurrent.futures.ProcessPoolExecutor) -> None:
    """Cancel what has not started and kill the worker processes, without waiting: a hung worker
    must not hold the search."""
    processes = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        if process.is_alive():
            process.kill()


def _importable_name(spec: KernelSpec) -> str:
    """How a fresh process finds the spec: a built-in by name, anything else by its module."""
    from omnitune.registry import BUILTIN_KERNELS, USER_FILE_MODULE_PREFIX

    if spec.name in BUILTIN_KERNELS:
        return spec.name
    if spec.module.startswith(USER_FILE_MODULE_PREFIX):
        # Loaded from a .py file: a fresh process must load the same file again.
        return sys.modules[spec.module].__file__
    return spec.module


# --- in the worker process ------------------------------------------------------------------

_problem_state: dict[str, Any] = {}
_capture = CaptureLoader()  # this worker's loads; off for good once a capture could not be ended


def _alone_on_the_gpu(device: str) -> AbstractContextManager:
    """What a worker holds while it puts work on the GPU (drawing a problem's inputs, a launch that
    could not be captured): the lanes' GPU lock (omnitune.measure.gpu_lock; the worker inherits its
    lane's environment), as a lane holds it for its own GPU work, so that none of it runs beside
    another lane's timings. Nothing where there is no lock (one search alone) or no GPU."""
    return gpu_lock_from_env() if device == "cuda" else nullcontext()


def _set_problem(kernel: str, problem_key: str, dtype: torch.dtype, device: str) -> None:
    _problem_state.update(kernel=kernel, problem_key=problem_key, dtype=dtype, device=device)


def _inputs_and_spec() -> tuple[KernelSpec, Any]:
    # Inputs are made on first use, once per worker: a worker that only ever sees failing configs
    # still pays for them only once. Their values are drawn on the GPU, not from the seed on the
    # CPU (omnitune.kernels._host.draw_on_target): only shapes, strides and dtypes reach the binary.
    from omnitune.registry import get_spec

    if "inputs" not in _problem_state:
        from omnitune.kernels._host import draw_on_target

        draw_on_target()  # a launch here only compiles: the inputs' values are never checked
        spec = get_spec(_problem_state["kernel"])
        device = _problem_state["device"]
        if device == "cuda" and torch.cuda.is_available():
            torch.cuda.set_device(0)
        _problem_state["spec"] = spec
        problem = spec.parse_shape(_problem_state["problem_key"])
        with _alone_on_the_gpu(device):
            inputs = spec.make_inputs(problem, _problem_state["dtype"], device, 0)
            # The output every launch of the problem is given, made once and here: new_output fills
            # it with NaN, a kernel on the GPU, which must not run beside a lane's timing — made
            # per config outside the lock, such fills ran in every worker during the lanes' checks
            # and timings (round 34 X2: a kernel that goes wrong when another process's kernels
            # share the GPU went wrong there). A capture writes nothing into it; a launch that
            # could not be captured writes values nobody reads.
            _problem_state["out"] = spec.new_output(inputs)
            _problem_state["inputs"] = inputs
    return _problem_state["spec"], _problem_state["inputs"]


def _launch_for(identity: tuple, values: dict) -> Launched:
    """_launch_once for the problem `identity` names ((kernel, problem key, dtype, device)), with
    the CPU time it took: a worker shared across a search's problems drops the previous problem's
    inputs (and the GPU memory they hold) on the first config of the next."""
    began = _cpu_s()
    if _problem_state.get("identity") != identity:
        _problem_state.clear()
        if identity[3] == "cuda" and torch.cuda.is_available():
            torch.cuda.empty_cache()
        _set_problem(*identity)
        _problem_state["identity"] = identity
    error = _launch_once(values)
    return Launched(error, _cpu_s() - began)


def _cpu_s() -> float:
    """This process's CPU time and that of its finished children (ptxas runs as one)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _launch_once(values: dict) -> str | None:
    """None when the config compiled (and, off the GPU, ran); otherwise a one-line reason.

    On a GPU the launch is captured into a CUDA graph that is thrown away (CaptureLoader): the
    compiler runs and the binary is loaded, and nothing reaches the GPU, where another process
    may be timing its kernels. A launch that cannot be captured is launched for real instead, as
    the lanes' other GPU work is: under their GPU lock."""
    try:
        spec, inputs = _inputs_and_spec()
        out = _problem_state["out"]
        config = Config(values)
        if out.is_cuda and _capture.usable:
            try:
                _capture.load(lambda: spec.launch(inputs, out, config))
                return None
            except Exception as exc:  # noqa: BLE001 — launched for real below, which reports it
                log.debug("capturing %s: %s: %s", config, type(exc).__name__, exc)
        with _alone_on_the_gpu("cuda" if out.is_cuda else "cpu"):
            spec.launch(inputs, out, config)
            if out.is_cuda:
                torch.cuda.synchronize()
            if spec.restore_inputs is not None:
                spec.restore_inputs(inputs)
        return None
    except Exception as exc:
        return one_line(exc)

"""Part 5, soak (GPU): minutes of mixed production calls, as a server would make them.

Every op of the preset's traffic (omnitune.verify.traffic) is called in its share of the calls,
in a seeded random order: decode steps replayed from CUDA graphs captured once (as an engine runs
them), prefill calls made eagerly through the public ops. Required: no call raises, no runtime
warning (a fused layer rolling back, a table ignored) and no sampled output disagrees with the
spec's reference — the first call of every op in every window and CHECK_FRACTION of the others
are compared. A graph that cannot be captured (an op that synchronizes with the host, say) is a
failure of that op, reported, and the op is then called eagerly so that the rest of the soak
still runs.

Reported: per op its calls, errors, mismatches and the drift of its median call time from the
first window to the last (windows of a minute; of half the soak when it is shorter than two), a
time-weighted drift of the whole mix, and per window NVML's clocks, temperature, power and
throttle reasons (omnitune.profile.telemetry). Drift beyond DRIFT_WARN, or thermal throttling,
warns. Call times are CUDA events around each call, so they include any host wait inside an
eager op (what a server's stream sees).

The device is reached through a small Backend (CUDA events, graphs, synchronize), so that the
scheduling and bookkeeping run on the CPU in the tests.
"""

from __future__ import annotations

import logging
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from omnitune.errors import one_line
from omnitune.verify.numerics import lost_context
from omnitune.verify.traffic import OpCall
from omnitune.verify.verdict import Check, Status

PART = "soak"
CHUNK = 64              # calls between synchronizations: events are read and sampled checks made
CHECK_FRACTION = 0.02   # of the calls after the first of each window
WINDOW_S = 60.0
DRIFT_WARN = 0.05
MAX_ERRORS_KEPT = 5


class Backend(Protocol):
    def capture(self, call: Callable[[], torch.Tensor]) -> tuple[Callable[[], None], torch.Tensor]:
        """(replay, static output) of `call` captured once; raises when it cannot be captured."""

    def start(self) -> Any: ...

    def stop(self, token: Any) -> Any: ...

    def elapsed_ms(self, start: Any, stop: Any) -> float: ...

    def synchronize(self) -> None: ...


class CudaBackend:
    """CUDA events around each call; each graph captured on a stream of its own after two warm-up
    calls there (compilation, the tables' lookups and the ops' per-stream workspaces stay out of
    the graph). A capture that fails leaves that stream unused from then on, and the current
    stream restored: torch.cuda.graph does not restore it when ending the capture raises."""

    def capture(self, call):
        stream = torch.cuda.Stream()
        prior = torch.cuda.current_stream()
        stream.wait_stream(prior)
        with torch.cuda.stream(stream):
            for _ in range(2):
                call()
        prior.wait_stream(stream)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, stream=stream):
                out = call()
        finally:
            torch.cuda.set_stream(prior)
        return graph.replay, out

    def start(self):
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def stop(self, token):
        return self.start()

    def elapsed_ms(self, start, stop) -> float:
        return start.elapsed_time(stop)

    def synchronize(self) -> None:
        torch.cuda.synchronize()


@dataclass
class _Op:
    call: OpCall
    weight: float
    run: Callable[[], Any]
    output: Callable[[Any], torch.Tensor]
    expected: torch.Tensor | None = None
    graph: bool = False
    capture_error: str | None = None
    setup_error: str | None = None
    broke_context: bool = False
    calls: int = 0
    errors: int = 0
    mismatches: int = 0
    checks: int = 0
    worst_error: float = 0.0
    first_errors: list[str] = field(default_factory=list)
    times: dict[int, list[float]] = field(default_factory=dict)
    checked_windows: set[int] = field(default_factory=set)

    def note_error(self, text: str) -> None:
        self.errors += 1
        if len(self.first_errors) < MAX_ERRORS_KEPT:
            self.first_errors.append(text)


class _RuntimeWarnings(logging.Handler):
    """Collects the runtime's warnings (logger omnitune.runtime) while the soak runs."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def run_soak(calls: Sequence[OpCall], weights: Sequence[float], minutes: float, *, backend: Backend | None = None,
             sampler_factory: Callable[[], Any] | None = None, seed: int = 1, chunk: int = CHUNK,
             clock: Callable[[], float] = time.monotonic) -> list[Check]:
    """Soak `calls` (with their shares of the calls) for `minutes`; one check per op and a summary."""
    backend = backend or CudaBackend()
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()  # the soak's own peak, not the memory part's
    sampler_factory = sampler_factory or _nvml_sampler
    watcher = _RuntimeWarnings()
    runtime_log = logging.getLogger("omnitune.runtime")
    runtime_log.addHandler(watcher)
    try:
        ops: list[_Op] = []
        aborted = None
        for c, w in zip(calls, weights):
            if aborted is not None:
                ops.append(_Op(c, w, run=c.call, output=lambda out: out, setup_error=f"not run: {aborted}"))
                continue
            op = _prepare(c, w, backend, watcher)
            ops.append(op)
            if op.broke_context:
                aborted = f"the CUDA context broke while preparing {c.label}"
        windows, seconds = [], 0.0
        if aborted is None:
            windows, aborted, seconds = _loop(ops, minutes, backend, sampler_factory, watcher, seed, chunk, clock)
    finally:
        runtime_log.removeHandler(watcher)
    return [_op_check(op) for op in ops] + [_summary(ops, windows, aborted, minutes, seconds)]


def _prepare(call: OpCall, weight: float, backend: Backend, watcher: _RuntimeWarnings) -> _Op:
    """The reference, a first eager call, and for a decode step its graph."""
    op = _Op(call, weight, run=call.call, output=lambda out: out)
    try:
        op.expected = call.reference()
        before = len(watcher.messages)
        out = call.call()
        backend.synchronize()
        _check_output(op, out)
        _note_warnings(op, watcher, before)
    except Exception as exc:  # noqa: BLE001 — an op that cannot even start is that op's failure
        op.setup_error = one_line(exc)
        op.note_error(f"first call: {op.setup_error}")
        op.broke_context = lost_context(exc)
        return op
    if call.step:
        try:
            replay, static_out = backend.capture(call.call)
            replay()
            backend.synchronize()
            _check_output(op, static_out)
        except Exception as exc:  # noqa: BLE001 — reported, and the op runs eagerly instead
            op.capture_error = one_line(exc)
            try:
                backend.synchronize()
            except Exception as later:  # noqa: BLE001 — the failed capture broke the context
                op.setup_error = f"after the failed capture: {one_line(later)}"
                op.broke_context = True
            return op
        op.graph = True
        op.run = replay
        op.output = lambda _unused, static_out=static_out: static_out
    return op


def _loop(ops: list[_Op], minutes: float, backend: Backend, sampler_factory, watcher: _RuntimeWarnings,
          seed: int, chunk: int, clock) -> tuple[list[dict], str | None, float]:
    live = [op for op in ops if op.setup_error is None]
    if not live:
        return [], "no op could be called", 0.0
    rng = random.Random(seed)
    total_s = minutes * 60.0
    window_s = min(WINDOW_S, total_s / 2) if total_s > 0 else WINDOW_S
    start = clock()
    windows: list[dict] = []
    sampler = None
    aborted: str | None = None
    while clock() - start < total_s and aborted is None:
        index = int((clock() - start) // window_s)
        if index >= len(windows):
            if sampler is not None:
                windows[-1]["telemetry"] = sampler.stop(windows[-1]["calls"])
            windows.append({"index": index, "start_s": round(clock() - start, 3), "calls": 0})
            sampler = sampler_factory()
            sampler.start()
        pending: list[tuple[_Op, Any, Any, Any]] = []
        for op in rng.choices(live, weights=[op.weight for op in live], k=chunk):
            before = len(watcher.messages)
            t0 = backend.start()
            try:
                out = op.run()
            except Exception as exc:  # noqa: BLE001 — counted; a broken context ends the soak
                op.note_error(one_line(exc))
                if lost_context(exc):
                    aborted = f"CUDA context lost: {one_line(exc)}"
                    break
                continue
            t1 = backend.stop(t0)
            op.calls += 1
            windows[-1]["calls"] += 1
            _note_warnings(op, watcher, before)
            sample = index not in op.checked_windows or rng.random() < CHECK_FRACTION
            op.checked_windows.add(index)
            pending.append((op, t0, t1, op.output(out) if sample else None))
        try:
            backend.synchronize()
        except Exception as exc:  # noqa: BLE001 — an asynchronous failure of some call of the chunk
            aborted = f"a call failed on the device: {one_line(exc)}"
            break
        for op, t0, t1, sampled in pending:
            op.times.setdefault(index, []).append(backend.elapsed_ms(t0, t1))
            if sampled is not None:
                _check_output(op, sampled)
    if sampler is not None and windows:
        windows[-1]["telemetry"] = sampler.stop(windows[-1]["calls"])
    return windows, aborted, clock() - start


def _check_output(op: _Op, out: torch.Tensor) -> None:
    error, tolerance = op.call.compare(out, op.expected)
    op.checks += 1
    op.worst_error = max(op.worst_error, error) if error == error else float("inf")
    if not error <= tolerance:
        op.mismatches += 1
        if len(op.first_errors) < MAX_ERRORS_KEPT:
            op.first_errors.append(f"mismatch: relative error {error:.3g} > tolerance {tolerance:g}")


def _note_warnings(op: _Op, watcher: _RuntimeWarnings, before: int) -> None:
    for message in watcher.messages[before:]:
        op.note_error(f"runtime warning: {message[:300]}")


def _drift(op: _Op) -> tuple[float | None, float | None, float | None]:
    """(first window's median ms, last window's, last / first − 1); None where a window is missing."""
    if len(op.times) < 2:
        return None, None, None
    first, last = op.times[min(op.times)], op.times[max(op.times)]
    a, b = statistics.median(first), statistics.median(last)
    return a, b, (b / a - 1.0) if a > 0 else None


def _op_check(op: _Op) -> Check:
    first, last, drift = _drift(op)
    problems = []
    if op.setup_error:
        problems.append(f"could not be called: {op.setup_error}")
    if op.capture_error:
        problems.append(f"CUDA graph capture failed: {op.capture_error}")
    if op.errors and not op.setup_error:
        problems.append(f"{op.errors} errors")
    if op.mismatches:
        problems.append(f"{op.mismatches} of {op.checks} sampled checks mismatched")
    mode = "graph" if op.graph else "eager"
    figures = f"{op.calls} calls ({mode}), {op.checks} checked"
    if drift is not None:
        figures += f", drift {drift:+.1%}"
    if problems:
        status, summary = Status.FAIL, "; ".join(problems) + f" — {figures}"
    elif drift is not None and abs(drift) > DRIFT_WARN:
        status, summary = Status.WARN, f"drift beyond {DRIFT_WARN:.0%}: {figures}"
    else:
        status, summary = Status.PASS, figures
    details = {
        "problem": op.call.label, "role": op.call.role, "step": op.call.step, "graph": op.graph,
        "capture_error": op.capture_error, "weight": op.weight, "calls": op.calls, "errors": op.errors,
        "mismatches": op.mismatches, "checks": op.checks, "worst_rel_error": op.worst_error,
        "first_errors": op.first_errors, "first_window_ms": first, "last_window_ms": last, "drift": drift,
        "median_ms_per_window": {str(k): statistics.median(v) for k, v in sorted(op.times.items())},
    }
    return Check(PART, op.call.label.split(" ", 1)[1] + f" ({op.call.role})", status, summary, op.call.kernel,
                 details)


def _summary(ops: list[_Op], windows: list[dict], aborted: str | None, minutes: float, seconds: float) -> Check:
    calls = sum(op.calls for op in ops)
    errors = sum(op.errors for op in ops)
    mismatches = sum(op.mismatches for op in ops)
    failed_ops = [op for op in ops if op.errors or op.mismatches or op.capture_error or op.setup_error]
    # The mix's drift: each op's first and last medians weighted by its share of the calls.
    paired = [(op.weight, *_drift(op)[:2]) for op in ops]
    paired = [(w, a, b) for w, a, b in paired if a is not None and b is not None]
    mix_drift = (sum(w * b for w, _, b in paired) / sum(w * a for w, a, _ in paired) - 1.0) if paired else None
    reasons = sorted({r for w in windows for r in (w.get("telemetry") or {}).get("throttle_reasons", [])})
    thermal = any((w.get("telemetry") or {}).get("throttled_thermal") for w in windows)
    figures = f"{seconds / 60:.1f} min, {calls} calls, {errors} errors, {mismatches} mismatches"
    if mix_drift is not None:
        figures += f", drift {mix_drift:+.1%}"
    if reasons:
        figures += ", throttled: " + ", ".join(reasons)
    if aborted or failed_ops:
        status = Status.FAIL
        summary = (f"stopped: {aborted}; " if aborted else "") + (
            f"{len(failed_ops)} ops failed; " if failed_ops else "") + figures
    elif (mix_drift is not None and abs(mix_drift) > DRIFT_WARN) or thermal:
        status, summary = Status.WARN, figures
    else:
        status, summary = Status.PASS, figures
    details = {
        "minutes_requested": minutes, "minutes_run": seconds / 60, "calls": calls, "errors": errors,
        "mismatches": mismatches, "checks": sum(op.checks for op in ops), "aborted": aborted,
        "graph_ops": sum(op.graph for op in ops), "eager_ops": sum(not op.graph for op in ops),
        "capture_failures": sum(op.capture_error is not None for op in ops), "drift": mix_drift,
        "throttle_reasons": reasons, "throttled_thermal": thermal, "windows": windows,
        "peak_memory_bytes": torch.cuda.max_memory_allocated() if torch.cuda.is_available() else None,
    }
    return Check(PART, "all", status, summary, None, details)


def _nvml_sampler():
    from omnitune.profile.telemetry import NvmlSampler

    return NvmlSampler(interval_s=0.05)

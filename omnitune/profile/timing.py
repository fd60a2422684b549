"""Time a GPU call with CUDA events.

Warm-up first (compilation, autotuning caches and allocator growth stay out of the numbers); then
each repetition is timed alone between two events, with the L2 cache flushed *before* the start
event so that every repetition reads its inputs from HBM, as a real model layer does. The
median is the figure; p20 and p80 give the spread.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

import torch

# Larger than any L2 we target (H200: 60 MiB); writing it evicts everything the kernel left.
_FLUSH_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True)
class Timing:
    median_ms: float
    p20_ms: float
    p80_ms: float
    min_ms: float
    repetitions: int

    @property
    def spread(self) -> float:
        """(p80 − p20) / median: a robust relative spread."""
        return (self.p80_ms - self.p20_ms) / self.median_ms if self.median_ms > 0 else 0.0


def quantile(sorted_values: list[float], q: float) -> float:
    """Linear-interpolated quantile of an already sorted list."""
    if not sorted_values:
        raise ValueError("no values")
    pos = q * (len(sorted_values) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def summarize(samples_ms: list[float]) -> Timing:
    s = sorted(samples_ms)
    return Timing(
        median_ms=statistics.median(s),
        p20_ms=quantile(s, 0.2),
        p80_ms=quantile(s, 0.8),
        min_ms=s[0],
        repetitions=len(s),
    )


class L2Flusher:
    """Owns one large buffer; zeroing it evicts the L2 between repetitions."""

    def __init__(self, device: torch.device | str | None = None):
        self.buffer = torch.empty(_FLUSH_BYTES, dtype=torch.uint8, device=device or "cuda")

    def __call__(self) -> None:
        self.buffer.zero_()


def time_cuda(
    fn: Callable[[], object],
    *,
    warmup: int = 3,
    repetitions: int = 50,
    max_seconds: float = 2.0,
    flush_l2: bool = True,
    flusher: L2Flusher | None = None,
) -> Timing:
    """Median time of fn() in milliseconds, each repetition between CUDA events.

    Stops early after `max_seconds` of kernel time (at least 5 repetitions), so that a slow config
    costs the search a bounded amount of time."""
    if not torch.cuda.is_available():
        raise RuntimeError("time_cuda needs a CUDA device")
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    flusher = flusher if flusher is not None else (L2Flusher() if flush_l2 else None)
    samples: list[float] = []
    spent_ms = 0.0
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(repetitions)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(repetitions)]
    for i in range(repetitions):
        if flusher is not None:
            flusher()
        starts[i].record()
        fn()
        ends[i].record()
        # Synchronize in small batches: enough to bound the time, cheap enough not to starve the GPU.
        if i % 8 == 7 or i == repetitions - 1:
            torch.cuda.synchronize()
            batch = [starts[j].elapsed_time(ends[j]) for j in range(len(samples), i + 1)]
            samples.extend(batch)
            spent_ms += sum(batch)
            if spent_ms > max_seconds * 1000 and len(samples) >= 5:
                break
    return summarize(samples)


def tflops(flop_count: float, time_ms: float) -> float:
    return flop_count / (time_ms * 1e-3) / 1e12 if time_ms > 0 else 0.0


def tbps(byte_count: float, time_ms: float) -> float:
    return byte_count / (time_ms * 1e-3) / 1e12 if time_ms > 0 else 0.0

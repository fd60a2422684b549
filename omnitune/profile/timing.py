"""Time a GPU call with CUDA events.

Warm-up first (compilation, autotuning caches and allocator growth stay out of the numbers); then
each repetition is timed alone between two events, with the L2 cache flushed *before* the start
event so that every repetition reads its inputs from HBM, as a real model layer does. The flush
reads a buffer larger than the L2 rather than writing one, so that it leaves no dirty lines whose
write-back the timed kernel would pay for (L2Flusher). The
median is the figure; p20 and p80 give the spread.

`time_interleaved` times several candidates round-robin instead, so that they can be ranked
against each other without drift between them passing for a difference (the search's finalists).

Host latency stays out of the figure. A launch through Python (argument checks, grid, the
kernel's launcher) takes 60–120 µs of CPU time on the H200 host, more when other processes load
the CPU: it can outlast the flush that precedes it, and then the GPU sits idle inside the timed
window waiting for the launch, and a 50 µs kernel would read as whatever the host took. Before
each start event the GPU is therefore given a spin (torch.cuda._sleep) sized from the host time
of the warm-up calls: while it spins the host enqueues the call, and the events time only the
device's work — the kernels and the gaps between them, as in a CUDA graph replay.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

# Larger than any L2 we target (H200: 60 MiB): passing all of it through the L2 evicts everything
# the kernel left.
_FLUSH_BYTES = 256 * 1024 * 1024
FLUSH_MODES = ("read", "write")
# The GPU spins this many times the host's enqueue time of one call (at least the minimum): room
# for a host that is slower on some repetitions than in the warm-up.
_CUSHION_FACTOR = 3.0
_CUSHION_MIN_S = 100e-6
_CUSHION_MAX_S = 20e-3


@dataclass(frozen=True)
class Timing:
    median_ms: float
    p20_ms: float
    p80_ms: float
    min_ms: float
    repetitions: int
    # Host seconds of the warm-up calls before the timed repetitions (each alone, synchronized, to
    # size the host cushion): GPU time a search holds without timing anything.
    warmup_s: float = 0.0

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


def summarize(samples_ms: list[float], warmup_s: float = 0.0) -> Timing:
    s = sorted(samples_ms)
    return Timing(
        median_ms=statistics.median(s),
        p20_ms=quantile(s, 0.2),
        p80_ms=quantile(s, 0.8),
        min_ms=s[0],
        repetitions=len(s),
        warmup_s=warmup_s,
    )


class L2Flusher:
    """Owns one buffer larger than the L2 and evicts the L2 with it between repetitions.

    mode "read" (the default) reads the buffer: the L2 is left holding clean lines, which cost
    nothing to evict, so the HBM traffic inside the timed window is the kernel's own. mode "write"
    zeroes the buffer instead, leaving the L2 full of dirty lines: a kernel that streams more than
    the L2 holds then also pays for writing them back to HBM, which a layer in a model, whose L2
    holds mostly weights it read, does not. "write" is what omnitune timed with before; it is kept
    so that the difference can be measured (benchmarks/l2_flush_study.py)."""

    def __init__(self, device: torch.device | str | None = None, mode: str = "read"):
        if mode not in FLUSH_MODES:
            raise ValueError(f"flush mode {mode!r}: use one of {', '.join(FLUSH_MODES)}")
        self.mode = mode
        self.buffer = torch.ones(_FLUSH_BYTES // 4, dtype=torch.int32, device=device or "cuda")

    def __call__(self) -> None:
        if self.mode == "read":
            self.buffer.amax()  # the result is not needed, only the pass over the buffer
        else:
            self.buffer.zero_()


class HostCushion:
    """A GPU spin enqueued before each start event, long enough for the host to enqueue the timed
    call behind it (see the module doc)."""

    def __init__(self, seconds: float, cycles_per_s: float):
        self.seconds = seconds
        self.cycles = int(seconds * cycles_per_s)

    @classmethod
    def warm_up(cls, fns: Sequence[Callable[[], object]], calls: int) -> HostCushion:
        """Run each fn `calls` times (at least once) and size the spin from the slowest host
        enqueue time seen after the first call (which may compile)."""
        host_s = 0.0
        for fn in fns:
            for i in range(max(1, calls)):
                torch.cuda.synchronize()
                start = time.perf_counter()
                fn()
                if i > 0 or calls <= 1:
                    host_s = max(host_s, time.perf_counter() - start)
        torch.cuda.synchronize()
        seconds = min(_CUSHION_MAX_S, max(_CUSHION_MIN_S, _CUSHION_FACTOR * host_s))
        return cls(seconds, _spin_cycles_per_second())

    def __call__(self) -> None:
        torch.cuda._sleep(self.cycles)


_cycles_per_s: list[float] = []


def _spin_cycles_per_second() -> float:
    """How many torch.cuda._sleep cycles pass per second on this GPU, measured once: the clock it
    counts is the SM clock, which differs between GPUs and with boost."""
    if not _cycles_per_s:
        cycles = 2_000_000
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(cycles)  # first call: the clock ramps up
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        torch.cuda.synchronize()
        _cycles_per_s.append(cycles / max(start.elapsed_time(end) / 1000.0, 1e-6))
    return _cycles_per_s[0]


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
    warming = time.perf_counter()
    cushion = HostCushion.warm_up([fn], warmup)
    warmup_s = time.perf_counter() - warming
    flusher = flusher if flusher is not None else (L2Flusher() if flush_l2 else None)
    samples: list[float] = []
    spent_ms = 0.0
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(repetitions)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(repetitions)]
    for i in range(repetitions):
        if flusher is not None:
            flusher()
        cushion()
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
    return summarize(samples, warmup_s)


def tflops(flop_count: float, time_ms: float) -> float:
    return flop_count / (time_ms * 1e-3) / 1e12 if time_ms > 0 else 0.0


def tbps(byte_count: float, time_ms: float) -> float:
    return byte_count / (time_ms * 1e-3) / 1e12 if time_ms > 0 else 0.0


def interleaved_order(count: int, rounds: int) -> list[int]:
    """The index of the callable timed at each step of an interleaved run: every round times each
    callable once (A B C), and each round starts one further along (A B C, B C A, C A B, …), so
    that no callable always runs first after a synchronize or always after the same neighbour."""
    if count < 1 or rounds < 1:
        raise ValueError(f"need at least one callable and one round, got {count} and {rounds}")
    return [(start + i) % count for start in range(rounds) for i in range(count)]


def time_interleaved(
    fns: Sequence[Callable[[], object]],
    *,
    rounds: int = 30,
    warmup: int = 2,
    max_seconds: float = 2.0,
    flush_l2: bool = True,
    flusher: L2Flusher | Sequence[L2Flusher | None] | None = None,
) -> list[list[float]]:
    """Time several callables against each other: round-robin (interleaved_order), each call
    alone between two CUDA events with the L2 flushed before it. Returns, per callable, one
    sample in ms per round.

    Timing candidates one after another lets clock and temperature drift between them pass for a
    difference; interleaved, every candidate sees the same drift. Stops after the round in which
    `max_seconds` of kernel time have passed (at least 5 rounds). `flusher` may also be a sequence,
    one flusher (or None: no flush) per callable, to compare ways of flushing side by side."""
    if not torch.cuda.is_available():
        raise RuntimeError("time_interleaved needs a CUDA device")
    order = interleaved_order(len(fns), rounds)
    cushion = HostCushion.warm_up(fns, warmup)
    if flusher is None:
        flusher = L2Flusher() if flush_l2 else None
    flushers = list(flusher) if isinstance(flusher, Sequence) else [flusher] * len(fns)
    if len(flushers) != len(fns):
        raise ValueError(f"{len(flushers)} flushers for {len(fns)} callables")
    samples: list[list[float]] = [[] for _ in fns]
    spent_ms = 0.0
    per_round = len(fns)
    for first in range(0, len(order), per_round):
        events = []
        for index in order[first:first + per_round]:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            if flushers[index] is not None:
                flushers[index]()
            cushion()
            start.record()
            fns[index]()
            end.record()
            events.append((index, start, end))
        torch.cuda.synchronize()  # once per round: cheap, and bounds the time spent
        for index, start, end in events:
            elapsed_ms = start.elapsed_time(end)
            samples[index].append(elapsed_ms)
            spent_ms += elapsed_ms
        rounds_done = first // per_round + 1
        if spent_ms > max_seconds * 1000 and rounds_done >= 5:
            break
    return samples

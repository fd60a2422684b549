"""Energy per call: back-to-back calls over a window long enough for NVML's energy counter.

The timed measurements of a search flush L2 between repetitions, so the energy read over their
window belongs partly to the flush, and many windows are shorter than the counter's refresh (a few
tens of ms on Hopper) — their energy reads as not measured. This measurement is separate: the
kernel alone, called back to back (L2 warm, as in a model's layer loop) for at least
`min_window_s`, the total-energy counter read before and after, divided by the calls. Idle power
is not subtracted: the figure is what the GPU drew per call while running this kernel. A kernel
shorter than its launch on the host (tens of µs through Python) cannot be run back to back this
way: the GPU waits for the host between calls. Given the call's timed device time, such a window
is marked host_paced (omnitune bench shows "host-paced" instead of charging idle time to it).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from omnitune.profile.telemetry import NvmlSampler

DEFAULT_WINDOW_S = 0.5
# Back-to-back calls slower than this many times the timed call: the host set the pace.
HOST_PACED_FACTOR = 1.5


def energy_per_call(
    run: Callable[[], Any], *, min_window_s: float = DEFAULT_WINDOW_S, sampler: NvmlSampler | None = None,
    synchronize: Callable[[], None] = torch.cuda.synchronize, timed_ms: float | None = None,
) -> dict[str, Any]:
    """{"energy_per_call_mj", "power_w_median", "calls", "window_s", ...} for `run` called back to
    back, with "host_paced" when `timed_ms` (the call's device time) is given; {"energy": "not
    available"} without NVML, {"energy": "not measured"} when the counter did not move."""
    sampler = sampler or NvmlSampler(bracket_energy=True)
    if not sampler.available():
        return {"energy": "not available"}
    # Size the window from a short probe, so a 5 µs kernel and a 5 ms one both fill it.
    synchronize()
    probe_calls, start = 0, time.perf_counter()
    while probe_calls < 3 or time.perf_counter() - start < 0.02:
        run()
        probe_calls += 1
        if probe_calls % 64 == 0:
            synchronize()
    synchronize()
    per_call_s = max((time.perf_counter() - start) / probe_calls, 1e-7)
    calls = max(10, int(min_window_s / per_call_s))
    sampler.start()
    start = time.perf_counter()
    for _ in range(calls):
        run()
    synchronize()
    window_s = time.perf_counter() - start
    summary = sampler.stop(calls)
    paced = {} if timed_ms is None else {"host_paced": window_s * 1e3 / calls > HOST_PACED_FACTOR * timed_ms}
    energy_j = summary.get("energy_j")
    if energy_j is None:
        return {"energy": "not measured", "calls": calls, "window_s": window_s, **paced}
    return {
        "energy_per_call_mj": energy_j * 1000.0 / calls,
        "power_w_mean": energy_j / window_s,
        "power_w_median": summary.get("power_w_median"),
        "sm_clock_mhz_median": summary.get("sm_clock_mhz_median"),
        "throttled_thermal": summary.get("throttled_thermal"),
        "throttled_power": summary.get("throttled_power"),
        "calls": calls,
        "window_s": window_s,
        **paced,
    }

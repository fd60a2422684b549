"""Side-by-side benchmark: our kernel (one or more configs) and the spec's baselines (e.g. every
SDPA backend), each verified against the reference and timed in the same process, on the same
inputs, one after another — so that the figures compare like with like."""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import torch

from omnitune.errors import first_line
from omnitune.profile.energy import energy_per_call
from omnitune.profile.timing import L2Flusher, tbps, tflops, time_cuda
from omnitune.trial import classify_exception
from omnitune.spec import Config, KernelSpec


@dataclass(frozen=True)
class BenchRow:
    name: str                   # "omnitune[default]", "sdpa_flash", ...
    kind: str                   # "omnitune" or "baseline"
    status: str                 # "ok", "mismatch", "not available", an error status
    time_ms: float = math.nan
    p20_ms: float = math.nan
    p80_ms: float = math.nan
    tflops: float = math.nan
    tbps: float = math.nan
    rel_error: float = math.nan
    config: dict | None = None
    detail: str = ""
    first_call_s: float = math.nan  # includes compilation: what a cold config costs a search
    energy: dict | None = None  # omnitune.profile.energy: per call, back to back, L2 warm

    def as_record(self) -> dict[str, Any]:
        return asdict(self)


def _bench_one(
    name: str, kind: str, run: Callable[[], torch.Tensor], reference: torch.Tensor, tolerance: float,
    compare, flop_count: float, byte_count: float, *, interpret: bool, flusher: L2Flusher | None,
    config: Config | None = None, repetitions: int = 50, energy: bool = False,
) -> BenchRow:
    cfg = config.as_dict() if config is not None else None
    first = time.perf_counter()
    try:
        with warnings.catch_warnings():
            # SDPA explains at length why each disabled backend was not used; we asked for one.
            warnings.simplefilter("ignore", UserWarning)
            out = run()
        if not interpret:
            torch.cuda.synchronize()
        first_call_s = time.perf_counter() - first
    except Exception as exc:  # noqa: BLE001 — a backend that cannot run here is a row, not a crash
        text = str(exc)
        if kind == "baseline" and any(s in text for s in ("No available kernel", "No viable backend", "not supported")):
            return BenchRow(name, kind, "not available", detail=first_line(exc, 200), config=cfg)
        status, detail = classify_exception(exc)
        return BenchRow(name, kind, status.value, detail=detail, config=cfg)
    err = compare(out, reference)
    status = "ok" if err <= tolerance else "mismatch"
    if interpret:
        start = time.perf_counter()
        run()
        ms = (time.perf_counter() - start) * 1e3
        return BenchRow(name, kind, status, ms, ms, ms, rel_error=err, config=cfg,
                        detail="interpreter: time not representative", first_call_s=first_call_s)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        timing = time_cuda(run, repetitions=repetitions, max_seconds=2.0, flusher=flusher)
        drawn = energy_per_call(run, timed_ms=timing.median_ms) if energy else None
    return BenchRow(
        name, kind, status, timing.median_ms, timing.p20_ms, timing.p80_ms,
        tflops(flop_count, timing.median_ms), tbps(byte_count, timing.median_ms), err, cfg,
        first_call_s=first_call_s, energy=drawn,
    )


def run_bench(
    spec: KernelSpec,
    problem: Any,
    dtype: torch.dtype,
    configs: Mapping[str, Config],
    *,
    interpret: bool = False,
    seed: int = 0,
    baselines: bool = True,
    repetitions: int = 50,
    energy: bool = False,
) -> list[BenchRow]:
    """Verify and time each of our configs and each baseline on one problem; with `energy`, also
    the energy each draws per call (omnitune.profile.energy)."""
    device = "cpu" if interpret else "cuda"
    inputs = spec.make_inputs(problem, dtype, device, seed)
    reference = spec.reference(inputs)
    tolerance = spec.tolerance[dtype]
    flop_count = spec.flops(problem)
    byte_count = spec.bytes_moved(problem, dtype)
    flusher = None if interpret else L2Flusher()
    rows: list[BenchRow] = []
    for label, config in configs.items():
        out = spec.new_output(inputs)

        def run(config=config, out=out):
            if spec.restore_inputs is not None:
                spec.restore_inputs(inputs)
            result = spec.launch(inputs, out, config)  # or the tensor that holds the result
            return result if isinstance(result, torch.Tensor) else out

        rows.append(_bench_one(f"omnitune[{label}]", "omnitune", run, reference, tolerance, spec.compare,
                               flop_count, byte_count, interpret=interpret, flusher=flusher,
                               config=config, repetitions=repetitions, energy=energy))
    if baselines and spec.baselines is not None and not interpret:
        for name, fn in spec.baselines(problem).items():
            rows.append(_bench_one(name, "baseline", lambda fn=fn: fn(inputs), reference, tolerance,
                                   spec.compare, flop_count, byte_count, interpret=False,
                                   flusher=flusher, repetitions=repetitions, energy=energy))
    return rows


def speedups(rows: list[BenchRow]) -> dict[str, dict[str, float]]:
    """For each of our rows, its speedup over each measured, correct baseline (baseline ms / ours)."""
    ours = [r for r in rows if r.kind == "omnitune" and r.status == "ok"]
    bases = [r for r in rows if r.kind == "baseline" and r.status == "ok"]
    return {o.name: {b.name: b.time_ms / o.time_ms for b in bases} for o in ours}

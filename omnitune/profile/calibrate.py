"""Measure this GPU's ceilings: the roofs that achieved TB/s and TFLOP/s are read against.

Datasheet peaks are not reachable (H200: 4.8 TB/s on paper, 4.25 TB/s measured for a
device-to-device copy; 989 dense bf16 TFLOP/s on paper, 698 measured for an 8192³ matmul, both
2026-11-29), so a kernel's efficiency is its figure over what this GPU does, measured here:
- copy_tbps: one ≥ 1 GiB device-to-device copy, bytes read + bytes written over its time;
- matmul_{bf16,fp16,tf32}_tflops: an 8192³ torch.matmul on random data (zeros would let the
  tensor cores idle on power and overstate the rate), 2·M·N·K flop over its time.

The arithmetic is in pure functions so that it is checked on the CPU; torch is imported only by
calibrate(), which needs a GPU.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from omnitune.errors import OmnituneError

COPY_BYTES = 1 << 30  # 1 GiB: far past any L2 (H200: 60 MiB), so the copy streams HBM
MATMUL_SIZE = 8192


class MissingCalibrationError(OmnituneError):
    """A figure needs a device's ceilings that were never measured."""


class Metric(str, enum.Enum):
    """A calibrated ceiling, named as the calibrations table stores it."""

    COPY_TBPS = "copy_tbps"
    MATMUL_BF16_TFLOPS = "matmul_bf16_tflops"
    MATMUL_FP16_TFLOPS = "matmul_fp16_tflops"
    MATMUL_TF32_TFLOPS = "matmul_tf32_tflops"


# The matmul rate that bounds a kernel computing in each dtype: fp32 kernels use tensor cores in
# tf32 (Triton's default dot precision), so the tf32 rate is their roof.
MATMUL_METRIC_FOR_DTYPE: dict[str, Metric] = {
    "bf16": Metric.MATMUL_BF16_TFLOPS,
    "fp16": Metric.MATMUL_FP16_TFLOPS,
    "fp32": Metric.MATMUL_TF32_TFLOPS,
}


def copy_bytes_moved(bytes_copied: int) -> int:
    """A copy reads every byte once and writes it once."""
    return 2 * bytes_copied


def matmul_flop_count(m: int, n: int, k: int) -> int:
    """Multiply-adds of an (m×k)·(k×n) product, counted as two flops each."""
    return 2 * m * n * k


def bandwidth_tbps(byte_count: float, time_ms: float) -> float:
    """Bytes over milliseconds → TB/s (10¹² bytes per second)."""
    if time_ms <= 0:
        raise ValueError(f"time_ms must be positive, got {time_ms}")
    return byte_count / (time_ms * 1e-3) / 1e12


def compute_tflops(flop_count: float, time_ms: float) -> float:
    """Flops over milliseconds → TFLOP/s (10¹² flops per second)."""
    if time_ms <= 0:
        raise ValueError(f"time_ms must be positive, got {time_ms}")
    return flop_count / (time_ms * 1e-3) / 1e12


@dataclass(frozen=True)
class Calibration:
    """One device's measured ceilings, value per metric (TB/s or TFLOP/s); details say how each
    was measured (sizes, repetitions, median and spread of the times)."""

    device_key: str
    values: Mapping[Metric, float]
    details: Mapping[Metric, Mapping[str, Any]] = field(default_factory=dict)

    @classmethod
    def from_metrics(cls, device_key: str, values: Mapping[str, float]) -> Calibration:
        """From stored rows (metric name → value); unknown metric names are ignored."""
        known = {m.value: m for m in Metric}
        return cls(device_key, {known[k]: float(v) for k, v in values.items() if k in known})

    @property
    def copy_tbps(self) -> float | None:
        return self.values.get(Metric.COPY_TBPS)

    def matmul_tflops(self, dtype: str) -> float | None:
        """The matmul roof for a kernel computing in dtype ('bf16', 'fp16' or 'fp32' → tf32)."""
        metric = MATMUL_METRIC_FOR_DTYPE.get(dtype)
        if metric is None:
            raise ValueError(f"no matmul roof for dtype {dtype!r}; use one of {', '.join(MATMUL_METRIC_FOR_DTYPE)}")
        return self.values.get(metric)

    def as_rows(self) -> list[tuple[str, float, dict[str, Any]]]:
        """(metric, value, detail) per metric, in Metric order."""
        return [(m.value, self.values[m], dict(self.details.get(m, {}))) for m in Metric if m in self.values]


def _timing_detail(timing: Any, **sizes: Any) -> dict[str, Any]:
    return {
        **sizes,
        "median_ms": timing.median_ms,
        "p20_ms": timing.p20_ms,
        "p80_ms": timing.p80_ms,
        "repetitions": timing.repetitions,
    }


def measure_copy_tbps(device: Any, bytes_copied: int = COPY_BYTES) -> tuple[float, dict[str, Any]]:
    """Device-to-device copy bandwidth in TB/s, counting bytes read + written."""
    import torch

    from omnitune.profile.timing import time_cuda

    src = torch.randint(0, 256, (bytes_copied,), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    # The copy itself is 4× the L2 flusher's buffer: flushing would only add noise.
    timing = time_cuda(lambda: dst.copy_(src), warmup=3, repetitions=20, max_seconds=2.0, flush_l2=False)
    moved = copy_bytes_moved(bytes_copied)
    del src, dst
    return bandwidth_tbps(moved, timing.median_ms), _timing_detail(timing, bytes_copied=bytes_copied)


def measure_matmul_tflops(device: Any, dtype_name: str, size: int = MATMUL_SIZE) -> tuple[float, dict[str, Any]]:
    """Dense size³ matmul rate in TFLOP/s; dtype_name 'bf16', 'fp16' or 'tf32' (fp32 storage,
    tensor cores in tf32)."""
    import torch

    from omnitune.profile.timing import time_cuda

    storage = {"bf16": torch.bfloat16, "fp16": torch.float16, "tf32": torch.float32}[dtype_name]
    generator = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(size, size, device=device, dtype=storage, generator=generator)
    b = torch.randn(size, size, device=device, dtype=storage, generator=generator)
    c = torch.empty(size, size, device=device, dtype=storage)
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = dtype_name == "tf32"
    try:
        timing = time_cuda(lambda: torch.matmul(a, b, out=c), warmup=5, repetitions=30, max_seconds=3.0,
                           flush_l2=False)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous
    del a, b, c
    flops = matmul_flop_count(size, size, size)
    return compute_tflops(flops, timing.median_ms), _timing_detail(timing, m=size, n=size, k=size)


def calibrate(device: Any = None) -> Calibration:
    """Measure this GPU's copy bandwidth and bf16, fp16 and tf32 matmul rates (about 10 s).

    Raises DeviceError without a CUDA GPU."""
    import torch

    from omnitune.errors import DeviceError
    from omnitune.profile.device import device_key

    if not torch.cuda.is_available():
        raise DeviceError("no CUDA GPU here; calibration measures a GPU's ceilings and needs one")
    device = torch.device(device if device is not None else "cuda")
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    with torch.cuda.device(device):
        values: dict[Metric, float] = {}
        details: dict[Metric, dict[str, Any]] = {}
        values[Metric.COPY_TBPS], details[Metric.COPY_TBPS] = measure_copy_tbps(device)
        for name, metric in (("bf16", Metric.MATMUL_BF16_TFLOPS), ("fp16", Metric.MATMUL_FP16_TFLOPS),
                             ("tf32", Metric.MATMUL_TF32_TFLOPS)):
            values[metric], details[metric] = measure_matmul_tflops(device, name)
        torch.cuda.empty_cache()
        key = device_key(torch.cuda.get_device_name(device))
    return Calibration(key, values, details)

"""Place a measured kernel on this GPU's roofline.

The roof at arithmetic intensity I (flop/byte) is min(peak TFLOP/s, I · peak TB/s); the ridge
point I* = peak TFLOP/s ÷ peak TB/s separates memory-bound kernels (I < I*: judged by the fraction
of bandwidth they reach) from compute-bound ones (judged by the fraction of the matmul rate).
Peaks are this device's calibration (omnitune.profile.calibrate), not datasheet numbers.

Pure functions, no GPU and no torch: report and plots call them on stored figures.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Any

from omnitune.profile.calibrate import Calibration, MissingCalibrationError


class BoundBy(str, enum.Enum):
    MEMORY = "memory"
    COMPUTE = "compute"


@dataclass(frozen=True)
class RooflinePoint:
    """A kernel's place under the roof. fraction_of_bound is achieved over the roof at its
    intensity: TB/s over peak TB/s when memory-bound, TFLOP/s over peak TFLOP/s when compute-bound."""

    label: str
    dtype: str
    arithmetic_intensity_flop_per_byte: float
    achieved_tflops: float
    achieved_tbps: float
    bound_tflops: float
    fraction_of_bound: float
    bound_by: BoundBy
    peak_tflops: float
    peak_tbps: float

    @property
    def ridge_flop_per_byte(self) -> float:
        return ridge_intensity(self.peak_tflops, self.peak_tbps)


def ridge_intensity(peak_tflops: float, peak_tbps: float) -> float:
    """The intensity (flop/byte) where the bandwidth slope meets the compute roof."""
    return peak_tflops / peak_tbps


def roof_tflops(intensity_flop_per_byte: float, peak_tflops: float, peak_tbps: float) -> float:
    """The attainable TFLOP/s at an intensity: min(compute roof, intensity × bandwidth)."""
    return min(peak_tflops, intensity_flop_per_byte * peak_tbps)


def roofline_point(
    flops: float,
    bytes_moved: float,
    time_ms: float,
    peak_tflops: float,
    peak_tbps: float,
    *,
    label: str = "",
    dtype: str = "",
) -> RooflinePoint:
    """A kernel that does `flops` and moves `bytes_moved` (its analytic model) in `time_ms`,
    against the given peaks. Zero flops (a copy) is memory-bound, judged by bandwidth alone."""
    if time_ms <= 0 or not math.isfinite(time_ms):
        raise ValueError(f"time_ms must be positive and finite, got {time_ms}")
    if flops < 0 or bytes_moved < 0 or (flops == 0 and bytes_moved == 0):
        raise ValueError(f"need non-negative flops and bytes, not both zero (got {flops}, {bytes_moved})")
    if peak_tflops <= 0 or peak_tbps <= 0:
        raise ValueError(f"peaks must be positive, got {peak_tflops} TFLOP/s and {peak_tbps} TB/s")
    seconds = time_ms * 1e-3
    achieved_tflops = flops / seconds / 1e12
    achieved_tbps = bytes_moved / seconds / 1e12
    intensity = flops / bytes_moved if bytes_moved > 0 else math.inf
    if intensity < ridge_intensity(peak_tflops, peak_tbps):
        bound_by, fraction = BoundBy.MEMORY, achieved_tbps / peak_tbps
    else:
        bound_by, fraction = BoundBy.COMPUTE, achieved_tflops / peak_tflops
    return RooflinePoint(
        label=label,
        dtype=dtype,
        arithmetic_intensity_flop_per_byte=intensity,
        achieved_tflops=achieved_tflops,
        achieved_tbps=achieved_tbps,
        bound_tflops=roof_tflops(intensity, peak_tflops, peak_tbps),
        fraction_of_bound=fraction,
        bound_by=bound_by,
        peak_tflops=peak_tflops,
        peak_tbps=peak_tbps,
    )


def dtype_label(dtype: Any) -> str:
    """'bf16' | 'fp16' | 'fp32' from a name or a torch.dtype."""
    if isinstance(dtype, str):
        return dtype
    from omnitune.spec import dtype_name

    return dtype_name(dtype)


def point_on_device(
    calibration: Calibration,
    dtype: Any,
    flops: float,
    bytes_moved: float,
    time_ms: float,
    *,
    label: str = "",
) -> RooflinePoint:
    """roofline_point with the peaks of a calibrated device: its copy bandwidth and the matmul
    rate of the dtype (bf16/fp16 → that dtype's, fp32 → tf32's)."""
    name = dtype_label(dtype)
    peak_tflops = calibration.matmul_tflops(name)
    peak_tbps = calibration.copy_tbps
    if peak_tflops is None or peak_tbps is None:
        raise MissingCalibrationError(
            f"the calibration of {calibration.device_key} lacks the copy or {name} matmul figure; "
            "run `omnitune calibrate` on that GPU"
        )
    return roofline_point(flops, bytes_moved, time_ms, peak_tflops, peak_tbps, label=label, dtype=name)

"""The roofline: classification on both sides of the ridge, and the fractions of the bound."""

from __future__ import annotations

import math

import pytest
import torch

from omnitune.profile.calibrate import Calibration, MissingCalibrationError
from omnitune.profile.roofline import BoundBy, point_on_device, ridge_intensity, roof_tflops, roofline_point

PEAK_TFLOPS, PEAK_TBPS = 698.0, 4.25  # an H200's measured bf16 matmul rate and copy bandwidth
RIDGE = PEAK_TFLOPS / PEAK_TBPS  # ≈ 164 flop/byte


def _time_ms(work: float, rate_per_s: float) -> float:
    return work / rate_per_s * 1e3


def test_ridge_and_roof():
    assert ridge_intensity(PEAK_TFLOPS, PEAK_TBPS) == pytest.approx(RIDGE)
    assert roof_tflops(10.0, PEAK_TFLOPS, PEAK_TBPS) == pytest.approx(42.5)  # on the bandwidth slope
    assert roof_tflops(1000.0, PEAK_TFLOPS, PEAK_TBPS) == PEAK_TFLOPS  # under the compute roof


def test_below_the_ridge_is_memory_bound_and_judged_by_bandwidth():
    flops, nbytes = 1e9, 1e8  # 10 flop/byte
    point = roofline_point(flops, nbytes, _time_ms(nbytes, PEAK_TBPS * 1e12 / 2), PEAK_TFLOPS, PEAK_TBPS)
    assert point.bound_by is BoundBy.MEMORY
    assert point.arithmetic_intensity_flop_per_byte == pytest.approx(10.0)
    assert point.achieved_tbps == pytest.approx(PEAK_TBPS / 2)
    assert point.achieved_tflops == pytest.approx(10.0 * PEAK_TBPS / 2)
    assert point.bound_tflops == pytest.approx(10.0 * PEAK_TBPS)
    assert point.fraction_of_bound == pytest.approx(0.5)


def test_above_the_ridge_is_compute_bound_and_judged_by_the_matmul_rate():
    flops, nbytes = 1e12, 1e9  # 1000 flop/byte
    point = roofline_point(flops, nbytes, _time_ms(flops, 0.8 * PEAK_TFLOPS * 1e12), PEAK_TFLOPS, PEAK_TBPS)
    assert point.bound_by is BoundBy.COMPUTE
    assert point.achieved_tflops == pytest.approx(0.8 * PEAK_TFLOPS)
    assert point.bound_tflops == PEAK_TFLOPS
    assert point.fraction_of_bound == pytest.approx(0.8)


def test_the_same_speed_is_judged_differently_on_either_side_of_the_ridge():
    below = roofline_point(RIDGE * 0.9 * 1e9, 1e9, 1.0, PEAK_TFLOPS, PEAK_TBPS)
    above = roofline_point(RIDGE * 1.1 * 1e9, 1e9, 1.0, PEAK_TFLOPS, PEAK_TBPS)
    assert below.bound_by is BoundBy.MEMORY and above.bound_by is BoundBy.COMPUTE
    assert below.fraction_of_bound == pytest.approx(below.achieved_tbps / PEAK_TBPS)
    assert above.fraction_of_bound == pytest.approx(above.achieved_tflops / PEAK_TFLOPS)


def test_exactly_at_the_ridge_counts_as_compute_bound():
    point = roofline_point(RIDGE * 1e9, 1e9, 1.0, PEAK_TFLOPS, PEAK_TBPS)
    assert point.bound_by is BoundBy.COMPUTE


def test_a_copy_kernel_is_memory_bound_by_bandwidth_alone():
    nbytes = 2e9
    point = roofline_point(0, nbytes, _time_ms(nbytes, 0.7 * PEAK_TBPS * 1e12), PEAK_TFLOPS, PEAK_TBPS,
                           label="kv write")
    assert point.bound_by is BoundBy.MEMORY
    assert point.arithmetic_intensity_flop_per_byte == 0.0
    assert point.achieved_tflops == 0.0
    assert point.fraction_of_bound == pytest.approx(0.7)
    assert point.label == "kv write"


def test_no_bytes_is_compute_bound():
    point = roofline_point(1e12, 0, 2.0, PEAK_TFLOPS, PEAK_TBPS)
    assert math.isinf(point.arithmetic_intensity_flop_per_byte)
    assert point.bound_by is BoundBy.COMPUTE
    assert point.fraction_of_bound == pytest.approx(0.5 / PEAK_TFLOPS * 1e3)


@pytest.mark.parametrize("flops, nbytes, time_ms, tflops, tbps", [
    (1e9, 1e9, 0.0, 698, 4.25),
    (1e9, 1e9, math.inf, 698, 4.25),
    (0, 0, 1.0, 698, 4.25),
    (-1, 1e9, 1.0, 698, 4.25),
    (1e9, 1e9, 1.0, 0, 4.25),
])
def test_impossible_inputs_are_refused(flops, nbytes, time_ms, tflops, tbps):
    with pytest.raises(ValueError):
        roofline_point(flops, nbytes, time_ms, tflops, tbps)


def test_a_device_calibration_picks_the_roof_of_the_dtype():
    cal = Calibration.from_metrics("NVIDIA_H200", {"copy_tbps": PEAK_TBPS, "matmul_bf16_tflops": PEAK_TFLOPS,
                                                   "matmul_fp16_tflops": 702.0, "matmul_tf32_tflops": 378.0})
    flops, nbytes = 1e12, 1e9
    bf16 = point_on_device(cal, torch.bfloat16, flops, nbytes, 2.0)
    fp32 = point_on_device(cal, "fp32", flops, nbytes, 2.0)
    assert (bf16.dtype, fp32.dtype) == ("bf16", "fp32")
    assert bf16.peak_tflops == PEAK_TFLOPS and fp32.peak_tflops == 378.0
    assert fp32.fraction_of_bound == pytest.approx(bf16.fraction_of_bound * PEAK_TFLOPS / 378.0)


def test_an_uncalibrated_device_says_how_to_calibrate():
    with pytest.raises(MissingCalibrationError, match="omnitune calibrate"):
        point_on_device(Calibration.from_metrics("X", {"copy_tbps": 3.0}), "bf16", 1e9, 1e9, 1.0)

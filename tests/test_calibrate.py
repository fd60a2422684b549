"""Calibration: the arithmetic on the CPU, the command's error and storage paths, and the real
measurement on the device."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from omnitune.cli import app
from omnitune.errors import DeviceError
from omnitune.profile import calibrate as calibrate_module
from omnitune.profile.calibrate import (
    Calibration,
    Metric,
    bandwidth_tbps,
    calibrate,
    compute_tflops,
    copy_bytes_moved,
    matmul_flop_count,
)

no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the path without a GPU")


def test_a_copy_counts_bytes_read_and_written():
    assert copy_bytes_moved(2**30) == 2**31


def test_bandwidth_of_the_h200_copy():
    # 2 GiB moved (1 GiB read + 1 GiB written) in 0.5053 ms is the 4.25 TB/s measured on an H200.
    moved = copy_bytes_moved(2**30)
    assert bandwidth_tbps(moved, 0.5053) == pytest.approx(2**31 / 0.5053e-3 / 1e12)
    assert bandwidth_tbps(moved, 0.5053) == pytest.approx(4.25, rel=1e-3)
    assert bandwidth_tbps(moved, 1.0106) == pytest.approx(bandwidth_tbps(moved, 0.5053) / 2)


def test_matmul_rate_counts_two_flops_per_multiply_add():
    assert matmul_flop_count(2, 3, 4) == 48
    flops = matmul_flop_count(8192, 8192, 8192)
    time_ms = flops / 698e12 * 1e3  # what an 8192³ matmul takes at 698 TFLOP/s
    assert compute_tflops(flops, time_ms) == pytest.approx(698.0)


@pytest.mark.parametrize("time_ms", [0.0, -1.0])
def test_non_positive_times_are_refused(time_ms):
    with pytest.raises(ValueError):
        bandwidth_tbps(1e9, time_ms)
    with pytest.raises(ValueError):
        compute_tflops(1e9, time_ms)


def test_calibration_roofs_per_dtype():
    cal = Calibration.from_metrics("NVIDIA_H200", {
        "copy_tbps": 4.25, "matmul_bf16_tflops": 698.0, "matmul_fp16_tflops": 702.0,
        "matmul_tf32_tflops": 378.0, "something_else": 1.0,
    })
    assert cal.copy_tbps == 4.25
    assert cal.matmul_tflops("bf16") == 698.0
    assert cal.matmul_tflops("fp16") == 702.0
    assert cal.matmul_tflops("fp32") == 378.0  # fp32 kernels run their dots in tf32
    assert [row[0] for row in cal.as_rows()] == [m.value for m in Metric]
    with pytest.raises(ValueError, match="bf16, fp16, fp32"):
        cal.matmul_tflops("int8")


def test_a_partial_calibration_answers_none():
    cal = Calibration.from_metrics("X", {"copy_tbps": 3.0})
    assert cal.matmul_tflops("bf16") is None
    assert [row[0] for row in cal.as_rows()] == ["copy_tbps"]


@no_gpu
def test_calibrate_needs_a_gpu():
    with pytest.raises(DeviceError, match="no CUDA GPU"):
        calibrate()


@no_gpu
def test_calibrate_command_without_gpu_is_one_line(tmp_db):
    result = CliRunner().invoke(app, ["calibrate"])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == ["error: no CUDA GPU here; calibration needs one"]


def test_calibrate_command_stores_every_metric(tmp_db, monkeypatch):
    from omnitune.cli import profile_cmd
    from omnitune.profile import device
    from omnitune.store import open_db

    measured = Calibration(
        "Test_GPU",
        {Metric.COPY_TBPS: 3.9, Metric.MATMUL_BF16_TFLOPS: 650.0, Metric.MATMUL_FP16_TFLOPS: 655.0,
         Metric.MATMUL_TF32_TFLOPS: 350.0},
        {m: {"median_ms": 1.25, "p20_ms": 1.2, "p80_ms": 1.3, "repetitions": 20} for m in Metric},
    )
    monkeypatch.setattr(profile_cmd, "_require_gpu", lambda what: None)
    monkeypatch.setattr(calibrate_module, "calibrate", lambda device=None: measured)
    monkeypatch.setattr(device, "current_device_facts", lambda interpret=False: None)
    result = CliRunner().invoke(app, ["calibrate", "--db", str(tmp_db)])
    assert result.exit_code == 0, result.output
    assert "matmul_bf16_tflops" in result.output and "650.00" in result.output
    rows = {r["metric"]: r for r in open_db(tmp_db).query("SELECT * FROM calibrations")}
    assert {k: rows[k]["value"] for k in rows} == {m.value: v for m, v in measured.values.items()}
    assert all(r["device_key"] == "Test_GPU" for r in rows.values())
    assert '"repetitions": 20' in rows["copy_tbps"]["detail_json"]


@pytest.mark.gpu
def test_calibrate_measures_plausible_ceilings():
    cal = calibrate()
    assert 0.1 < cal.copy_tbps < 20
    bf16, tf32 = cal.matmul_tflops("bf16"), cal.matmul_tflops("fp32")
    assert 10 < bf16 < 5000
    assert bf16 > tf32 > 0  # half-precision tensor cores outrun tf32 on every GPU we target
    assert cal.details[Metric.COPY_TBPS]["bytes_copied"] >= 2**30

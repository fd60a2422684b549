"""Figures: each writer produces a real PNG; the numbers behind them (best so far, importance)
are what they claim."""

from __future__ import annotations

import importlib.util
import itertools
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from omnitune.profile import plots
from omnitune.profile.calibrate import Calibration
from omnitune.profile.roofline import point_on_device

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

# matplotlib is the `plot` extra; figures are skipped where it is not installed, the numbers
# behind them are tested everywhere.
needs_matplotlib = pytest.mark.skipif(
    importlib.util.find_spec("matplotlib") is None, reason="matplotlib (the plot extra) is not installed"
)


def _assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert len(data) > 8_000  # axes, text and lines, not an empty canvas


def _grid_trials(study: str = "attention|lq=512|bf16|NVIDIA_H200", base_ms: float = 1.0) -> pd.DataFrame:
    """Every config of a small grid; the time depends on BLOCK_M alone (128 halves it)."""
    rows = []
    grid = itertools.product((64, 128), (32, 64, 128), (4, 8))
    for number, (block_m, block_n, warps) in enumerate(grid):
        config = {"BLOCK_M": block_m, "BLOCK_N": block_n, "num_warps": warps}
        rows.append({
            "study": study, "sampler": "grid", "trial_number": number,
            "config_json": json.dumps(config, sort_keys=True), "status": "ok",
            "time_ms": base_ms * (0.5 if block_m == 128 else 1.0), "is_default": int(number == 0),
        })
    return pd.DataFrame(rows)


def _search_trials() -> pd.DataFrame:
    rows = []
    times = {"tpe": [3.0, None, 2.5, 2.7, 1.2, 1.4, 1.1], "random": [2.9, 3.1, 2.2, None, 2.0, 2.1, 1.9]}
    for sampler, series in times.items():
        for number, t in enumerate(series):
            rows.append({"study": "s", "sampler": sampler, "trial_number": number,
                         "status": "ok" if t is not None else "out_of_resources", "time_ms": t,
                         "config_json": json.dumps({"BLOCK_M": 64 if number % 2 else 128}),
                         "is_default": int(number == 0)})
    return pd.DataFrame(rows)


def test_best_so_far_never_rises_and_skips_failures():
    curves = plots.best_so_far(_search_trials())
    tpe = curves[curves["group"] == "tpe"]["best_time_ms"].tolist()
    assert tpe == [3.0, 3.0, 2.5, 2.5, 1.2, 1.2, 1.1]
    random = curves[curves["group"] == "random"]["best_time_ms"].tolist()
    assert random == [2.9, 2.9, 2.2, 2.2, 2.0, 2.0, 1.9]


@needs_matplotlib
def test_convergence_png(tmp_path):
    path = plots.convergence(_search_trials(), tmp_path / "figures" / "convergence.png")
    _assert_png(path)


def test_convergence_needs_a_successful_trial(tmp_path):
    df = _search_trials().assign(status="mismatch")
    with pytest.raises(ValueError, match="no successful trial"):
        plots.convergence(df, tmp_path / "c.png")


def test_importance_finds_the_parameter_that_decides_the_time():
    importance = plots.parameter_importance(_grid_trials())
    assert importance.index[0] == "BLOCK_M"
    assert importance["BLOCK_M"] == pytest.approx(1.0)
    assert importance["BLOCK_N"] == pytest.approx(0.0, abs=1e-12)
    assert importance["num_warps"] == pytest.approx(0.0, abs=1e-12)


def test_importance_ignores_differences_between_shapes():
    both = pd.concat([_grid_trials("small", base_ms=1.0), _grid_trials("large", base_ms=40.0)], ignore_index=True)
    assert plots.parameter_importance(both)["BLOCK_M"] == pytest.approx(1.0)
    # Without the study column the 40× gap between the shapes dominates the variance.
    assert plots.parameter_importance(both.drop(columns="study"))["BLOCK_M"] < 0.2


def test_importance_counts_only_ok_trials():
    df = _grid_trials()
    eight_warps = df["config_json"].map(lambda text: json.loads(text)["num_warps"] == 8)
    df.loc[eight_warps, "status"] = "compile_error"
    df.loc[eight_warps, "time_ms"] = 1000.0
    importance = plots.parameter_importance(df)
    assert importance["num_warps"] == 0.0  # a single value left among the ok trials
    assert importance["BLOCK_M"] == pytest.approx(1.0)


@needs_matplotlib
def test_param_importance_png(tmp_path):
    _assert_png(plots.param_importance(_grid_trials(), tmp_path / "importance.png"))


@needs_matplotlib
def test_roofline_png(tmp_path):
    cal = Calibration.from_metrics("NVIDIA_H200", {"copy_tbps": 4.25, "matmul_bf16_tflops": 698.0,
                                                   "matmul_fp16_tflops": 702.0, "matmul_tf32_tflops": 378.0})
    points = [
        point_on_device(cal, "bf16", 2.4e12, 1.7e8, 4.0, label="attention prefill"),
        point_on_device(cal, "fp32", 2.0e9, 1.6e8, 0.2, label="decode fp32"),
        point_on_device(cal, "bf16", 0, 2e9, 0.7, label="kv write"),
    ]
    _assert_png(plots.roofline(points, cal, tmp_path / "roofline.png"))


def test_roofline_without_bandwidth_is_refused(tmp_path):
    cal = Calibration.from_metrics("X", {"matmul_bf16_tflops": 600.0})
    with pytest.raises(ValueError, match="copy bandwidth"):
        plots.roofline([], cal, tmp_path / "r.png")


def test_importing_plots_does_not_import_matplotlib():
    code = "import sys, omnitune.profile.plots; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


# --- convergence across shapes, labels, memory-only kernels ----------------------------------------


def _two_shapes() -> pd.DataFrame:
    """Two studies 40× apart, each starting at its default (trial 0); one pruned trial, no time."""
    rows = []
    for study, default_ms, series in (("small", 2.0, [2.0, 1.5, None, 1.0]), ("large", 80.0, [80.0, 60.0, 70.0])):
        for number, t in enumerate(series):
            rows.append({"study": study, "sampler": "tpe", "trial_number": number, "time_ms": t,
                         "status": "ok" if t is not None else "pruned", "is_default": int(number == 0),
                         "config_json": json.dumps({"BLOCK_M": 16 * (number + 1)})})
    return pd.DataFrame(rows)


def test_convergence_across_shapes_is_relative_to_each_default_and_skips_pruned_trials():
    lines = plots.convergence_lines(_two_shapes(), group_by="study")
    assert lines.relative and lines.defaults_ms == {"small": 2.0, "large": 80.0}
    small = lines.curves[lines.curves["group"] == "small"]
    assert small["position"].tolist() == [1, 2, 3]  # the pruned trial is not a measured config
    assert small["y"].tolist() == pytest.approx([2.0 / 2.0, 1.5 / 2.0, 1.0 / 2.0])
    large = lines.curves[lines.curves["group"] == "large"]
    assert large["y"].tolist() == pytest.approx([1.0, 60.0 / 80.0, 60.0 / 80.0])
    # One study, or a study without a default: plain milliseconds.
    assert not plots.convergence_lines(_two_shapes().query("study == 'small'"), group_by="study").relative
    no_default = _two_shapes().assign(is_default=0)
    assert not plots.convergence_lines(no_default, group_by="study").relative
    with pytest.raises(ValueError, match="default-config trial in every study"):
        plots.convergence_lines(no_default, group_by="study", relative=True)


def test_a_samplers_line_takes_its_default_from_the_study():
    df = _two_shapes().query("study == 'small'").copy()
    df.loc[df["trial_number"] > 0, "sampler"] = "grid"  # the default was measured by the other sampler
    lines = plots.convergence_lines(pd.concat([df, _two_shapes().query("study == 'large'")]))
    assert lines.defaults_ms["grid"] == 2.0


@needs_matplotlib
def test_relative_convergence_png(tmp_path):
    _assert_png(plots.convergence(_two_shapes(), tmp_path / "relative.png", group_by="study"))


def test_short_labels_drop_default_fields_and_move_the_common_ones_to_a_title():
    keys = ["b=1,h=28,d=128,causal=1,spans=0,span_len=0", "b=2,h=28,d=128,causal=0,spans=16,span_len=324"]
    labels, common = plots.short_problem_labels(keys, {"causal": "0", "spans": "0", "span_len": "0"})
    assert labels == {keys[0]: "b=1 causal=1", keys[1]: "b=2 spans=16 span_len=324"}
    assert common == "h=28 d=128"
    alone, nothing_common = plots.short_problem_labels(keys[:1], {"spans": "0", "span_len": "0"})
    assert alone == {keys[0]: "b=1 h=28 d=128 causal=1"} and nothing_common == ""
    # Without defaults only the common fields go; the labels stay distinct.
    labels, _ = plots.short_problem_labels(keys)
    assert len(set(labels.values())) == 2 and all("h=28" not in label for label in labels.values())


@needs_matplotlib
def test_roofline_of_memory_only_kernels_is_a_bandwidth_chart(tmp_path):
    cal = Calibration.from_metrics("NVIDIA_H200", {"copy_tbps": 4.23, "matmul_bf16_tflops": 793.0})
    points = [point_on_device(cal, "bf16", 0, 4.7e8, 0.12, label="t=65536 hkv=8"),
              point_on_device(cal, "bf16", 0, 2.3e5, 0.0044, label="t=64 hkv=4")]
    _assert_png(plots.roofline(points, cal, tmp_path / "bandwidth.png", title="kv_cache_write"))


def test_a_figure_that_cannot_be_written_leaves_the_earlier_one(tmp_path, monkeypatch):
    """A figure is written whole or not at all: a failed write keeps the previous file."""
    import os

    from omnitune.profile import plots

    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    path = tmp_path / "convergence.png"
    plots._save(Figure(), path)
    before = path.read_bytes()
    assert before.startswith(b"\x89PNG")

    def full_disk(fd):  # the data written, the flush to disk fails
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(OSError):
        fig = Figure()
        fig.add_subplot().plot([1, 2, 3])
        plots._save(fig, path)
    monkeypatch.undo()
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["convergence.png"]

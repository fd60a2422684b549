"""PNG figures of search and profile results: convergence, parameter importance, roofline.

Inputs are plain pandas DataFrames (shaped like the results database's trials table) and
dataclasses, so that every figure is drawn and tested without a database or a GPU. matplotlib is
imported inside the functions, on its Agg canvas without pyplot's global state, so that nothing
else pays for it or depends on a display.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from omnitune.profile.calibrate import Calibration
from omnitune.profile.roofline import RooflinePoint, roof_tflops

if TYPE_CHECKING:
    from matplotlib.figure import Figure

_DPI = 150


def _figure(width_in: float = 8.0, height_in: float = 5.0) -> Figure:
    from matplotlib.figure import Figure

    return Figure(figsize=(width_in, height_in), layout="constrained")


def _save(fig: Figure, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=_DPI, format="png")
    return path


def _ok_trials(df: pd.DataFrame) -> pd.DataFrame:
    """Trials that measured a usable time: status ok (when there is a status), time finite > 0."""
    ok = df
    if "status" in ok.columns:
        ok = ok[ok["status"] == "ok"]
    times = pd.to_numeric(ok["time_ms"], errors="coerce").astype(float)
    return ok[np.isfinite(times) & (times > 0)]


def _group_column(df: pd.DataFrame, group_by: str | None) -> str | None:
    if group_by is not None:
        if group_by not in df.columns:
            raise ValueError(f"no column {group_by!r} to group by; columns are {', '.join(df.columns)}")
        return group_by
    return next((c for c in ("sampler", "study") if c in df.columns), None)


def best_so_far(df: pd.DataFrame, group_by: str | None = None) -> pd.DataFrame:
    """Per group (sampler, else study, else one), the best ok time after each trial:
    columns group, trial_number, best_time_ms. Failed trials keep the best so far."""
    column = _group_column(df, group_by)
    ok_index = set(_ok_trials(df).index)
    frames = []
    for name, part in (df.groupby(column, sort=True) if column else [("all trials", df)]):
        part = part.sort_values("trial_number")
        times = pd.to_numeric(part["time_ms"], errors="coerce").where(part.index.isin(ok_index))
        frames.append(pd.DataFrame({
            "group": str(name),
            "trial_number": part["trial_number"].to_numpy(),
            "best_time_ms": times.cummin().ffill().to_numpy(),
        }))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(
        columns=["group", "trial_number", "best_time_ms"])


def convergence(df: pd.DataFrame, path: str | Path, *, group_by: str | None = None,
                title: str = "Search convergence") -> Path:
    """Best time so far against trial number, one line per sampler (or study); the default
    config's time, where the trials hold one (is_default), as a dashed line in the same colour.

    df needs trial_number and time_ms; status, sampler/study and is_default are used if present."""
    curves = best_so_far(df, group_by)
    if curves["best_time_ms"].notna().sum() == 0:
        raise ValueError("no successful trial to plot")
    column = _group_column(df, group_by)
    fig = _figure()
    ax = fig.subplots()
    for i, (name, curve) in enumerate(curves.groupby("group", sort=True)):
        color = f"C{i % 10}"
        ax.plot(curve["trial_number"], curve["best_time_ms"], drawstyle="steps-post", color=color,
                linewidth=2, label=name)
        if "is_default" in df.columns:
            rows = df if column is None else df[df[column].astype(str) == name]
            defaults = _ok_trials(rows[rows["is_default"].astype(bool)])
            if len(defaults):
                ax.axhline(float(defaults["time_ms"].min()), color=color, linestyle="--", linewidth=1,
                           label=f"{name}: default config")
    finite = curves["best_time_ms"].dropna()
    if finite.max() / finite.min() > 10:
        ax.set_yscale("log")
    ax.set_xlabel("trial number")
    ax.set_ylabel("best time so far (ms)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    return _save(fig, path)


def _configs(df: pd.DataFrame) -> pd.DataFrame:
    """One column per launch parameter, from config_json (text) or config (mappings)."""
    if "config_json" in df.columns:
        rows = [json.loads(text) for text in df["config_json"]]
    elif "config" in df.columns:
        rows = [dict(c) for c in df["config"]]
    else:
        raise ValueError("the trials need a config_json or config column")
    return pd.DataFrame(rows, index=df.index)


def parameter_importance(df: pd.DataFrame) -> pd.Series:
    """Per launch parameter, the share of the variance of log(time) that grouping the ok trials
    by that parameter's value explains (η², 0…1), sorted high to low.

    log time, so that a parameter that halves the time counts the same on fast and slow shapes;
    with several studies (problems) in df, each study's mean is removed first, so the differences
    between shapes are not credited to any parameter. Each parameter is judged alone: the shares
    of correlated parameters overlap and need not sum to 1."""
    ok = _ok_trials(df)
    if ok.empty:
        raise ValueError("no successful trial to judge parameters by")
    y = pd.Series([math.log(float(t)) for t in ok["time_ms"]], index=ok.index)
    if "study" in ok.columns:
        y = y - y.groupby(ok["study"]).transform("mean")
    params = _configs(ok)
    total = float(((y - y.mean()) ** 2).sum())
    shares = {}
    for name in params.columns:
        values = params[name].astype(str)
        if total == 0.0 or values.nunique() < 2:
            shares[name] = 0.0
            continue
        grouped = y.groupby(values)
        between = float((grouped.count() * (grouped.mean() - y.mean()) ** 2).sum())
        shares[name] = between / total
    return pd.Series(shares, name="importance", dtype=float).sort_values(ascending=False)


def param_importance(df: pd.DataFrame, path: str | Path, *,
                     title: str = "Launch-parameter importance") -> Path:
    """A bar chart of parameter_importance(df): which launch parameters decide the time."""
    importance = parameter_importance(df).sort_values()
    fig = _figure(7.0, max(2.5, 0.45 * len(importance) + 1.5))
    ax = fig.subplots()
    bars = ax.barh(importance.index, importance.to_numpy() * 100, color="C0")
    ax.bar_label(bars, labels=[f"{v * 100:.0f}%" for v in importance], padding=3, fontsize="small")
    ax.set_xlim(0, 110)
    ax.set_xlabel("variance of log(time) explained (%)")
    ax.set_ylabel("launch parameter")
    ax.set_title(title)
    ax.grid(True, axis="x", alpha=0.3)
    return _save(fig, path)


def roofline(points: Sequence[RooflinePoint], calibration: Calibration, path: str | Path, *,
             title: str | None = None) -> Path:
    """Log-log roofline of a device: the measured copy bandwidth as the slope, the measured matmul
    rate of each dtype among the points as a roof, each kernel a labelled point. Points without
    flops (copies) cannot sit on a log axis: they are listed in a note with their fraction of
    the bandwidth."""
    peak_tbps = calibration.copy_tbps
    if peak_tbps is None:
        raise ValueError(f"the calibration of {calibration.device_key} has no copy bandwidth")
    plotted = [p for p in points if p.achieved_tflops > 0 and math.isfinite(p.arithmetic_intensity_flop_per_byte)]
    memory_only = [p for p in points if p not in plotted]
    dtypes = sorted({p.dtype for p in points if p.dtype}) or ["bf16"]
    roofs = [(d, calibration.matmul_tflops(d)) for d in dtypes]
    roofs = [(d, peak) for d, peak in roofs if peak is not None]
    if not roofs:
        raise ValueError(f"the calibration of {calibration.device_key} has no matmul rate for {', '.join(dtypes)}")

    ridges = [peak / peak_tbps for _, peak in roofs]
    xs = [p.arithmetic_intensity_flop_per_byte for p in plotted] + ridges
    x_lo, x_hi = min(xs) / 8, max(xs) * 8
    grid = [x_lo * (x_hi / x_lo) ** (i / 200) for i in range(201)]

    fig = _figure(8.5, 5.5)
    ax = fig.subplots()
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.plot(grid, [x * peak_tbps for x in grid], color="0.6", linestyle=":", linewidth=1)
    for i, (dtype, peak) in enumerate(roofs):
        label = f"{'tf32' if dtype == 'fp32' else dtype} matmul {peak:.0f} TFLOP/s"
        ax.plot(grid, [roof_tflops(x, peak, peak_tbps) for x in grid], color=f"C{i}", linewidth=2, label=label)
        ridge = peak / peak_tbps
        ax.annotate(f"ridge {ridge:.0f} FLOP/byte", (ridge, peak), textcoords="offset points", xytext=(4, 6),
                    fontsize="x-small", color=f"C{i}")
    roof_colors = {dtype: f"C{i}" for i, (dtype, _) in enumerate(roofs)}
    ax.plot([], [], color="0.6", linestyle=":", label=f"copy bandwidth {peak_tbps:.2f} TB/s")
    for p in plotted:
        x = p.arithmetic_intensity_flop_per_byte
        # A point takes its dtype's roof colour: that roof is the one it is judged against.
        ax.scatter([x], [p.achieved_tflops], color=roof_colors.get(p.dtype, "black"), edgecolor="black",
                   zorder=3, s=30)
        # Labels of points in the right part of the axis go to their left, inside the frame.
        right_side = math.log(x / x_lo) > 0.6 * math.log(x_hi / x_lo)
        ax.annotate(f"{p.label} ({p.fraction_of_bound * 100:.0f}% of roof)", (x, p.achieved_tflops),
                    textcoords="offset points", xytext=(-6 if right_side else 6, -12),
                    ha="right" if right_side else "left", fontsize="small")
    if memory_only:
        note = "no FLOPs (memory only):\n" + "\n".join(
            f"{p.label}: {p.achieved_tbps:.2f} TB/s, {p.fraction_of_bound * 100:.0f}% of copy bandwidth"
            for p in memory_only)
        ax.text(0.98, 0.02, note, transform=ax.transAxes, ha="right", va="bottom", fontsize="small",
                bbox={"boxstyle": "round", "facecolor": "white", "edgecolor": "0.7"})
    top = max(peak for _, peak in roofs)
    lowest = min([p.achieved_tflops for p in plotted] + [x_lo * peak_tbps])
    ax.set_ylim(lowest / 2, top * 2)
    ax.set_xlim(x_lo, x_hi)
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("performance (TFLOP/s)")
    ax.set_title(title or f"Roofline — {calibration.device_key}")
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(loc="upper left", fontsize="small")
    return _save(fig, path)

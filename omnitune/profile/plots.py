"""PNG figures of search and profile results: convergence, parameter importance, roofline.

Labels come from `short_problem_labels`: problem keys without their default fields, and without
the fields every key shares (those go to the title once).

Inputs are plain pandas DataFrames (shaped like the results database's trials table) and
dataclasses, so that every figure is drawn and tested without a database or a GPU. matplotlib is
imported inside the functions, on its Agg canvas without pyplot's global state, so that nothing
else pays for it or depends on a display.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
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
    """Write the figure whole or not at all: into a temporary file beside `path`, then renamed
    over it, so that a failed write (a full disk) leaves an earlier figure as it was."""
    import io

    from omnitune.table_files import write_bytes_atomic

    buffer = io.BytesIO()
    fig.savefig(buffer, dpi=_DPI, format="png")
    path = Path(path)
    write_bytes_atomic(path, buffer.getvalue())
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
    columns group, trial_number, position (1, 2, … within the group, in trial order) and
    best_time_ms. Failed trials keep the best so far."""
    column = _group_column(df, group_by)
    ok_index = set(_ok_trials(df).index)
    frames = []
    for name, part in (df.groupby(column, sort=True) if column else [("all trials", df)]):
        part = part.sort_values("trial_number")
        times = pd.to_numeric(part["time_ms"], errors="coerce").where(part.index.isin(ok_index))
        frames.append(pd.DataFrame({
            "group": str(name),
            "trial_number": part["trial_number"].to_numpy(),
            "position": np.arange(1, len(part) + 1),
            "best_time_ms": times.cummin().ffill().to_numpy(),
        }))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(
        columns=["group", "trial_number", "position", "best_time_ms"])


@dataclass(frozen=True)
class ConvergenceLines:
    """What a convergence figure draws: per line (`group`), the best time so far at each count
    of configs measured (`position`), and `y`, that time as plotted — divided by the line's
    default-config time when `relative`."""

    curves: pd.DataFrame  # group, trial_number, position, best_time_ms, y
    defaults_ms: dict[str, float | None]
    relative: bool


def convergence_lines(
    df: pd.DataFrame, group_by: str | None = None, relative: bool | None = None
) -> ConvergenceLines:
    """The numbers behind `convergence`. Constraint-pruned trials are left out (they cost no GPU
    time); each line's default time is the best ok default-config trial among its trials, else
    among its studies' (another sampler's line may hold it). relative=None: relative when the
    lines span several studies and every line has a default time."""
    if "status" in df.columns:
        df = df[df["status"] != "pruned"]
    curves = best_so_far(df, group_by)
    if curves["best_time_ms"].notna().sum() == 0:
        raise ValueError("no successful trial to plot")
    column = _group_column(df, group_by)
    groups = [str(name) for name in sorted(curves["group"].unique())]
    defaults = {name: _default_time_ms(df, column, name) for name in groups}
    several_studies = "study" in df.columns and df["study"].nunique() > 1
    if relative is None:
        relative = several_studies and all(t is not None for t in defaults.values())
    elif relative and any(t is None for t in defaults.values()):
        raise ValueError("a relative convergence plot needs an ok default-config trial in every study")
    scale = curves["group"].map(lambda name: defaults[name] if relative else 1.0).astype(float)
    return ConvergenceLines(curves.assign(y=curves["best_time_ms"] / scale), defaults, relative)


def convergence(df: pd.DataFrame, path: str | Path, *, group_by: str | None = None,
                title: str = "Search convergence", relative: bool | None = None) -> Path:
    """Best time so far against the number of configs measured, one line per sampler (or study,
    or the given group column): convergence_lines, drawn.

    The x axis counts each line's own measured trials, so that lines of different samplers or
    studies start together and compare. Absolute: times in ms, each line's default config as a
    dashed line in its colour. Relative: each line divided by its default-config time, so that
    shapes whose times differ 50× share one axis and read as "fraction of the default's time"
    (1 = the default, dashed), on a linear axis that leaves a far-worse start off the top.
    df needs trial_number and time_ms; status, sampler/study and is_default are used if present."""
    from matplotlib.ticker import MaxNLocator

    lines = convergence_lines(df, group_by, relative)
    relative, defaults = lines.relative, lines.defaults_ms
    groups = sorted(defaults)
    fig = _figure(9.0, 5.5 + 0.18 * len(groups))
    ax = fig.subplots()
    plotted = []
    for i, name in enumerate(groups):
        curve = lines.curves[lines.curves["group"] == name]
        color = f"C{i % 10}"
        plotted.append(curve["y"])
        ax.plot(curve["position"], curve["y"], drawstyle="steps-post", color=color, linewidth=2, label=name)
        # The final best as a dot: a line of a single trial is otherwise invisible.
        last = curve.dropna(subset=["y"]).tail(1)
        ax.plot(last["position"], last["y"], marker="o", markersize=5, color=color)
        if not relative and defaults[name] is not None:
            ax.axhline(defaults[name], color=color, linestyle="--", linewidth=1)
    finite = pd.concat(plotted).dropna()
    if relative:
        ax.axhline(1.0, color="0.3", linestyle="--", linewidth=1, label="the default config")
        _clip_relative(ax, groups, plotted, finite)
    else:
        if any(t is not None for t in defaults.values()):
            ax.plot([], [], color="0.4", linestyle="--", linewidth=1, label="dashed: the default config")
        if finite.max() / finite.min() > 10:
            ax.set_yscale("log")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("configs measured")
    ax.set_ylabel("best time so far ÷ default config's time" if relative else "best time so far (ms)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    _legend(ax, len(groups) + 1)
    return _save(fig, path)


# Above this multiple of the default's time a line is off the chart: a sampler that starts far
# worse than the default (a grid's first configs) would otherwise squash every other line.
_RELATIVE_TOP = 1.5


def _clip_relative(ax, groups: list[str], curves: list[pd.Series], finite: pd.Series) -> None:
    """A linear axis from the best line's lowest point to a little above the default (at most
    _RELATIVE_TOP); lines that start higher enter from the top, and a note says where they began."""
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    bottom = float(finite.min())
    highest = max(float(finite.max()), 1.0)
    top = min(highest + 0.08 * (highest - bottom) + 1e-3, _RELATIVE_TOP)
    ax.set_ylim(bottom - 0.05 * (top - bottom), top)
    # Enough decimals that neighbouring ticks differ (a search that gained 2 % spans 0.98–1.00).
    decimals = max(2, math.ceil(-math.log10((top - bottom) / 5)))
    ax.yaxis.set_major_locator(MaxNLocator(nbins=10, steps=[1, 2, 5, 10]))  # ticks that round to themselves
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:.{decimals}f}×"))
    above = [f"{name} starts at {float(curve.dropna().iloc[0]):.1f}×" for name, curve in zip(groups, curves)
             if len(curve.dropna()) and float(curve.dropna().max()) > top]
    if above:
        ax.text(0.99, 0.98, "off the top: " + "; ".join(above), transform=ax.transAxes, ha="right", va="top",
                fontsize="x-small", bbox={"boxstyle": "round", "facecolor": "white", "edgecolor": "0.7"})


def _default_time_ms(df: pd.DataFrame, column: str | None, name: str) -> float | None:
    """The best ok time of the default config among a line's trials, else among the trials of
    the line's studies (another sampler's line may hold it); None if there is none."""
    if "is_default" not in df.columns:
        return None
    rows = df if column is None else df[df[column].astype(str) == name]
    found = _ok_trials(rows[rows["is_default"].astype(bool)])
    if found.empty and "study" in df.columns and column not in (None, "study"):
        studies = df[df["study"].isin(rows["study"].unique())]
        found = _ok_trials(studies[studies["is_default"].astype(bool)])
    return float(found["time_ms"].min()) if len(found) else None


def _legend(ax, entries: int) -> None:
    """Inside the axes when short; below them, in two columns, once it would cover the lines."""
    if entries > 4:
        ax.legend(fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.12), ncols=2, frameon=False)
    else:
        ax.legend(fontsize="small")


def short_problem_labels(
    problem_keys: Sequence[str], defaults: Mapping[str, str] | None = None
) -> tuple[dict[str, str], str]:
    """Legend labels for problem keys ('b=1,h=28,…,spans=0,span_len=0'): fields at their default
    value are dropped, and fields equal in every key are dropped too and returned once, as the
    common part (for a title). Returns ({key: label}, common). Labels stay distinct."""
    defaults = defaults or {}
    parsed = {key: _key_fields(key) for key in problem_keys}
    field_sets = list(parsed.values())
    common_fields = (
        [(name, value) for name, value in field_sets[0] if all((name, value) in fields for fields in field_sets[1:])]
        if len(field_sets) > 1 else []
    )
    common = [(n, v) for n, v in common_fields if defaults.get(n) != v]
    labels = {}
    for key, fields in parsed.items():
        kept = [(n, v) for n, v in fields if defaults.get(n) != v and (n, v) not in common_fields]
        labels[key] = " ".join(f"{n}={v}" for n, v in kept) or "defaults"
    if len(set(labels.values())) < len(labels):  # cannot happen for keys of one kernel; be safe
        labels = {key: key for key in problem_keys}
    return labels, " ".join(f"{n}={v}" for n, v in common)


def _key_fields(key: str) -> list[tuple[str, str]]:
    """'b=1,h=2' → [('b', '1'), ('h', '2')]; a part without '=' is kept whole as a name."""
    fields = []
    for part in filter(None, key.split(",")):
        name, _, value = part.partition("=")
        fields.append((name.strip(), value.strip()))
    return fields


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


# One marker per point (with the colour cycle): points that sit close together stay apart and
# are named in the legend, where labels written beside them would overlap.
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "*")


def roofline(points: Sequence[RooflinePoint], calibration: Calibration, path: str | Path, *,
             title: str | None = None) -> Path:
    """Log-log roofline of a device: the measured copy bandwidth as the slope, the measured matmul
    rate of each dtype among the points as a roof, each kernel a point with its own marker, named
    in a legend below with its fraction of the roof that bounds it. Points without flops (copies)
    cannot sit on a log axis: they are listed in a note with their fraction of the bandwidth; when
    every point is one, the figure is a bar chart of TB/s against the copy bandwidth instead."""
    peak_tbps = calibration.copy_tbps
    if peak_tbps is None:
        raise ValueError(f"the calibration of {calibration.device_key} has no copy bandwidth")
    plotted = [p for p in points if p.achieved_tflops > 0 and math.isfinite(p.arithmetic_intensity_flop_per_byte)]
    memory_only = [p for p in points if p not in plotted]
    if memory_only and not plotted:
        return _bandwidth_bars(memory_only, peak_tbps, path, title=title or f"Bandwidth — {calibration.device_key}")
    dtypes = sorted({p.dtype for p in points if p.dtype}) or ["bf16"]
    roofs = [(d, calibration.matmul_tflops(d)) for d in dtypes]
    roofs = [(d, peak) for d, peak in roofs if peak is not None]
    if not roofs:
        raise ValueError(f"the calibration of {calibration.device_key} has no matmul rate for {', '.join(dtypes)}")

    ridges = [peak / peak_tbps for _, peak in roofs]
    xs = [p.arithmetic_intensity_flop_per_byte for p in plotted] + ridges
    x_lo, x_hi = min(xs) / 8, max(xs) * 8
    grid = [x_lo * (x_hi / x_lo) ** (i / 200) for i in range(201)]

    fig = _figure(8.5, 5.5 + 0.2 * len(plotted))
    ax = fig.subplots()
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.plot(grid, [x * peak_tbps for x in grid], color="0.6", linestyle=":", linewidth=1)
    roof_styles = ("-", "--", "-.")
    roof_handles = []
    for i, (dtype, peak) in enumerate(roofs):
        label = f"{'tf32' if dtype == 'fp32' else dtype} matmul {peak:.0f} TFLOP/s"
        (line,) = ax.plot(grid, [roof_tflops(x, peak, peak_tbps) for x in grid], color="0.15",
                          linestyle=roof_styles[i % len(roof_styles)], linewidth=1.8, label=label)
        roof_handles.append(line)
        ridge = peak / peak_tbps
        ax.annotate(f"ridge {ridge:.0f} FLOP/byte", (ridge, peak), textcoords="offset points", xytext=(4, 6),
                    fontsize="x-small", color="0.15")
    (copy_line,) = ax.plot([], [], color="0.6", linestyle=":", label=f"copy bandwidth {peak_tbps:.2f} TB/s")
    point_handles = []
    for i, p in enumerate(plotted):
        # Each point is judged by the roof above it: bandwidth left of the ridge, matmul right of it.
        if p.bound_by.value == "memory":
            figure = f"{p.achieved_tbps:.2f} TB/s, {p.fraction_of_bound * 100:.0f}% of the copy bandwidth"
        else:
            roof = "tf32" if p.dtype == "fp32" else p.dtype
            figure = f"{p.achieved_tflops:.0f} TFLOP/s, {p.fraction_of_bound * 100:.0f}% of the {roof} matmul roof"
        point_handles.append(ax.scatter(
            [p.arithmetic_intensity_flop_per_byte], [p.achieved_tflops], marker=_MARKERS[i % len(_MARKERS)],
            color=f"C{i % 10}", edgecolor="black", linewidth=0.6, zorder=3, s=55, label=f"{p.label}: {figure}",
        ))
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
    roof_legend = ax.legend(handles=roof_handles + [copy_line], loc="upper left", fontsize="small")
    ax.add_artist(roof_legend)
    if point_handles:
        ax.legend(handles=point_handles, loc="upper center", bbox_to_anchor=(0.5, -0.12), fontsize="small",
                  frameon=False, ncols=1)
    return _save(fig, path)


def _bandwidth_bars(points: Sequence[RooflinePoint], peak_tbps: float, path: str | Path, *, title: str) -> Path:
    """Memory-only kernels: achieved TB/s per point against the measured copy bandwidth."""
    fig = _figure(8.0, max(2.8, 0.5 * len(points) + 1.8))
    ax = fig.subplots()
    labels = [p.label for p in points]
    values = [p.achieved_tbps for p in points]
    ax.barh(labels, values, color="C0")
    for row, p in enumerate(points):
        text = f"{p.achieved_tbps:.2f} TB/s ({p.fraction_of_bound * 100:.0f}%)"
        # Inside a long bar (the bandwidth line would cross a label beside it), else beside it.
        inside = p.achieved_tbps > 0.5 * peak_tbps
        ax.text(p.achieved_tbps * (0.98 if inside else 1.0) + (0 if inside else 0.01 * peak_tbps), row, text,
                va="center", ha="right" if inside else "left", fontsize="small",
                color="white" if inside else "black")
    ax.axvline(peak_tbps, color="0.15", linestyle="--", linewidth=1.5)
    # Named beside the line rather than in a legend, which would sit on a bar or its label.
    ax.annotate(f"copy bandwidth\n{peak_tbps:.2f} TB/s", xy=(peak_tbps, 0.0), xycoords=("data", "axes fraction"),
                xytext=(4, 4), textcoords="offset points", fontsize="x-small", ha="left", va="bottom")
    ax.set_xlim(0, peak_tbps * 1.3)
    ax.invert_yaxis()  # first point on top, as listed
    ax.set_xlabel("achieved TB/s (memory only: no FLOPs to place on a roofline)")
    ax.set_title(title)
    ax.grid(True, axis="x", alpha=0.3)
    return _save(fig, path)

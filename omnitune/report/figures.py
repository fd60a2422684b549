"""The report's figures (omnitune.profile.plots): per kernel, search convergence, launch-
parameter importance and the roofline of each key's best."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from omnitune.profile.calibrate import Calibration
from omnitune.report.frame import _OK, CALIBRATE_HINT, roofline_point_of, search_trials


@dataclass(frozen=True)
class FiguresWritten:
    """What write_figures did: the PNGs written, and one line per figure it had to skip."""

    paths: tuple[Path, ...]
    notes: tuple[str, ...]


def problem_defaults_of(problem_type: type) -> dict[str, str]:
    """The fields of a problem dataclass that have a default, written as problem keys write
    them (booleans as 1/0): the parts of a key that short labels may leave out."""
    import dataclasses

    defaults = {}
    for f in dataclasses.fields(problem_type):
        if f.default is not dataclasses.MISSING:
            value = f.default
            defaults[f.name] = ("1" if value else "0") if isinstance(value, bool) else str(value)
    return defaults


def write_figures(
    trials: pd.DataFrame,
    summary: pd.DataFrame,
    calibrations: Mapping[str, Calibration],
    out_dir: Path,
    *,
    problem_defaults=None,
) -> FiguresWritten:
    """Per kernel, into out_dir: <kernel>_convergence.png (best time so far per study, or per
    sampler where several searched one key), <kernel>_importance.png (which launch parameters
    decide the time) and <kernel>_roofline.png (each key's best on the device's measured roofline;
    one file per device, suffixed by its key, when a kernel was tuned on several).

    `problem_defaults(kernel)` gives the problem fields with defaults, left out of the labels.
    A figure that cannot be drawn (nothing ok, no calibration) is skipped with a note."""
    from omnitune.profile import plots

    out_dir = Path(out_dir)
    searched = search_trials(trials)
    paths: list[Path] = []
    notes: list[str] = []
    uncalibrated: set[str] = set()
    for kernel, rows in searched.groupby("kernel", sort=True):
        # The interpreter's times say nothing about a GPU: drawn only when there is nothing else.
        on_gpu = rows["representative"].fillna(0) != 0
        rows = rows[on_gpu] if on_gpu.any() else rows
        defaults = problem_defaults(kernel) if problem_defaults else {}
        labels, common = plots.short_problem_labels(sorted(rows["problem_key"].unique()), defaults)
        suffix = f" ({common})" if common else ""
        if not on_gpu.any():
            suffix += " — interpreter, not representative"
        lines = rows.assign(line=_line_labels(rows, labels))
        try:
            paths.append(plots.convergence(lines, out_dir / f"{kernel}_convergence.png", group_by="line",
                                           title=f"{kernel}: search convergence{suffix}"))
            ok = rows[rows["status"] == _OK]
            shapes = ok["study"].nunique()
            paths.append(plots.param_importance(
                rows, out_dir / f"{kernel}_importance.png",
                title=f"{kernel}: launch-parameter importance\n({len(ok)} ok trials over {shapes} "
                f"shape{'s' if shapes != 1 else ''}; each parameter judged alone)"))
        except ValueError:
            notes.append(f"{kernel}: no trial ran ok, so no convergence or importance figure")
            continue
        best = summary[summary["kernel"] == kernel]
        placed = []  # (device key, its name, its points)
        for device, on_device in best.groupby("device_key", sort=True):
            names = on_device["device_name"].dropna()
            device_name = str(names.iloc[0]) if len(names) else device
            calibration = calibrations.get(device)
            points = [roofline_point_of(r, calibration, label=labels.get(r["problem_key"], r["problem_key"]))
                      for r in on_device.to_dict("records")]
            points = [pt for pt in points if pt is not None]
            if points:
                placed.append((device, device_name, points))
            elif calibration is None and on_device["representative"].any():
                uncalibrated.add(device_name)
        for device, device_name, points in placed:
            name = f"{kernel}_roofline.png" if len(placed) == 1 else f"{kernel}_roofline_{device}.png"
            title = f"{kernel} on {device_name}: roofline{suffix}"
            paths.append(plots.roofline(points, calibrations[device], out_dir / name, title=title))
    if uncalibrated:
        notes.append(f"roofline figure skipped: no calibration for {', '.join(sorted(uncalibrated))}; {CALIBRATE_HINT}")
    return FiguresWritten(tuple(paths), tuple(notes))


def _line_labels(rows: pd.DataFrame, labels: Mapping[str, str]) -> list[str]:
    """One convergence line per study, named by its short problem label (with dtype and device
    where the kernel has several); per sampler where several samplers searched one study."""
    several_dtypes = rows["dtype"].nunique() > 1
    several_devices = rows["device_key"].nunique() > 1
    samplers_per_study = rows.groupby("study")["sampler"].nunique()
    names = []
    for r in rows.to_dict("records"):
        name = labels.get(r["problem_key"], r["problem_key"])
        if several_dtypes:
            name += f" {r['dtype']}"
        if several_devices:
            name += f" · {r['device_name'] if isinstance(r['device_name'], str) else r['device_key']}"
        if samplers_per_study[r["study"]] > 1:
            name += f" · {r['sampler']}"
        names.append(name)
    return names

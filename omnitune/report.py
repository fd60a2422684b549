"""What a search found: the results database turned into a DataFrame, and that frame rendered.

Pure functions over pandas: `load_trials`, `load_calibrations` and `load_profiles` read the
database through omnitune.store (read-only: reporting never creates or migrates one), `best_per_key` reduces the trials
to one row per kernel × problem × dtype × device, `summarize` picks the columns a person reads —
with each result placed on its device's measured roofline and beside its ncu profile — and the
`render_*` functions turn a summary into a rich table, CSV, Markdown or JSON. `write_figures`
draws the PNGs of omnitune.profile.plots. The CLI (omnitune/cli/tables_cmd.py) only chooses among
them; omnitune.export builds on `best_per_key`.

Re-timed finalists (omnitune.search.finalists): a re-timing is a trial row of its own whose
extra_json holds a "finalist" entry. Where a key has re-timings, its best is the lowest median of
its latest re-timing, and the default's time comes from that re-timing too when it was among
them; the counts (trials, failures) and the figures count only the search's own trials.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from omnitune import store
from omnitune.errors import OmnituneError
from omnitune.profile.calibrate import Calibration
from omnitune.profile.roofline import RooflinePoint, point_on_device
from omnitune.search.finalists import NOISY_CV, finalist_facts
from omnitune.trial import TrialStatus

KEY_COLUMNS = ["kernel", "problem_key", "dtype", "device_key"]

# The catalogue's columns, as omnitune.store defines them (TrialRecord).
TRIAL_COLUMNS = list(store.TRIAL_COLUMNS)

PROFILE_COLUMNS = [
    "id", "kernel", "problem_key", "dtype", "device_key", "config_json", "config_label", "which",
    "duration_us", "l1_hit_pct", "l2_hit_pct", "dram_pct_of_peak", "achieved_occupancy_pct", "measured_at",
]

# The ncu profile shown beside a result (see profile_per_key): which config it is of, and its counters.
NCU_COLUMNS = [
    "ncu_which", "ncu_config", "ncu_duration_us", "ncu_l1_hit_pct", "ncu_l2_hit_pct",
    "ncu_dram_pct_of_peak", "ncu_occupancy_pct",
]

SUMMARY_COLUMNS = [
    "kernel", "problem_key", "dtype", "device_key", "device_name", "best_config", "time_ms",
    "p20_ms", "p80_ms", "cv", "noisy", "tflops", "tbps", "tflops_fraction_of_peak",
    "tbps_fraction_of_peak", "bound_by", "default_time_ms", "speedup_vs_default", "trials",
    "ok_trials", "failures", "pruned", "representative", *NCU_COLUMNS,
]

CALIBRATE_HINT = "run omnitune calibrate on it to read TFLOP/s and TB/s against its measured roofline"

NOT_REPRESENTATIVE_MARK = "⚠ interpreter"
NOT_REPRESENTATIVE_NOTE = (
    f"{NOT_REPRESENTATIVE_MARK}: measured under Triton's interpreter — correctness only, "
    "times are not representative."
)

_OK = "ok"
# Configs the constraints rejected before anything compiled: not trials (nothing was measured),
# counted apart from them and from the failures.
_PRUNED = TrialStatus.PRUNED.value


# --- reading -------------------------------------------------------------------------------------


def load_trials(db_path: Path, kernel: str | None = None) -> pd.DataFrame:
    """Every row of the results database's `trials` table (of one kernel if given).

    Opened read-only: a missing file is a StoreError, never a new empty database. A database
    without a trials table yet gives an empty frame."""
    return store.read_trials(db_path, kernel)


def load_devices(db_path: Path) -> pd.DataFrame:
    """The `devices` table (one row per GPU key), empty if the database has none."""
    return store.read_devices(db_path)


def load_calibrations(db_path: Path) -> dict[str, Calibration]:
    """Each calibrated device's ceilings (`omnitune calibrate`), by device key."""
    rows = store.read_table(db_path, "calibrations", ["device_key", "metric", "value"])
    return {
        key: Calibration.from_metrics(key, dict(zip(group["metric"], group["value"])))
        for key, group in rows.groupby("device_key", sort=True)
    }


def load_profiles(db_path: Path, kernel: str | None = None) -> pd.DataFrame:
    """The `profiles` table (ncu counters per profiled config), of one kernel if given."""
    return store.read_table(db_path, "profiles", PROFILE_COLUMNS, where="kernel", value=kernel)


# --- reducing ------------------------------------------------------------------------------------


def with_retiming(trials: pd.DataFrame) -> pd.DataFrame:
    """The trials with the columns of a finalist's re-timing read from extra_json: retime_session
    (NaN for the search's own trials), cv and noisy."""
    facts = [finalist_facts(_json_object(text)) for text in trials["extra_json"]]
    out = trials.copy()
    out["retime_session"] = pd.Series([f["session"] if f else math.nan for f in facts], index=trials.index, dtype=float)
    out["cv"] = pd.Series([f["cv"] if f else math.nan for f in facts], index=trials.index, dtype=float)
    out["noisy"] = pd.Series([bool(f["cv"] > NOISY_CV) if f else None for f in facts], index=trials.index,
                             dtype=object)
    return out


def search_trials(trials: pd.DataFrame) -> pd.DataFrame:
    """The search's own trials: without the finalists' re-timings (which repeat configs)."""
    return trials[with_retiming(trials)["retime_session"].isna()]


def _json_object(text) -> dict:
    try:
        value = json.loads(text) if isinstance(text, str) else {}
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def best_per_key(trials: pd.DataFrame) -> pd.DataFrame:
    """One row per kernel × problem × dtype × device.

    Each row holds the best ok trial's columns (lowest time_ms, ties to the lowest trial_number;
    NaN when no trial of the key is ok) plus: default_time_ms (the default config's best ok
    time), default_config_json, speedup_vs_default (default_time_ms / time_ms), trials (the
    configs measured: every status but pruned), ok_trials, failures (e.g. "mismatch 2,
    compile_error 1"), pruned (configs the constraints rejected before compiling: not trials),
    representative (False if any trial ran under the interpreter), and cv and noisy (NaN/None
    unless re-timed).

    Where a key's finalists were re-timed, the best is the fastest of its latest re-timing, and
    default_time_ms is the default's re-timed median when it was re-timed with them: times that
    were measured side by side are compared with each other."""
    extra = ["default_time_ms", "default_config_json", "speedup_vs_default", "trials", "ok_trials",
             "failures", "pruned", "cv", "noisy"]
    if trials.empty:
        return pd.DataFrame(columns=TRIAL_COLUMNS + extra)
    annotated = with_retiming(trials)
    retimed = annotated["retime_session"].notna()
    trials = annotated[~retimed]
    latest = annotated[retimed & (annotated["status"] == _OK) & annotated["time_ms"].notna()]
    latest = latest[latest["retime_session"] == latest.groupby(KEY_COLUMNS)["retime_session"].transform("max")]
    groups = trials.groupby(KEY_COLUMNS, sort=True)
    stats = pd.DataFrame({
        "trials": groups["status"].agg(lambda s: int((s != _PRUNED).sum())),
        "ok_trials": groups["status"].agg(lambda s: int((s == _OK).sum())),
        "failures": groups["status"].agg(failure_summary),
        "pruned": groups["status"].agg(lambda s: int((s == _PRUNED).sum())),
        "representative": groups["representative"].agg(lambda s: bool((s.fillna(0) != 0).all())),
    })

    ok = trials[(trials["status"] == _OK) & trials["time_ms"].notna()]
    # A key with a re-timing takes its best from it alone: those medians were measured side by side.
    retimed_keys = pd.MultiIndex.from_frame(latest[KEY_COLUMNS]) if len(latest) else None
    candidates = ok if retimed_keys is None else pd.concat(
        [ok[~pd.MultiIndex.from_frame(ok[KEY_COLUMNS]).isin(retimed_keys)], latest])
    best = (
        candidates.sort_values(["time_ms", "trial_number"], kind="stable")
        .drop_duplicates(KEY_COLUMNS)
        .set_index(KEY_COLUMNS)
        .drop(columns=["representative", "retime_session"])
    )
    searched_default = ok[ok["is_default"] == 1].groupby(KEY_COLUMNS)["time_ms"].min()
    retimed_default = latest[latest["is_default"] == 1].groupby(KEY_COLUMNS)["time_ms"].min()
    default_time = retimed_default.combine_first(searched_default).rename("default_time_ms")
    # The default's config, preferably from a trial that ran ok (any one will do: they are equal).
    defaults = trials[trials["is_default"] == 1].assign(_failed=lambda d: d["status"] != _OK)
    default_config = (
        defaults.sort_values(["_failed", "time_ms"], kind="stable", na_position="last")
        .drop_duplicates(KEY_COLUMNS)
        .set_index(KEY_COLUMNS)["config_json"]
        .rename("default_config_json")
    )

    out = stats.join(best, how="left").join(default_time, how="left").join(default_config, how="left")
    out["speedup_vs_default"] = out["default_time_ms"] / out["time_ms"]
    # Keys without an ok trial still need their device's name for display.
    names = groups["device_name"].first()
    out["device_name"] = out["device_name"].where(out["device_name"].notna(), names)
    return out.reset_index()[TRIAL_COLUMNS + extra]


def failure_summary(statuses: pd.Series) -> str:
    """'mismatch 2, compile_error 1': failed trials by status, most frequent first (pruned
    configs are not trials, so not failures either)."""
    counts = Counter(s for s in statuses if s not in (_OK, _PRUNED))
    ordered = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return ", ".join(f"{status} {n}" for status, n in ordered)


def summarize(
    trials: pd.DataFrame,
    calibrations: Mapping[str, Calibration] | None = None,
    profiles: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """The report: one row per kernel × problem × dtype × device with SUMMARY_COLUMNS, sorted.

    With `calibrations` (by device key), each result is placed on its device's roofline: its
    TFLOP/s over the matmul roof of its dtype, its TB/s over the copy bandwidth, and which of the
    two bounds it (NaN where the device is not calibrated). With `profiles`, the ncu columns hold
    the profile chosen by profile_per_key."""
    best = best_per_key(trials)
    summary = best.rename(columns={"config_label": "best_config"})
    summary = roofline_columns(summary, calibrations or {})
    summary = _with_profile_columns(summary, profiles)
    summary = summary[SUMMARY_COLUMNS].copy()
    summary["representative"] = summary["representative"].astype(bool)
    for column in ("trials", "ok_trials", "pruned"):
        summary[column] = summary[column].astype(int)
    return summary.sort_values(KEY_COLUMNS, kind="stable").reset_index(drop=True)


# --- the roofline ---------------------------------------------------------------------------------


def roofline_point_of(row: Mapping, calibration: Calibration | None, label: str = "") -> RooflinePoint | None:
    """Where one result (a row with time_ms, tflops, tbps, dtype) sits on its device's measured
    roofline; None without a calibration holding the roofs it needs, or without rates (the
    interpreter's results, a failed key)."""
    time_ms, tflops, tbps = (_float(row.get(c)) for c in ("time_ms", "tflops", "tbps"))
    if calibration is None or not (time_ms > 0) or not (tflops >= 0 and tbps >= 0) or tflops + tbps <= 0:
        return None
    # The analytic counts behind the stored rates: rate × time.
    flops, bytes_moved = tflops * time_ms * 1e9, tbps * time_ms * 1e9
    try:
        return point_on_device(calibration, row["dtype"], flops, bytes_moved, time_ms, label=label)
    except (OmnituneError, ValueError):
        return None  # no roof for this dtype in the calibration


def roofline_columns(summary: pd.DataFrame, calibrations: Mapping[str, Calibration]) -> pd.DataFrame:
    """`summary` with tflops_fraction_of_peak, tbps_fraction_of_peak and bound_by ('memory' or
    'compute', None where there is no point)."""
    points = [roofline_point_of(row, calibrations.get(row["device_key"])) for row in summary.to_dict("records")]
    out = summary.copy()
    out["tflops_fraction_of_peak"] = [p.achieved_tflops / p.peak_tflops if p else math.nan for p in points]
    out["tbps_fraction_of_peak"] = [p.achieved_tbps / p.peak_tbps if p else math.nan for p in points]
    out["bound_by"] = pd.Series([p.bound_by.value if p else None for p in points], index=out.index, dtype=object)
    return out


def uncalibrated_devices(summary: pd.DataFrame, calibrations: Mapping[str, Calibration]) -> list[str]:
    """Names of the GPUs whose results cannot be placed on a roofline for want of a calibration
    (the interpreter has none to want)."""
    rows = summary[summary["representative"] & summary["time_ms"].notna()]
    missing = rows[rows["bound_by"].isna() & (rows["tflops"].fillna(0) + rows["tbps"].fillna(0) > 0)]
    names = {(r["device_name"] if isinstance(r["device_name"], str) else r["device_key"])
             for r in missing.to_dict("records")}
    return sorted(names)


def calibration_note(summary: pd.DataFrame, calibrations: Mapping[str, Calibration]) -> str | None:
    """One line for below the table when a GPU of the report lacks a calibration; else None."""
    missing = uncalibrated_devices(summary, calibrations)
    if not missing:
        return None
    return f"no calibration for {', '.join(missing)}: {CALIBRATE_HINT}"


# --- ncu profiles ---------------------------------------------------------------------------------


def profiles_for(summary: pd.DataFrame, profiles: pd.DataFrame | None) -> pd.DataFrame:
    """The profiles of the keys the summary shows, by key, then tuned, default, custom, oldest first."""
    if profiles is None or profiles.empty or summary.empty:
        return pd.DataFrame(columns=PROFILE_COLUMNS)
    keys = pd.MultiIndex.from_frame(summary[KEY_COLUMNS])
    shown = profiles[pd.MultiIndex.from_frame(profiles[KEY_COLUMNS]).isin(keys)]
    order = {"tuned": 0, "default": 1, "custom": 2}
    shown = shown.assign(_which=shown["which"].map(order).fillna(3))
    shown = shown.sort_values([*KEY_COLUMNS, "_which", "id"], kind="stable")
    return shown.drop(columns="_which").reset_index(drop=True)


def profile_per_key(summary: pd.DataFrame, profiles: pd.DataFrame | None) -> dict[tuple, dict]:
    """Per key, the one profile to show beside its result: the newest of the best config, else
    the newest 'tuned' one, else the newest of any config."""
    chosen: dict[tuple, dict] = {}
    shown = profiles_for(summary, profiles)
    if shown.empty:
        return chosen
    best_config = {tuple(r[c] for c in KEY_COLUMNS): r["config_json"] for r in summary.to_dict("records")
                   if "config_json" in r}
    for key, group in shown.groupby(KEY_COLUMNS, sort=False):
        rows = group.sort_values("id", ascending=False).to_dict("records")
        preferred = ([r for r in rows if r["config_json"] == best_config.get(key)]
                     + [r for r in rows if r["which"] == "tuned"] + rows)
        chosen[key] = preferred[0]
    return chosen


def _with_profile_columns(summary: pd.DataFrame, profiles: pd.DataFrame | None) -> pd.DataFrame:
    chosen = profile_per_key(summary, profiles)
    fields = {"ncu_which": "which", "ncu_config": "config_label", "ncu_duration_us": "duration_us",
              "ncu_l1_hit_pct": "l1_hit_pct", "ncu_l2_hit_pct": "l2_hit_pct",
              "ncu_dram_pct_of_peak": "dram_pct_of_peak", "ncu_occupancy_pct": "achieved_occupancy_pct"}
    out = summary.copy()
    keys = [tuple(r[c] for c in KEY_COLUMNS) for r in summary.to_dict("records")]
    for column, field in fields.items():
        values = [chosen[k][field] if k in chosen else None for k in keys]
        text = column in ("ncu_which", "ncu_config")
        out[column] = pd.Series(values, index=out.index, dtype=object if text else float)
    return out


def _float(value) -> float:
    return math.nan if _is_missing(value) else float(value)


# --- figures -------------------------------------------------------------------------------------


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


# --- rendering -----------------------------------------------------------------------------------


def render_csv(summary: pd.DataFrame) -> str:
    """Machine-readable: every SUMMARY_COLUMN, raw numbers, empty cells for missing values."""
    return summary.to_csv(index=False, lineterminator="\n")


def render_json(summary: pd.DataFrame) -> str:
    """A JSON list of rows (missing numbers as null), newline-terminated."""
    records = [
        {k: _json_value(v) for k, v in row.items()} for row in summary.to_dict(orient="records")
    ]
    return json.dumps(records, indent=2) + "\n"


def display_frame(summary: pd.DataFrame) -> pd.DataFrame:
    """The summary as the strings a person reads (the table and Markdown formats)."""
    rows = []
    for r in summary.to_dict(orient="records"):
        rows.append({
            "kernel": r["kernel"],
            "problem": r["problem_key"],
            "dtype": r["dtype"],
            "device": r["device_name"] if isinstance(r["device_name"], str) else r["device_key"],
            "best config": r["best_config"] if isinstance(r["best_config"], str) else "—",
            "ms": _number(r["time_ms"], "#.4g"),
            "p20–p80 ms": _spread(r["p20_ms"], r["p80_ms"]),
            "CV": _cv(r["cv"], r["noisy"]),
            "TFLOP/s": _rate(r["tflops"], ".1f", r["tflops_fraction_of_peak"]),
            "TB/s": _rate(r["tbps"], ".2f", r["tbps_fraction_of_peak"]),
            "bound": r["bound_by"] if isinstance(r["bound_by"], str) else "—",
            "default ms": _number(r["default_time_ms"], "#.4g"),
            "speedup": _number(r["speedup_vs_default"], ".2f", suffix="×"),
            "trials": str(r["trials"]),
            "failures": r["failures"] or "",
            "pruned": str(r["pruned"]),
            "note": "" if r["representative"] else NOT_REPRESENTATIVE_MARK,
        })
    columns = ["kernel", "problem", "dtype", "device", "best config", "ms", "p20–p80 ms", "CV", "TFLOP/s",
               "TB/s", "bound", "default ms", "speedup", "trials", "failures", "pruned", "note"]
    return pd.DataFrame(rows, columns=columns)


def profile_display_frame(profiles: pd.DataFrame, device_names: Mapping[str, str] | None = None) -> pd.DataFrame:
    """Stored ncu profiles (profiles_for) as the strings a person reads."""
    names = device_names or {}
    rows = [{
        "kernel": r["kernel"],
        "problem": r["problem_key"],
        "dtype": r["dtype"],
        "device": names.get(r["device_key"], r["device_key"]),
        "config": r["config_label"] if isinstance(r["config_label"], str) else r["config_json"],
        "which": r["which"],
        "µs": _number(r["duration_us"], ".1f"),
        "L1 hit %": _number(r["l1_hit_pct"], ".1f"),
        "L2 hit %": _number(r["l2_hit_pct"], ".1f"),
        "DRAM % of peak": _number(r["dram_pct_of_peak"], ".1f"),
        "occupancy %": _number(r["achieved_occupancy_pct"], ".1f"),
    } for r in profiles.to_dict(orient="records")]
    columns = ["kernel", "problem", "dtype", "device", "config", "which", "µs", "L1 hit %", "L2 hit %",
               "DRAM % of peak", "occupancy %"]
    return pd.DataFrame(rows, columns=columns)


_NUMERIC_DISPLAY = {"ms", "p20–p80 ms", "CV", "TFLOP/s", "TB/s", "default ms", "speedup", "trials", "pruned", "µs",
                    "L1 hit %", "L2 hit %", "DRAM % of peak", "occupancy %"}


def _markdown_table(frame: pd.DataFrame) -> list[str]:
    lines = [
        "| " + " | ".join(frame.columns) + " |",
        "| " + " | ".join("---:" if c in _NUMERIC_DISPLAY else "---" for c in frame.columns) + " |",
    ]
    for row in frame.itertuples(index=False):
        lines.append("| " + " | ".join(str(cell).replace("|", "\\|") for cell in row) + " |")
    return lines


def render_markdown(summary: pd.DataFrame, profiles: pd.DataFrame | None = None, notes: tuple[str, ...] = ()) -> str:
    """A GitHub-flavoured Markdown table, then the ncu profiles of its keys (profiles_for) as a
    second table, then the interpreter footnote and `notes` where they apply."""
    lines = _markdown_table(display_frame(summary))
    if profiles is not None and not profiles.empty:
        lines += ["", "ncu profiles:", ""]
        lines += _markdown_table(profile_display_frame(profiles, _device_names(summary)))
    footnotes = ([] if summary["representative"].all() else [NOT_REPRESENTATIVE_NOTE]) + list(notes)
    for note in footnotes:
        lines += ["", note]
    return "\n".join(lines) + "\n"


def render_table(summary: pd.DataFrame, title: str = "", profiles: pd.DataFrame | None = None,
                 notes: tuple[str, ...] = ()):
    """The `table` format: one table per kernel × device × dtype (so none needs a column), each
    problem key whole on a line of its own (it can be copied back as --shape), and below it two
    lines per result — median over spread (the CV where the finalists were re-timed), TFLOP/s
    over TB/s (each with its fraction of the device's measured roof) beside the bound, default
    time over speedup, trials over failures and pruned configs — so that it stays legible in an
    80-column terminal. Then a table of the ncu profiles of the keys shown (profiles_for), and
    `notes`. Print it with crop=False (see omnitune.keyed_table)."""
    from rich.console import Group
    from rich.markup import escape

    from omnitune.keyed_table import Column, KeyedTable

    frame = display_frame(summary)
    parts: list = [title] if title else []
    for (kernel, device, dtype), rows in frame.groupby(["kernel", "device", "dtype"], sort=False):
        marked = (rows["note"] != "").any()
        heading = f"[bold]{escape(kernel)}[/] on [bold]{escape(device)}[/], {dtype}"
        table = KeyedTable(
            [Column("best config", wrap=True, min_width=10), Column("ms\np20–p80/CV", "right"),
             Column("TFLOP/s\nTB/s", "right"), Column("bound", "right"), Column("default\nspeedup", "right"),
             Column("trials\nfailures", wrap=True, min_width=8)],
            title=heading + (f"  [yellow]{NOT_REPRESENTATIVE_MARK}[/]" if marked else ""),
            caption=NOT_REPRESENTATIVE_NOTE if marked else None,
        )
        for index, r in rows.iterrows():
            raw = summary.iloc[index]  # display_frame keeps the summary's order, from 0
            median = r["ms"] + (" [yellow]⚠[/]" if r["note"] else "")
            if r["CV"] == "—":
                spread = r["p20–p80 ms"]
            else:  # re-timed: the CV is the spread that decided the ranking
                noisy = r["CV"].endswith(NOISY_MARK)
                spread = f"CV {r['CV']}"
                median += " [yellow]noisy[/]" if noisy else ""
                spread = spread.removesuffix(f" {NOISY_MARK}")
            table.add_row(
                r["problem"], escape(r["best config"]),
                _two_lines(median, spread),
                # Without parentheses: two characters that an 80-column terminal needs elsewhere.
                _two_lines(_rate(raw["tflops"], ".1f", raw["tflops_fraction_of_peak"], parens=False),
                           _rate(raw["tbps"], ".2f", raw["tbps_fraction_of_peak"], parens=False)),
                r["bound"],
                _two_lines(r["default ms"], r["speedup"]),
                _two_lines(r["trials"], escape(_failures_and_pruned(r["failures"], raw["pruned"]))),
            )
        parts.append(table)
    if profiles is not None and not profiles.empty:
        parts.append(_profiles_table(profile_display_frame(profiles, _device_names(summary))))
    parts += [escape(note) for note in notes]
    return Group(*parts)


def _failures_and_pruned(failures: str, pruned: int) -> str:
    """'mismatch 1 · 2 pruned': the failed trials, then the configs pruned before any trial."""
    return " · ".join(part for part in (failures, f"{pruned} pruned" if pruned else "") if part)


def _profiles_table(frame: pd.DataFrame):
    from rich.markup import escape

    from omnitune.keyed_table import Column, KeyedTable

    table = KeyedTable(
        [Column("kernel\ndevice", wrap=True), Column("dtype"), Column("config\nwhich", wrap=True, min_width=10)]
        + [Column(header, "right") for header in ("µs", "L1 hit %\nL2 hit %", "DRAM %\nof peak", "occupancy\n%")],
        title="[bold]ncu profiles[/]",
    )
    for r in frame.to_dict(orient="records"):
        table.add_row(
            r["problem"],
            _two_lines(escape(r["kernel"]), escape(r["device"])), r["dtype"],
            _two_lines(escape(r["config"]), r["which"]),
            r["µs"], _two_lines(r["L1 hit %"], r["L2 hit %"]), r["DRAM % of peak"], r["occupancy %"],
        )
    return table


def _device_names(summary: pd.DataFrame) -> dict[str, str]:
    return {r["device_key"]: r["device_name"] for r in summary.to_dict("records") if isinstance(r["device_name"], str)}


def _two_lines(first: str, second: str) -> str:
    return f"{first}\n[dim]{second}[/]" if second and second != "—" else first


def _is_missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA


def _number(value, fmt: str, suffix: str = "") -> str:
    if _is_missing(value):
        return "—"
    return f"{float(value):{fmt}}{suffix}"


def _rate(value, fmt: str, fraction_of_peak=None, parens: bool = True) -> str:
    """'548.5 (69%)': the rate and, where the device is calibrated, its fraction of the roof."""
    # The runner reports a rate of 0 where it has none (under the interpreter): show it as absent.
    if _is_missing(value) or float(value) <= 0:
        return "—"
    text = _number(value, fmt)
    if not _is_missing(fraction_of_peak):
        percent = f"{float(fraction_of_peak) * 100:.0f}%"
        text += f" ({percent})" if parens else f" {percent}"
    return text


NOISY_MARK = "noisy"


def _cv(cv, noisy) -> str:
    """'0.4%', or '2.6% noisy' past NOISY_CV; '—' for a result that was not re-timed."""
    if _is_missing(cv):
        return "—"
    return f"{float(cv) * 100:.1f}%" + (f" {NOISY_MARK}" if noisy is True else "")


def _spread(p20, p80) -> str:
    if _is_missing(p20) or _is_missing(p80):
        return "—"
    return f"{float(p20):#.4g}–{float(p80):#.4g}"


def _json_value(value):
    if _is_missing(value):
        return None
    if isinstance(value, float) and math.isinf(value):
        return None
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    return value

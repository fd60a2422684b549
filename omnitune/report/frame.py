"""The results database as a report reads it: the trials loaded through omnitune.store, reduced
to one row per kernel × problem × dtype × device (`best_per_key`), and the columns a person
reads (`summarize`), with each result placed on its device's measured roofline and beside its
ncu profile.

Re-timed finalists (omnitune.search.finalists): a re-timing is a trial row of its own whose
extra_json holds a "finalist" entry. Where a key has re-timings, its best is the lowest median of
its latest whole re-timing (one that stored a row for each config it re-timed), and the default's
time comes from that re-timing too when it was among them; the counts (trials, failures) and the
figures count only the search's own trials.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Mapping
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
# An ok row whose time no measurement gives (zero, negative, infinite, not a number: written by
# hand or by a corrupt writer): counted as a failure under this name rather than winning its key
# at -3.6 ms or making the default's time and the speedup over it impossible.
IMPOSSIBLE_TIME = "impossible_time"
TIME_COLUMNS = ("time_ms", "p20_ms", "p80_ms")
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
    (NaN for the search's own trials), retime_configs (how many configs its session re-timed; NaN
    where a row predates the count), cv and noisy."""
    facts = [finalist_facts(_json_object(text)) for text in trials["extra_json"]]
    out = trials.copy()
    out["retime_session"] = pd.Series([f["session"] if f else math.nan for f in facts], index=trials.index, dtype=float)
    out["retime_configs"] = pd.to_numeric(pd.Series([f.get("configs") if f else None for f in facts],
                                                    index=trials.index, dtype=object), errors="coerce")
    out["cv"] = pd.Series([f["cv"] if f else math.nan for f in facts], index=trials.index, dtype=float)
    out["noisy"] = pd.Series([bool(f["cv"] > NOISY_CV) if f else None for f in facts], index=trials.index,
                             dtype=object)
    return out


def impossible_times(trials: pd.DataFrame) -> dict[str, pd.Series]:
    """For each of TIME_COLUMNS, which ok rows hold a value there that is not a positive, finite
    number of milliseconds (a missing value is not one: a failed or old row may lack p20/p80)."""
    ok = trials["status"] == _OK
    return {column: ok & trials[column].notna()
            & ~pd.to_numeric(trials[column], errors="coerce").between(0, math.inf, inclusive="neither")
            for column in TIME_COLUMNS}


def in_any_column(by_column: dict[str, pd.Series]) -> pd.Series:
    """The rows that impossible_times marks in any of its columns."""
    return pd.concat(by_column.values(), axis=1).any(axis=1)


def with_impossible_times_failed(trials: pd.DataFrame) -> pd.DataFrame:
    """The trials with each ok row of an impossible time given the status IMPOSSIBLE_TIME."""
    impossible = in_any_column(impossible_times(trials))
    return trials.assign(status=trials["status"].mask(impossible, IMPOSSIBLE_TIME)) if impossible.any() else trials


def search_trials(trials: pd.DataFrame) -> pd.DataFrame:
    """The search's own trials: without the finalists' re-timings (which repeat configs), and an
    impossible time failed (with_impossible_times_failed) so that no figure plots it."""
    return with_impossible_times_failed(trials[with_retiming(trials)["retime_session"].isna()])


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
    annotated = with_retiming(with_impossible_times_failed(trials))
    retimed = annotated["retime_session"].notna()
    trials = annotated[~retimed]
    whole = in_whole_sessions(annotated)
    latest = annotated[whole & (annotated["status"] == _OK) & annotated["time_ms"].notna()]
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


def in_whole_sessions(annotated: pd.DataFrame) -> pd.Series:
    """Of trials read through with_retiming (every status), which are re-timings of a session that
    stored a row for each config it re-timed. A process stopped while storing them leaves the
    winner without the default beside it (stored winner first): its speedup would be taken against
    the search's own time of the default, measured apart from it, so the search's figures stand
    for that key instead."""
    retimings = annotated[annotated["retime_session"].notna()]
    if retimings.empty:
        return pd.Series(False, index=annotated.index, dtype=bool)
    stored = retimings.groupby([*KEY_COLUMNS, "retime_session"], dropna=False)["retime_session"].transform("size")
    whole = retimings["retime_configs"].isna() | (stored >= retimings["retime_configs"])
    return whole.reindex(annotated.index, fill_value=False)


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


def _is_missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA

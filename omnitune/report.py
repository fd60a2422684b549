"""What a search found: the results database turned into a DataFrame, and that frame rendered.

Pure functions over pandas: `load_trials` reads the `trials` table (read-only: reporting never
creates or migrates a database), `best_per_key` reduces it to one row per kernel × problem ×
dtype × device, `summarize` picks the columns a person reads, and the `render_*` functions turn a
summary into a rich table, CSV, Markdown or JSON. The CLI (omnitune/cli/tables_cmd.py) only
chooses among them; omnitune.export builds on `best_per_key`.
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections import Counter
from pathlib import Path

import pandas as pd

from omnitune.errors import StoreError

KEY_COLUMNS = ["kernel", "problem_key", "dtype", "device_key"]

TRIAL_COLUMNS = [
    "study", "trial_number", "kernel", "problem_key", "problem_json", "dtype", "device_key",
    "device_name", "sampler", "config_json", "config_label", "status", "time_ms", "p20_ms",
    "p80_ms", "rel_error", "tflops", "tbps", "detail", "representative", "is_default",
    "extra_json", "source_hash", "torch_version", "triton_version", "omnitune_version",
    "measured_at",
]

SUMMARY_COLUMNS = [
    "kernel", "problem_key", "dtype", "device_key", "device_name", "best_config", "time_ms",
    "p20_ms", "p80_ms", "tflops", "tbps", "default_time_ms", "speedup_vs_default", "trials",
    "ok_trials", "failures", "representative",
]

NOT_REPRESENTATIVE_MARK = "⚠ interpreter"
NOT_REPRESENTATIVE_NOTE = (
    f"{NOT_REPRESENTATIVE_MARK}: measured under Triton's interpreter — correctness only, "
    "times are not representative."
)

_OK = "ok"


# --- reading -------------------------------------------------------------------------------------


def load_trials(db_path: Path, kernel: str | None = None) -> pd.DataFrame:
    """Every row of the results database's `trials` table (of one kernel if given).

    Opened read-only: a missing file is a StoreError, never a new empty database. A database
    without a trials table yet gives an empty frame."""
    return _read_table(db_path, "trials", TRIAL_COLUMNS, "kernel", kernel)


def load_devices(db_path: Path) -> pd.DataFrame:
    """The `devices` table (one row per GPU key), empty if the database has none."""
    columns = ["key", "name", "compute_capability", "driver"]
    return _read_table(db_path, "devices", columns, None, None)


def _read_table(db_path: Path, table: str, columns: list[str], where: str | None, value: str | None) -> pd.DataFrame:
    db_path = Path(db_path)
    if not db_path.is_file():
        raise StoreError(f"no results database at {db_path}; run omnitune search first, or pass --db PATH")
    try:
        con = sqlite3.connect(f"{db_path.resolve().as_uri()}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        raise StoreError(f"cannot open {db_path}: {exc}") from None
    try:
        present = con.execute(
            "SELECT 1 FROM sqlite_master WHERE type IN ('table', 'view') AND name = ?", (table,)
        ).fetchone()
        if not present:
            return pd.DataFrame(columns=columns)
        select = ", ".join(f'"{c}"' for c in columns)
        query = f'SELECT {select} FROM "{table}"'
        params: tuple = ()
        if where is not None and value is not None:
            query += f' WHERE "{where}" = ?'
            params = (value,)
        return pd.read_sql_query(query, con, params=params)
    except sqlite3.DatabaseError as exc:
        raise StoreError(f"{db_path} is not an omnitune results database: {exc}") from None
    finally:
        con.close()


# --- reducing ------------------------------------------------------------------------------------


def best_per_key(trials: pd.DataFrame) -> pd.DataFrame:
    """One row per kernel × problem × dtype × device.

    Each row holds the best ok trial's columns (lowest time_ms, ties to the lowest trial_number;
    NaN when no trial of the key is ok) plus: default_time_ms (the default config's best ok
    time), default_config_json, speedup_vs_default (default_time_ms / time_ms), trials (all
    statuses), ok_trials, failures (e.g. "pruned 12, mismatch 1") and representative (False if
    any trial ran under the interpreter)."""
    extra = ["default_time_ms", "default_config_json", "speedup_vs_default", "trials", "ok_trials",
             "failures"]
    if trials.empty:
        return pd.DataFrame(columns=TRIAL_COLUMNS + extra)
    groups = trials.groupby(KEY_COLUMNS, sort=True)
    stats = pd.DataFrame({
        "trials": groups.size(),
        "ok_trials": groups["status"].agg(lambda s: int((s == _OK).sum())),
        "failures": groups["status"].agg(failure_summary),
        "representative": groups["representative"].agg(lambda s: bool((s.fillna(0) != 0).all())),
    })

    ok = trials[(trials["status"] == _OK) & trials["time_ms"].notna()]
    best = (
        ok.sort_values(["time_ms", "trial_number"], kind="stable")
        .drop_duplicates(KEY_COLUMNS)
        .set_index(KEY_COLUMNS)
        .drop(columns=["representative"])
    )
    default_time = ok[ok["is_default"] == 1].groupby(KEY_COLUMNS)["time_ms"].min().rename("default_time_ms")
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
    """'pruned 12, mismatch 1': failed trials by status, most frequent first."""
    counts = Counter(s for s in statuses if s != _OK)
    ordered = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return ", ".join(f"{status} {n}" for status, n in ordered)


def summarize(trials: pd.DataFrame) -> pd.DataFrame:
    """The report: one row per kernel × problem × dtype × device with SUMMARY_COLUMNS, sorted."""
    best = best_per_key(trials)
    summary = best.rename(columns={"config_label": "best_config"})
    summary = summary[SUMMARY_COLUMNS].copy()
    summary["representative"] = summary["representative"].astype(bool)
    for column in ("trials", "ok_trials"):
        summary[column] = summary[column].astype(int)
    return summary.sort_values(KEY_COLUMNS, kind="stable").reset_index(drop=True)


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
            "TFLOP/s": _rate(r["tflops"], ".1f"),
            "TB/s": _rate(r["tbps"], ".2f"),
            "default ms": _number(r["default_time_ms"], "#.4g"),
            "speedup": _number(r["speedup_vs_default"], ".2f", suffix="×"),
            "trials": str(r["trials"]),
            "failures": r["failures"] or "",
            "note": "" if r["representative"] else NOT_REPRESENTATIVE_MARK,
        })
    columns = ["kernel", "problem", "dtype", "device", "best config", "ms", "p20–p80 ms", "TFLOP/s",
               "TB/s", "default ms", "speedup", "trials", "failures", "note"]
    return pd.DataFrame(rows, columns=columns)


def render_markdown(summary: pd.DataFrame) -> str:
    """A GitHub-flavoured Markdown table, with the interpreter footnote when it applies."""
    frame = display_frame(summary)
    numeric = {"ms", "p20–p80 ms", "TFLOP/s", "TB/s", "default ms", "speedup", "trials"}
    lines = [
        "| " + " | ".join(frame.columns) + " |",
        "| " + " | ".join("---:" if c in numeric else "---" for c in frame.columns) + " |",
    ]
    for row in frame.itertuples(index=False):
        lines.append("| " + " | ".join(str(cell).replace("|", "\\|") for cell in row) + " |")
    if not summary["representative"].all():
        lines += ["", NOT_REPRESENTATIVE_NOTE]
    return "\n".join(lines) + "\n"


def render_table(summary: pd.DataFrame, title: str = ""):
    """The `table` format: one rich Table per kernel × device (so neither needs a column), two
    lines per result — median over spread, TFLOP/s over TB/s, default time over speedup, trials
    over failures — so that it stays legible in an 80-column terminal."""
    from rich import box
    from rich.console import Group
    from rich.table import Table

    frame = display_frame(summary)
    parts: list = [title] if title else []
    for (kernel, device), rows in frame.groupby(["kernel", "device"], sort=False):
        marked = (rows["note"] != "").any()
        heading = f"[bold]{kernel}[/] on [bold]{device}[/]"
        table = Table(
            title=heading + (f"  [yellow]{NOT_REPRESENTATIVE_MARK}[/]" if marked else ""),
            title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True,
            caption=NOT_REPRESENTATIVE_NOTE if marked else None, caption_justify="left",
        )
        table.add_column("problem", overflow="fold", min_width=10)
        table.add_column("dtype", no_wrap=True)
        table.add_column("best config", overflow="fold", min_width=10)
        for header in ("ms\np20–p80", "TFLOP/s\nTB/s", "default ms\nspeedup"):
            table.add_column(header, justify="right", no_wrap=True)
        table.add_column("trials\nfailures", overflow="fold", min_width=10)
        for r in rows.to_dict(orient="records"):
            median = r["ms"] + (" [yellow]⚠[/]" if r["note"] else "")
            table.add_row(
                r["problem"], r["dtype"], r["best config"],
                _two_lines(median, r["p20–p80 ms"]),
                _two_lines(r["TFLOP/s"], r["TB/s"]),
                _two_lines(r["default ms"], r["speedup"]),
                _two_lines(r["trials"], r["failures"]),
            )
        parts.append(table)
    return Group(*parts)


def _two_lines(first: str, second: str) -> str:
    return f"{first}\n[dim]{second}[/]" if second and second != "—" else first


def _is_missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA


def _number(value, fmt: str, suffix: str = "") -> str:
    if _is_missing(value):
        return "—"
    return f"{float(value):{fmt}}{suffix}"


def _rate(value, fmt: str) -> str:
    # The runner reports a rate of 0 where it has none (under the interpreter): show it as absent.
    return "—" if _is_missing(value) or float(value) <= 0 else _number(value, fmt)


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

"""The report's summary rendered: a rich table, CSV, Markdown or JSON."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping

import pandas as pd

from omnitune.report.frame import NOT_REPRESENTATIVE_MARK, NOT_REPRESENTATIVE_NOTE, _is_missing


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

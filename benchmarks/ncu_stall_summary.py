"""Where a kernel's warps wait, from Nsight Compute's source page: the SASS instructions with the
most warp-stall samples, and the stall reasons of each.

    ncu --set full --import-source yes -k regex:NAME -c 1 -o REPORT python ...
    ncu -i REPORT.ncu-rep --page source --csv --print-source sass > SOURCE.csv
    python benchmarks/ncu_stall_summary.py SOURCE.csv [--top 30]

Prints the share of all samples each of the top instructions holds, its stall reasons above 5% of
its samples, and the totals per reason over the kernel (the WarpStateStats section says the same
in aggregate; this says which instruction).
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

SAMPLES = "Warp Stall Sampling (All Samples)"


def _number(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def read_rows(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    """The CSV's header and rows; ncu prints a few lines before the header (skipped: the header is
    the first line naming the sample column)."""
    lines = path.read_text(errors="replace").splitlines()
    start = next((i for i, line in enumerate(lines) if SAMPLES in line), None)
    if start is None:
        raise SystemExit(f"{path}: no '{SAMPLES}' column (was the report collected with source counters?)")
    reader = csv.DictReader(lines[start:])
    return list(reader.fieldnames or []), list(reader)


def summarize(header: list[str], rows: list[dict[str, str]], top: int) -> list[str]:
    # Per-reason columns: ncu names them after the stall reason (e.g. "stall_long_sb"), with the
    # all-samples and not-issued variants; keep the all-samples ones.
    reasons = [c for c in header if c.lower().startswith("stall") or "stall_" in c.lower()]
    reasons = [c for c in reasons if "not_issued" not in c.lower() and "not issued" not in c.lower()]
    total = sum(_number(r.get(SAMPLES, "0")) for r in rows) or 1.0
    out = [f"{len(rows)} SASS instructions, {total:.0f} stall samples"]
    totals = {c: sum(_number(r.get(c, "0")) for r in rows) for c in reasons}
    ranked = sorted(totals.items(), key=lambda kv: -kv[1])
    out.append("by reason: " + ", ".join(f"{c} {100 * v / total:.1f}%" for c, v in ranked if v / total >= 0.01))
    source_column = next((c for c in header if c.lower() == "source"), None)
    for row in sorted(rows, key=lambda r: -_number(r.get(SAMPLES, "0")))[:top]:
        samples = _number(row.get(SAMPLES, "0"))
        if not samples:
            break
        why = ", ".join(f"{c} {100 * _number(row[c]) / samples:.0f}%" for c in reasons
                        if _number(row.get(c, "0")) / samples >= 0.05)
        where = row.get("Address", row.get("# Address", ""))
        text = row.get(source_column, "") if source_column else ""
        out.append(f"{100 * samples / total:5.1f}%  {where:>6}  {text.strip()[:70]:70}  {why}")
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source_csv", type=Path)
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args(argv)
    header, rows = read_rows(args.source_csv)
    print("\n".join(summarize(header, rows, args.top)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

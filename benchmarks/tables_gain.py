"""What a search gained over the answer the tables gave before it.

For each problem a results database holds a search of, the runtime is asked what it would have
launched with the tables of an earlier commit (and which rung answered: exact, nearest, predictor,
default); that config's time as the search itself measured it (a search measures the default, the
known-good configs and what the nearest tables lend before it samples, so the earlier answer
is usually among its trials), and the search's best. "earlier ÷ best" is how much slower a user of
the earlier tables ran this problem, on the search's own clock (each config's one measurement in
its trial; the finalists' re-timings left out, as benchmarks/search_wall.py does). No GPU
needed: it reads the database and the tables.

    python benchmarks/tables_gain.py --db presets.db --before d0200e9 [--dtype fp16] [--out gain.json]
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from search_wall import search_times  # noqa: E402 — every config timed the same way: finalists' re-timings left out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", required=True, help="results database of the searches")
    parser.add_argument("--before", required=True, help="git commit whose tuned_configs/ stood before the searches")
    parser.add_argument("--dtype", default=None, help="only problems searched in this dtype (bf16, fp16, fp32)")
    parser.add_argument("--out", default=None, help="write the rows and the summary as JSON here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tables_before_") as folder:
        tables = checkout_tables(args.before, Path(folder))
        rows = gains(args.db, tables, args.dtype)
    summary = summarize(rows)
    for line in report_lines(rows, summary):
        print(line)
    if args.out:
        command = ["python", "benchmarks/tables_gain.py", *(argv if argv is not None else sys.argv[1:])]
        Path(args.out).write_text(json.dumps({"command": command, "before": args.before, "db": args.db,
                                              "summary": summary, "rows": rows}, indent=1))
    return 0


def checkout_tables(commit: str, folder: Path) -> Path:
    """tuned_configs/ as it stood at `commit`, written under `folder`."""
    listing = subprocess.run(["git", "-C", str(ROOT), "ls-tree", "-r", "--name-only", commit, "tuned_configs"],
                             capture_output=True, text=True, check=True).stdout.split()
    for name in listing:
        if name.endswith(".json"):
            text = subprocess.run(["git", "-C", str(ROOT), "show", f"{commit}:{name}"],
                                  capture_output=True, text=True, check=True).stdout
            path = folder / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    return folder / "tuned_configs"


def gains(db: str, tables: Path, dtype: str | None) -> list[dict]:
    """One row per study: the earlier tables' answer, its time in the study, the study's best."""
    import omnitune.runtime as runtime
    from omnitune.registry import get_spec
    from omnitune.spec import parse_dtype

    runtime.config_dirs = lambda: [tables]  # the earlier tables only, not the working tree's
    runtime.clear_cache()
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        studies = con.execute("SELECT study, kernel, problem_key, problem_json, dtype, device_name FROM trials "
                              "GROUP BY study ORDER BY MIN(rowid)").fetchall()
    finally:
        con.close()
    rows = []
    for study, kernel, problem_key, problem_json, dtype_name, device_name in studies:
        if dtype is not None and dtype_name != dtype:
            continue
        problem = get_spec(kernel).problem_from_mapping(json.loads(problem_json))
        answer = runtime.lookup(kernel, problem, parse_dtype(dtype_name), device_name)
        times = search_times(db, study)
        earlier = times.get(json.dumps(dict(answer.config), sort_keys=True))
        best = min(times.values()) if times else None
        rows.append({"kernel": kernel, "problem": problem_key, "dtype": dtype_name, "rung": answer.rung.value,
                     "earlier_config": dict(answer.config), "earlier_ms": earlier, "best_ms": best,
                     "earlier_over_best": earlier / best if earlier and best else None})
    return rows


def summarize(rows: list[dict]) -> dict:
    ratios = [r["earlier_over_best"] for r in rows if r["earlier_over_best"]]
    rungs: dict[str, int] = {}
    for r in rows:
        rungs[r["rung"]] = rungs.get(r["rung"], 0) + 1
    return {
        "problems": len(rows), "earlier_measured": len(ratios), "rungs": rungs,
        "median": statistics.median(ratios) if ratios else None, "worst": max(ratios) if ratios else None,
        "geomean": statistics.geometric_mean(ratios) if ratios else None,
        "over_5pct": sum(1 for x in ratios if x > 1.05),
    }


def report_lines(rows: list[dict], summary: dict) -> list[str]:
    lines = [f"{r['kernel']} {r['dtype']}|{r['problem']}: {r['rung']}, earlier ÷ best "
             + (f"{r['earlier_over_best']:.3f}" if r["earlier_over_best"] else "not measured by the search")
             for r in rows]
    if summary["earlier_measured"]:
        lines.append(f"{summary['problems']} problems ({summary['rungs']}); the earlier answer measured on "
                     f"{summary['earlier_measured']}: earlier ÷ best median {summary['median']:.3f}, geometric mean "
                     f"{summary['geomean']:.3f}, worst {summary['worst']:.3f}, > 5% slower on {summary['over_5pct']}")
    return lines


if __name__ == "__main__":
    raise SystemExit(main())

"""The finalists' re-timings a results database holds, with their spreads, as JSON on stdout.

    python benchmarks/finalist_spreads.py omnitune.db [--kernel kv_compress]

One row per re-timed finalist (the trials whose extra holds the re-timing's figures,
omnitune.search.finalists): problem, config, re-timed median, p20-p80 spread over the median,
the rounds' coefficient of variation, and whether the re-timing called it noisy. Then, per
problem, the largest and the median spread and CV: how certain the winner the search declared is.
Round 32's Q compares two databases of the same search made with and without a quiet host.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import sys

from omnitune.search.finalists import finalist_facts


def finalist_rows(path: str, kernel: str | None) -> list[dict]:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        query = "select problem_key, config_label, time_ms, p20_ms, p80_ms, extra_json from trials where status = 'ok'"
        args: tuple = ()
        if kernel:
            query, args = query + " and kernel = ?", (kernel,)
        rows = db.execute(query, args).fetchall()
    finalists = []
    for problem_key, config, time_ms, p20, p80, extra_json in rows:
        facts = finalist_facts(json.loads(extra_json or "{}"))
        if facts is None or not time_ms:
            continue
        finalists.append({
            "problem_key": problem_key, "config": config, "time_ms": time_ms, "p20_ms": p20, "p80_ms": p80,
            "spread": (p80 - p20) / time_ms if p20 is not None and p80 is not None else None,
            "cv": facts["cv"], "noisy": facts["noisy"], "rounds": facts["rounds"],
        })
    return finalists


def per_problem(finalists: list[dict]) -> dict[str, dict]:
    problems: dict[str, list[dict]] = {}
    for row in finalists:
        problems.setdefault(row["problem_key"], []).append(row)
    return {key: {"finalists": len(rows), "noisy": sum(r["noisy"] for r in rows),
                  "max_spread": max(r["spread"] for r in rows), "median_spread": statistics.median(r["spread"] for r in rows),
                  "max_cv": max(r["cv"] for r in rows), "median_cv": statistics.median(r["cv"] for r in rows)}
            for key, rows in problems.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("db")
    parser.add_argument("--kernel")
    args = parser.parse_args()
    finalists = finalist_rows(args.db, args.kernel)
    json.dump({"db": args.db, "finalists": finalists, "problems": per_problem(finalists)}, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()

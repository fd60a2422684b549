"""Copy into one results database the trials of problems it lacks from others: training searched
over several sessions (each into a database of its own) exported as one table.

A problem — (kernel, problem key, dtype, device) — that TARGET already holds keeps only TARGET's
trials: a problem searched again is not mixed with its earlier, shorter search. Every other
problem's trials come over whole from the first SOURCE that holds it. Only the `trials` catalogue
is copied (what `omnitune export` reads), not the studies' Optuna storage, so resume a copied
problem's search in its own database, not in TARGET.

    python benchmarks/merge_trials.py merged.db round22.db --kernel kv_compress
    python -m omnitune export --db merged.db --kernel kv_compress --out tuned_configs
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
from pathlib import Path

PROBLEM = ("kernel", "problem_key", "dtype", "device_key")


def merge(target: Path, sources: list[Path], kernel: str | None = None) -> dict[str, int]:
    """Trials copied from each source into target (by path), for problems target lacked."""
    copied = {}
    with sqlite3.connect(target) as db:
        for source in sources:
            db.execute("ATTACH DATABASE ? AS source", (str(source),))
            try:
                held = " AND ".join(f"t.{c} = s.{c}" for c in PROBLEM)
                where = "NOT EXISTS (SELECT 1 FROM main.trials t WHERE " + held + ")"
                args: tuple = ()
                if kernel is not None:
                    where += " AND s.kernel = ?"
                    args = (kernel,)
                before = db.total_changes
                db.execute(f"INSERT INTO main.trials SELECT * FROM source.trials s WHERE {where}", args)
                copied[str(source)] = db.total_changes - before
                db.commit()
            finally:
                db.execute("DETACH DATABASE source")
    return copied


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target", type=Path, help="the results database to add to (it must exist)")
    parser.add_argument("sources", type=Path, nargs="+", help="results databases to copy from, first wins")
    parser.add_argument("--kernel", help="only this kernel's trials")
    args = parser.parse_args(argv)
    for path in (args.target, *args.sources):
        if not path.is_file():
            print(f"error: {path}: no such database", file=sys.stderr)
            return 2
    try:
        copied = merge(args.target, args.sources, args.kernel)
    except sqlite3.DatabaseError as exc:
        print(f"error: {exc} (are these omnitune results databases?)", file=sys.stderr)
        return 2
    for source, count in copied.items():
        print(f"{source}: {count} trials copied into {args.target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

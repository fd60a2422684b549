"""Leave one problem out over a results database: for each tuned problem, the config the
predictor of a table's predictor block would have chosen had that problem not been tuned (fit on
the kernel's other problems of the same dtype and device), and its measured time there ÷ the best
there — beside the default config's and the nearest rung's (omnitune.predict.leave_one_out).

A ratio is read from the held-out problem's own stored trials, so it is known only where its
search measured that config ("-" otherwise). No GPU is used: run it on the database of a GPU's
searches (on the GPU host, or a copy of its database anywhere).

    python benchmarks/predictor_loo.py --db omnitune.db [--kernel attention ...] [--neighbours 3]
                                       [--trials-json benchmarks/results/search_trials_h200.json]
                                       [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import pandas as pd

from omnitune import store
from omnitune.predict import NEIGHBOURS, leave_one_out_trials, summary
from omnitune.registry import get_spec


def load_trials(db: Path | None, trials_json: Path | None) -> pd.DataFrame:
    """The trials of a results database, or of a JSON dump of its `trials` rows (as stored in
    benchmarks/results/), read through a temporary database made by omnitune.store."""
    if db is not None:
        return store.read_trials(db)
    rows = json.loads(trials_json.read_text())["trials"]
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "results.db"
        database = store.open_db(path)
        store.record_trials(database, [store.TrialRecord(**{c: row.get(c) for c in store.TRIAL_COLUMNS})
                                       for row in rows])
        database.conn.close()
        return store.read_trials(path)


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--db", type=Path, help="a results database")
    source.add_argument("--trials-json", type=Path, help="a JSON file whose 'trials' are catalogue rows")
    parser.add_argument("--kernel", action="append", help="only these kernels (default: every kernel stored)")
    parser.add_argument("--neighbours", type=int, default=NEIGHBOURS, help="tuned problems a prediction uses")
    parser.add_argument("--json", type=Path, help="also write every row and the summaries here")
    args = parser.parse_args(argv)
    trials = load_trials(args.db, args.trials_json)
    report = {}
    for kernel in args.kernel or sorted(set(trials["kernel"])):
        held = leave_one_out_trials(get_spec(kernel), trials, neighbours=args.neighbours)
        print(f"\n{kernel}: {len(held)} problems held out in turn (ratios: time ÷ the best measured there)")
        print(f"  {'predicted':>9} {'expected':>9} {'default':>8} {'nearest':>8}  problem")
        for h in held:
            print(f"  {_ratio(h.ratio):>9} {_ratio(h.expected_ratio):>9} {_ratio(h.default_ratio):>8} "
                  f"{_ratio(h.nearest_ratio):>8}  {h.dtype}|{h.problem_key} ({h.rung}: {h.config})")
        totals = summary(held)
        print(f"  summary: {json.dumps(totals, default=str)}")
        report[kernel] = {"held_out": [asdict(h) for h in held], "summary": totals}
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The search loop's own host time per measured config, with the measuring taken out: the real
driver (run_search, its strategies, claims, penalties and fallback) over a recorded H200 sweep
(tests/data/sweep_kv_cache_write_t64_h200.json, the KV write at 64 tokens: 65 valid configs, 37%
of its box), its runner looking results up (omnitune.measure.replay), with the study in SQLite
as `omnitune search` keeps it. Everything it times is host work the GPU waits through between two
measurements: the sampler's asks and tells, the storage's writes, the proposals that a constraint
prunes or that repeat a measured config. Per sampler, with its proposals as it makes them and kept
inside the valid, unmeasured configs (omnitune.search.strategies.valid_only), the median of a few
seeds: trials asked, wall, ms a measured config. CPU only; this machine's figures.

    PYTHONPATH=$PWD python benchmarks/search_host_overhead.py --out benchmarks/results/search_host_overhead_cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import optuna

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

BUDGET = 50


def run(sampler: str, wrapped: bool, seed: int, db: Path) -> tuple[int, float]:
    import test_strategies as recorded

    from omnitune.measure.replay import ReplayRunner, replay_device
    from omnitune.search import driver
    from omnitune.search.driver import SearchOptions, run_search

    original = driver.ValidOnly, driver.TPE_STARTUP_TRIALS
    if not wrapped:  # the sampler as it was: proposals as it makes them, Optuna's 10 startup trials
        driver.ValidOnly, driver.TPE_STARTUP_TRIALS = (lambda inner, *args, **kwargs: inner), None
    try:
        runner = ReplayRunner(recorded.RECORDED)
        options = SearchOptions(device=replay_device("NVIDIA H200"), trials=BUDGET, sampler=sampler, seed=seed,
                                finalists=0, warm_start=())
        started = time.perf_counter()
        outcome = run_search(recorded.SPEC, recorded.PROBLEM, recorded.DTYPE, options,
                             runner_factory=lambda: runner, storage=f"sqlite:///{db}")
        wall = time.perf_counter() - started
    finally:
        driver.ValidOnly, driver.TPE_STARTUP_TRIALS = original
    asked = len(optuna.load_study(study_name=outcome.study_name, storage=f"sqlite:///{db}").trials)
    assert outcome.measured_total == BUDGET
    return asked, wall


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for sampler in ("tpe", "random"):
            for wrapped in (False, True):
                asked, walls = [], []
                for seed in range(args.seeds):
                    db = Path(tmp) / f"{sampler}_{wrapped}_{seed}.optuna.db"
                    a, w = run(sampler, wrapped, seed, db)
                    asked.append(a)
                    walls.append(w)
                    os.remove(db)
                row = {"sampler": sampler, "proposals": "valid_only" if wrapped else "as the sampler makes them",
                       "measured": BUDGET, "trials_asked": statistics.median(asked),
                       "wall_s": statistics.median(walls), "ms_per_measured": 1000 * statistics.median(walls) / BUDGET}
                rows.append(row)
                print(f"{sampler:6s} {row['proposals']:26s} {BUDGET} measured: {row['trials_asked']:.0f} trials asked, "
                      f"{row['wall_s']:.2f} s, {row['ms_per_measured']:.0f} ms a measured config")
    report = {"command": " ".join(sys.argv), "machine": platform.processor() or platform.machine(),
              "cpus": os.cpu_count(), "optuna": optuna.__version__, "seeds": args.seeds, "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

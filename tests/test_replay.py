"""benchmarks/replay.py on a small synthetic sweep whose answers are known: each strategy run by
the real search driver over the recording."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest
import torch

from omnitune.registry import get_spec
from omnitune.trial import TrialResult, TrialStatus

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "replay.py"
_spec = importlib.util.spec_from_file_location("replay", _PATH)
replay = importlib.util.module_from_spec(_spec)
sys.modules["replay"] = replay  # dataclasses look their module up while the file is executed
_spec.loader.exec_module(replay)

KERNEL = "kv_cache_write"
PROBLEM_KEY = "t=4,hkv=2,d=64,block_size=16"


def _rows(best_at: int, failed_at: int, problem_key: str = PROBLEM_KEY) -> tuple[list[dict], list]:
    """Catalogue rows for every valid config of a tiny problem: the config at grid position
    `best_at` (1-based) is fastest, the one at `failed_at` failed; the rest are slow."""
    spec = get_spec(KERNEL)
    problem = spec.parse_shape(problem_key)
    order = [c for c in spec.all_configs() if c in set(spec.valid_configs(problem, torch.float16))]
    rows = []
    for position, config in enumerate(order, 1):
        status = "mismatch" if position == failed_at else "ok"
        time_ms = 1.0 if position == best_at else 5.0 + position
        rows.append({"kernel": KERNEL, "problem_key": problem_key, "dtype": "fp16", "status": status,
                     "config_json": json.dumps(config.as_dict()), "time_ms": time_ms})
    rows.append({"kernel": "attention", "problem_key": "b=1", "dtype": "fp16", "status": "ok",
                 "config_json": "{}", "time_ms": 0.001})  # another problem: ignored
    return rows, order


def test_grid_order_finds_the_best_at_its_position():
    rows, order = _rows(best_at=7, failed_at=2)
    sweep = replay.sweep_from_rows(rows, KERNEL, PROBLEM_KEY, "fp16")
    assert len(sweep.times_ms) == len(order) and sweep.best_ms == 1.0
    assert sweep.times_ms[order[1]] is None
    assert replay.trials_to_good(sweep, ("grid",), "grid", 0) == 7


def test_seeded_samplers_reach_the_best_within_the_space_and_warm_start_helps_when_the_default_is_best():
    rows, order = _rows(best_at=len(_rows(1, 2)[1]), failed_at=1)
    sweep = replay.sweep_from_rows(rows, KERNEL, PROBLEM_KEY, "fp16")
    for sampler in ("tpe", "random", "cmaes"):
        counts = [replay.trials_to_good(sweep, ("fallback", sampler), sampler, seed) for seed in range(3)]
        assert all(1 <= c <= len(order) for c in counts)
    # Make the default the best: a warm start then needs exactly one trial.
    default = sweep.spec.default_config(sweep.problem, sweep.dtype)
    results = dict(sweep.results)
    results[default] = TrialResult(default, TrialStatus.OK, time_ms=0.5)
    warm = replay.Sweep(sweep.spec, sweep.problem, sweep.dtype, results)
    assert replay.trials_to_good(warm, ("planned", "fallback", "tpe"), "tpe", 0) == 1


def test_summary_is_median_and_p90_and_counts_misses():
    result = replay.summarize("x", [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, None])
    assert (result.median_trials, result.p90_trials, result.never_reached, result.runs) == (5.5, 9.0, 1, 11)
    assert math.isnan(replay.summarize("y", [None]).median_trials)


def test_an_incomplete_sweep_is_refused():
    rows, _ = _rows(best_at=1, failed_at=2)
    with pytest.raises(SystemExit, match="not an exhaustive sweep"):
        replay.sweep_from_rows(rows[3:], KERNEL, PROBLEM_KEY, "fp16")


def _sweep_of(problem_key: str, best_at: int) -> tuple[object, list]:
    rows, order = _rows(best_at=best_at, failed_at=1, problem_key=problem_key)
    return replay.sweep_from_rows(rows, KERNEL, problem_key, "fp16"), order


def test_neighbour_winners_are_the_other_sweeps_best_nearest_first_leaving_this_one_out():
    here, _ = _sweep_of("t=4,hkv=2,d=64,block_size=16", best_at=3)
    near, near_order = _sweep_of("t=8,hkv=2,d=64,block_size=16", best_at=2)
    far, far_order = _sweep_of("t=512,hkv=2,d=64,block_size=16", best_at=3)
    assert near_order[1] in here.times_ms and far_order[2] in here.times_ms
    assert replay.neighbour_winners(here, [far, here, near]) == [near_order[1], far_order[2]]


def test_all_mode_replays_every_exhaustive_sweep_and_plots(tmp_path):
    rows = []
    for key, best in (("t=4,hkv=2,d=64,block_size=16", 3), ("t=64,hkv=2,d=64,block_size=16", 4)):
        rows += _rows(best_at=best, failed_at=1, problem_key=key)[0]
    # An incomplete sweep of a third problem is skipped.
    rows += _rows(best_at=2, failed_at=1, problem_key="t=9,hkv=2,d=64,block_size=16")[0][:2]
    trials = tmp_path / "trials.json"
    trials.write_text(json.dumps({"trials": rows}))
    out, png = tmp_path / "replay.json", tmp_path / "replay.png"
    replay.main(["--trials-json", str(trials), "--all", "--seeds", "2", "--out", str(out), "--plot", str(png)])
    docs = json.loads(out.read_text())["sweeps"]
    assert [d["problem_key"].split(",")[0] for d in docs] == ["t=4", "t=64"]
    for doc in docs:
        names = [r["strategy"] for r in doc["strategies"]]
        assert "tpe (warm: + other problems' winners)" in names and "grid (spec order)" in names
        assert all(r["median_trials"] is None or 1 <= r["median_trials"] <= doc["valid_configs"]
                   for r in doc["strategies"])
    assert png.stat().st_size > 10_000

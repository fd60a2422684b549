"""benchmarks/coverage_rescore.py: a held-out run's problems answered again by the runtime as the
code and tables are now, scored from the run's own timings where it timed the answer."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import torch
from conftest import write_tuned_table

from omnitune import runtime
from omnitune.kernels.attention import SPEC, AttentionProblem
from omnitune.spec import Config

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import coverage_rescore

GPU = "Test GPU X1"
TUNED_AT = AttentionProblem(b=1, h=8, hkv=2, lq=2048, lk=2048, d=64, causal=True)
NEAR = dataclasses.replace(TUNED_AT, lq=1536, lk=1536)   # 1.33x: lent under any ratio ≥ 1.33
FAR = dataclasses.replace(TUNED_AT, lq=640, lk=640)      # 3.2x: lent under 4, not under 2
ALONE = dataclasses.replace(TUNED_AT, h=4, hkv=4, lq=512, lk=512)  # no entry with its heads: the default
TABLE = Config(BACKEND="triton", BLOCK_M=128, BLOCK_N=32, num_warps=8, num_stages=2, PACK_GQA=False, USE_TMA=True)
OTHER = Config(BACKEND="triton", BLOCK_M=32, BLOCK_N=128, num_warps=4, num_stages=4, PACK_GQA=True, USE_TMA=False)


def _table(folder: Path) -> None:
    write_tuned_table(folder, SPEC, GPU, [(TUNED_AT, "fp16", TABLE)], time_ms=0.5)


def _row(problem, pick, times) -> dict:
    default = SPEC.default_config(problem, torch.float16)
    return {"key": f"fp16|{SPEC.problem_key(problem)}", "kernel": "attention", "dtype": "fp16", "status": "ok",
            "problem": dataclasses.asdict(problem), "rung": "nearest",
            "configs": {"pick": dict(pick), "default": dict(default), "tuned": dict(OTHER)},
            "times_ms": dict(zip(("pick", "default", "tuned"), times)),
            "ratios": {"pick_over_tuned": times[0] / times[2]}}


def test_answers_are_scored_by_the_timing_of_the_config_they_match(tables_dir):
    _table(tables_dir)
    shipped = SPEC.match.max_ratio
    doc = {"device": {"name": GPU}, "rows": [
        _row(NEAR, TABLE, (1.0, 1.2, 1.0)),    # the table's config, timed as the pick
        _row(FAR, TABLE, (1.5, 1.0, 1.0)),     # the table's config lent 3.2x away: 1.5x the optimum
        _row(ALONE, OTHER, (1.0, 2.0, 1.0)),   # answered now by the default: 2x the optimum
    ]}
    with_four = coverage_rescore.rescore(doc, GPU, max_ratio=4.0)["kernels"]["attention"]
    assert [r["pick_over_tuned"] for r in with_four["rows"]] == [1.0, 1.5, 2.0]
    assert [r["timed_as"] for r in with_four["rows"]] == ["pick", "pick", "default"]
    assert with_four["within_95pct"] == 1 and [r["key"] for r in with_four["changed"]] == [doc["rows"][2]["key"]]

    with_two = coverage_rescore.rescore(doc, GPU, max_ratio=2.0)["kernels"]["attention"]
    far = with_two["rows"][1]
    assert far["rung"] == "default" and far["timed_as"] == "default" and far["pick_over_tuned"] == 1.0
    assert with_two["within_95pct"] == 2
    assert SPEC.match.max_ratio == shipped  # put back after the block
    runtime.clear_cache()


def test_an_answer_the_run_never_timed_is_not_measured(tables_dir):
    _table(tables_dir)
    row = _row(NEAR, OTHER, (1.0, 1.2, 1.0))
    row["configs"]["tuned"] = dict(OTHER.replace(num_stages=3))  # the table's config is none of the three
    scored = coverage_rescore.rescore({"rows": [row]}, GPU)["kernels"]["attention"]
    assert scored["rows"][0]["pick_over_tuned"] is None and scored["rows"][0]["timed_as"] is None
    assert scored["not_measured"] == [row["key"]] and scored["within_95pct"] == 0


def test_the_command_line_reads_a_results_file(tables_dir, tmp_path, capsys):
    _table(tables_dir)
    path = tmp_path / "coverage.json"
    path.write_text(json.dumps({"device": {"name": GPU}, "rows": [_row(NEAR, TABLE, (1.0, 1.2, 1.0))]}))
    out = tmp_path / "rescored.json"
    assert coverage_rescore.main([str(path), "--json", str(out)]) == 0
    assert "attention: 1 of 1 within 95%" in capsys.readouterr().out
    assert json.loads(out.read_text())["kernels"]["attention"]["timed"] == 1
    (tmp_path / "bare.json").write_text(json.dumps({"rows": []}))
    assert coverage_rescore.main([str(tmp_path / "bare.json")]) == 2

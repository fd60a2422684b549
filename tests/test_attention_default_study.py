"""benchmarks/attention_default_study.py chooses attention's untuned answer: its problems must be
none that the held-out evaluation judges that answer on, none a preset point and none a shipped
table's entry; every candidate it times must be valid; and its rule analysis must score rules as
they are meant to (checked here on made-up timings with a known answer)."""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import attention_default_study as study

from omnitune.kernels.attention import SPEC, AttentionProblem
from omnitune.profile.bench import BenchRow

A = AttentionProblem
BF16 = torch.bfloat16


def _keys(problems) -> set[str]:
    return {SPEC.problem_key(p) for p, _ in problems}


def test_training_is_neither_held_out_nor_preset_nor_a_shipped_entry():
    keys = _keys(study.TRAINING)
    assert 24 <= len(study.TRAINING) <= 30 and len(keys) == len(study.TRAINING)
    assert not keys & study.held_out_keys()
    assert not keys & study.preset_keys()
    assert study.preset_keys(), "no preset problems found: the check above would prove nothing"
    shipped = set()
    for path in (ROOT / "tuned_configs" / "attention").glob("*.json"):
        shipped |= {key.split("|", 1)[1] for key in json.loads(path.read_text())["entries"]}
    assert not keys & shipped


def test_training_spans_both_questions():
    problems = [p for p, _ in study.TRAINING]
    prefill = [p for p in problems if study.kind_of(p) == "prefill"]
    assert len({p.lq for p in prefill if 256 <= p.lq < 1024}) >= 5, "the SDPA threshold needs points below 1,024"
    assert {True, False} == {p.causal for p in prefill}
    light = [p for p in problems if study.kind_of(p) == "query_light"]
    assert {True, False} == {p.causal for p in light}
    assert min(p.lq for p in light) == 1 and max(p.lk for p in light) >= 16000
    assert any(study.kind_of(p) == "cross" for p in problems)
    assert {"bf16", "fp16"} == {d for _, d in study.TRAINING} and {64, 128} == {p.d for p in problems}


def test_every_candidate_is_valid_and_the_untuned_answer_is_recorded_as_what_it_is():
    for problem, dtype_name in study.TRAINING:
        dtype = study.DTYPES[dtype_name]
        chosen = study.candidates(problem, dtype)
        assert {"default", "untuned", "sdpa", "sdpa_cudnn"} <= set(chosen)
        assert chosen["untuned"] == SPEC.untuned_answer(problem, dtype)
        assert all(not SPEC.violations(problem, c, dtype) for c in chosen.values())
        distinct, aliases = study.measured_once(chosen)
        assert len(set(distinct.values())) == len(distinct)
        assert aliases["untuned"] in ("default", "sdpa")


# Made-up timings (ms) by candidate name; any candidate not named takes 2 ms.
P_640 = A(b=2, h=32, hkv=4, lq=640, lk=640, d=128, causal=True)      # SDPA wins
P_384 = A(b=2, h=32, hkv=4, lq=384, lk=384, d=128, causal=True)      # the default wins
P_LIGHT = A(b=8, h=32, hkv=4, lq=4, lk=4000, d=128, causal=True)     # 8 warps over 128 keys win
P_ONE = A(b=4, h=16, hkv=16, lq=1, lk=3000, d=128, causal=True)      # one row: no 32-row tile applies
TIMES = {
    P_640: {"default": 1.0, "sdpa": 0.8},
    P_384: {"default": 1.0, "sdpa": 1.2},
    P_LIGHT: {"default": 1.0, "m16_n128_w8_s2": 0.7, "sdpa": 3.0},
    P_ONE: {"default": 1.0, "m16_n128_w8_s2": 1.02, "sdpa": 3.0},
}


@pytest.fixture(scope="module")
def rows():
    """The study's rows for the made-up timings: measure() with run_bench answering from TIMES."""
    def fake_bench(spec, problem, dtype, configs, **kwargs):
        return [BenchRow(f"omnitune[{name}]", "omnitune", "ok", TIMES[problem].get(name, 2.0), rel_error=0.0,
                         config=config.as_dict()) for name, config in configs.items()]

    original = study.run_bench
    study.run_bench = fake_bench
    try:
        return [study.measure(p, "bf16", study.candidates(p, BF16), interpret=False, repetitions=1, sms=132)
                for p in TIMES]
    finally:
        study.run_bench = original


def test_the_rows_name_the_fastest_and_give_aliases_the_time_of_what_they_are(rows):
    by_problem = {SPEC.parse_shape(r["problem"]): r for r in rows}
    assert [by_problem[p]["fastest"] for p in TIMES] == ["sdpa", "default", "m16_n128_w8_s2", "default"]
    light = by_problem[P_LIGHT]["candidates"]
    assert light["untuned"]["same_as"] == "default" and light["untuned"]["over_best"] == pytest.approx(1 / 0.7)
    assert light["m32_n128_w4_s3"]["same_as"] == "default"  # the default's own tile, under its name
    assert "m32_n128_w4_s3" not in by_problem[P_ONE]["candidates"]  # 1 row: a 32-row tile breaks a constraint


def test_the_rules_score_as_the_timings_say(rows):
    scores = study.analyze(rows)
    assert scores["untuned today"]["within_5pct"] == 2  # P_384, P_ONE
    assert scores["sdpa from 512 rows"] | {} == scores["sdpa from 640 rows"]
    assert (scores["sdpa from 512 rows"]["within_5pct"], scores["sdpa from 512 rows"]["changed"]) == (3, 1)
    assert scores["sdpa from 256 rows"]["within_5pct"] == 2  # P_384 to SDPA: 1.2x
    assert scores["sdpa from 768 rows"]["within_5pct"] == 2
    assert scores["query-light causal: m16_n128_w8_s2"]["within_5pct"] == 3
    assert scores["query-light causal: m16_n128_w8_s2"]["changed"] == 2  # P_LIGHT and P_ONE
    # the default's own tile changes nothing; SDPA for query-light causal is 3x slower
    assert scores["query-light causal: m32_n128_w4_s3"]["changed"] == 0
    assert scores["query-light causal: sdpa"]["worst_over_best"] == pytest.approx(3 / 0.7)
    both = functools.partial(study.first_of, rules=(
        functools.partial(study.sdpa_from_rows, rows=512),
        functools.partial(study.query_light_tile, tile="m16_n128_w8_s2")))
    assert study.score(rows, both)["within_5pct"] == 4
    assert study.score(rows, both)["geomean_over_best"] == pytest.approx(1.02 ** 0.25)


def test_a_rule_falls_back_to_the_untuned_answer_where_its_tile_does_not_apply(rows):
    one = next(r for r in rows if SPEC.parse_shape(r["problem"]) == P_ONE)
    rule = functools.partial(study.first_of, rules=(functools.partial(study.query_light_tile, tile="m32_n128_w4_s3"),))
    assert rule(P_ONE, one["candidates"]) == "untuned"
    # the smallest 128-key tile: 32 rows for 4 queries × 8 heads packed, 16 for one row
    light = next(r for r in rows if SPEC.parse_shape(r["problem"]) == P_LIGHT)
    assert study.smallest_wide_tile(P_LIGHT, light["candidates"]) == "m32_n128_w4_s3"
    assert study.smallest_wide_tile(P_ONE, one["candidates"]) == "m16_n128_w4_s3"
    # not query-light, or not causal: the tile rules say nothing
    assert study.query_light_tile(P_640, {}, tile="m16_n128_w4_s3") is None
    assert study.query_light_tile(A(b=4, h=16, hkv=16, lq=1, lk=3000, d=128), {"m16_n128_w4_s3": {}},
                                  tile="m16_n128_w4_s3") is None


def test_the_summary_lays_out_both_questions(rows):
    s = study.summary(rows)
    assert [r["lq"] for r in s["prefill_by_rows"]] == [384, 640]
    assert s["prefill_by_rows"][1]["default_over_sdpa"] == pytest.approx(1.25)
    winners = {r["problem"]: r for r in s["query_light_winners"]}
    light = winners[SPEC.problem_key(P_LIGHT)]
    assert (light["fastest"], light["rows_a_program"], light["default_programs"]) == ("m16_n128_w8_s2", 32, 32)
    assert s["candidates"]["sdpa"]["worst_over_best"] == pytest.approx(3 / 0.7)
    assert s["candidates"]["default"]["within_5pct"] == 2

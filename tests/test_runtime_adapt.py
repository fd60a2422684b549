"""The nearest rung carries a tuned config over to the shape asked by the kernel's rule
(KernelSpec.adapt): paged decode scales its split count so the grid keeps the tuned shape's
number of programs. A rule that raises, leaves the space or breaks a constraint leaves the tuned
config as it is."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import write_tuned_table

from omnitune import runtime
from omnitune.kernels import paged_decode_attention as pda
from omnitune.runtime import Rung, _adapt
from omnitune.spec import Config

GPU = "Test GPU X1"
TUNED_PROBLEM = pda.PagedDecodeProblem(b=4, h=28, hkv=4, lq=1, ctx=16384, d=128, block_size=16)
TUNED = Config(BLOCK_N=64, FUSED_REDUCE=False, NUM_SPLITS=32, PACK_GQA=True, num_stages=2, num_warps=4)


def _write_table(config_dir, problem=TUNED_PROBLEM, config=TUNED):
    write_tuned_table(config_dir, pda.SPEC, GPU, [(problem, "bf16", config)], time_ms=0.04, trials=20,
                      measured_at="2026-12-01T12:00:00+00:00")


@pytest.mark.parametrize("b, ctx, splits", [
    (1, 32768, 128),   # a quarter of the sequences: four times the splits (512 programs as tuned)
    (2, 65536, 64),
    (4, 16384, 32),    # the tuned shape itself: unchanged
    (16, 16384, 8),
    (64, 16384, 2),
    (1, 4096, 16),     # capped: at least 256 keys per split
])
def test_paged_decode_splits_follow_the_programs_the_tuned_grid_had(b, ctx, splits):
    problem = dataclasses.replace(TUNED_PROBLEM, b=b, ctx=ctx)
    adapted = pda.adapt_config(TUNED_PROBLEM, problem, TUNED)
    assert adapted["NUM_SPLITS"] == splits
    assert adapted.replace(NUM_SPLITS=32) == TUNED  # nothing else moves
    assert not pda.SPEC.violations(problem, adapted, torch.bfloat16)


def test_a_split_count_of_one_drops_the_in_launch_reduction():
    fused = TUNED.replace(FUSED_REDUCE=True)
    problem = dataclasses.replace(TUNED_PROBLEM, b=256, ctx=512)
    adapted = pda.adapt_config(TUNED_PROBLEM, problem, fused)
    assert adapted["NUM_SPLITS"] == 1 and adapted["FUSED_REDUCE"] is False
    assert not pda.SPEC.violations(problem, adapted, torch.bfloat16)


def test_a_one_split_grid_that_overfills_the_wave_takes_the_defaults_smaller_tile():
    # Tuned at batch 64 × 4 kv heads (256 programs: one wave of 3 an SM holds them), one split of
    # 64-key tiles; carried to batch 128 (512 programs, past the wave): 32-key tiles over 2 warps,
    # as the default takes there. Within the wave, or from a tuned grid that overfilled it too,
    # the tile stays as tuned.
    tuned_problem = dataclasses.replace(TUNED_PROBLEM, b=64, ctx=4096)
    one_split = TUNED.replace(NUM_SPLITS=1, num_stages=3)
    big = dataclasses.replace(tuned_problem, b=128, ctx=1500)
    adapted = pda.adapt_config(tuned_problem, big, one_split)
    assert adapted == one_split.replace(BLOCK_N=32, num_warps=2)
    assert adapted == pda.SPEC.default_config(big, torch.bfloat16)
    assert not pda.SPEC.violations(big, adapted, torch.bfloat16)
    within = dataclasses.replace(tuned_problem, b=96, ctx=3000)  # 384 programs: still one wave
    assert pda.adapt_config(tuned_problem, within, one_split) == one_split
    overfilled = dataclasses.replace(tuned_problem, b=160)  # 640 programs tuned
    assert pda.adapt_config(overfilled, dataclasses.replace(overfilled, b=256), one_split) == one_split
    two_waves = dataclasses.replace(tuned_problem, b=256, ctx=1500)  # 1024 programs: 16-key tiles
    assert pda.adapt_config(tuned_problem, two_waves, one_split) == one_split.replace(BLOCK_N=16, num_warps=2)
    assert pda.adapt_config(tuned_problem, two_waves, one_split) == pda.SPEC.default_config(two_waves, torch.bfloat16)
    fp8 = dataclasses.replace(big, cache_dtype="fp8_e4m3")  # the default keeps its tile over fp8
    assert pda.adapt_config(dataclasses.replace(tuned_problem, cache_dtype="fp8_e4m3"), fp8, one_split) == one_split


def test_the_nearest_rung_answers_with_the_adapted_config_and_says_so(tables_dir):
    _write_table(tables_dir)
    problem = dataclasses.replace(TUNED_PROBLEM, b=1, ctx=32768)
    answer = runtime.lookup(pda.SPEC.name, problem, torch.bfloat16, GPU)
    assert answer.rung is Rung.NEAREST
    assert answer.config == TUNED.replace(NUM_SPLITS=128)
    assert answer.tuned_config == TUNED
    why = runtime.explain(pda.SPEC.name, problem, torch.bfloat16, GPU).why
    assert "adapted" in why and TUNED.label() in why


def test_a_shape_with_the_tuned_grid_gets_the_tuned_config_unmarked(tables_dir):
    _write_table(tables_dir)
    problem = dataclasses.replace(TUNED_PROBLEM, ctx=32768)  # same batch: same programs
    answer = runtime.lookup(pda.SPEC.name, problem, torch.bfloat16, GPU)
    assert answer.rung is Rung.NEAREST and answer.config == TUNED and answer.tuned_config is None


@pytest.mark.parametrize("rule", [
    lambda tuned, problem, config: 1 / 0,                                  # raises
    lambda tuned, problem, config: config.replace(NUM_SPLITS=3),            # not in the space
    lambda tuned, problem, config: "not a config",
    lambda tuned, problem, config: config,                                  # changes nothing
])
def test_a_rule_that_raises_or_leaves_the_space_adapts_nothing(rule):
    spec = dataclasses.replace(pda.SPEC, adapt=rule)
    assert _adapt.carried_over(spec, TUNED_PROBLEM, dataclasses.replace(TUNED_PROBLEM, b=1), TUNED) is None


def test_an_adapted_config_that_breaks_a_constraint_is_not_served(tables_dir, monkeypatch):
    # 128 splits of 128-key tiles leave splits of an 8k context empty: the tuned config answers.
    monkeypatch.setattr(pda, "adapt_config", lambda tuned, problem, config: config.replace(NUM_SPLITS=128, BLOCK_N=128))
    _write_table(tables_dir)
    problem = dataclasses.replace(TUNED_PROBLEM, b=1, ctx=8192)
    answer = runtime.lookup(pda.SPEC.name, problem, torch.bfloat16, GPU)
    assert answer.rung is Rung.NEAREST and answer.config == TUNED and answer.tuned_config is None


def _predictor_block(points):
    from omnitune.runtime._predictor import KIND, default_features

    features, match = default_features(pda.SPEC)
    return {"kind": KIND, "neighbours": 4, "features": list(features), "match": list(match),
            "points": {f"bf16|{pda.SPEC.problem_key(p)}": {"dtype": "bf16", "problem": dataclasses.asdict(p),
                                                          "time_ratios": {c.label(): r for c, r in ratios.items()}}
                       for p, ratios in points}}


def test_the_predictor_ranks_its_neighbours_configs_as_carried_over_to_the_problem():
    # Measured at batch 4: 32 splits best (512 programs), 8 splits 1.5x slower. Asked for batch 1
    # with twice the kv heads: the 32 splits that filled the GPU there are 64 here, and they rank
    # first; without the rule the ranking would offer the neighbour's own 32.
    from omnitune.runtime._predictor import parse_predictor

    fewer = TUNED.replace(NUM_SPLITS=8)
    predictor, bad, _ = parse_predictor(_predictor_block([(TUNED_PROBLEM, {TUNED: 1.0, fewer: 1.5})]), pda.SPEC)
    assert not bad
    target = pda.PagedDecodeProblem(b=1, h=56, hkv=8, lq=1, ctx=32768, d=128, block_size=16)
    ranking = predictor.rank(pda.SPEC, target, torch.bfloat16)
    (best_ratio, best), (_, second) = ranking.candidates()
    assert best == TUNED.replace(NUM_SPLITS=64) and best_ratio == 1.0
    assert second == TUNED.replace(NUM_SPLITS=16)
    assert ranking.estimate(TUNED) == ranking.neighbours[0][1].typical  # the as-measured 32: not a candidate here
    plain = predictor.rank(dataclasses.replace(pda.SPEC, adapt=None), target, torch.bfloat16)
    assert plain.candidates()[0] == (1.0, TUNED)


# --- attention: the long causal prefill tile stays above the length the default takes it at ----

LONG = Config(BACKEND="triton", BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=3, PACK_GQA=False, USE_TMA=True)


@pytest.mark.parametrize("lq, expected", [
    (3000, LONG.replace(BLOCK_M=64, BLOCK_N=64, num_warps=4)),  # below 8,192: the plain tile
    (12000, LONG),                                              # above: as tuned
])
def test_attention_carries_the_long_prefill_tile_only_where_the_default_takes_it(tables_dir, lq, expected):
    from omnitune.kernels import attention
    from omnitune.kernels.attention import AttentionProblem

    tuned = AttentionProblem(b=1, h=16, hkv=2, lq=8510, lk=8510, d=128, causal=True, spans=1, span_len=256)
    write_tuned_table(tables_dir, attention.SPEC, GPU, [(tuned, "bf16", LONG)], time_ms=1.0)
    problem = dataclasses.replace(tuned, lq=lq, lk=lq, spans=2, span_len=729)
    answer = runtime.lookup("attention", problem, torch.bfloat16, GPU)
    assert answer.rung is Rung.NEAREST and answer.config == expected
    assert answer.tuned_config == (LONG if expected != LONG else None)


def test_attention_carries_every_other_config_as_tuned():
    from omnitune.kernels.attention import AttentionProblem, adapt_config

    tuned = AttentionProblem(b=1, h=16, hkv=2, lq=8510, lk=8510, d=128, causal=True, spans=1, span_len=256)
    short = dataclasses.replace(tuned, lq=3000, lk=3000)
    other = LONG.replace(BLOCK_N=64)  # not the long-prefill tile
    assert adapt_config(tuned, short, other) == other
    sdpa = LONG.replace(BACKEND="sdpa")
    assert adapt_config(tuned, short, sdpa) == sdpa
    plain = {"causal": False, "spans": 0, "span_len": 0}
    assert adapt_config(dataclasses.replace(tuned, **plain), dataclasses.replace(short, **plain), LONG) == LONG

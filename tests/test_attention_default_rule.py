"""Attention's default for query-light tiles over long key ranges: 128-key tiles where a tile holds
≤ 32 query rows and the keys number ≥ 1,024, or 64 rows and ≥ 16,000 keys, and the grid has no
more programs than the SMs (the H200 trials behind it: the comments at WIDE_KEY_TILE_MAX_ROWS and
WIDE_KEY_TILE_64_ROWS_MIN_KEYS in omnitune/kernels/attention.py).
Every default and untuned answer stays a valid config, whatever the shape, dtype or device."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch

from omnitune.kernels import attention as attention_module
from omnitune.kernels.attention import (
    LONG_PREFILL_MIN_QUERIES,
    SPEC,
    WIDE_KEY_TILE_64_ROWS_MIN_KEYS,
    WIDE_KEY_TILE_MIN_KEYS,
    AttentionProblem,
)
from omnitune.spec import Config, DeviceLimits

from conftest import DEVICE

BF16 = torch.bfloat16


def _tile(cfg: Config) -> tuple:
    return (cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["num_warps"], cfg["num_stages"], cfg["PACK_GQA"], cfg["USE_TMA"])


@pytest.mark.parametrize("problem, tile", [
    # the training shapes: one query over 4,096 / 16,384 keys at batch 4, 16 programs packed — the
    # 128-key tile was the best config of this kernel the searches found on both
    (AttentionProblem(b=4, h=28, hkv=4, lq=1, lk=4096, d=128), (16, 128, 4, 3, True, True)),
    (AttentionProblem(b=4, h=28, hkv=4, lq=1, lk=16384, d=128), (16, 128, 4, 3, True, True)),
    # causal, a few queries over long keys: 16 and 28 packed rows (16- and 32-row tiles), 32 and 8 programs
    (AttentionProblem(b=8, h=32, hkv=4, lq=2, lk=4096, d=128, causal=True), (16, 128, 4, 3, True, True)),
    (AttentionProblem(b=2, h=28, hkv=4, lq=4, lk=8192, d=128, causal=True), (32, 128, 4, 3, True, True)),
    # no GQA: 8 rows of one head a program, 64 programs
    (AttentionProblem(b=4, h=16, hkv=16, lq=8, lk=2048, d=64, causal=True), (16, 128, 4, 3, False, True)),
    # a span mask: the same rows, the same loads
    (AttentionProblem(b=1, h=28, hkv=4, lq=1, lk=9000, d=128, causal=True, spans=1, span_len=300),
     (16, 128, 4, 3, True, True)),
    # not taken: 256 programs (batch 64; measured neutral), more than the SMs
    (AttentionProblem(b=64, h=28, hkv=4, lq=1, lk=4096, d=128), (16, 64, 4, 3, True, True)),
    # not taken: 1,792 programs unpacked (measured 1.185x slower with 128 keys)
    (AttentionProblem(b=64, h=28, hkv=28, lq=1, lk=4096, d=128), (16, 64, 4, 3, False, True)),
    # not taken: fewer than 1,024 keys
    (AttentionProblem(b=4, h=28, hkv=4, lq=1, lk=1023, d=128), (16, 64, 4, 3, True, True)),
    # not taken: 64-row tiles (8 queries × 8 heads a kv head; 128 queries) under 16,000 keys —
    # slower with 128 keys
    (AttentionProblem(b=1, h=32, hkv=4, lq=8, lk=8192, d=128, causal=True), (64, 64, 4, 3, True, True)),
    (AttentionProblem(b=1, h=28, hkv=4, lq=128, lk=4096, d=128, causal=True), (64, 64, 4, 3, False, True)),
    # taken: 64-row tiles over ≥ 16,000 keys on a grid no larger than the SMs (the study's three:
    # 28 and 128 programs)
    (AttentionProblem(b=1, h=28, hkv=4, lq=64, lk=20000, d=128), (64, 128, 4, 3, False, True)),
    (AttentionProblem(b=1, h=64, hkv=8, lq=128, lk=16000, d=128, causal=True), (64, 128, 4, 3, False, True)),
    (AttentionProblem(b=1, h=32, hkv=8, lq=256, lk=16000, d=128), (64, 128, 4, 3, False, True)),
    # not taken: 160 programs (640 causal queries, 16 heads), more than the SMs — measured slower
    (AttentionProblem(b=1, h=16, hkv=2, lq=640, lk=24000, d=128, causal=True), (64, 64, 4, 3, False, True)),
    # not taken: 3 stages of 128-key tiles do not fit at d=256 (the 2-stage wide tile measured slower)
    (AttentionProblem(b=4, h=28, hkv=4, lq=1, lk=4096, d=256), (16, 64, 4, 3, True, True)),
])
def test_the_default_takes_128_key_tiles_for_few_rows_over_long_keys_on_a_small_grid(problem, tile):
    cfg = SPEC.default_config(problem, BF16)
    assert _tile(cfg) == tile, cfg
    assert cfg["BACKEND"] == "triton" and not SPEC.violations(problem, cfg, BF16)


@pytest.mark.parametrize("problem, tile", [
    # causal prefill of ≥ 8,192 rows at head dim 128, with spans or without: 128×128 over 8 warps
    # (the shipped table's 9 such entries with spans all chose it)
    (AttentionProblem(b=1, h=28, hkv=4, lq=8260, lk=8260, d=128, causal=True, spans=1, span_len=256),
     (128, 128, 8, 3, False, True)),
    (AttentionProblem(b=1, h=64, hkv=8, lq=12000, lk=12000, d=128, causal=True, spans=8, span_len=1000),
     (128, 128, 8, 3, False, True)),
    (AttentionProblem(b=1, h=32, hkv=4, lq=16384, lk=16384, d=128, causal=True), (128, 128, 8, 3, False, True)),
    # not taken: shorter (the searches kept 64×64 at 640-765 rows), not causal, another head dim
    (AttentionProblem(b=1, h=28, hkv=4, lq=4096, lk=4096, d=128, causal=True, spans=1, span_len=256),
     (64, 64, 4, 3, False, True)),
    (AttentionProblem(b=1, h=32, hkv=4, lq=16384, lk=16384, d=128), (64, 64, 4, 3, False, True)),
    (AttentionProblem(b=1, h=24, hkv=4, lq=20000, lk=20000, d=64, causal=True, spans=20, span_len=300),
     (64, 64, 4, 3, False, True)),
])
def test_long_causal_prefill_takes_128_by_128_tiles_over_8_warps(problem, tile):
    for dtype in (BF16, torch.float16):
        cfg = SPEC.default_config(problem, dtype)
        assert _tile(cfg) == tile, (dtype, cfg)
        assert not SPEC.violations(problem, cfg, dtype)


def test_fp32_keeps_64_key_tiles_where_3_stages_of_128_do_not_fit():
    problem = AttentionProblem(b=4, h=28, hkv=4, lq=1, lk=4096, d=128)
    assert SPEC.default_config(problem, torch.float16)["BLOCK_N"] == 128
    cfg = SPEC.default_config(problem, torch.float32)
    assert (cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["num_stages"]) == (16, 64, 3)
    assert not SPEC.violations(problem, cfg, torch.float32)


def test_the_rule_reads_the_devices_sms_and_tma(monkeypatch):
    problem = AttentionProblem(b=8, h=32, hkv=4, lq=2, lk=4096, d=128, causal=True)  # 32 programs
    few = AttentionProblem(b=4, h=28, hkv=4, lq=1, lk=4096, d=128)  # 16 programs: fewer than 132 SMs
    assert SPEC.default_config(problem, BF16)["BLOCK_N"] == 128
    assert SPEC.untuned_answer(few, BF16)["BACKEND"] == "sdpa"
    # a GPU of 16 SMs: 32 programs are more than its SMs, and 16 fill them
    monkeypatch.setattr(attention_module, "_device_limits", lambda: DeviceLimits(multiprocessors=16))
    assert SPEC.default_config(problem, BF16)["BLOCK_N"] == 64
    assert SPEC.untuned_answer(few, BF16)["BACKEND"] == "triton"
    monkeypatch.undo()
    # no TMA (before sm_90): the same wide tile through pointer loads, valid there
    monkeypatch.setattr(attention_module, "_tma_here", lambda: False)
    older = SPEC.default_config(problem, BF16)
    assert _tile(older) == (16, 128, 4, 3, True, False)
    assert not SPEC.violations(problem, older, BF16, dataclasses.replace(DeviceLimits(), compute_capability=(8, 0)))


@pytest.mark.parametrize("problem, backend, block_n", [
    # non-causal, a grid smaller than the SMs: the SDPA rule still answers first
    (AttentionProblem(b=4, h=28, hkv=4, lq=1, lk=4096, d=128), "sdpa", None),
    # causal: this kernel, with the wide tile
    (AttentionProblem(b=8, h=32, hkv=4, lq=2, lk=4096, d=128, causal=True), "triton", 128),
    (AttentionProblem(b=64, h=28, hkv=4, lq=1, lk=4096, d=128), "triton", 64),
    # non-causal, a small grid of 64-row tiles: not SDPA (1.32x and 1.52x slower there), the wide tile
    (AttentionProblem(b=1, h=32, hkv=8, lq=256, lk=16000, d=128), "triton", 128),
    (AttentionProblem(b=1, h=28, hkv=4, lq=64, lk=20000, d=128), "triton", 128),
])
def test_the_untuned_answer_keeps_its_order(problem, backend, block_n):
    answer = SPEC.untuned_answer(problem, BF16)
    assert answer.get("BACKEND", "triton") == backend
    if block_n is not None:
        assert answer["BLOCK_N"] == block_n
    assert not SPEC.violations(problem, answer, BF16)


def _sweep():
    for (h, hkv), lq, lk, d, b, mask in itertools.product(
            ((1, 1), (8, 2), (28, 4), (64, 8)),
            (1, 4, 7, 33, 96, 2048, 8192),
            (20, 1023, 3000, 32768),
            (64, 80, 128, 256),
            (1, 64),
            ("none", "causal", "spans")):
        if mask == "spans":
            if lk < 8:
                continue
            yield AttentionProblem(b=b, h=h, hkv=hkv, lq=lq, lk=lk, d=d, causal=True, spans=1, span_len=lk // 4)
        else:
            yield AttentionProblem(b=b, h=h, hkv=hkv, lq=lq, lk=lk, d=d, causal=mask == "causal")


def test_every_default_and_untuned_answer_is_valid_over_a_sweep(monkeypatch):
    problems = list(_sweep())
    wide = 0
    for tma in (True, False):
        monkeypatch.setattr(attention_module, "_tma_here", lambda: tma)
        limits = DeviceLimits() if tma else dataclasses.replace(DeviceLimits(), compute_capability=(8, 0))
        for problem in problems:
            for dtype in (torch.float16, torch.bfloat16, torch.float32):
                for cfg in (SPEC.default_config(problem, dtype), SPEC.untuned_answer(problem, dtype)):
                    assert not SPEC.violations(problem, cfg, dtype, limits), (problem, dtype, cfg)
                    assert SPEC.coerce_config(cfg.as_dict()) == cfg
                default = SPEC.default_config(problem, dtype)
                if default["BLOCK_M"] == 128:  # long causal prefill
                    assert problem.causal and problem.lq >= LONG_PREFILL_MIN_QUERIES and problem.d == 128
                    assert (default["BLOCK_N"], default["num_warps"], default["num_stages"]) == (128, 8, 3)
                elif default["BLOCK_N"] == 128:
                    wide += 1
                    assert ((default["BLOCK_M"] <= 32 and problem.lk >= WIDE_KEY_TILE_MIN_KEYS)
                            or (default["BLOCK_M"] == 64 and problem.lk >= WIDE_KEY_TILE_64_ROWS_MIN_KEYS))
                    assert default["num_stages"] == 3 and default["num_warps"] == 4
    assert wide  # the sweep reaches the rule


def test_the_wide_tile_computes_attention():
    # the rule's config on a shape it fires for, small enough for the interpreter: one query head
    # pair over 1,024 keys (8 tiles), causal and not
    for causal in (False, True):
        problem = AttentionProblem(b=1, h=2, hkv=1, lq=3, lk=1024, d=64, causal=causal)
        cfg = SPEC.default_config(problem, torch.float16)
        assert (cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["PACK_GQA"]) == (16, 128, True)
        inputs = SPEC.make_inputs(problem, torch.float16, DEVICE, seed=3)
        out = SPEC.new_output(inputs)
        assert SPEC.launch(inputs, out, cfg) is None
        assert SPEC.compare(out, SPEC.reference(inputs)) < SPEC.tolerance[torch.float16]


@pytest.mark.parametrize("lq, h, hkv, packed", [
    (4, 16, 2, True),     # fewer rows than a tile: packed, as before
    (80, 28, 4, True),    # 80 rows pad to 128 a head; 7 heads packed, 560 rows pad to 576
    (160, 24, 8, True),   # 3 heads: 480 rows pad to 512, against 3 × 192
    (128, 64, 8, False),  # whole tiles either way: one head a tile
    (200, 28, 4, False),  # past the measured range: one head a tile
    (80, 16, 16, False),  # no GQA: nothing to pack
])
def test_the_default_packs_query_heads_where_it_pads_fewer_rows(lq, h, hkv, packed):
    problem = AttentionProblem(b=8, h=h, hkv=hkv, lq=lq, lk=3000, d=128, causal=True)
    default = SPEC.default_config(problem, BF16)
    assert bool(default["PACK_GQA"]) is packed
    assert not SPEC.violations(problem, default, BF16)

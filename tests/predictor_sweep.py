"""A stored synthetic sweep with a known structure, for the predictor's tests: kv_cache_write
problems of 64 to 4,096 tokens, every valid config measured with made-up times whose best token
block is t/64 — so the best config follows one dimension in a known way."""

from __future__ import annotations

import math

import torch

from omnitune.kernels.kv_cache_write import SPEC, KVCacheWriteProblem
from trial_rows import trial_row

FP16 = torch.float16
TOKENS = (64, 128, 256, 512, 1024, 2048, 4096)


def problem(t, hkv=4):
    return KVCacheWriteProblem(t=t, hkv=hkv, d=128, block_size=16)


def best_block_t(t):
    """The known structure: the fastest token block is t/64 (one octave of t, one of BLOCK_T)."""
    return min(64, max(1, t // 64))


def synthetic_ms(p, config):
    """Made-up times: a quadratic bowl in log2 BLOCK_T around best_block_t, all kv heads per program
    best, fewer warps slightly better."""
    miss = math.log2(config["BLOCK_T"]) - math.log2(best_block_t(p.t))
    return (p.t * 1e-4 * (1 + 0.3 * miss**2) * (1 + 0.2 * abs(math.log2(config["BLOCK_H"]) - 2))
            * (1 + 0.05 * math.log2(config["num_warps"])))


def true_best(p):
    return min(SPEC.valid_configs(p, FP16), key=lambda c: (synthetic_ms(p, c), c.label()))


def sweep_rows(tokens=TOKENS, hkv=4):
    """Every valid config of each problem measured, plus a fast mismatch and a slow re-timing
    of the winner: neither may count."""
    rows = []
    for t in tokens:
        p = problem(t, hkv)
        default = SPEC.default_config(p, FP16)
        configs = SPEC.valid_configs(p, FP16)
        for n, config in enumerate(configs):
            rows.append(trial_row(n, p, config, time_ms=synthetic_ms(p, config), is_default=config == default,
                                  spec=SPEC))
        worst = max(configs, key=lambda c: synthetic_ms(p, c))
        rows.append(trial_row(len(configs), p, worst.replace(num_warps=1) if worst["num_warps"] > 1 else worst,
                              status="mismatch", time_ms=1e-9, spec=SPEC))
        rows.append(trial_row(len(configs) + 1, p, true_best(p), time_ms=synthetic_ms(p, true_best(p)) * 10,
                              extra={"finalist": {"session": 1, "cv": 0.01}}, spec=SPEC))
    return rows

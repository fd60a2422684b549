"""Paged decode with few sequences and long contexts (issue 15's batch 1–4 × 32k–128k), as users
call it, beside SDPA over a contiguous cache, in one run.

A few sequences cannot fill 132 SMs unless each is split many ways; the default config splits
until the grid fills one wave of 4 programs per SM (up to 128 splits). Per shape (bf16, h28/4,
d=128, pages of 16), every implementation measured the ways benchmarks/ops_bench.py measures (eager back to back with host
time, and as CUDA-graph replays), interleaved, medians, % of this device's copy bandwidth by the
kernel's byte model:
  - sdpa_contiguous: SDPA over the same context gathered into a contiguous cache (no PyTorch
    path reads a paged cache);
  - omnitune_plan_run: PagedDecodePlan.run with the config the tables answer for the shape;
  - default_plan_run: the same with the kernel's default config (what an untuned shape gets);
  - splits_N: the default config with N splits (does the split count the default picks fill the
    GPU, or would more help?).

    PYTHONPATH=$PWD python benchmarks/long_decode_bench.py --out $OUT/long_decode_h200.json
"""

from __future__ import annotations

import sys

import torch

from benchmarks.ops_bench import Case, cases_main, paged_decode_case

BATCHES = (1, 2, 4)
CONTEXTS = (32768, 65536, 131072)
HEADS, KV_HEADS = 28, 4
SPLIT_PROBES = (64, 128)


def long_decode_case(device, b: int, ctx: int) -> Case:
    from omnitune.kernels import paged_decode_attention as pda

    problem = pda.PagedDecodeProblem(b=b, h=HEADS, hkv=KV_HEADS, lq=1, ctx=ctx, d=128, block_size=16)
    default = pda.SPEC.default_config(problem, torch.bfloat16)
    configs = {"default_plan_run": default}
    for splits in SPLIT_PROBES:
        probe = default.replace(NUM_SPLITS=splits)
        if splits != int(default["NUM_SPLITS"]) and not pda.SPEC.violations(problem, probe, torch.bfloat16):
            configs[f"splits_{splits}"] = probe
    case = paged_decode_case(device, b=b, h=HEADS, hkv=KV_HEADS, ctx=ctx, extra_plans=configs)
    case.notes += f"; default {default.label()}"
    return case


def cases(device) -> list:
    return [lambda b=b, ctx=ctx: long_decode_case(device, b, ctx) for b in BATCHES for ctx in CONTEXTS]


def main(argv=None) -> int:
    return cases_main(__doc__.splitlines()[0], "long_decode_bench", cases, argv)

if __name__ == "__main__":
    sys.exit(main())

"""Paged decode in one launch against two, as users call it, beside SDPA, in one run.

A split config launches the split kernel and then the combine kernel: two C launches of host
time per decode step, and on the GPU the combine's own time and the gap before it. One launch
does it all where the split's partials are combined in the same launch (FUSED_REDUCE, the last
split of each column combining them) or where there is one split (no partials). Whether either
pays is measured here on the shapes issue 13 and issue 15 hold us to: batch 64, h28/4, 4k (the
goals: ≤ 1.05x SDPA over a contiguous cache eager, ≤ 25 µs of host time for
PagedDecodePlan.run), and the long contexts at batch 1–2 that read < 85% of copy bandwidth in
round 9 (b1 32k and 64k, b2 32k).

Per shape, every implementation measured as benchmarks/ops_bench.py measures (eager back to back
with host time, and as CUDA-graph replays), interleaved, medians, checked against SDPA first:
  - sdpa_contiguous, omnitune (the function), omnitune_plan_run (PagedDecodePlan.run with the
    table's config), internal_launch — as in ops_bench;
  - fused: the table's config with FUSED_REDUCE;
  - one_split_*: NUM_SPLITS=1 variants (batch 64 only: at batch 1–2 one split is a few programs);
  - fused_splits_N: the table's config with N splits, reduced in the launch (long contexts).

    PYTHONPATH=$PWD python benchmarks/decode_one_launch.py --out $OUT/decode_one_launch_h200.json
"""

from __future__ import annotations

import sys

import torch

from benchmarks.ops_bench import Case, cases_main, paged_decode_case

SHAPES = ((64, 4096), (1, 32768), (1, 65536), (2, 32768))  # (batch, context)
HEADS, KV_HEADS = 28, 4


def one_launch_case(device, b: int, ctx: int) -> Case:
    from omnitune.kernels import paged_decode_attention as pda

    problem = pda.PagedDecodeProblem(b=b, h=HEADS, hkv=KV_HEADS, lq=1, ctx=ctx, d=128, block_size=16)
    plan = pda.PagedDecodePlan(batch=b, num_heads=HEADS, num_kv_heads=KV_HEADS, head_dim=128, block_size=16,
                               max_blocks=problem.pages_per_sequence, max_context_len=ctx, dtype=torch.bfloat16,
                               device=device)
    tuned = plan.config
    candidates = {"fused": tuned.replace(FUSED_REDUCE=True)}
    if b >= 16:
        for block_n, warps, stages in ((64, 4, 2), (64, 4, 3), (128, 8, 2), (32, 4, 3)):
            candidates[f"one_split_n{block_n}_w{warps}_s{stages}"] = tuned.replace(
                NUM_SPLITS=1, FUSED_REDUCE=False, BLOCK_N=block_n, num_warps=warps, num_stages=stages)
    else:
        for splits in (64, 128):
            candidates[f"fused_splits_{splits}"] = tuned.replace(NUM_SPLITS=splits, FUSED_REDUCE=True)
    configs = {name: config for name, config in candidates.items()
               if config != tuned and not pda.SPEC.violations(problem, config, torch.bfloat16)}
    case = paged_decode_case(device, b=b, h=HEADS, hkv=KV_HEADS, ctx=ctx, extra_plans=configs)
    case.notes += "; " + "; ".join(f"{name} {config.label()}" for name, config in configs.items())
    return case


def cases(device) -> list:
    return [lambda b=b, ctx=ctx: one_launch_case(device, b, ctx) for b, ctx in SHAPES]


def main(argv=None) -> int:
    return cases_main(__doc__.splitlines()[0], "decode_one_launch", cases, argv)


if __name__ == "__main__":
    sys.exit(main())

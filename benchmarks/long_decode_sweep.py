"""Is there a config of today's paged-decode kernel that reads a long context at ≥ 85% of copy
bandwidth with few sequences (issue 15's shapes that fall short: batch 1 at 32k and 64k, batch 2
at 32k)? A grid over the knobs that set how the context is cut and read — splits, keys per tile,
warps, pipeline stages (GQA packed, the combine as a second launch: the forms that won every
earlier search of these shapes) — each config as users call it: PagedDecodePlan.run captured as
a CUDA graph (10 calls a graph, medians of 5 rounds of 10 replays), % of the copy bandwidth
omnitune.profile.calibrate measures in the same run, by the kernel's byte model. Every config is
checked against SDPA over the same context, gathered contiguous, before it is timed. The configs
are compiled first in parallel processes (omnitune.measure.precompile).

    PYTHONPATH=$PWD python benchmarks/long_decode_sweep.py --out $OUT/long_decode_sweep_h200.json

--fused-reduce adds every config again with the splits combined in the same launch
(FUSED_REDUCE): twice the configs.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.ops_bench import capture, copy_bandwidth_report, graph_call_us

SHAPES = ((1, 32768), (1, 65536), (2, 32768))
HEADS, KV_HEADS, HEAD_DIM, PAGE = 28, 4, 128, 16
GRID = {"NUM_SPLITS": (32, 48, 64, 96, 128), "BLOCK_N": (32, 64, 128), "num_warps": (2, 4, 8),
        "num_stages": (2, 3, 4)}
ROUNDS, REPLAYS = 5, 10
TOLERANCE = 2e-2  # bf16 output against SDPA in bf16


def configs_for(problem, dtype, grid: dict = GRID) -> list:
    from omnitune.kernels.paged_decode_attention import SPEC

    base = SPEC.default_config(problem, dtype).replace(PACK_GQA=True, FUSED_REDUCE=False)
    found = []
    for values in itertools.product(*grid.values()):
        config = base.replace(**dict(zip(grid, values)))
        if not SPEC.violations(problem, config, dtype):
            found.append(config)
    return found


def sweep_shape(device, b: int, ctx: int, copy_tbps: float, grid: dict = GRID) -> dict:
    from omnitune.kernels import paged_decode_attention as pda
    from omnitune.measure.precompile import precompile

    dtype = torch.bfloat16
    problem = pda.PagedDecodeProblem(b=b, h=HEADS, hkv=KV_HEADS, lq=1, ctx=ctx, d=HEAD_DIM, block_size=PAGE)
    configs = configs_for(problem, dtype, grid)
    began = time.perf_counter()
    report = precompile(pda.SPEC, problem, dtype, configs)
    print(f"b{b} ctx{ctx}: {report.summary()}", flush=True)
    inputs = pda.SPEC.make_inputs(problem, dtype, device, seed=0)
    q, kc, vc, tables, lens = inputs.q, inputs.key_cache, inputs.value_cache, inputs.block_tables, inputs.context_lens
    k_dense, v_dense = pda.contiguous_context(inputs, ctx)  # the same context, contiguous, for SDPA
    expected = F.scaled_dot_product_attention(q, k_dense.contiguous(), v_dense.contiguous(), enable_gqa=True)
    moved = pda.SPEC.bytes_moved(problem, dtype)
    rows = []
    for config in configs:
        row = {"config": config.label()}
        try:
            plan = pda.PagedDecodePlan(batch=b, num_heads=HEADS, num_kv_heads=KV_HEADS, head_dim=HEAD_DIM,
                                       block_size=PAGE, max_blocks=tables.shape[1], max_context_len=ctx,
                                       dtype=dtype, device=device, config=config)
            out = plan.run(q, kc, vc, tables, lens)
            torch.cuda.synchronize()
            row["error"] = ((out.float() - expected.float()).norm() / expected.float().norm()).item()
            if not row["error"] <= TOLERANCE:
                rows.append(row)
                continue
            graph = capture(lambda plan=plan: plan.run(q, kc, vc, tables, lens))
            row["graph_us"] = statistics.median(graph_call_us(graph, replays=REPLAYS) for _ in range(ROUNDS))
            row["pct_of_copy"] = 100 * moved / (row["graph_us"] * 1e-6) / 1e12 / copy_tbps
            del graph
        except Exception as exc:  # noqa: BLE001 — a config that fails is a row saying why
            row["failed"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200]
        rows.append(row)
    timed = sorted((r for r in rows if "graph_us" in r), key=lambda r: r["graph_us"])
    default = pda.SPEC.default_config(problem, dtype).label()
    print(f"b{b} ctx{ctx} ({moved / 1e6:.0f} MB): {len(timed)} of {len(configs)} timed in "
          f"{time.perf_counter() - began:.0f} s; fastest:", flush=True)
    for r in timed[:5]:
        print(f"   {r['graph_us']:7.1f} µs  {r['pct_of_copy']:5.1f}% of copy  {r['config']}", flush=True)
    return {"bytes_moved": moved, "default": default, "rows": rows,
            "fastest": timed[0] if timed else None}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--fused-reduce", action="store_true",
                        help="each config also with FUSED_REDUCE (the splits combined in the same launch)")
    args = parser.parse_args(argv)
    grid = {**GRID, "FUSED_REDUCE": (False, True)} if args.fused_reduce else GRID
    if not torch.cuda.is_available():
        print("long_decode_sweep needs a CUDA GPU", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    copy_tbps, report = copy_bandwidth_report(device, grid=grid, shapes={})
    for b, ctx in SHAPES:
        report["shapes"][f"b{b} ctx{ctx}"] = sweep_shape(device, b, ctx, copy_tbps, grid)
        torch.cuda.empty_cache()
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1))  # each shape kept as it finishes
    print(f"copy bandwidth {copy_tbps:.2f} TB/s; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Where a long-context decode call's time goes at batch 1–2 (issue 15's shapes below 85% of copy
bandwidth): PagedDecodePlan.run as a CUDA graph beside its two launches each captured alone (the
split kernel over the pages, the combine of its partials), for a few split counts, and beside
reads of the same bytes that are not attention — a copy of them, a sum over them, and the
fastest of a small grid of pure-read Triton kernels (benchmarks/read_ceiling.py: the ceiling of
any one launch that reads these bytes), each one launch captured the same way — so that what any
one kernel of this size costs is measured, not assumed. Per shape (bf16, h28/4, d=128, pages of 16), per implementation: µs per call as graph
replays (10 calls a graph, medians of 7 rounds of 20 replays), and % of this device's copy
bandwidth (the large copy omnitune.profile.calibrate measures) by the kernel's byte model.

    PYTHONPATH=$PWD python benchmarks/long_decode_parts.py --out $OUT/long_decode_parts_h200.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

from benchmarks.ops_bench import ROUNDS, capture, copy_bandwidth_report, graph_call_us
from benchmarks.read_ceiling import check as check_reads
from benchmarks.read_ceiling import read_variants

SHAPES = ((1, 32768), (1, 65536), (2, 32768))
HEADS, KV_HEADS, HEAD_DIM, PAGE = 28, 4, 128, 16
SPLITS = (32, 64, 128)


def parts(device, b: int, ctx: int) -> dict:
    from omnitune.kernels import paged_decode_attention as pda

    problem = pda.PagedDecodeProblem(b=b, h=HEADS, hkv=KV_HEADS, lq=1, ctx=ctx, d=HEAD_DIM, block_size=PAGE)
    inputs = pda.SPEC.make_inputs(problem, torch.bfloat16, device, seed=0)
    q, kc, vc, tables, lens = inputs.q, inputs.key_cache, inputs.value_cache, inputs.block_tables, inputs.context_lens
    moved = pda.SPEC.bytes_moved(problem, torch.bfloat16)
    default = pda.SPEC.default_config(problem, torch.bfloat16)
    impls = {}
    for splits in SPLITS:
        config = default.replace(NUM_SPLITS=splits)
        if pda.SPEC.violations(problem, config, torch.bfloat16):
            continue
        plan = pda.PagedDecodePlan(batch=b, num_heads=HEADS, num_kv_heads=KV_HEADS, head_dim=HEAD_DIM,
                                   block_size=PAGE, max_blocks=tables.shape[1], max_context_len=ctx,
                                   dtype=torch.bfloat16, device=device, config=config)
        launch = plan._plan
        split_args = pda._split_args(q, kc, vc, tables, lens, plan._scale_log2, plan.out, plan._scratch,
                                     launch.fused, None, None)
        impls[f"run_s{splits}"] = lambda plan=plan: plan.run(q, kc, vc, tables, lens, check=False)
        impls[f"split_only_s{splits}"] = lambda launch=launch, args=split_args: launch.split(launch.split_grid, args)
        if plan._fixed_combine is not None:
            impls[f"combine_only_s{splits}"] = plan._fixed_combine
    # The same bytes read by a copy (read + write: 2x the bytes) and by a sum (read only).
    flat = torch.randn(int(moved) // 2, device=device, dtype=torch.bfloat16)
    dst = torch.empty_like(flat)
    total = torch.empty((), device=device, dtype=torch.float32)
    impls["copy_same_bytes"] = lambda: dst.copy_(flat)
    impls["sum_same_bytes"] = lambda: torch.sum(flat, dim=0, dtype=torch.float32, out=total)
    reads = read_variants(flat, torch.empty(flat.numel() // 4096 + 1, device=device, dtype=torch.float32))
    read_errors = check_reads(reads, flat)
    impls |= {name: fn for name, fn in reads.items() if read_errors[name] < 1e-4}
    graphs = {}
    for name, fn in impls.items():
        fn()
        torch.cuda.synchronize()
        graphs[name] = capture(fn)
    samples = {name: [] for name in graphs}
    for _ in range(ROUNDS):
        for name, graph in graphs.items():
            samples[name].append(graph_call_us(graph))
    graph_us = {name: statistics.median(v) for name, v in samples.items()}
    fastest_read = min((name for name in graph_us if name.startswith("read_")), key=graph_us.get, default=None)
    return {"default": default.label(), "bytes_moved": moved, "graph_us": graph_us,
            "read_errors": read_errors, "fastest_read": fastest_read}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("long_decode_parts needs a CUDA GPU", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    copy_tbps, report = copy_bandwidth_report(device, shapes={})
    for b, ctx in SHAPES:
        result = parts(device, b, ctx)
        moved = result["bytes_moved"]
        result["pct_of_copy"] = {}
        for name, us in result["graph_us"].items():
            byte_count = 2 * moved if name == "copy_same_bytes" else moved
            result["pct_of_copy"][name] = 100 * byte_count / (us * 1e-6) / 1e12 / copy_tbps
        report["shapes"][f"b{b} ctx{ctx}"] = result
        print(f"== b{b} ctx{ctx} ({moved / 1e6:.1f} MB; default {result['default']})")
        for name, us in result["graph_us"].items():
            if name.startswith("read_") and name != result["fastest_read"]:
                continue  # every variant is in the JSON; the fastest stands for them here
            print(f"   {name:34s} {us:7.1f} µs  {result['pct_of_copy'][name]:5.1f}% of copy")
        torch.cuda.empty_cache()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print(f"copy bandwidth {copy_tbps:.2f} TB/s; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Our attention kernel beside every SDPA backend on the H200, bf16, head dim 128.

For each shape: a short hand-picked list of configs (plus the default), each verified against the
reference and timed with CUDA events (L2 flushed between repetitions), then SDPA's flash, cuDNN
and memory-efficient backends on the same inputs in the same process.

    python benchmarks/attention_bench.py --out benchmarks/results/attention_bench_h200.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from attention_shapes import SHAPES
from omnitune.kernels.attention import SPEC
from omnitune.profile.bench import run_bench, speedups
from omnitune.profile.device import current_device_facts

PREFILL = [
    dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3, USE_TMA=False),
    dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3, USE_TMA=True),
    dict(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=2, USE_TMA=True),
    dict(BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=3, USE_TMA=True),
    dict(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=3, USE_TMA=True),
    dict(BLOCK_M=64, BLOCK_N=128, num_warps=4, num_stages=3, USE_TMA=True),
    dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3, USE_TMA=True),
]
DECODE = [
    dict(BLOCK_M=16, BLOCK_N=64, num_warps=4, num_stages=3, USE_TMA=False),
    dict(BLOCK_M=16, BLOCK_N=128, num_warps=4, num_stages=3, USE_TMA=True),
    dict(BLOCK_M=16, BLOCK_N=128, num_warps=8, num_stages=3, USE_TMA=True),
    dict(BLOCK_M=16, BLOCK_N=64, num_warps=4, num_stages=4, USE_TMA=True),
    dict(BLOCK_M=16, BLOCK_N=128, num_warps=4, num_stages=2, USE_TMA=False),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--only", nargs="*", help="shape names to run (default: all)")
    args = parser.parse_args()
    dtype = torch.bfloat16
    results = []
    for name, shape in SHAPES.items():
        if args.only and name not in args.only:
            continue
        problem = SPEC.parse_shape(shape)
        default = SPEC.default_config(problem, dtype)
        picks = DECODE if problem.lq < 64 else PREFILL
        configs = {"default": default}
        for i, values in enumerate(picks):
            cfg = default.replace(**values)
            if not SPEC.violations(problem, cfg, dtype) and cfg not in configs.values():
                configs[f"pick{i}"] = cfg
        start = time.perf_counter()
        rows = run_bench(SPEC, problem, dtype, configs)
        wall_s = time.perf_counter() - start
        ours = [r for r in rows if r.kind == "omnitune" and r.status == "ok"]
        best = min(ours, key=lambda r: r.time_ms) if ours else None
        results.append({
            "name": name, "shape": shape, "problem_key": SPEC.problem_key(problem), "dtype": "bf16",
            "flops": SPEC.flops(problem), "bytes": SPEC.bytes_moved(problem, dtype),
            "rows": [r.as_record() for r in rows], "speedups": speedups(rows),
            "best": best.name if best else None, "wall_s": wall_s,
        })
        print(f"== {name} {shape} ({wall_s:.1f} s)")
        for r in rows:
            print(f"   {r.name:22s} {r.status:14s} {r.time_ms:9.4f} ms {r.tflops:7.1f} TFLOP/s {r.tbps:6.2f} TB/s err {r.rel_error:.2e} {r.detail[:80]}")
        args.out.parent.mkdir(parents=True, exist_ok=True)
        payload = {"device": current_device_facts().as_dict(), "source_hash": SPEC.source_hash(),
                   "command": "python benchmarks/attention_bench.py --out " + str(args.out), "results": results}
        args.out.write_text(json.dumps(payload, indent=2, sort_keys=True, default=str) + "\n")
    print("\nshape                 best ours            ms   TFLOP/s | flash    cudnn    effic.  (speedup of best ours)")
    for res in results:
        rows = {r["name"]: r for r in res["rows"]}
        b = rows.get(res["best"]) if res["best"] else None
        sp = res["speedups"].get(res["best"], {}) if res["best"] else {}
        if b:
            print(f"{res['name']:22s}{res['best']:18s}{b['time_ms']:8.4f} {b['tflops']:7.1f} | "
                  + "  ".join(f"{sp.get(k, float('nan')):6.2f}x" for k in ("sdpa_flash", "sdpa_cudnn", "sdpa_efficient")))


if __name__ == "__main__":
    main()

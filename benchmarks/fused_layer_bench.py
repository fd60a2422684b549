"""Fused against unfused cross-modal attention layers on the H200, bf16, side by side.

For each shape: the unfused layer (cuBLAS GEMMs + SDPA), the K/V projection GEMM alone (the part
every path shares), and for each fused path (FUSION=q, FUSION=q_out) a small sweep of valid
configs — the default first, then a seeded random spread of the rest — each verified against the
fp32 reference, then timed with CUDA events and the L2 flushed between repetitions, in one process
on the same inputs (omnitune.profile.bench.run_bench). Prints shape → unfused ms, best q ms, best
q_out ms, the best fused path's speedup over unfused, and what the rollback would choose (the
fastest of the three: a tuned table measures all paths, so it is never slower than unfused).

    python benchmarks/fused_layer_bench.py --out benchmarks/results/fused_layer_h200.json [--quick]
    python benchmarks/fused_layer_bench.py --kv-cached --out benchmarks/results/fused_layer_kv_cached_h200.json

--kv-cached runs the decode-like shapes as a decode step does: with the attended modality's K/V
projected once beforehand (kv_cached=True), so that no path runs the K/V GEMM and the comparison is
fused against unfused per step. Each such shape also times, for context, the unfused layer that
still projects x_kv (`unfused_uncached_ms`) and the K/V GEMM that caching takes out of the step.

Budget: compiling a config takes about a second. The full run sweeps up to 6 configs per fused
path per shape, --quick 3; once --budget-s seconds have passed, the remaining shapes drop to the
quick sweep so that the run ends within about four minutes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import time
from pathlib import Path

import torch

from omnitune.kernels.cross_attention_layer import SPEC, CrossAttentionLayerProblem, fused_config, kv_projection, unfused
from omnitune.profile.bench import run_bench
from omnitune.profile.device import current_device_facts
from omnitune.profile.timing import L2Flusher, time_cuda

MODELS = {
    "qwen7b": dict(hidden=3584, h=28, hkv=4, d=128),   # Qwen2.5-Omni-7B
    "qwen3b": dict(hidden=2048, h=16, hkv=2, d=128),   # Qwen2.5-Omni-3B
    "dit": dict(hidden=3072, h=24, hkv=24, d=128),     # a diffusion transformer, 24 × 128
}
# (name, model, b, lq, lk)
SHAPES = [
    ("decode b1 lq1 lk1k", "qwen7b", 1, 1, 1024),
    ("decode b1 lq16 lk4k", "qwen7b", 1, 16, 4096),
    ("decode b8 lq1 lk4k", "qwen7b", 8, 1, 4096),
    ("decode b8 lq16 lk2k", "qwen7b", 8, 16, 2048),
    ("t2i prefill b8 lq512 lk4k", "qwen7b", 8, 512, 4096),
    ("long video b1 lq256 lk16k", "qwen7b", 1, 256, 16384),
    ("3B decode b1 lq16 lk4k", "qwen3b", 1, 16, 4096),
    ("3B t2i prefill b8 lq512 lk4k", "qwen3b", 8, 512, 4096),
    ("DiT b8 lq512 lk4k", "dit", 8, 512, 4096),
]
DTYPE = torch.bfloat16
FULL, QUICK = 6, 3


def sweep(problem: CrossAttentionLayerProblem, fusion: str, count: int) -> list:
    """Up to `count` valid configs of one fused path: the default's tiles first, then a seeded
    random spread of the others (deterministic, so reruns compare like with like)."""
    valid = [c for c in SPEC.valid_configs(problem, DTYPE) if c["FUSION"] == fusion]
    first = fused_config(problem, DTYPE, fusion)
    if fusion == "q":
        first = first.replace(BLOCK_O=64)
    picked = [first] if first in valid else []
    rest = [c for c in valid if c not in picked]
    random.Random(f"{SPEC.problem_key(problem)}|{fusion}").shuffle(rest)
    return picked + rest[: max(0, count - len(picked))]


def bench_shape(name: str, problem, count: int) -> dict:
    configs = {"unfused": SPEC.complete_config({"FUSION": "none"}, problem, DTYPE)}
    for fusion in ("q", "q_out"):
        for i, cfg in enumerate(sweep(problem, fusion, count)):
            configs[f"{fusion}#{i}"] = cfg
    start = time.perf_counter()
    rows = run_bench(SPEC, problem, DTYPE, configs, baselines=True)
    kv_gemm, uncached = _time_uncached_parts(problem)
    torch.cuda.empty_cache()  # those inputs are gone now

    def best(prefix):
        ok = [r for r in rows if r.kind == "omnitune" and r.name.startswith(f"omnitune[{prefix}") and r.status == "ok"]
        return min(ok, key=lambda r: r.time_ms) if ok else None

    base = next((r for r in rows if r.kind == "baseline" and r.status == "ok"), None)
    unfused_ms = base.time_ms if base else (best("unfused").time_ms if best("unfused") else float("nan"))
    paths = {"none": unfused_ms, "q": best("q#"), "q_out": best("q_out#")}
    paths = {k: (v.time_ms if hasattr(v, "time_ms") else v) for k, v in paths.items()}
    fused = {k: v for k, v in paths.items() if k != "none" and v is not None}
    best_fused = min(fused, key=fused.get) if fused else None
    choice = min((k for k, v in paths.items() if v is not None), key=paths.get)
    fastest = min(v for v in paths.values() if v is not None)
    return {
        "name": name, "problem_key": SPEC.problem_key(problem), "dtype": "bf16", "kv_cached": problem.kv_cached,
        "flops": SPEC.flops(problem), "bytes": SPEC.bytes_moved(problem, DTYPE),
        "configs_per_path": count, "wall_s": time.perf_counter() - start,
        "rows": [r.as_record() for r in rows],
        "kv_gemm_ms": kv_gemm.median_ms,
        # Uncached, the GEMM is part of the unfused layer; cached, it is what caching took out.
        "kv_gemm_share_of_unfused": None if problem.kv_cached else kv_gemm.median_ms / unfused_ms,
        "unfused_uncached_ms": uncached.median_ms if uncached else None,
        "speedup_cached_fastest_vs_uncached_unfused": uncached.median_ms / fastest if uncached else None,
        "unfused_ms": unfused_ms, "best_q_ms": paths["q"], "best_q_out_ms": paths["q_out"],
        "best_q_config": _config_of(rows, best("q#")), "best_q_out_config": _config_of(rows, best("q_out#")),
        "best_fused": best_fused,
        "speedup_best_fused_vs_unfused": unfused_ms / fused[best_fused] if best_fused else None,
        "rollback_choice": choice,
        "mismatches": [r.name for r in rows if r.status == "mismatch"],
        "failures": {r.name: f"{r.status}: {r.detail[:120]}" for r in rows if r.status not in ("ok", "mismatch")},
    }


def _time_uncached_parts(problem):
    """The K/V projection alone (the GEMM every uncached path runs identically, and the one a
    cached problem no longer runs), and for a cached problem the unfused layer that still runs it."""
    inputs = SPEC.make_inputs(dataclasses.replace(problem, kv_cached=False), DTYPE, "cuda", 1)
    flusher = L2Flusher()
    kv_gemm = time_cuda(lambda: kv_projection(inputs.x_kv, inputs.wkv, inputs.bkv), flusher=flusher)
    uncached = time_cuda(lambda: unfused(inputs), flusher=flusher) if problem.kv_cached else None
    return kv_gemm, uncached


def _config_of(rows, row):
    return row.config if row is not None else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="JSON results file")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK} configs per fused path instead of {FULL}")
    parser.add_argument("--budget-s", type=float, default=120.0,
                        help="after this many seconds, the remaining shapes get the quick sweep")
    parser.add_argument("--only", nargs="*", help="shape names to run (default: all)")
    parser.add_argument("--kv-cached", action="store_true",
                        help="only the decode-like shapes, with K/V projected once beforehand (kv_cached)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    started = time.perf_counter()
    results = []
    for name, model, b, lq, lk in SHAPES:
        if (args.only and name not in args.only) or (args.kv_cached and "decode" not in name):
            continue
        problem = CrossAttentionLayerProblem(b=b, lq=lq, lk=lk, kv_cached=args.kv_cached, **MODELS[model])
        if args.kv_cached:
            name += ", K/V cached"
        late = time.perf_counter() - started > args.budget_s
        res = bench_shape(name, problem, QUICK if args.quick or late else FULL)
        results.append(res)
        print(f"== {name} [{res['problem_key']}] {res['wall_s']:.1f} s, {res['configs_per_path']} configs/path; "
              f"mismatches {res['mismatches'] or 'none'}; failures {len(res['failures'])}", flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        payload = {"device": current_device_facts().as_dict(), "source_hash": SPEC.source_hash(),
                   "command": "python benchmarks/fused_layer_bench.py --out " + str(args.out)
                   + (" --quick" if args.quick else "") + (" --kv-cached" if args.kv_cached else ""),
                   "total_s": time.perf_counter() - started, "results": results}
        args.out.write_text(json.dumps(payload, indent=2, sort_keys=True, default=str) + "\n")

    def ms(x):
        return f"{x:8.4f}" if isinstance(x, float) else "       —"

    # Cached, "KV GEMM" is the projection taken out of each step, and "uncached" the unfused layer
    # that still runs it: how much a decode step gains from caching alone.
    print(f"\n{'shape':36s} {'unfused':>8s} {'KV GEMM':>8s} {'best q':>8s} {'best q_out':>10s} "
          f"{'fused/unf':>9s}  {'rollback':8s}" + (f" {'uncached':>8s} {'gain':>6s}" if args.kv_cached else ""))
    for r in results:
        sp = r["speedup_best_fused_vs_unfused"]
        line = (f"{r['name']:36s} {ms(r['unfused_ms'])} {ms(r['kv_gemm_ms'])} {ms(r['best_q_ms'])} "
                f"{ms(r['best_q_out_ms'])}  {(f'{sp:7.2f}x' if sp else '      —')}  {r['rollback_choice']:8s}")
        if r["kv_cached"]:
            line += f" {ms(r['unfused_uncached_ms'])} {r['speedup_cached_fastest_vs_uncached_unfused']:5.2f}x"
        print(line)
    print(f"total {time.perf_counter() - started:.0f} s; wrote {args.out}")


if __name__ == "__main__":
    main()

"""What keeping bad block numbers from being read costs paged decode: the split kernel with no
guard (trusting the table), with out-of-range pages masked, and with them clamped into the
cache — on the shipped configs, as CUDA-graph replays (10 calls per graph) and, as rounds 1–5
measured kernels, one launch at a time between CUDA events with the L2 flushed by reading;
SDPA over a contiguous cache both ways beside them.

    PYTHONPATH=$PWD python benchmarks/paged_decode_guard_study.py --out $OUT/paged_decode_guard_h200.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F

from ops_bench import capture, graph_call_us  # benchmarks/ is on the path when run as a script
from omnitune.kernels import paged_decode_attention as pda
from omnitune.profile.calibrate import measure_copy_tbps
from omnitune.profile.timing import time_cuda

SHAPES = ((64, 28, 4, 4096), (4, 32, 4, 16384), (1, 28, 4, 131072))
GUARDS = {0: "none", 1: "mask", 2: "clamp"}


def graph_us(fn, calls=10, replays=30) -> float:
    """The median of 5 measurements of µs per call, as a graph of `calls` calls replayed."""
    graph = capture(fn, calls)
    return sorted(graph_call_us(graph, calls, replays) for _ in range(5))[2]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    copy_tbps, _ = measure_copy_tbps("cuda")
    report = {"device": torch.cuda.get_device_name(), "copy_tbps": copy_tbps, "shapes": {}}
    default_guard = pda.PAGE_GUARD[0]
    for b, h, hkv, ctx in SHAPES:
        problem = pda.PagedDecodeProblem(b=b, h=h, hkv=hkv, lq=1, ctx=ctx, d=128, block_size=16)
        inputs = pda.SPEC.make_inputs(problem, torch.bfloat16, "cuda", 0)
        moved = pda.SPEC.bytes_moved(problem, torch.bfloat16)
        config = pda._config_for(b, h, hkv, 1, 128, 16, ctx, None, torch.bfloat16)
        out = torch.empty_like(inputs.q)
        row = {"config": config.label(), "bytes_moved": moved}
        ref = None
        for guard, name in GUARDS.items():
            pda.PAGE_GUARD[0] = guard
            fn = lambda: pda.launch(inputs, out, config)  # noqa: E731
            fn()
            torch.cuda.synchronize()
            ref = out.clone() if ref is None else ref
            same = torch.equal(out, ref)
            g = graph_us(fn)
            flushed = time_cuda(fn, repetitions=30).median_ms * 1e3
            row[name] = {"graph_us": g, "graph_pct_of_copy": 100 * moved / (g * 1e-6) / 1e12 / copy_tbps,
                         "flushed_us": flushed,
                         "flushed_pct_of_copy": 100 * moved / (flushed * 1e-6) / 1e12 / copy_tbps,
                         "equal_to_unguarded": same}
        pda.PAGE_GUARD[0] = default_guard
        if b * ctx <= 64 * 16384:
            k, v = (t.contiguous() for t in pda.contiguous_context(inputs, ctx))
            sdpa = lambda: F.scaled_dot_product_attention(inputs.q, k, v, enable_gqa=True)  # noqa: E731
            g = graph_us(sdpa)
            flushed = time_cuda(sdpa, repetitions=30).median_ms * 1e3
            row["sdpa_contiguous"] = {"graph_us": g, "flushed_us": flushed,
                                      "graph_pct_of_copy": 100 * moved / (g * 1e-6) / 1e12 / copy_tbps}
            del k, v
        report["shapes"][f"b{b} h{h}/{hkv} ctx{ctx}"] = row
        print(f"b{b} ctx{ctx} {config.label()}")
        for name, r in row.items():
            if isinstance(r, dict):
                print(f"   {name:16s} " + "  ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}"
                                                 for k, v in r.items()))
        inputs = None  # the next shape's cache must not sit beside this one's
        torch.cuda.empty_cache()
    args.out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

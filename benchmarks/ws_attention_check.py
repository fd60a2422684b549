"""Issue 15: why round 10's warp-specialized attention was wrong at 16k in the library where the
probe was right, and how fast it is where it is right.

Round 10 built attention's warp-specialized form into the library (one key loop under
`tl.range(..., warp_specialize=True)` over descriptors the kernel makes, BLOCK_M 128, 4 warps;
commit 93a8251) and took it out again: it failed the search's reference check at 16k (h32/4 with
64- and 128-key tiles, h24/24), while the probe kernel of the same form (benchmarks/
hopper_probe_kernels.py, no GQA) was right on every shape at 2 stages. 8k and 16k run one binary,
so the fault follows the launch, not the code compiled. The two differed in how they were
launched (the probe through the JIT, the library through its bound C launcher, whose scratch
for the in-kernel descriptors Triton's launch wrapper asks an allocator for on every launch),
in what they launched on (the probe one input per shape; the search fresh inputs for every
config), and in the kernel (GQA, a masked output store).

This script takes those apart, each on its own, on fresh random inputs for every launch (the
output poisoned with NaN first), against SDPA:

- form: the library's kernel ("library": omnitune/kernels/attention_ws.py, round 10's kernel of
  commit 93a8251) and the probe ("probe", no GQA: h24/24 only). Round 34's run (part W) also ran
  a copy of the library's kernel with the probe's unmasked output store, right everywhere as the
  others were; the script as run is in commit 4c6dfe2, which added its results;
- launch: the JIT (`kernel[grid](...)`) or the library's bound C launcher (`DirectLauncher.bind`);
- scratch: a fresh `torch.empty` per launch (as the library's allocator did) or one buffer kept
  for every launch;
- launches: several in a row on new inputs each, then the same inputs twice.

Then every form and shape that was right everywhere is timed beside SDPA's cuDNN backend, each a
CUDA graph of a few launches replayed, interleaved round by round.

    PYTHONPATH=$PWD python benchmarks/ws_attention_check.py --out $OUT/ws_attention_check.json
    PYTHONPATH=$PWD python benchmarks/ws_attention_check.py --quick      # h24/24 8k and 16k, 128-key tiles
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time

import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hopper_probe_kernels import HEAD_DIM, _fa_fwd
from hopper_probe_timing import timed_graph

from omnitune.kernels._launch import DirectLauncher
from omnitune.kernels.attention_ws import _attention_fwd_ws

LOG2E = 1.4426950408889634
# Against SDPA's own bf16 output: a right kernel differs by bf16 rounding (relative RMS ~3e-3);
# a wrong one (a stale tile, another head's keys) by O(1).
REL_RMS_TOL = 2e-2
LAUNCHES = 4
ROUNDS = 7


_LIBRARY = DirectLauncher(_attention_fwd_ws)
_PROBE = DirectLauncher(_fa_fwd)


class Scratch:
    """Triton's allocator for the in-kernel descriptors' global scratch: `fresh` hands out a new
    torch.empty per launch (as the library's did; freed when the launch returns), else one
    buffer, grown when a launch needs more, kept for every launch."""

    def __init__(self, fresh: bool):
        self.fresh = fresh
        self.kept = None
        self.calls = 0

    def __call__(self, size: int, alignment: int, stream):
        self.calls += 1
        if self.fresh:
            return torch.empty(size, dtype=torch.int8, device="cuda")
        if self.kept is None or self.kept.numel() < size:
            self.kept = torch.empty(size, dtype=torch.int8, device="cuda")
        return self.kept


def _form_launch(form: str, path: str, h: int, hkv: int, lq: int, lk: int, causal: bool, block_n: int):
    """A function (q, k, v, out) → None launching `form` through `path` ("jit" or "direct")."""
    qk_scale = LOG2E / math.sqrt(HEAD_DIM)
    if form == "probe":
        assert h == hkv, "the probe has no GQA"
        constexprs = {"HEAD_DIM": HEAD_DIM, "BLOCK_M": 128, "BLOCK_N": block_n, "Q_DESC": True, "KV_DESC": True,
                      "O_DESC": False, "MAKE_DESC": True, "WARP_SPEC": True, "CAUSAL": 2 if causal else 0,
                      "WS_DIAG": False, "num_warps": 4, "num_stages": 2}
        grid = (lq // 128, h, 1)
        bound = _PROBE.bind(constexprs, 4)

        def args(q, k, v, out):
            # the probe's descriptor arguments are unused (0) with MAKE_DESC; its rows are [b·h·L, D]
            return (q, k, v, out, 0, 0, 0, 0, HEAD_DIM, HEAD_DIM, HEAD_DIM, HEAD_DIM, lq, lk, qk_scale)
        jit = _fa_fwd
    else:
        constexprs = {"HEAD_DIM": HEAD_DIM, "GROUP": h // hkv, "BLOCK_M": 128, "BLOCK_N": block_n, "CAUSAL": causal,
                      "EVEN_K": lk % block_n == 0, "num_warps": 4, "num_stages": 2}
        grid = (triton.cdiv(lq, 128), h, 1)  # b = 1
        bound = _LIBRARY.bind(constexprs, 4)

        def args(q, k, v, out):
            return (q, k, v, out, *out.stride(), h, hkv, lq, lk, qk_scale)
        jit = _attention_fwd_ws

    if path == "jit":
        def run(q, k, v, out):
            jit[grid](*args(q, k, v, out), **constexprs)
    else:
        # the bound launcher takes the first `objects` arguments as tensors; the probe's unused
        # descriptor slots are plain ints after them, which its key holds as values
        def run(q, k, v, out):
            bound(grid, args(q, k, v, out))
    return run


def _inputs(h: int, hkv: int, l: int, seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn((1, h, l, HEAD_DIM), generator=g, device="cuda", dtype=torch.bfloat16)
    k = torch.randn((1, hkv, l, HEAD_DIM), generator=g, device="cuda", dtype=torch.bfloat16)
    v = torch.randn((1, hkv, l, HEAD_DIM), generator=g, device="cuda", dtype=torch.bfloat16)
    return q, k, v


def _sdpa(q, k, v, causal: bool, cudnn: bool = False):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = [SDPBackend.CUDNN_ATTENTION] if cudnn else [SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION,
                                                            SDPBackend.EFFICIENT_ATTENTION]
    with sdpa_kernel(backends):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                                enable_gqa=q.shape[1] != k.shape[1])


def _error(out: torch.Tensor, ref: torch.Tensor) -> dict:
    diff = out.float() - ref.float()
    finite = bool(torch.isfinite(out).all())
    rel = float(diff.pow(2).mean().sqrt() / ref.float().pow(2).mean().sqrt()) if finite else float("inf")
    bad_rows = int(((diff.abs().amax(-1) > 0.1) | ~torch.isfinite(out).all(-1)).sum())
    return {"rel_rms": rel, "max_abs": float(diff.abs().max()) if finite else float("inf"),
            "finite": finite, "bad_rows": bad_rows, "ok": finite and rel <= REL_RMS_TOL}


def check(form, path, fresh_scratch, h, hkv, l, causal, block_n, seed0: int) -> dict:
    scratch = Scratch(fresh_scratch)
    triton.set_allocator(scratch)
    run = _form_launch(form, path, h, hkv, l, l, causal, block_n)
    errors = []
    keep = None
    for i in range(LAUNCHES + 2):
        if i < LAUNCHES or keep is None:
            q, k, v = _inputs(h, hkv, l, seed0 + i)
            keep = (q, k, v)
        q, k, v = keep  # the last two launches: the same inputs as the one before
        out = torch.full_like(q, float("nan"))
        run(q, k, v, out)
        torch.cuda.synchronize()
        errors.append(_error(out, _sdpa(q, k, v, causal)))
    return {"form": form, "path": path, "scratch": "fresh" if fresh_scratch else "kept",
            "shape": f"b1_h{h}/{hkv}_L{l}_{'causal' if causal else 'full'}", "block_n": block_n,
            "ok": all(e["ok"] for e in errors), "launches": errors, "allocator_calls": scratch.calls}


def timing(cases: list, h, hkv, l, causal) -> list[dict]:
    """Each case (name, run) and cuDNN as CUDA graphs of a few launches, interleaved per round."""
    q, k, v = _inputs(h, hkv, l, 1234)
    flops = 4.0 * h * l * l * HEAD_DIM / (2 if causal else 1)
    reps = max(3, min(10, int(4e12 / flops)))
    out = torch.empty_like(q)
    # each a CUDA graph of `reps` launches (its replay), or the eager loop where capture failed
    graphs = {name: timed_graph(lambda run=run: run(q, k, v, out), reps)[0] for name, run in cases}
    graphs["sdpa_cudnn"] = timed_graph(lambda: _sdpa(q, k, v, causal, cudnn=True), reps)[0]
    times = {name: [] for name in graphs}
    for r in range(ROUNDS):
        names = list(graphs)
        names = names[r % len(names):] + names[:r % len(names)]
        for name in names:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            graphs[name]()  # warm
            start.record()
            graphs[name]()
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end) / reps)
    base = statistics.median(times["sdpa_cudnn"])
    rows = []
    for name, ts in times.items():
        ms = statistics.median(ts)
        rows.append({"case": name, "shape": f"b1_h{h}/{hkv}_L{l}_{'causal' if causal else 'full'}", "ms": ms,
                     "tflops": flops / ms / 1e9, "x_cudnn": base / ms, "spread": (max(ts) - min(ts)) / ms})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out")
    ap.add_argument("--quick", action="store_true", help="h24/24 8k and 16k, 128-key tiles, non-causal only")
    args = ap.parse_args(argv)
    torch.backends.cuda.matmul.allow_tf32 = False
    props = torch.cuda.get_device_properties(0)
    shapes = [(h, hkv, l, causal) for h, hkv in ((24, 24), (32, 4)) for l in (8192, 16384) for causal in (False, True)]
    block_ns = (128, 64)
    if args.quick:
        shapes, block_ns = [s for s in shapes if s[0] == 24 and not s[3]], (128,)
    result = {"what": __doc__.splitlines()[0], "device": props.name, "torch": torch.__version__,
              "triton": triton.__version__, "python": platform.python_version(), "checks": [], "timing": []}

    def write():
        if args.out:
            with open(args.out, "w") as f:
                json.dump(result, f, indent=1)

    started = time.time()
    seed = 0
    right = {}
    for h, hkv, l, causal in shapes:
        for block_n in block_ns:
            forms = ["library"] + (["probe"] if h == hkv else [])
            for form in forms:
                for path, fresh in (("direct", True), ("jit", True), ("direct", False), ("jit", False)):
                    seed += 10
                    try:
                        row = check(form, path, fresh, h, hkv, l, causal, block_n, seed)
                    except Exception as e:  # noqa: BLE001 — a compile or launch failure is a row, and the run goes on
                        row = {"form": form, "path": path, "scratch": "fresh" if fresh else "kept",
                               "shape": f"b1_h{h}/{hkv}_L{l}_{'causal' if causal else 'full'}", "block_n": block_n,
                               "ok": False, "error": f"{type(e).__name__}: {str(e)[:300]}"}
                    result["checks"].append(row)
                    rels = [f"{e['rel_rms']:.1e}" for e in row.get("launches", [])]
                    print(f"{row['shape']:<24} n{block_n:<4} {form:<23} {path:<6} {row['scratch']:<5} "
                          f"{'ok' if row['ok'] else 'WRONG'}  rel_rms {' '.join(rels)} {row.get('error', '')}",
                          flush=True)
                    right.setdefault((h, hkv, l, causal, form, block_n), []).append(row["ok"])
                    write()
    print(f"checks: {time.time() - started:.0f} s", flush=True)
    for h, hkv, l, causal in shapes:
        cases = []
        for block_n in block_ns:
            for form in ("library", "probe"):
                if all(right.get((h, hkv, l, causal, form, block_n), [False])):
                    triton.set_allocator(Scratch(False))
                    cases.append((f"{form}_n{block_n}", _form_launch(form, "direct", h, hkv, l, l, causal, block_n)))
        try:
            rows = timing(cases, h, hkv, l, causal)
        except Exception as e:  # noqa: BLE001 — a failed capture is a row too
            rows = [{"shape": f"b1_h{h}/{hkv}_L{l}", "error": f"{type(e).__name__}: {str(e)[:300]}"}]
        result["timing"].extend(rows)
        for r in rows:
            if "error" in r:
                print(r)
            else:
                print(f"{r['shape']:<24} {r['case']:<16} {r['ms']:.3f} ms  {r['tflops']:.0f} TFLOP/s  "
                      f"{r['x_cudnn']:.3f}x cuDNN  spread {r['spread']:.3f}", flush=True)
        write()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

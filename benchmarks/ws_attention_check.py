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

- form: round 10's library kernel ("library", commit 93a8251's, below; the attention kernel's
  WARP_SPEC form of benchmarks/variants/attention_warp_spec.patch) and the probe ("probe", no
  GQA: h24/24 only). Round 34's part W also ran a copy of the library's kernel with the probe's
  unmasked output store, right everywhere as the others were (the script as run: commit 4c6dfe2);
- launch: the JIT (`kernel[grid](...)`) or the library's bound C launcher (`DirectLauncher.bind`);
- scratch: a fresh `torch.empty` per launch (as the library's allocator did) or one buffer kept
  for every launch;
- launches: several in a row on new inputs each, then the same inputs twice.

Then every form and shape that was right everywhere is timed beside SDPA's cuDNN backend, each a
CUDA graph of a few launches replayed, interleaved round by round.

    PYTHONPATH=$PWD python benchmarks/ws_attention_check.py --out $OUT/ws_attention_check.json
    PYTHONPATH=$PWD python benchmarks/ws_attention_check.py --quick      # h24/24 8k and 16k, 128-key tiles
    PYTHONPATH=$PWD python benchmarks/ws_attention_check.py --quick --launches 8 --busy 3 --busy-kind matmul
        # the checks beside three processes running matrix products (round 34 Y2: every 16k launch wrong)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hopper_probe_kernels import HEAD_DIM, _fa_fwd
from hopper_probe_timing import timed_graph

from omnitune.kernels._launch import DirectLauncher
from omnitune.kernels.attention import sdpa

LOG2E = 1.4426950408889634
# Against SDPA's own bf16 output: a right kernel differs by bf16 rounding (relative RMS ~3e-3);
# a wrong one (a stale tile, another head's keys) by O(1).
REL_RMS_TOL = 2e-2
LAUNCHES = 4
# The attention kernel as it ships (omnitune/kernels/attention.py), not warp-specialized: its
# descriptors, where it uses TMA, are made on the host and passed as launch parameters.
SHIPPED = {"shipped_tma": True, "shipped_ptr": False}
# --busy: other processes keep the GPU busy with matrix products while the checks run, as a
# search's lanes (each a process of its own) or a serving engine beside others do. The GPU then
# switches between their contexts, and a kernel can be preempted in the middle.
# "matmul": cuBLAS, whose TMA descriptors are kernel parameters; "ws": this script's warp-specialized
# kernel, whose descriptors each launch writes into global scratch (the same sizes as the checks'
# at h24/24 16k, so likely the same virtual addresses in each process).
BUSY_SCRIPT = """
import os, sys, time, torch
sys.path.insert(0, os.path.dirname(sys.argv[3]))
end = time.time() + float(sys.argv[1])
if sys.argv[2] == "ws":
    import triton
    import ws_attention_check as w
    triton.set_allocator(w.Scratch(True))
    run = w._form_launch("library", "direct", 24, 24, 16384, 16384, False, 128)
    q, k, v = w._inputs(24, 24, 16384, 99)
    out = torch.empty_like(q)
    step = lambda: run(q, k, v, out)
else:
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    def step():
        global a
        a = (a @ a).clamp_(-1, 1)
while time.time() < end:
    for _ in range(8):
        step()
    torch.cuda.synchronize()
"""
ROUNDS = 7


@triton.jit
def _attention_fwd_ws(
    Q, K, V, Out,
    stride_ob, stride_oh, stride_om, stride_od,
    H, HKV, LQ, LK,
    qk_scale,
    HEAD_DIM: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    EVEN_K: tl.constexpr,
):
    # Q, K and V are contiguous [B·H·L, D] (the launcher copies views that are not). Rows past a
    # head's LQ read the next head's queries (or TMA's zeros past the tensor) and are not stored;
    # keys past LK (the next kv head's, or zeros) are masked. Causal is bottom-right aligned.
    pid_m = tl.program_id(0)
    if CAUSAL:
        pid_m = tl.num_programs(0) - 1 - pid_m  # heaviest blocks first
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    kv_row = (b * HKV + h // GROUP) * LK
    bh_rows = tl.num_programs(1)
    q_desc = tl.make_tensor_descriptor(Q, shape=[bh_rows * LQ, HEAD_DIM], strides=[HEAD_DIM, 1],
                                       block_shape=[BLOCK_M, HEAD_DIM])
    k_desc = tl.make_tensor_descriptor(K, shape=[(bh_rows // GROUP) * LK, HEAD_DIM], strides=[HEAD_DIM, 1],
                                       block_shape=[BLOCK_N, HEAD_DIM])
    v_desc = tl.make_tensor_descriptor(V, shape=[(bh_rows // GROUP) * LK, HEAD_DIM], strides=[HEAD_DIM, 1],
                                       block_shape=[BLOCK_N, HEAD_DIM])
    qpos = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q = q_desc.load([pid_bh * LQ + pid_m * BLOCK_M, 0])
    if CAUSAL:
        limit = tl.minimum(tl.maximum(qpos + 1 + LK - LQ, 0), LK)
        hi = tl.minimum(tl.maximum((pid_m + 1) * BLOCK_M + LK - LQ, 0), LK)  # the block's last row's limit
    else:
        limit = qpos * 0 + LK
        hi = LK
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    for start_n in tl.range(0, hi, BLOCK_N, warp_specialize=True):
        k = k_desc.load([kv_row + start_n, 0])
        v = v_desc.load([kv_row + start_n, 0])
        qk = tl.dot(q, tl.trans(k))
        if CAUSAL or not EVEN_K:
            qk = tl.where((start_n + offs_n)[None, :] < limit[:, None], qk * qk_scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            # A row that has seen no key yet keeps m = -inf; subtract 0 so exp2 gives 0, not NaN.
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        else:
            qk = qk * qk_scale
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            m_safe = m_new
        p = tl.math.exp2(qk - m_safe[:, None])
        alpha = tl.math.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)  # rows that saw no key (LQ > LK, causal) write zeros
    out = acc / l_safe[:, None]
    o_ptrs = (Out + b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh
              + qpos[:, None] * stride_om + offs_d[None, :] * stride_od)
    tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=(qpos < LQ)[:, None])


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
    """A function (q, k, v, out) → None launching `form` through `path` ("jit" or "direct"; the
    shipped kernel's forms take the op's own launch whatever `path` says)."""
    qk_scale = LOG2E / math.sqrt(HEAD_DIM)
    if form in SHIPPED:
        from omnitune.kernels.attention import _launch
        from omnitune.spec import Config

        # the long-prefill tile of the known-good list, through host descriptors (TMA) or pointers
        config = Config(BACKEND="triton", BLOCK_M=128, BLOCK_N=block_n, num_warps=8, num_stages=3, PACK_GQA=False,
                        USE_TMA=SHIPPED[form])

        def run(q, k, v, out):
            _launch(q, k, v, causal, 1.0 / math.sqrt(HEAD_DIM), None, out, config)
        return run
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
    """SDPA as the attention op's own backends call it (GQA without expanding K/V): forced to
    cuDNN, or as it dispatches."""
    return sdpa(q, k, v, causal, 1.0 / math.sqrt(HEAD_DIM), "sdpa_cudnn" if cudnn else "sdpa")


def _shape_name(h: int, hkv: int, l: int, causal: bool) -> str:
    return f"b1_h{h}/{hkv}_L{l}_{'causal' if causal else 'full'}"


def _error(out: torch.Tensor, ref: torch.Tensor) -> dict:
    diff = out.float() - ref.float()
    finite = bool(torch.isfinite(out).all())
    rel = float(diff.pow(2).mean().sqrt() / ref.float().pow(2).mean().sqrt()) if finite else float("inf")
    bad = (diff.abs().amax(-1) > 0.1) | ~torch.isfinite(out).all(-1)  # [b, h, L]: rows off by > 0.1
    bad_rows = int(bad.sum())
    # Where a wrong launch is wrong: (head, 128-row block, wrong rows in it) for the first few
    # blocks — whole blocks point at a stale tile or descriptor, scattered rows at a race.
    blocks = bad[0].unflatten(-1, (-1, 128)).sum(-1) if bad.shape[-1] % 128 == 0 else bad[0][..., None].sum(-1)
    where = [[int(h), int(m), int(blocks[h, m])] for h, m in blocks.nonzero().tolist()[:12]]
    return {"rel_rms": rel, "max_abs": float(diff.abs().max()) if finite else float("inf"),
            "finite": finite, "bad_rows": bad_rows, "bad_blocks": where, "ok": finite and rel <= REL_RMS_TOL}


def check(form, path, fresh_scratch, h, hkv, l, causal, block_n, seed0: int, launches: int) -> dict:
    """`launches` launches on fresh inputs, then two on the last inputs again."""
    scratch = Scratch(fresh_scratch)
    triton.set_allocator(scratch)
    run = _form_launch(form, path, h, hkv, l, l, causal, block_n)
    errors = []
    keep = None
    for i in range(launches + 2):
        if i < launches or keep is None:
            q, k, v = _inputs(h, hkv, l, seed0 + i)
            keep = (q, k, v)
        q, k, v = keep  # the last two launches: the same inputs as the one before
        out = torch.full_like(q, float("nan"))
        run(q, k, v, out)
        torch.cuda.synchronize()
        errors.append(_error(out, _sdpa(q, k, v, causal)))
    return {"form": form, "path": path, "scratch": "fresh" if fresh_scratch else "kept",
            "shape": _shape_name(h, hkv, l, causal), "block_n": block_n,
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
        rows.append({"case": name, "shape": _shape_name(h, hkv, l, causal), "ms": ms,
                     "tflops": flops / ms / 1e9, "x_cudnn": base / ms, "spread": (max(ts) - min(ts)) / ms})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out")
    ap.add_argument("--quick", action="store_true", help="h24/24 8k and 16k, 128-key tiles, non-causal only")
    ap.add_argument("--busy", type=int, default=0, metavar="N",
                    help="N other processes run matrix products on the GPU during the checks (no timing then)")
    ap.add_argument("--busy-kind", choices=("matmul", "ws"), default="matmul",
                    help="what the --busy processes run: matrix products, or this warp-specialized kernel")
    ap.add_argument("--launches", type=int, default=LAUNCHES, help="checked launches on fresh inputs per case")
    ap.add_argument("--forms", default="library,probe",
                    help="comma-separated: library, probe (warp-specialized), shipped_tma, shipped_ptr (the "
                         "attention kernel as it ships, 128x128 tiles over 8 warps, TMA or pointer loads)")
    args = ap.parse_args(argv)
    busy = [subprocess.Popen([sys.executable, "-c", BUSY_SCRIPT, "600", args.busy_kind, os.path.abspath(__file__)])
            for _ in range(args.busy)]
    if busy:
        time.sleep(8)  # their contexts made and their products running
    torch.backends.cuda.matmul.allow_tf32 = False
    props = torch.cuda.get_device_properties(0)
    shapes = [(h, hkv, l, causal) for h, hkv in ((24, 24), (32, 4)) for l in (8192, 16384) for causal in (False, True)]
    block_ns = (128, 64)
    if args.quick:
        shapes, block_ns = [s for s in shapes if s[0] == 24 and not s[3]], (128,)
    result = {"what": __doc__.splitlines()[0], "device": props.name, "torch": torch.__version__,
              "triton": triton.__version__, "python": platform.python_version(), "busy": args.busy,
              "busy_kind": args.busy_kind, "launches": args.launches, "checks": [], "timing": []}

    def write():
        if args.out:
            with open(args.out, "w") as f:
                json.dump(result, f, indent=1)

    started = time.time()
    seed = 0
    right = {}
    for h, hkv, l, causal in shapes:
        for block_n in block_ns:
            forms = [f for f in args.forms.split(",") if f != "probe" or h == hkv]
            for form in forms:
                regimes = (("op", True),) if form in SHIPPED else (("direct", True), ("jit", True), ("direct", False),
                                                                   ("jit", False))
                for path, fresh in regimes:
                    seed += 10
                    try:
                        row = check(form, path, fresh, h, hkv, l, causal, block_n, seed, args.launches)
                    except Exception as e:  # noqa: BLE001 — a compile or launch failure is a row, and the run goes on
                        row = {"form": form, "path": path, "scratch": "fresh" if fresh else "kept",
                               "shape": _shape_name(h, hkv, l, causal), "block_n": block_n,
                               "ok": False, "error": f"{type(e).__name__}: {str(e)[:300]}"}
                    result["checks"].append(row)
                    rels = [f"{e['rel_rms']:.1e}" for e in row.get("launches", [])]
                    print(f"{row['shape']:<24} n{block_n:<4} {form:<23} {path:<6} {row['scratch']:<5} "
                          f"{'ok' if row['ok'] else 'WRONG'}  rel_rms {' '.join(rels)} {row.get('error', '')}",
                          flush=True)
                    right.setdefault((h, hkv, l, causal, form, block_n), []).append(row["ok"])
                    write()
    print(f"checks: {time.time() - started:.0f} s", flush=True)
    for proc in busy:
        proc.kill()
    if busy:
        return 0
    for h, hkv, l, causal in shapes:
        cases = []
        for block_n in block_ns:
            for form in args.forms.split(","):
                if all(right.get((h, hkv, l, causal, form, block_n), [False])):
                    triton.set_allocator(Scratch(False))
                    cases.append((f"{form}_n{block_n}", _form_launch(form, "direct", h, hkv, l, l, causal, block_n)))
        try:
            rows = timing(cases, h, hkv, l, causal)
        except Exception as e:  # noqa: BLE001 — a failed capture is a row too
            rows = [{"shape": _shape_name(h, hkv, l, causal), "error": f"{type(e).__name__}: {str(e)[:300]}"}]
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

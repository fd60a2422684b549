"""Issue 15 on the H200: do warp specialization, tensor descriptors or a persistent grid make
Triton 3.6's FlashAttention forward faster? The probe kernels of docs/hopper.md
(benchmarks/hopper_probe_kernels.py), compiled offline until now, launched and timed beside
PyTorch SDPA's cuDNN and flash backends, shape by shape: an ablation table.

Shapes: bf16, head dim 128, b=1, 32 or 24 heads, L = 8192 or 16384, causal and not. The probe
has no GQA: K and V have as many heads as Q. Each variant is one row of one shape: compiled once
(all of them together, in a thread pool, before the first shape: the shapes' sizes are runtime
arguments and reuse the binary), checked on the shape against SDPA in fp32 math (a fresh random
input per shape, the output poisoned with NaN before the launch; a wrong variant is reported and
not timed), then timed as the replay of a CUDA graph of a few launches, the median of several
rounds in which every variant and both SDPA backends take turns (the order rotating), so that
clocks and power weigh on all alike. A variant that fails to compile or launch is a row that says
so; the script goes on.

Variants are only those docs/hopper.md found to compile: pointer loads; K/V or Q/K/V through host
descriptors (triton.tools.tensor_descriptor.TensorDescriptor: no in-kernel descriptors, so no
triton.set_allocator); warp specialization (Q/K/V through host descriptors, O through pointers,
BLOCK_M 128, 4 warps, and under a causal mask only the one-loop form, CAUSAL=2); the persistent
grid (no causal mask in that probe). Combinations that docs/hopper.md found not to compile are
rows marked "skipped".

    python benchmarks/hopper_probe_timing.py --out $OUT/hopper_probe_timing_h200.json
    python benchmarks/hopper_probe_timing.py --quick
    python benchmarks/hopper_probe_timing.py --shapes b1_h32_L8192_causal,b1_h24_L16384_full
    python benchmarks/hopper_probe_timing.py --offline-compile     # no GPU: compile every variant for sm_90
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import threading
import time
from dataclasses import asdict, dataclass

import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hopper_probe_kernels import HEAD_DIM, _fa_fwd, _fa_fwd_persistent  # noqa: E402

LOG2E = 1.4426950408889634
# Correctness against SDPA in fp32 math: every element finite, and both bounds hold. The relative
# RMS error is the one that catches a wrong kernel (a zero or mis-scaled output over L=16384 keys
# is small in absolute terms); the max bounds any single element (bf16 rounds 4.0 to ±0.008).
MAX_ABS_TOL = 2e-2
REL_RMS_TOL = 2e-2
ROUNDS = 5
# A first launch that has not finished after this long is taken as hung (a warp-specialized
# kernel whose barriers never complete spins forever): the results so far are written and the
# process ends, since a hung kernel holds the GPU until it does.
HANG_S = 20.0
QUICK_ROUNDS = 3
GRAPH_FLOPS = 4e12  # each graph holds enough launches for about this many flops (3 to 10 launches)
REF_BYTES = 4 << 30  # the fp32 reference's score matrices, per chunk of heads

# ------------------------------------------------------------------------------------------------
# Shapes and variants
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    b: int
    h: int
    L: int
    causal: bool
    hkv: int = 0  # K/V heads; 0: as many as h, and left out of the name (this probe's shapes)

    @property
    def name(self) -> str:
        kv = f"_kv{self.hkv}" if self.hkv else ""
        return f"b{self.b}_h{self.h}{kv}_L{self.L}_{'causal' if self.causal else 'full'}"

    @property
    def flops(self) -> float:
        full = 4.0 * self.b * self.h * self.L * self.L * HEAD_DIM
        return full / 2 if self.causal else full


SHAPES = [Shape(1, h, L, causal) for h in (32, 24) for L in (8192, 16384) for causal in (True, False)]
QUICK_SHAPES = [Shape(1, 32, 8192, True), Shape(1, 32, 8192, False)]

# How the probe reads Q and K/V: (Q through a host descriptor, K/V through host descriptors).
# O is always stored through pointers: a host descriptor of BLOCK_M rows does not compile under
# warp specialization (each consumer stores 64 rows), and the others need no descriptor for it.
LOADS = {"ptr": (False, False), "kv": (False, True), "qkv": (True, True), "dev": (True, True)}
# "dev": Q/K/V through descriptors the kernel makes itself (tl.make_tensor_descriptor, MAKE_DESC),
# whose scratch comes from triton.set_allocator. Triton's Hopper warp specialization partitions
# the data only with such on-device descriptors, not host ones (triton-lang/triton PR 7658,
# "Enable Warpspec for FA with non-causal and on-device TMA"), which may be why the host-descriptor
# warp-specialized probes hung on the H200.


@dataclass(frozen=True)
class Variant:
    loads: str            # "ptr", "kv", "qkv" (LOADS)
    block_n: int
    num_warps: int
    num_stages: int
    warp_spec: bool = False
    causal_mode: int = 0  # the probe's CAUSAL: 0 no mask, 1 two key loops, 2 one masked loop
    persistent: bool = False
    block_m: int = 128

    @property
    def name(self) -> str:
        parts = ["persist"] if self.persistent else []
        parts += [self.loads] + (["ws"] if self.warp_spec else [])
        parts += [f"n{self.block_n}", f"w{self.num_warps}", f"s{self.num_stages}"]
        parts += {0: [], 1: ["2loops"], 2: ["1loop"]}[self.causal_mode]
        return "_".join(parts)

    def constexprs(self, num_sms: int) -> dict:
        q_desc, kv_desc = LOADS[self.loads]
        c = dict(HEAD_DIM=HEAD_DIM, BLOCK_M=self.block_m, BLOCK_N=self.block_n, Q_DESC=q_desc, KV_DESC=kv_desc,
                 O_DESC=False, MAKE_DESC=self.loads == "dev")
        if self.persistent:
            c.update(NUM_SMS=num_sms, FLATTEN=False, WS_OUTER=self.warp_spec, WS_INNER=False)
        else:
            c.update(WARP_SPEC=self.warp_spec, CAUSAL=self.causal_mode, WS_DIAG=False)
        return c


def _v(loads, bn, warps, stages, ws=False, mode=0, persistent=False):
    return Variant(loads, bn, warps, stages, ws, mode, persistent)


# Non-causal: pointer loads over BLOCK_N × stages, K/V then Q/K/V through descriptors at 8 warps,
# warp specialization at 4 (its only working form), the persistent grid with and without it.
FULL_VARIANTS = [
    _v("ptr", 64, 8, 2), _v("ptr", 64, 8, 3), _v("ptr", 128, 8, 2), _v("ptr", 128, 8, 3),
    _v("kv", 64, 8, 2), _v("kv", 128, 8, 2),
    _v("qkv", 64, 8, 2), _v("qkv", 64, 8, 2, persistent=True),
    # descriptors made in the kernel (see LOADS), then warp-specialized last: a hang there (see
    # HANG_S) leaves every other row measured. The in-kernel-descriptor ones (the form Triton's
    # own tests run) first: the host-descriptor ones hung in round 9.
    _v("dev", 64, 8, 2), _v("dev", 64, 4, 2, ws=True), _v("dev", 128, 4, 2, ws=True), _v("dev", 64, 4, 3, ws=True),
    _v("qkv", 64, 4, 2, ws=True), _v("qkv", 128, 4, 2, ws=True),
    _v("qkv", 64, 4, 2, ws=True, persistent=True),
]
# Causal: the two-loop form (omnitune's) and the one-loop form (the only one warp specialization
# compiles), each without WS at 8 warps, so that "qkv_n64_w8_s2_1loop" → "qkv_ws_n64_w4_s2_1loop"
# isolates warp specialization and "…_2loops" → "…_1loop" the cost of masking every tile.
CAUSAL_VARIANTS = [
    _v("ptr", 64, 8, 2, mode=1), _v("ptr", 64, 8, 3, mode=1), _v("ptr", 128, 8, 2, mode=1),
    _v("ptr", 64, 8, 2, mode=2), _v("ptr", 128, 8, 2, mode=2),
    _v("kv", 64, 8, 2, mode=1), _v("kv", 128, 8, 2, mode=1),
    _v("qkv", 64, 8, 2, mode=1), _v("qkv", 64, 8, 2, mode=2),
    # descriptors made in the kernel, then warp-specialized with them (they ran in round 10)
    _v("dev", 64, 8, 2, mode=2), _v("dev", 64, 4, 2, ws=True, mode=2), _v("dev", 128, 4, 2, ws=True, mode=2),
    _v("dev", 64, 4, 3, ws=True, mode=2), _v("qkv", 64, 4, 2, ws=True, mode=2),
    _v("qkv", 128, 4, 2, ws=True, mode=2),
]
QUICK_FULL = [_v("ptr", 64, 8, 2), _v("kv", 64, 8, 2), _v("qkv", 64, 8, 2), _v("qkv", 64, 4, 2, ws=True),
              _v("qkv", 64, 4, 2, ws=True, persistent=True)]
QUICK_CAUSAL = [_v("ptr", 64, 8, 2, mode=1), _v("qkv", 64, 8, 2, mode=1), _v("qkv", 64, 8, 2, mode=2),
                _v("qkv", 64, 4, 2, ws=True, mode=2)]
# Rows that are not attempted, with the reason (docs/hopper.md, compiled offline).
CAUSAL_SKIPPED = {
    "qkv_ws_n64_w4_s2_2loops": "does not compile: warp_specialize with two key loops fails "
                               "(Dominance.cpp 'expected non-null blocks', docs/hopper.md)",
    "persist_*": "not measured: the persistent probe has no causal mask",
}


# On the H200 (round 9, benchmarks/results/hopper_probe_timing_h200_ws_hang.json) the first
# warp-specialized launch with host descriptors, qkv_ws_n64_w4_s2_1loop at b1 h32 L8192 causal, had
# not finished after 20 s, and in round 10 qkv_ws_n64_w4_s2 at b1 h32 L8192 non-causal neither
# (hopper_probe_timing_ws_h200_round10.json): Triton 3.6 compiles `tl.range(...,
# warp_specialize=True)` for sm_90 over host descriptors, but the kernel does not complete. With the
# descriptors made in the kernel (the "dev" loads, the form Triton's own tutorial runs) the same
# loop completed, correct, in round 10. The hanging form stays a row marked so unless
# --try-warp-spec asks for it again.
WARP_SPEC_HANGS = ("not launched: warp specialization over host descriptors hung on the H200 (first launch "
                   "unfinished after 20 s, rounds 9 and 10); --try-warp-spec launches it")


def hangs(v: Variant) -> bool:
    """Warp specialization over host descriptors: hung on the H200 (WARP_SPEC_HANGS)."""
    return v.warp_spec and v.loads != "dev"


def variants_for(shape: Shape, quick: bool, try_warp_spec: bool = False) -> list[Variant]:
    if shape.causal:
        chosen = QUICK_CAUSAL if quick else CAUSAL_VARIANTS
    else:
        chosen = QUICK_FULL if quick else FULL_VARIANTS
    return chosen if try_warp_spec else [v for v in chosen if not hangs(v)]


def warp_spec_rows_skipped(shape: Shape, quick: bool) -> list[str]:
    """The names of the variants of `shape` that a run without --try-warp-spec leaves out (hangs)."""
    return [v.name for v in variants_for(shape, quick, True) if hangs(v)]


# ------------------------------------------------------------------------------------------------
# Launching one probe
# ------------------------------------------------------------------------------------------------


def make_inputs(shape: Shape, dtype, device, seed: int):
    """q, k, v as [b, h, L, d] (SDPA's layout; contiguous, so each is also the probe's [b·h·L, d])."""
    g = torch.Generator(device=device).manual_seed(seed)
    return tuple(torch.randn(shape.b, shape.h, shape.L, HEAD_DIM, generator=g, device=device, dtype=dtype)
                 for _ in range(3))


def build_launch(v: Variant, q, k, v_, out, causal: bool, num_sms: int):
    """(kernel, grid, positional args, keyword args) for one probe launch on these tensors."""
    b, h, L, d = q.shape
    assert d == HEAD_DIM and L % v.block_m == 0 and L % v.block_n == 0, (q.shape, v)
    assert causal == (v.causal_mode != 0) and not (causal and v.persistent), (causal, v)
    q2, k2, v2, o2 = (t.view(b * h * L, d) for t in (q, k, v_, out))
    q_desc, kv_desc = LOADS[v.loads]
    from triton.tools.tensor_descriptor import TensorDescriptor

    on_host = v.loads != "dev"
    if not on_host:
        _allow_device_descriptors()
    qd = TensorDescriptor.from_tensor(q2, [v.block_m, d]) if q_desc and on_host else 0
    kd = TensorDescriptor.from_tensor(k2, [v.block_n, d]) if kv_desc and on_host else 0
    vd = TensorDescriptor.from_tensor(v2, [v.block_n, d]) if kv_desc and on_host else 0
    qk_scale = (1.0 / math.sqrt(d)) * LOG2E  # the probe's softmax is in exp2
    strides = (q2.stride(0), k2.stride(0), v2.stride(0), o2.stride(0))
    if v.persistent:
        tiles = (L // v.block_m) * b * h
        kernel, grid = _fa_fwd_persistent, (min(num_sms, tiles),)
        args = (q2, k2, v2, o2, qd, kd, vd, 0, *strides, L, L, b * h, qk_scale)
    else:
        kernel, grid = _fa_fwd, (L // v.block_m, b * h)
        args = (q2, k2, v2, o2, qd, kd, vd, 0, *strides, L, L, qk_scale)
    kwargs = dict(v.constexprs(num_sms), num_warps=v.num_warps, num_stages=v.num_stages)
    return kernel, grid, args, kwargs


def _allow_device_descriptors() -> None:
    """Descriptors made in a kernel need global scratch memory: Triton asks the allocator set here
    (a CUDA-graph capture records the allocation's address, as for any tensor)."""
    triton.set_allocator(lambda size, alignment, stream: torch.empty(size, dtype=torch.int8, device="cuda"))


def launch(v: Variant, q, k, v_, out, causal: bool, num_sms: int):
    kernel, grid, args, kwargs = build_launch(v, q, k, v_, out, causal, num_sms)
    kernel[grid](*args, **kwargs)


def reference(q, k, v, causal: bool) -> torch.Tensor:
    """SDPA in fp32 math, a few heads at a time (L×L fp32 scores per head)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    b, h, L, _ = q.shape
    chunk = max(1, REF_BYTES // (L * L * 4))
    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    with sdpa_kernel(SDPBackend.MATH):
        for i in range(0, h, chunk):
            s = slice(i, i + chunk)
            out[:, s] = torch.nn.functional.scaled_dot_product_attention(
                q[:, s].float(), k[:, s].float(), v[:, s].float(), is_causal=causal)
    return out


def compare(out: torch.Tensor, ref: torch.Tensor) -> dict:
    """max abs error, relative RMS error, non-finite count, and whether all are within tolerance."""
    diff = out.float() - ref
    finite = torch.isfinite(diff)
    nonfinite = int((~finite).sum())
    diff = torch.where(finite, diff, torch.zeros_like(diff))
    max_abs = float(diff.abs().max())
    rel_rms = float(diff.norm() / ref.norm().clamp_min(1e-30))
    ok = nonfinite == 0 and max_abs <= MAX_ABS_TOL and rel_rms <= REL_RMS_TOL
    return dict(correct=ok, max_abs_err=max_abs, rel_rms_err=rel_rms, nonfinite=nonfinite)


def _one_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    text = lines[-1] if lines else ""
    return f"{type(exc).__name__}: {text}"[:300]


# ------------------------------------------------------------------------------------------------
# Compiling every variant up front, in parallel
# ------------------------------------------------------------------------------------------------


def precompile(jobs: list[tuple[Variant, Shape]], device, num_sms: int, threads: int) -> dict:
    """Compile each (variant, shape) launch without running it, in Triton's async compile mode
    (compiles run in a thread pool; Triton's JIT caches the binaries under the same keys the
    launches will use). Returns {binary_key: "failed: …"} for those that did not compile."""
    from concurrent.futures import ThreadPoolExecutor

    try:
        from triton.runtime._async_compile import AsyncCompileMode
    except ImportError:  # compile lazily at the first launch instead
        return {}
    failed, futures = {}, {}
    with ThreadPoolExecutor(threads) as pool, AsyncCompileMode(pool, ignore_errors=True):
        for v, shape in jobs:
            q = torch.empty(shape.b, shape.h, max(256, v.block_m), HEAD_DIM, device=device, dtype=torch.bfloat16)
            try:
                kernel, grid, args, kwargs = build_launch(v, q, q, q, q, shape.causal, num_sms)
                futures[binary_key(v, shape)] = kernel.warmup(*args, grid=grid, **kwargs)
            except Exception as exc:
                failed[binary_key(v, shape)] = f"failed: {_one_line(exc)}"
        for key, future in futures.items():
            try:
                if hasattr(future, "result"):
                    future.result()
            except Exception as exc:
                failed[key] = f"failed: {_one_line(exc)}"
    return failed


def binary_key(v: Variant, shape: Shape) -> tuple:
    """What tells one compiled binary from another: the variant's constexprs and options, and
    the runtime ints' specialisation — alike for every shape here (strides and L divisible by
    16) except the persistent kernel's BH (b·h), specialised on divisibility by 16."""
    return (v, shape.b * shape.h % 16 == 0) if v.persistent else (v,)


def compile_jobs(shapes: list[Shape], quick: bool, try_warp_spec: bool) -> list[tuple[Variant, Shape]]:
    """One (variant, shape) per distinct binary."""
    jobs, seen = [], set()
    for shape in shapes:
        for v in variants_for(shape, quick, try_warp_spec):
            if binary_key(v, shape) not in seen:
                seen.add(binary_key(v, shape))
                jobs.append((v, shape))
    return jobs


# ------------------------------------------------------------------------------------------------
# Timing
# ------------------------------------------------------------------------------------------------


def _sdpa_call(q, k, v, causal: bool, backend):
    from torch.nn.attention import sdpa_kernel

    def call():
        with sdpa_kernel(backend):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return call


def timed_graph(fn, launches: int):
    """(replay, how, graph): a CUDA graph of `launches` calls, else (capture failed) the eager loop."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(launches):
                fn()
        graph.replay()
        torch.cuda.synchronize()
        return graph.replay, "cuda_graph", graph
    except Exception as exc:
        torch.cuda.synchronize()

        def eager():
            for _ in range(launches):
                fn()
        return eager, f"eager (graph capture failed: {_one_line(exc)})", None


def time_rounds(replays: dict, launches: int, rounds: int) -> dict:
    """{name: [ms per launch, one per round]}: every replay once per round, the order rotated."""
    names = list(replays)
    times = {n: [] for n in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        events = []
        for n in order:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            replays[n]()
            end.record()
            events.append((n, start, end))
        torch.cuda.synchronize()
        for n, start, end in events:
            times[n].append(start.elapsed_time(end) / launches)
    return times


def timed_beside_cudnn(shape: Shape, calls: dict, rows: dict, rounds: int) -> None:
    """Each call ({name: fn}, "sdpa_cudnn" among them) captured in a CUDA graph and timed in
    interleaved rounds; its row gets ms, TFLOP/s and the ratio to cuDNN (a capture that fails: its
    row's status)."""
    launches = launches_for(shape)
    replays, keep = {}, []
    for name, call in calls.items():
        try:
            replay, how, graph = timed_graph(call, launches)
        except Exception as exc:
            rows[name]["status"] = f"failed: {_one_line(exc)}"
            continue
        replays[name] = replay
        keep.append(graph)
        rows[name]["timing"] = how
    times = time_rounds(replays, launches, rounds) if replays else {}
    cudnn_ms = statistics.median(times["sdpa_cudnn"]) if "sdpa_cudnn" in times else None
    for name, ms_list in times.items():
        ms = statistics.median(ms_list)
        rows[name].update(ms=ms, ms_rounds=ms_list, launches_per_graph=launches, rounds=rounds,
                          tflops=shape.flops / (ms * 1e-3) / 1e12,
                          vs_cudnn=(cudnn_ms / ms) if cudnn_ms else None)
    del keep, replays
    torch.cuda.empty_cache()


def launches_for(shape: Shape) -> int:
    return max(3, min(10, math.ceil(GRAPH_FLOPS / shape.flops)))


# ------------------------------------------------------------------------------------------------
# One shape
# ------------------------------------------------------------------------------------------------


def _row(shape: Shape, name: str, **fields) -> dict:
    return dict(shape=shape.name, b=shape.b, h=shape.h, hkv=shape.h, L=shape.L, d=HEAD_DIM, causal=shape.causal,
                variant=name, **fields)


class _hang_watch:
    """Ends the process if the block takes longer than HANG_S: writes the rows so far (this one
    marked hung) through _PARTIAL's writer, prints why, and exits with status 3."""

    def __init__(self, what: str, row: dict):
        self.what, self.row = what, row
        self.timer = threading.Timer(HANG_S, self._hung)
        self.timer.daemon = True

    def _hung(self) -> None:
        self.row["status"] = f"hung: the first launch had not finished after {HANG_S:.0f} s"
        print(f"{self.what}: {self.row['status']}; writing the results so far and exiting", flush=True)
        if _PARTIAL["write"] is not None:
            current = [r for r in _PARTIAL["current"].values() if r is not self.row]
            _PARTIAL["write"](_PARTIAL["rows"] + current + [self.row], partial=True)
        os._exit(3)

    def __enter__(self):
        self.timer.start()
        return self

    def __exit__(self, *exc) -> None:
        self.timer.cancel()


# The rows of the shapes done so far and the function that writes them: what a hang leaves.
_PARTIAL: dict = {"rows": [], "current": {}, "write": None}


RECHECKS = 5  # launches after the first whose outputs are checked too


def run_shape(shape: Shape, variants: list[Variant], compile_failed: dict, num_sms: int, rounds: int,
              seed: int, skipped_warp_spec: tuple[str, ...] = ()) -> list[dict]:
    from torch.nn.attention import SDPBackend

    q, k, v = make_inputs(shape, torch.bfloat16, "cuda", seed)
    ref = reference(q, k, v, shape.causal)
    rows, calls = {}, {}
    _PARTIAL["current"] = rows  # what a hang in this shape leaves, with the shapes before it
    out = torch.empty_like(q)
    for variant in variants:
        row = _row(shape, variant.name, kind="triton", **asdict(variant))
        rows[variant.name] = row
        if binary_key(variant, shape) in compile_failed:
            row["status"] = compile_failed[binary_key(variant, shape)]
            continue
        print(f"  {shape.name} {variant.name}: first launch", flush=True)
        try:
            out.fill_(float("nan"))
            started = time.perf_counter()
            with _hang_watch(f"{shape.name} {variant.name}", row):
                launch(variant, q, k, v, out, shape.causal, num_sms)
                torch.cuda.synchronize()
            row["first_launch_s"] = round(time.perf_counter() - started, 3)
        except Exception as exc:
            row["status"] = f"failed: {_one_line(exc)}"
            continue
        row.update(compare(out, ref))
        row["status"] = "ok" if row["correct"] else "wrong"
        if row["correct"]:
            # A race shows on some launches only: launched RECHECKS more times, each output checked.
            wrong = 0
            for _ in range(RECHECKS):
                out.fill_(float("nan"))
                launch(variant, q, k, v, out, shape.causal, num_sms)
                wrong += not compare(out, ref)["correct"]
            row.update(rechecks=RECHECKS, rechecks_wrong=wrong)
            if wrong:
                row["status"] = f"wrong on {wrong} of {RECHECKS} more launches"
        if row["status"] == "ok":
            calls[variant.name] = (lambda variant=variant: launch(variant, q, k, v, out, shape.causal, num_sms))
    for name, backend in (("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION), ("sdpa_flash", SDPBackend.FLASH_ATTENTION)):
        row = _row(shape, name, kind="sdpa", backend=backend.name)
        rows[name] = row
        call = _sdpa_call(q, k, v, shape.causal, backend)
        try:
            got = call()
            torch.cuda.synchronize()
        except Exception as exc:
            row["status"] = f"failed: {_one_line(exc)}"
            continue
        row.update(compare(got, ref))
        row["status"] = "ok" if row["correct"] else "wrong"
        del got
        calls[name] = call  # SDPA is timed even if outside the tolerance; its row says so
    del ref
    torch.cuda.empty_cache()
    timed_beside_cudnn(shape, calls, rows, rounds)
    result = list(rows.values())
    if shape.causal:
        for name, reason in CAUSAL_SKIPPED.items():
            result.append(_row(shape, name, kind="triton", status=f"skipped: {reason}"))
    for name in skipped_warp_spec:
        result.append(_row(shape, name, kind="triton", status=f"skipped: {WARP_SPEC_HANGS}"))
    return result


# ------------------------------------------------------------------------------------------------
# Report
# ------------------------------------------------------------------------------------------------


def environment() -> dict:
    props = torch.cuda.get_device_properties(0)
    return dict(gpu=torch.cuda.get_device_name(0), sms=props.multi_processor_count,
                capability=f"{props.major}.{props.minor}", memory_gib=round(props.total_memory / 2**30, 1),
                torch=torch.__version__, triton=triton.__version__, cuda=torch.version.cuda,
                cudnn=torch.backends.cudnn.version(), python=platform.python_version())


def _fmt(x, spec):
    return "" if x is None else format(x, spec)


NAMES = ("Names: loads (ptr, kv = K/V host descriptors, qkv = Q/K/V host descriptors), ws = warp "
         "specialization, n = BLOCK_N (BLOCK_M 128), w = warps, s = stages; causal: 2loops = CAUSAL=1 "
         "(unmasked loop + masked diagonal loop), 1loop = CAUSAL=2 (every tile masked).")


def markdown(rows: list[dict], heads: str = "K/V heads = Q heads: no GQA", names: str = NAMES) -> str:
    """A table a shape: each row's status, time, TFLOP/s, ratio to cuDNN and errors."""
    lines = []
    for shape in dict.fromkeys(r["shape"] for r in rows):
        lines += ["", f"### {shape} (bf16, d={HEAD_DIM}{', ' + heads if heads else ''})", "",
                  "| variant | status | ms | TFLOP/s | × cuDNN | max abs err | rel RMS err |",
                  "|---|---|---:|---:|---:|---:|---:|"]
        for r in (r for r in rows if r["shape"] == shape):
            status = r.get("status", "")
            status = status if len(status) < 90 else status[:87] + "..."
            lines.append(f"| {r['variant']} | {status} | {_fmt(r.get('ms'), '.3f')} | {_fmt(r.get('tflops'), '.0f')}"
                         f" | {_fmt(r.get('vs_cudnn'), '.2f')} | {_fmt(r.get('max_abs_err'), '.2e')}"
                         f" | {_fmt(r.get('rel_rms_err'), '.2e')} |")
    lines += ["", "× cuDNN: SDPA cuDNN's median ms over the row's (above 1: faster than cuDNN). " + names]
    return "\n".join(lines)


def select_shapes(quick: bool, names: str | None) -> list[Shape]:
    shapes = QUICK_SHAPES if quick and not names else SHAPES
    if names:
        wanted = [n.strip() for n in names.split(",") if n.strip()]
        shapes = [s for s in shapes if any(w == s.name or w in s.name for w in wanted)]
        if not shapes:
            raise SystemExit(f"--shapes {names!r} matches none of {[s.name for s in SHAPES]}")
    return shapes


# ------------------------------------------------------------------------------------------------
# Offline compile (no GPU): every variant for sm_90, as hopper_features_offline.py compiles
# ------------------------------------------------------------------------------------------------


def offline_compile(quick: bool, names: str | None) -> list[dict]:
    """Compile each variant's launch for sm_90 on this machine (CPU tensors stand in for the
    GPU's: the signature is Triton's own specialisation of the launcher's arguments)."""
    from hopper_features_offline import TARGET, _specialised_source

    rows = []
    for v, shape in compile_jobs(select_shapes(quick, names), quick, try_warp_spec=True):
        q = torch.empty(shape.b, shape.h, max(256, v.block_m), HEAD_DIM, dtype=torch.bfloat16)
        kernel, _, args, kwargs = build_launch(v, q, q, q, q, shape.causal, 132)
        options = {o: kwargs.pop(o) for o in ("num_warps", "num_stages")}
        started = time.perf_counter()
        row = dict(variant=v.name, bh=shape.b * shape.h)
        try:
            compiled = triton.compile(_specialised_source(kernel, args, kwargs), target=TARGET, options=options)
        except Exception as exc:
            row.update(compiled=False, error=_one_line(exc))
        else:
            ttgir = compiled.asm["ttgir"]
            row.update(compiled=True, shared=compiled.metadata.shared, warps=compiled.metadata.num_warps,
                       warp_specialize="ttg.warp_specialize" in ttgir,
                       tma="cp.async.bulk.tensor" in compiled.asm["ptx"])
        row["compile_s"] = round(time.perf_counter() - started, 2)
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


# ------------------------------------------------------------------------------------------------
# Driver
# ------------------------------------------------------------------------------------------------


def _write(path: str, env: dict, quick: bool, rounds: int, compile_s: float, total_s: float, rows: list[dict],
           partial: bool) -> None:
    result = dict(
        what="Triton 3.6 FlashAttention-forward probes (benchmarks/hopper_probe_kernels.py) launched and timed "
             "beside SDPA cuDNN and flash: issue 15's ablation of warp specialization, host tensor "
             "descriptors and a persistent grid",
        environment=env, quick=quick, rounds=rounds, partial=partial,
        notes=["bf16, head dim 128; no GQA in the probe: K/V have as many heads as Q (hkv = h)",
               "flops: 4·b·h·L²·d, half of it under a causal mask",
               f"correct: every element finite, max abs err <= {MAX_ABS_TOL}, relative RMS err <= "
               f"{REL_RMS_TOL}, against SDPA in fp32 math on a fresh random input per shape, the output "
               "poisoned with NaN before each variant's launch; a wrong variant is not timed",
               "ms: median over rounds of a CUDA graph replay of launches_per_graph launches, divided by "
               "them; every variant and SDPA once per round, the order rotated",
               "vs_cudnn: SDPA cuDNN's ms / the row's ms (above 1: faster than cuDNN)",
               "O is stored through pointers in every variant; descriptors are host TensorDescriptors",
               f"partial: the run ended early (a first launch hung for {HANG_S:.0f} s, or shapes remain)"],
        compile_s=compile_s, total_s=total_s, rows=rows)
    write_json(path, result)


def write_json(path: str, result: dict) -> None:
    """The result at path, written whole or not at all (a run cut short keeps its last file)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(result, f, indent=1, default=str)
        f.write("\n")
    os.replace(path + ".tmp", path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="write every row and the environment as JSON here")
    parser.add_argument("--quick", action="store_true", help="two shapes, five variants each, three rounds")
    parser.add_argument("--shapes", help="comma-separated shape names or substrings, e.g. b1_h32_L8192_causal")
    parser.add_argument("--rounds", type=int, help=f"timing rounds (default {ROUNDS}, --quick {QUICK_ROUNDS})")
    parser.add_argument("--threads", type=int, default=min(8, os.cpu_count() or 1), help="compile threads")
    parser.add_argument("--try-warp-spec", action="store_true",
                        help="also launch warp specialization over host descriptors (it hung on the H200: see WARP_SPEC_HANGS)")
    parser.add_argument("--offline-compile", action="store_true",
                        help="no GPU: compile every chosen variant for sm_90 and print what compiled")
    args = parser.parse_args(argv)
    if args.offline_compile:
        offline_compile(args.quick, args.shapes)
        return 0
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU (or --offline-compile)")
    started = time.perf_counter()
    shapes = select_shapes(args.quick, args.shapes)
    rounds = args.rounds or (QUICK_ROUNDS if args.quick else ROUNDS)
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    env = environment()
    print(json.dumps(env), flush=True)
    jobs = compile_jobs(shapes, args.quick, args.try_warp_spec)
    try:
        failed = precompile(jobs, "cuda", num_sms, args.threads)
    except Exception as exc:  # the pool itself broke: every variant compiles at its first launch instead
        print(f"parallel compile failed ({_one_line(exc)}); compiling at first launch", flush=True)
        failed = {}
    compile_s = time.perf_counter() - started
    print(f"compiled {len(jobs) - len(failed)}/{len(jobs)} binaries in {compile_s:.1f} s", flush=True)
    for key, why in failed.items():
        print(f"  {key[0].name}: {why}", flush=True)
    rows = _PARTIAL["rows"]
    if args.out:
        _PARTIAL["write"] = lambda done, partial=False: _write(args.out, env, args.quick, rounds, compile_s,
                                                                time.perf_counter() - started, done, partial)
    for i, shape in enumerate(shapes):
        t = time.perf_counter()
        try:
            skipped = () if args.try_warp_spec else tuple(warp_spec_rows_skipped(shape, args.quick))
            shape_rows = run_shape(shape, variants_for(shape, args.quick, args.try_warp_spec), failed, num_sms,
                                   rounds, seed=1000 + i, skipped_warp_spec=skipped)
        except Exception as exc:  # e.g. out of memory for the reference: the shape is one failed row
            shape_rows = [_row(shape, "*", kind="shape", status=f"failed: {_one_line(exc)}")]
        rows += shape_rows
        if _PARTIAL["write"] is not None:
            _PARTIAL["write"](rows, partial=i + 1 < len(shapes))
        best = min((r for r in shape_rows if r.get("kind") == "triton" and r.get("ms")), key=lambda r: r["ms"],
                   default=None)
        cudnn = next((r for r in shape_rows if r["variant"] == "sdpa_cudnn" and r.get("ms")), None)
        print(f"{shape.name}: {time.perf_counter() - t:.1f} s; best probe "
              f"{best['variant'] + ' %.3f ms' % best['ms'] if best else '-'}; "
              f"cuDNN {'%.3f ms' % cudnn['ms'] if cudnn else '-'}", flush=True)
    total_s = time.perf_counter() - started
    print(markdown(rows))
    print(f"\ntotal {total_s:.1f} s (compile {compile_s:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

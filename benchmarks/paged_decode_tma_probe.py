"""Paged decode with each page's K and V fetched by the tensor memory accelerator (Hopper TMA), one
page a loop step, beside the library's split kernel (pointer loads), both as CUDA-graph replays of
the whole call (split kernel + combine), in one run. A study, not a library path.

Why: issue 15's long contexts at batch 1-4 stop at 66-81% of copy bandwidth on the H200, where a
plain read of the same bytes reaches 94-100%; issue 16's fp8 loop is bound by instructions, a
third of them K/V addresses. A TMA load takes one descriptor and two coordinates (the page number
and the kv head) for a whole [page, head_dim] tile: no per-element address, no register staging,
and the pipeliner keeps num_stages − 1 pages in flight through shared memory. Bounds are the
hardware's: a page number outside the cache reads zeros, never memory past it.

The probe's kernel (_split_tma) keeps the library's split-K partials layout and calls its combine
kernel, so only the split kernel differs. Pages of 16 keys, GQA packed (all query heads of a kv
head in one program), one query token. Each config's output is NaN-poisoned first and compared
with the library's (relative RMS) and with a float64 reference of the cache.

    PYTHONPATH=$PWD python benchmarks/paged_decode_tma_probe.py --out $OUT/paged_decode_tma.json
    TRITON_INTERPRET=1 PYTHONPATH=$PWD python benchmarks/paged_decode_tma_probe.py --check-only  # CPU, small
    PYTHONPATH=$PWD python benchmarks/paged_decode_tma_probe.py --offline --out benchmarks/results/decode_loop_offline_tma.json

--offline compiles the probe's split kernel for sm_90 without a GPU (as decode_registers_offline.py
--loop does the library's) and counts its key loop's instructions a key, registers and shared
memory, over bf16 and fp8 caches, one and two pages a step, 1-4 warps.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from functools import partial
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from omnitune.kernels import paged_decode_attention as pda
from omnitune.kernels._host import LOG2E

try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover — older Triton
    TensorDescriptor = None


@triton.jit
def _attend(q, k, v, n, ctx, m_i, l_i, acc, qk_scale, MASKED: tl.constexpr):
    """One page's keys into the running softmax. MASKED for a page the context ends in: its
    slots past the context hold whatever the engine left there (inf or NaN in the tests' caches),
    and a masked score's p = 0 still makes 0 · inf = NaN in P·V, so V is zeroed too."""
    if MASKED:
        v = tl.where((n < ctx)[:, None], v, 0.0)
    qk = tl.dot(q, tl.trans(k)) * qk_scale
    if MASKED:
        qk = tl.where((n < ctx)[None, :], qk, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    prob = tl.math.exp2(qk - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    return m_new, l_i * alpha + tl.sum(prob, 1), tl.dot(prob.to(v.dtype), v, acc * alpha[:, None])


@triton.jit
def _load_page(k_desc, v_desc, page, hk, PAGE: tl.constexpr, HEAD_DIM: tl.constexpr, KV_FP8: tl.constexpr):
    k = k_desc.load([page, 0, hk, 0]).reshape(PAGE, HEAD_DIM)
    v = v_desc.load([page, 0, hk, 0]).reshape(PAGE, HEAD_DIM)
    if KV_FP8:
        k = k.to(tl.float16)
        v = v.to(tl.float16)
    return k, v


@triton.jit
def _split_tma(
    Q, k_desc, v_desc, BlockTables, ContextLens, PartM, PartL, PartAcc, KScale, VScale,
    stride_qb, stride_qh, stride_btb,
    H, MAX_PAGES, qk_scale,
    PAGE: tl.constexpr, HEAD_DIM: tl.constexpr, GROUP: tl.constexpr, BLOCK_M: tl.constexpr,
    NUM_SPLITS: tl.constexpr, KV_FP8: tl.constexpr, PAIRS: tl.constexpr,
):
    b = tl.program_id(0)
    hk = tl.program_id(1)
    split = tl.program_id(2)
    rows = tl.arange(0, BLOCK_M)
    head = hk * GROUP + rows
    row_valid = rows < GROUP
    ctx = tl.minimum(tl.maximum(tl.load(ContextLens + b), 0), MAX_PAGES * PAGE)
    pages = tl.cdiv(ctx, PAGE)
    p_start = tl.cdiv(split * pages, NUM_SPLITS)
    p_end = tl.cdiv((split + 1) * pages, NUM_SPLITS)
    # Pages wholly inside the context go through the unmasked loop, PAIRS + 1 a step; the rest
    # (at most PAIRS whole pages and the page the context ends in) through the masked one.
    steps = tl.maximum(tl.minimum(p_end, ctx // PAGE) - p_start, 0) // (PAIRS + 1)
    main_stop = p_start + steps * (PAIRS + 1)

    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + b.to(tl.int64) * stride_qb + head.to(tl.int64)[:, None] * stride_qh + offs_d[None, :],
                mask=row_valid[:, None], other=0.0)
    if KV_FP8:
        q = (q.to(tl.float32) * qk_scale).to(tl.float16)
        qk_scale = tl.load(KScale)
        v_scale = tl.load(VScale)

    table = BlockTables + b.to(tl.int64) * stride_btb
    offs_n = tl.arange(0, PAGE)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    # Page numbers one step ahead, as the library's loop loads them, so that a step's TMA loads
    # do not wait on a load of the same step (the pipeliner would then keep one in flight).
    next_a = tl.load(table + p_start, mask=p_start < main_stop, other=0)
    next_b = tl.load(table + p_start + 1, mask=p_start + 1 < main_stop, other=0)
    for p in range(p_start, main_stop, PAIRS + 1):
        page_a = next_a
        page_b = next_b
        ahead = p + PAIRS + 1
        next_a = tl.load(table + ahead, mask=ahead < main_stop, other=0)
        if PAIRS:
            next_b = tl.load(table + ahead + 1, mask=ahead + 1 < main_stop, other=0)
            k0, v0 = _load_page(k_desc, v_desc, page_a, hk, PAGE, HEAD_DIM, KV_FP8)
            k1, v1 = _load_page(k_desc, v_desc, page_b, hk, PAGE, HEAD_DIM, KV_FP8)
            qk0 = tl.dot(q, tl.trans(k0)) * qk_scale
            qk1 = tl.dot(q, tl.trans(k1)) * qk_scale
            m_new = tl.maximum(m_i, tl.maximum(tl.max(qk0, 1), tl.max(qk1, 1)))
            p0 = tl.math.exp2(qk0 - m_new[:, None])
            p1 = tl.math.exp2(qk1 - m_new[:, None])
            alpha = tl.math.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p0, 1) + tl.sum(p1, 1)
            acc = tl.dot(p1.to(v1.dtype), v1, tl.dot(p0.to(v0.dtype), v0, acc * alpha[:, None]))
            m_i = m_new
        else:
            k, v = _load_page(k_desc, v_desc, page_a, hk, PAGE, HEAD_DIM, KV_FP8)
            m_i, l_i, acc = _attend(q, k, v, p * PAGE + offs_n, ctx, m_i, l_i, acc, qk_scale, False)
    for p in range(main_stop, p_end):
        k, v = _load_page(k_desc, v_desc, tl.load(table + p), hk, PAGE, HEAD_DIM, KV_FP8)
        m_i, l_i, acc = _attend(q, k, v, p * PAGE + offs_n, ctx, m_i, l_i, acc, qk_scale, True)
    if KV_FP8:
        acc = acc * v_scale
    # The library's partials layout: [B, H, 1, NUM_SPLITS] and [B, H, 1, NUM_SPLITS, HEAD_DIM].
    part = (b.to(tl.int64) * H + head) * NUM_SPLITS + split
    tl.store(PartM + part, m_i, mask=row_valid)
    tl.store(PartL + part, l_i, mask=row_valid)
    tl.store(PartAcc + part[:, None] * HEAD_DIM + offs_d[None, :], acc, mask=row_valid[:, None])


class TmaDecode:
    """One call's launch of the probe: descriptors and partials made once (as a plan would)."""

    def __init__(self, inputs: pda.PagedDecodeInputs, splits: int, warps: int, stages: int, pairs: bool = False):
        q, kc = inputs.q, inputs.key_cache
        b, h, lq, d = q.shape
        assert lq == 1, "the probe decodes one token"
        self.inputs, self.splits, self.warps, self.stages, self.pairs = inputs, splits, warps, stages, pairs
        self.hkv, self.page = kc.shape[2], kc.shape[1]
        self.group = h // self.hkv
        block = [1, self.page, 1, d]
        self.k_desc = TensorDescriptor(kc, list(kc.shape), list(kc.stride()), block)
        self.v_desc = TensorDescriptor(inputs.value_cache, list(kc.shape), list(inputs.value_cache.stride()), block)
        dev = q.device
        self.part_m = torch.empty((b, h, 1, splits), dtype=torch.float32, device=dev)
        self.part_l = torch.empty_like(self.part_m)
        self.part_acc = torch.empty((b, h, 1, splits, d), dtype=torch.float32, device=dev)
        self.fp8 = inputs.k_scale is not None
        one = torch.ones(1, dtype=torch.float32, device=dev)
        self.k_scale = inputs.k_scale if self.fp8 else one
        self.v_scale = inputs.v_scale if self.fp8 else one

    def __call__(self, out: torch.Tensor, split: bool = True, combine: bool = True) -> torch.Tensor:
        b, h, _, d = self.inputs.q.shape
        if split:
            self.split()
        if combine:
            pda._paged_decode_combine[(b * h,)](
                self.part_m, self.part_l, self.part_acc, out, *out.stride(), h, 1,
                HEAD_DIM=d, BLOCK_D=d, NUM_SPLITS=self.splits, BLOCK_S=triton.next_power_of_2(self.splits))
        return out

    def split(self) -> None:
        x = self.inputs
        q = x.q
        b, h, _, d = q.shape
        _split_tma[(b, self.hkv, self.splits)](
            q, self.k_desc, self.v_desc, x.block_tables, x.context_lens,
            self.part_m, self.part_l, self.part_acc, self.k_scale, self.v_scale,
            q.stride(0), q.stride(1), x.block_tables.stride(0),
            h, x.block_tables.shape[1], x.sm_scale * LOG2E,
            PAGE=self.page, HEAD_DIM=d, GROUP=self.group, BLOCK_M=max(16, triton.next_power_of_2(self.group)),
            NUM_SPLITS=self.splits, KV_FP8=self.fp8, PAIRS=self.pairs, num_warps=self.warps, num_stages=self.stages)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _inputs(b: int, ctx: int, fp8: bool, device, h=28, hkv=4, d=128) -> tuple:
    problem = pda.PagedDecodeProblem(b=b, h=h, hkv=hkv, lq=1, ctx=ctx, d=d, block_size=16,
                                     cache_dtype="fp8_e4m3" if fp8 else "auto")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float16
    return problem, pda.SPEC.make_inputs(problem, dtype, device, seed=0)


def check_only() -> int:
    """Small shapes under the interpreter: the probe against the float64 reference, single pages
    and pairs, contexts ending inside a page and on its edge, one sequence shorter than its table."""
    device = torch.device("cpu")
    worst = 0.0
    for (b, ctx, splits), pairs in itertools.product(((1, 40, 2), (2, 100, 3), (1, 16, 4), (3, 96, 2)), (False, True)):
        _, inputs = _inputs(b, ctx, False, device, h=8, hkv=2, d=32)
        if b > 1:  # the first sequence's context cut short: pages of its table past it are never read
            inputs.context_lens[0] = ctx - 37
        out = pda.new_output(inputs)
        TmaDecode(inputs, splits, 1, 2, pairs)(out)
        err = _rel(out, pda.reference(inputs))
        print(f"b{b} ctx{inputs.context_lens.tolist()} splits{splits} pairs={pairs}: rel error {err:.2e}")
        worst = max(worst, err)
    return 0 if worst < 2e-3 else 1


def offline_rows() -> list[dict]:
    """Static counts of the probe's key loop compiled for sm_90 (b×28 query heads over 4 kv
    heads, d=128, pages of 16, 4 stages), one row a (cache, warps, pages a step)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import cubin
    from decode_registers_offline import LOOP_FAMILIES

    rows = []
    for kv, warps, pairs in itertools.product(("bf16", "fp8e4nv"), (1, 2, 4), (False, True)):
        tile = f"tensordesc<{kv}[1,16,1,128]>"
        pointers = {"Q": "*bf16", "k_desc": tile, "v_desc": tile, "BlockTables": "*i32", "ContextLens": "*i32",
                    "PartM": "*fp32", "PartL": "*fp32", "PartAcc": "*fp32", "KScale": "*fp32", "VScale": "*fp32"}
        constexprs = {"PAGE": 16, "HEAD_DIM": 128, "GROUP": 7, "BLOCK_M": 16, "NUM_SPLITS": 64,
                      "KV_FP8": kv != "bf16", "PAIRS": pairs}
        kernel = cubin.compile_sm90(_split_tma, pointers, constexprs, warps, 4, aligned=("MAX_PAGES",),
                                    floats=("qk_scale",))
        loop = cubin.loop_counts(kernel)
        per_key = warps / (16 * (2 if pairs else 1))  # one step per warp covers its pages' keys with the others
        rows.append({"cache": "fp8" if kv != "bf16" else "bf16", "pages_a_step": 2 if pairs else 1,
                     "num_warps": warps, "num_stages": 4, **cubin.cubin_resources(kernel),
                     "shared_bytes": kernel.metadata.shared,
                     "instructions_per_key": round(loop["instructions"] * per_key, 2),
                     "per_key": {f: round(loop["opcodes"].get(f, 0) * per_key, 2) for f in (*LOOP_FAMILIES, "UTMALDG")},
                     "opcodes": loop["opcodes"]})
        r = rows[-1]
        print(f"{r['cache']:4s} {r['pages_a_step']} page(s) a step, {warps} warp(s): {r['registers']} registers, "
              f"{r['shared_bytes'] // 1024} KiB shared, {r['instructions_per_key']} instructions a key", flush=True)
    return rows


def _graph_us(fn) -> float:
    from ops_bench import best_graph_us
    return best_graph_us(fn, 5)


def library_case(b: int, ctx: int, fp8: bool, device: torch.device, copy_tbps: float) -> tuple:
    """A study's shape (h28/4, d=128, pages of 16, one token): its inputs, the bytes the byte model
    moves, the reference, and PagedDecodePlan.run over them with the tables' config — its output
    and a case dict holding its graph-replayed µs, % of copy and error."""
    problem, inputs = _inputs(b, ctx, fp8, device)
    dtype = inputs.q.dtype  # bf16 on a GPU
    moved = pda.SPEC.bytes_moved(problem, dtype)
    ref = pda.reference(inputs)
    plan = pda.PagedDecodePlan(batch=b, num_heads=28, num_kv_heads=4, head_dim=128, block_size=16,
                               max_blocks=inputs.block_tables.shape[1], max_context_len=ctx,
                               dtype=dtype, device=device, cache_dtype=torch.float8_e4m3fn if fp8 else None)

    def lib_call():
        x = inputs
        return plan.run(x.q, x.key_cache, x.value_cache, x.block_tables, x.context_lens,
                        k_scale=x.k_scale, v_scale=x.v_scale)

    lib_out = lib_call().clone()
    us = _graph_us(lib_call)
    case = {"b": b, "ctx": ctx, "cache": "fp8_e4m3" if fp8 else "bf16", "bytes_moved": moved,
            "library": {"config": plan.config.label(), "graph_us": us, "rel_to_reference": _rel(lib_out, ref),
                        "pct_of_copy": 100 * moved / (us * 1e-6) / (copy_tbps * 1e12)}}
    print(f"== {case['cache']} b{b} {ctx}: library {case['library']}", flush=True)
    return inputs, moved, ref, lib_out, case


def checked_and_timed(row: dict, build, inputs, lib_out: torch.Tensor, ref: torch.Tensor, moved: float,
                      copy_tbps: float) -> dict:
    """row completed with a study call's relative error against the library's output and the
    reference, and its graph-replayed µs and % of copy (build() makes the call; call(out) fills
    out, NaN-poisoned first). A config that fails to build, compile or run is recorded, not raised."""
    try:
        call = build()
        out = call(pda.new_output(inputs))
        torch.cuda.synchronize()
        row["rel_to_library"] = _rel(out, lib_out)
        row["rel_to_reference"] = _rel(out, ref)
        row["graph_us"] = _graph_us(lambda: call(out))
        row["pct_of_copy"] = 100 * moved / (row["graph_us"] * 1e-6) / (copy_tbps * 1e12)
    except Exception as exc:  # noqa: BLE001 — a config that fails is a result
        row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    print("  ", row, flush=True)
    return row


def _summary(case: dict) -> str:
    """One line: the library's call and the fastest right TMA config, µs and % of copy."""
    good = [r for r in case["tma"] if "graph_us" in r and r["rel_to_library"] < 2e-2]
    best = min(good, key=lambda r: r["graph_us"]) if good else None
    lib = case["library"]
    tma = (f"{best['graph_us']:.1f} µs ({best['pct_of_copy']:.0f}%) at {best['splits']} splits, {best['warps']} "
           f"warps, {best['stages']} stages{', pairs' if best['pairs'] else ''}" if best else "none right")
    return (f"SUMMARY {case['cache']} b{case['b']} {case['ctx']}: library {lib['graph_us']:.1f} µs "
            f"({lib['pct_of_copy']:.0f}%), TMA best {tma}")


def parts(out_path: Path) -> int:
    """Where a long-context call's time goes, TMA form, bf16 b1: the whole call, the split kernel
    alone, the combine alone, and the whole call over empty contexts (every program started, its
    partials written, no key read: the launch-and-wave cost no read can hide), beside a copy."""
    from ops_bench import copy_bandwidth_report
    device = torch.device("cuda")
    copy_tbps, report = copy_bandwidth_report(device, cases=[])
    for ctx, splits in ((32768, 128), (32768, 64), (65536, 64)):
        problem, inputs = _inputs(1, ctx, False, device)
        moved = pda.SPEC.bytes_moved(problem, torch.bfloat16)
        call, out = TmaDecode(inputs, splits, 1, 4), pda.new_output(inputs)
        row = {"b": 1, "ctx": ctx, "splits": splits, "warps": 1, "stages": 4, "bytes_moved": moved}
        row["call_us"] = _graph_us(partial(call, out))
        row["split_us"] = _graph_us(partial(call, out, combine=False))
        row["combine_us"] = _graph_us(partial(call, out, split=False))
        lens = inputs.context_lens.clone()
        inputs.context_lens.zero_()
        row["empty_call_us"] = _graph_us(partial(call, out))
        inputs.context_lens.copy_(lens)
        row["read_at_copy_us"] = moved / (copy_tbps * 1e12) * 1e6
        print(row, flush=True)
        report["cases"].append(row)
    out_path.write_text(json.dumps(report, indent=1))
    return 0


def probe(out_path: Path, quick: bool) -> int:
    from ops_bench import copy_bandwidth_report
    device = torch.device("cuda")
    copy_tbps, report = copy_bandwidth_report(device, cases=[])
    # Issue 15's shapes first and issue 16's next, so that a call cut short keeps the most asked-for.
    shapes = [(False, 1, 32768), (False, 1, 65536), (False, 2, 32768), (False, 4, 32768), (True, 64, 4096),
              (False, 1, 131072), (True, 64, 16384)]
    # (splits, warps, stages, pairs): one page (16 keys) or two a loop step
    grids = {
        False: [(64, 1, 4, False), (64, 1, 4, True), (64, 1, 6, True), (128, 1, 4, False), (128, 1, 4, True),
                (64, 2, 4, True), (128, 2, 4, True), (64, 2, 6, False), (128, 2, 6, True), (64, 4, 4, False),
                (64, 4, 4, True), (128, 4, 4, True), (32, 4, 4, False), (32, 2, 6, True)],
        True: list(itertools.product((2, 4), (1, 2), (4, 6), (False, True))),
    }
    if quick:
        grids = {False: [(64, 1, 4, False), (64, 4, 4, True)], True: [(4, 1, 4, False), (2, 1, 6, True)]}
    for fp8, b, ctx in shapes:
        inputs, moved, ref, lib_out, case = library_case(b, ctx, fp8, device, copy_tbps)
        case["tma"] = []
        for splits, warps, stages, pairs in grids[fp8]:
            row = {"splits": splits, "warps": warps, "stages": stages, "pairs": pairs}
            build = partial(TmaDecode, inputs, splits, warps, stages, pairs)
            case["tma"].append(checked_and_timed(row, build, inputs, lib_out, ref, moved, copy_tbps))
        report["cases"].append(case)
        out_path.write_text(json.dumps(report, indent=1))  # kept as it goes: a timeout loses nothing
        print(_summary(case), flush=True)
        torch.cuda.empty_cache()
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--quick", action="store_true", help="three configs a shape")
    parser.add_argument("--check-only", action="store_true", help="small shapes against the reference, no timing")
    parser.add_argument("--offline", action="store_true", help="static loop counts for sm_90, no GPU (needs --out)")
    parser.add_argument("--parts", action="store_true", help="where a batch-1 long-context call's time goes")
    args = parser.parse_args(argv)
    if TensorDescriptor is None:
        print("this Triton has no host tensor descriptors", file=sys.stderr)
        return 2
    if args.check_only:
        return check_only()
    if args.offline and args.out is not None:
        rows = offline_rows()
        args.out.write_text(json.dumps({"command": " ".join(sys.argv), "triton": triton.__version__, "rows": rows},
                                       indent=1))
        return 0
    if args.out is None or not torch.cuda.is_available():
        print("timing needs --out and a CUDA GPU", file=sys.stderr)
        return 2
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    return parts(args.out) if args.parts else probe(args.out, args.quick)


if __name__ == "__main__":
    sys.exit(main())

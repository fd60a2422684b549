"""Paged decode with every kv head of a sequence in one program, beside the library's split kernel
(one kv head a program), both as CUDA-graph replays of the whole call (split kernel + combine), in
one run. A study, not a library path.

Why: at batch 1 with a 32k context (bf16, h28/4, d=128) the library's call streams its 67 MB about
3.5 µs slower than a kernel that only reads them contiguously (docs/results.md rounds 37-38), and
no form of the library's kernel closed it. One difference is what a program reads. In the cache's
layout [blocks, page, kv heads, d] one slot holds every kv head's row side by side (1 KB at h28/4),
and the library's program, one kv head's, reads a 256-byte piece of each slot, 1 KB apart; the
other three pieces are read by three other programs at other times. This probe's program reads
whole slots: its tile is [BLOCK_N keys × KV_HEADS, d], rows slot by slot, and its rows are every
query head of the sequence (28, in a 32-row tile). One QK dot scores every query head against every
kv head's keys and a block-diagonal mask keeps each query head to its own kv head's (3/4 of the
dot's work is thrown away: at b1 the tensor cores are idle anyway). `graph_launch_floor.py --paged`
measures the same choice on a read alone.

The probe keeps the library's partials layout and calls its combine kernel, so only the split
kernel differs. One query token, pages of any power-of-two size. Each config's output is
NaN-poisoned first and compared with the library's (relative RMS) and with a float32 reference.

    PYTHONPATH=$PWD python benchmarks/decode_all_heads_probe.py --out $OUT/decode_all_heads.json
    TRITON_INTERPRET=1 PYTHONPATH=$PWD python benchmarks/decode_all_heads_probe.py --check-only  # CPU, small
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
sys.path.insert(0, str(Path(__file__).resolve().parent))
from paged_decode_tma_probe import _rel, checked_and_timed, library_case  # noqa: E402

from omnitune.kernels import paged_decode_attention as pda  # noqa: E402
from omnitune.kernels._host import LOG2E  # noqa: E402


@triton.jit
def _split_all_heads(
    Q, KeyCache, ValueCache, BlockTables, ContextLens, PartM, PartL, PartAcc,
    stride_qb, stride_qh, stride_kcb, stride_kcs, stride_kch, stride_vcb, stride_vcs, stride_vch, stride_btb,
    H, MAX_PAGES, NUM_SPLITS, qk_scale,
    PAGE: tl.constexpr, HEAD_DIM: tl.constexpr, KV_HEADS: tl.constexpr, GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    # axis 0: sequence; axis 1: split of the context (the library's split bounds)
    b = tl.program_id(0)
    split = tl.program_id(1)
    rows = tl.arange(0, BLOCK_M)  # row r: query head r, whose keys are kv head r // GROUP's
    row_valid = rows < H
    ctx = tl.minimum(tl.maximum(tl.load(ContextLens + b), 0), MAX_PAGES * PAGE)
    tiles = tl.cdiv(ctx, BLOCK_N)
    k_start = tl.cdiv(split * tiles, NUM_SPLITS) * BLOCK_N
    k_end = tl.minimum(tl.cdiv((split + 1) * tiles, NUM_SPLITS) * BLOCK_N, ctx)

    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + b.to(tl.int64) * stride_qb + rows.to(tl.int64)[:, None] * stride_qh + offs_d[None, :],
                mask=row_valid[:, None], other=0.0)
    # Tile row c: key c // KV_HEADS of the tile, kv head c % KV_HEADS — a slot's heads side by side.
    cols = tl.arange(0, BLOCK_N * KV_HEADS)
    col_key = cols // KV_HEADS
    col_kv = cols % KV_HEADS
    own_head = (rows // GROUP)[:, None] == col_kv[None, :]
    k_heads = col_kv.to(tl.int64) * stride_kch
    v_heads = col_kv.to(tl.int64) * stride_vch
    table = BlockTables + b.to(tl.int64) * stride_btb

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    # Page numbers one tile ahead, as the library loads them (so the pipeliner keeps K/V in flight).
    first = k_start + col_key
    page_next = tl.load(table + first // PAGE, mask=first < k_end, other=0)
    for start_n in range(k_start, k_end, BLOCK_N):
        n = start_n + col_key
        key_valid = n < k_end
        page = page_next.to(tl.int64)
        ahead = n + BLOCK_N
        page_next = tl.load(table + ahead // PAGE, mask=ahead < k_end, other=0)
        in_page = (n % PAGE).to(tl.int64)
        k_rows = page * stride_kcb + in_page * stride_kcs + k_heads
        v_rows = page * stride_vcb + in_page * stride_vcs + v_heads
        k = tl.load(KeyCache + k_rows[:, None] + offs_d[None, :], mask=key_valid[:, None], other=0.0)
        v = tl.load(ValueCache + v_rows[:, None] + offs_d[None, :], mask=key_valid[:, None], other=0.0)
        qk = tl.dot(q, tl.trans(k))
        qk = tl.where(own_head & key_valid[None, :], qk * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no key yet: exp2 gives 0, not NaN
        p = tl.math.exp2(qk - m_safe[:, None])
        alpha = tl.math.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m_i = m_new
    part = (b.to(tl.int64) * H + rows) * NUM_SPLITS + split
    tl.store(PartM + part, m_i, mask=row_valid)
    tl.store(PartL + part, l_i, mask=row_valid)
    tl.store(PartAcc + part[:, None] * HEAD_DIM + offs_d[None, :], acc, mask=row_valid[:, None])


class AllHeadsDecode:
    """One call's launches of the probe, its partials made once (as a plan would)."""

    def __init__(self, inputs: pda.PagedDecodeInputs, splits: int, block_n: int, warps: int, stages: int):
        q, kc = inputs.q, inputs.key_cache
        b, h, lq, d = q.shape
        if lq != 1 or kc.stride(3) != 1 or inputs.value_cache.stride(3) != 1 or inputs.k_scale is not None:
            raise ValueError("the probe decodes one token over a 16-bit cache whose head dimension is contiguous")
        self.inputs, self.splits, self.block_n, self.warps, self.stages = inputs, splits, block_n, warps, stages
        self.hkv, self.page = kc.shape[2], kc.shape[1]
        self.part_m = torch.empty((b, h, 1, splits), dtype=torch.float32, device=q.device)
        self.part_l = torch.empty_like(self.part_m)
        self.part_acc = torch.empty((b, h, 1, splits, d), dtype=torch.float32, device=q.device)

    def __call__(self, out: torch.Tensor) -> torch.Tensor:
        x = self.inputs
        q, kc, vc = x.q, x.key_cache, x.value_cache
        b, h, _, d = q.shape
        _split_all_heads[(b, self.splits)](
            q, kc, vc, x.block_tables, x.context_lens, self.part_m, self.part_l, self.part_acc,
            q.stride(0), q.stride(1), kc.stride(0), kc.stride(1), kc.stride(2), vc.stride(0), vc.stride(1),
            vc.stride(2), x.block_tables.stride(0), h, x.block_tables.shape[1], self.splits, x.sm_scale * LOG2E,
            PAGE=self.page, HEAD_DIM=d, KV_HEADS=self.hkv, GROUP=h // self.hkv,
            BLOCK_M=max(16, triton.next_power_of_2(h)), BLOCK_N=self.block_n,
            num_warps=self.warps, num_stages=self.stages)
        pda._paged_decode_combine[(b * h,)](
            self.part_m, self.part_l, self.part_acc, out, *out.stride(), h, 1,
            HEAD_DIM=d, BLOCK_D=d, NUM_SPLITS=self.splits, BLOCK_S=triton.next_power_of_2(self.splits))
        return out


# (batch, context, splits, keys a tile): contexts ending inside a page and on its edge, more splits
# than tiles, one sequence shorter than its table, one empty. --check-only and the tests both run these.
CHECK_CASES = ((1, 40, 2, 16), (2, 100, 3, 16), (1, 16, 4, 32), (3, 96, 8, 32))


def checked_case(b: int, ctx: int, splits: int, block_n: int, device: torch.device, dtype: torch.dtype):
    """One small ragged case (h8/2, d=32, pages of 16): the probe's output poisoned first, and the
    float64 reference of the same cache."""
    problem = pda.PagedDecodeProblem(b=b, h=8, hkv=2, lq=1, ctx=ctx, d=32, block_size=16)
    inputs = pda.SPEC.make_inputs(problem, dtype, device, seed=b)
    if b > 1:  # the first sequence's context cut short: pages of its table past it are never read
        inputs.context_lens[0] = ctx - 37
    if b > 2:
        inputs.context_lens[2] = 0
    out = pda.new_output(inputs).fill_(float("nan"))
    return AllHeadsDecode(inputs, splits, block_n, 4, 2)(out), pda.reference(inputs), inputs


def check_only() -> int:
    """CHECK_CASES under the interpreter, fp16, against the float64 reference."""
    worst = 0.0
    for b, ctx, splits, block_n in CHECK_CASES:
        out, want, inputs = checked_case(b, ctx, splits, block_n, torch.device("cpu"), torch.float16)
        err = _rel(out, want) if torch.isfinite(out).all() else float("inf")
        print(f"b{b} ctx{inputs.context_lens.tolist()} splits{splits} BLOCK_N {block_n}: rel error {err:.2e}")
        worst = max(worst, err)
    return 0 if worst < 5e-3 else 1  # the spec's fp16 tolerance


# (splits, keys a tile per kv head, warps, stages)
CONFIGS = tuple(itertools.product((64, 128, 256), (16, 32), (4, 8), (2, 3, 4)))
SHAPES = ((1, 32768), (1, 65536), (2, 32768), (1, 131072), (4, 32768))  # (batch, context), bf16, h28/4, d=128


def probe(out_path: Path) -> int:
    from ops_bench import copy_bandwidth_report

    device = torch.device("cuda")
    copy_tbps, report = copy_bandwidth_report(device, cases=[])
    for b, ctx in SHAPES:
        inputs, moved, ref, lib_out, case = library_case(b, ctx, False, device, copy_tbps)
        case["all_heads"] = []
        for splits, block_n, warps, stages in CONFIGS:
            row = {"splits": splits, "BLOCK_N": block_n, "warps": warps, "stages": stages}
            build = partial(AllHeadsDecode, inputs, splits, block_n, warps, stages)
            case["all_heads"].append(checked_and_timed(row, build, inputs, lib_out, ref, moved, copy_tbps))
        good = [r for r in case["all_heads"] if "graph_us" in r and r["rel_to_reference"] < 2e-2]
        best = min(good, key=lambda r: r["graph_us"]) if good else None
        case["best"] = best
        found = "none right" if best is None else f"{best['graph_us']:.1f} µs ({best['pct_of_copy']:.0f}%), {best}"
        library = case["library"]
        print(f"SUMMARY b{b} {ctx}: library {library['graph_us']:.1f} µs ({library['pct_of_copy']:.0f}%), "
              f"all heads a program {found}", flush=True)
        report["cases"].append(case)
        out_path.write_text(json.dumps(report, indent=1))  # kept as it goes: a timeout loses nothing
        del inputs, ref, lib_out
        torch.cuda.empty_cache()
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--out", type=Path, help="time the probe beside the library on a GPU, results to this JSON")
    mode.add_argument("--check-only", action="store_true", help="small shapes against the reference (CPU)")
    args = parser.parse_args(argv)
    return check_only() if args.check_only else probe(args.out)


if __name__ == "__main__":
    sys.exit(main())

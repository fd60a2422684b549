"""Paged decode attention: a few query tokens per sequence over a paged KV cache, split-KV.

Algorithm (flash-decoding). Sequence b's keys and values live in pages of block_size tokens of
key_cache and value_cache [num_blocks, block_size, Hkv, D]; its logical page j is physical block
block_tables[b, j], and it holds context_lens[b] tokens. Its Lq ≤ 16 query tokens are the last Lq
of the context: query i sits at position ctx − Lq + i and sees keys [0, ctx − Lq + i + 1) (causal
among the new tokens, as speculative decoding and chunked decode need). The context is cut into
NUM_SPLITS contiguous key ranges; one program per (sequence, head, split) runs FlashAttention's
online softmax over its range (exp2, sm_scale·log2(e) folded into one multiply) and writes its
partial row max m, denominator l and unnormalised fp32 accumulator to scratch; a second kernel
combines the splits of each query row: out = Σ_s 2^(m_s − M) · acc_s / Σ_s 2^(m_s − M) · l_s.
With NUM_SPLITS = 1 the first kernel normalises and writes the output itself (one launch).

In-launch reduction (FUSED_REDUCE). Instead of the second kernel, each split program, after
writing its partials, takes a ticket: an atomic add (acq_rel, GPU scope, after a CTA barrier so
that all its threads' stores are released) on one int32 per (sequence, head column). The program
that draws NUM_SPLITS − 1 is the last: every other split's partials are visible to it, and it
combines them for all its rows (loads through L2, .cg) and writes the output, then puts the
ticket back to 0. The tickets live in a buffer kept per device and stream, zeroed once when it is
made, so no memset is launched per call; two launches running at once on different streams get
different buffers. What it saves: the second launch (its gap and its tail, which matter next to
a short read; docs/kv_cache.md). What it costs: one program per column does the whole combine
(NUM_SPLITS × rows × D fp32 from L2) at the end, and — compiled for sm_90 — the split kernel
needs more registers (see default_config). Left to the search.

Pages and tiles. Keys are taken BLOCK_N at a time; each key's page is looked up in the block
table on its own, so BLOCK_N (a power of two, ≥ 16 for tl.dot) need not relate to block_size: a
tile may cover part of a page or several pages, and any block_size works. Each split's range is a
multiple of BLOCK_N keys (whole pages when BLOCK_N ≥ block_size, both powers of two), so only the
last tile of a sequence is partial; the tiles are shared out evenly, so any split count balances.

Grid. split kernel: axis 0: sequence; axis 1: query head — or, with PACK_GQA, kv head, the
program's rows then being all GROUP query heads × Lq tokens that share it, so each K/V page is
read once per kv head instead of GROUP times; axis 2: split. combine kernel: axis 0: one query row
(sequence, head, token).

Constexprs. HEAD_DIM: the real head dim; BLOCK_D: it rounded up to a power of two (masked).
PAGE_SIZE: block_size (a constexpr, so that a power of two makes the page arithmetic a shift and
a mask). GROUP: query heads per kv head. BLOCK_M: query rows per program, the next power of two ≥ 16 of
(GROUP·Lq with PACK_GQA, else Lq). BLOCK_N: keys per tile. NUM_SPLITS: key ranges per sequence.
PACK_GQA: rows from a whole GQA group. IEEE_DOT: exact fp32 products for fp32 inputs (the checking
path). FUSED_REDUCE: combine in the same launch. BLOCK_S: NUM_SPLITS rounded up to a power of two.

Memory traffic model: each sequence's K and V rows of its context read once per kv head (the
ideal PACK_GQA reaches; without it the other GROUP − 1 reads hit L2 at best), q read and the
output written once: bytes = (2·B·Hkv·ctx + 2·B·H·Lq)·D·elt + 4·B·pages (block table). The fp32
partials, (D + 2)·4 bytes per row and split written and read back, depend on the config and are
left out, so a config that splits too finely shows as lower TB/s.
"""

from __future__ import annotations

import math
import operator
import threading
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from omnitune.errors import InputError
from omnitune.kernels import _dispatch, _fp8
from omnitune.kernels._host import (
    LOG2E,
    op_scale,
    require_head_groups,
    require_int32_offsets,
    seeded_rand,
    softmax_scale,
)
from omnitune.kernels._launch import BoundLauncher, DirectLauncher, FixedLaunch, PlanCache, bounded_put
from omnitune.kernels._launch import _current_device, _raw_stream
from omnitune.kernels._library import library_op
from omnitune.kernels import _launch as launching
from omnitune.kernels import _steady as steady
from omnitune.runtime import _generation as runtime_generation
from omnitune.spec import (
    Config,
    Constraint,
    DeviceLimits,
    KernelSpec,
    MatchPolicy,
    Param,
    element_bytes,
    optional_field,
    poisoned,
    require_runnable_device,
)

MAX_QUERY_TOKENS = 16
MIN_HEAD_DIM, MAX_HEAD_DIM = 16, 256


@triton.jit
def _paged_decode_split(
    Q, KeyCache, ValueCache, BlockTables, ContextLens,
    Out, PartM, PartL, PartAcc, Tickets, KScale, VScale,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kcb, stride_kcs, stride_kch, stride_kcd,
    stride_vcb, stride_vcs, stride_vch, stride_vcd,
    stride_btb, stride_btp,
    stride_ob, stride_oh, stride_om, stride_od,
    stride_ks, stride_vs,
    H, LQ, NUM_BLOCKS, MAX_PAGES,
    qk_scale,
    PAGE_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    PACK_GQA: tl.constexpr,
    FUSED_REDUCE: tl.constexpr,
    BLOCK_S: tl.constexpr,
    IEEE_DOT: tl.constexpr,
    PAGE_GUARD: tl.constexpr,
    KV_FP8: tl.constexpr,
    ROWS_32: tl.constexpr,
):
    # axis 0: sequence; axis 1: query head (or kv head when PACK_GQA); axis 2: split of the context
    b = tl.program_id(0)
    pid_h = tl.program_id(1)
    split = tl.program_id(2)

    rows = tl.arange(0, BLOCK_M)
    if PACK_GQA:
        hk = pid_h
        head = hk * GROUP + rows // LQ
        qi = rows % LQ
        row_valid = rows < GROUP * LQ
    else:
        hk = pid_h // GROUP
        head = pid_h + rows * 0
        qi = rows
        row_valid = rows < LQ

    # Whatever context_lens holds, only pages of the block table are read: the context is
    # clamped to the table's capacity (the check mode reports such lengths before launching).
    ctx = tl.minimum(tl.maximum(tl.load(ContextLens + b), 0), MAX_PAGES * PAGE_SIZE)
    limit = ctx - LQ + qi + 1  # row r sees keys [0, limit_r)

    # This split's keys: [k_start, k_end), whole BLOCK_N tiles (only the context's last is partial)
    # shared out as evenly as the tiles allow: split s starts at tile ⌈s·tiles / NUM_SPLITS⌉. Any
    # split count balances (24 splits of 256 tiles: 10 or 11 each), and split 0 is never empty:
    # it holds key 0, which every query row sees (the combine relies on it).
    tiles = tl.cdiv(ctx, BLOCK_N)
    k_start = tl.cdiv(split * tiles, NUM_SPLITS) * BLOCK_N
    k_end = tl.minimum(tl.cdiv((split + 1) * tiles, NUM_SPLITS) * BLOCK_N, ctx)

    offs_d = tl.arange(0, BLOCK_D)
    d_valid = offs_d < HEAD_DIM
    q_ptrs = (
        Q + b.to(tl.int64) * stride_qb + head.to(tl.int64)[:, None] * stride_qh
        + qi.to(tl.int64)[:, None] * stride_qm + offs_d.to(tl.int64)[None, :] * stride_qd
    )
    q = tl.load(q_ptrs, mask=row_valid[:, None] & d_valid[None, :], other=0.0)
    if KV_FP8:
        # An fp8 cache holds K / k_scale and V / v_scale (one scale per cache or per kv head):
        # k_scale becomes the score scale; v_scale multiplies the fp32 accumulator after the loop,
        # so V enters the dot unscaled (every e4m3 value, |v| ≤ 448, is exact in fp16, and so is
        # Σ p·v's range in fp32, whatever the scale).
        # The tiles are widened to fp16 (exact for every e4m3 value; one conversion instruction
        # per two elements, where widening to bf16 took several and made the kernel slower
        # than over a bf16 cache) and the dots run in fp16, so q is taken to fp16 once, with
        # sm_scale · log2(e) already applied (which keeps |q| far from fp16's 65504).
        if not IEEE_DOT:
            q = (q.to(tl.float32) * qk_scale).to(tl.float16)
            qk_scale = tl.load(KScale + hk * stride_ks)
        else:
            qk_scale = qk_scale * tl.load(KScale + hk * stride_ks)
        v_scale = tl.load(VScale + hk * stride_vs)
        # 1.0, computed at run time: x / x of an x ≥ 1 (max also turns a NaN scale into 1), which
        # the compiler cannot fold. See the V tile below for why V is multiplied by it.
        unit = tl.maximum(v_scale, 1.0)
        v_one = (unit / unit).to(tl.float16)

    table = BlockTables + b.to(tl.int64) * stride_btb
    k_head = KeyCache + hk.to(tl.int64) * stride_kch
    v_head = ValueCache + hk.to(tl.int64) * stride_vch
    offs_n = tl.arange(0, BLOCK_N)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    # The tile's page numbers are loaded one iteration ahead (page_next). Loaded in the same
    # iteration, they would make the K/V addresses depend on a load of that iteration, and Triton's
    # software pipeliner then keeps ONE K/V tile in flight whatever num_stages says (compiled for
    # sm_90: one buffer each for 3 or 4 stages); carried over from the previous iteration, the
    # K/V loads get num_stages − 1 buffers, the memory-level parallelism a decode step lives on.
    # PAGE_SIZE is a constexpr: a power of two makes the page arithmetic a shift and a mask.
    first = k_start + offs_n
    page_next = tl.load(table + (first // PAGE_SIZE).to(tl.int64) * stride_btp, mask=first < k_end, other=0)
    for start_n in range(k_start, k_end, BLOCK_N):
        n = start_n + offs_n
        key_valid = n < k_end
        page = page_next
        ahead = n + BLOCK_N
        page_next = tl.load(table + (ahead // PAGE_SIZE).to(tl.int64) * stride_btp, mask=ahead < k_end, other=0)
        # A block number outside the cache is never followed. Clamped into the cache (2, the
        # default), it reads a wrong but existing block — that sequence's output is garbage, as
        # its table is; masking its keys out instead (1) cost a third of the speed on the H200
        # (benchmarks/results/paged_decode_guard_h200.json: 173 vs 130 µs at batch 64, 4k).
        if PAGE_GUARD == 1:
            key_valid = key_valid & (page >= 0) & (page < NUM_BLOCKS)
        elif PAGE_GUARD == 2:
            page = tl.minimum(tl.maximum(page, 0), NUM_BLOCKS - 1)
        page = page.to(tl.int64)
        # A row's offset inside its page in 32 bits where the host found (PAGE_SIZE − 1) × the
        # slot stride below 2^31 (every cache but one with pages of 2^31 elements or a view that
        # far apart): one widening multiply a row instead of a 64-bit one, 34.75 instead of 36.0
        # instructions a key in the fp8 one-warp loop compiled for sm_90, 94.2 → 88.7 µs at
        # batch 64, 4k (benchmarks/results/h200_round26_R2.log).
        in_page = n % PAGE_SIZE
        if not ROWS_32:
            in_page = in_page.to(tl.int64)
        k_row = page * stride_kcb + in_page * stride_kcs
        v_row = page * stride_vcb + in_page * stride_vcs
        kv_mask = key_valid[:, None] & d_valid[None, :]
        k = tl.load(k_head + k_row[:, None] + offs_d.to(tl.int64)[None, :] * stride_kcd, mask=kv_mask, other=0.0)
        v = tl.load(v_head + v_row[:, None] + offs_d.to(tl.int64)[None, :] * stride_vcd, mask=kv_mask, other=0.0)
        if KV_FP8:
            k = k.to(q.dtype)
            # Times a run-time 1.0 on the way to the dot: an elementwise op Triton cannot fold
            # into the dot operand, so V is widened in the layout it was copied in (16-byte
            # copies, K's page lookups) and staged through shared memory as fp16 — instead of
            # being loaded as fp8 straight into the transposed operand layout, which 8-bit data
            # reach only with narrow loads and 68 more registers per thread (168 against 100 at
            # BLOCK_N=64, compiled for sm_90). In fp16 (one HMUL2 per two elements) rather than
            # the significand of v_scale in fp32 as before: 36.0 instead of 43.7 instructions a
            # key at one warp over 16-key tiles (benchmarks/results/decode_loop_offline_v_unscaled.json),
            # 94.2 against 97.0 µs at batch 64, 4k and 328 against 343 µs at 16k on the H200
            # (fp8_decode_few_warps_h200_round25_V_*.json).
            v = v.to(q.dtype) * v_one
        if IEEE_DOT:
            qk = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            qk = tl.dot(q, tl.trans(k))
        visible = (n[None, :] < limit[:, None]) & key_valid[None, :]
        qk = tl.where(visible, qk * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        # A row that has seen no key yet keeps m = -inf; subtract 0 instead so exp2 gives 0, not NaN.
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(qk - m_safe[:, None])
        alpha = tl.math.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        if IEEE_DOT:
            acc = tl.dot(p.to(v.dtype), v, acc, input_precision="ieee")
        else:
            acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new
    if KV_FP8:
        acc = acc * v_scale

    if NUM_SPLITS == 1:
        # A row that saw no key (an empty or clamped context, a masked page) writes zeros.
        o_ptrs = (
            Out + b.to(tl.int64) * stride_ob + head.to(tl.int64)[:, None] * stride_oh
            + qi.to(tl.int64)[:, None] * stride_om + offs_d.to(tl.int64)[None, :] * stride_od
        )
        out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
        tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=row_valid[:, None] & d_valid[None, :])
    else:
        # Scratch is contiguous [B, H, LQ, NUM_SPLITS] (m, l) and [B, H, LQ, NUM_SPLITS, HEAD_DIM] (acc).
        part = ((b.to(tl.int64) * H + head) * LQ + qi) * NUM_SPLITS + split
        tl.store(PartM + part, m_i, mask=row_valid)
        tl.store(PartL + part, l_i, mask=row_valid)
        tl.store(PartAcc + part[:, None] * HEAD_DIM + offs_d[None, :], acc,
                 mask=row_valid[:, None] & d_valid[None, :])
        if FUSED_REDUCE:
            # Every thread's partial stores must precede the release below (the atomic is issued
            # by one thread; the barrier orders the others' stores before it).
            tl.debug_barrier()
            ticket_ptr = Tickets + b * tl.num_programs(1) + pid_h
            # acq_rel at GPU scope: releases this split's partials, and the last split acquires
            # everyone else's.
            arrived = tl.atomic_add(ticket_ptr, 1, sem="acq_rel")
            if arrived == NUM_SPLITS - 1:
                _reduce_splits(PartM, PartL, PartAcc, Out, b, head, qi, row_valid,
                               stride_ob, stride_oh, stride_om, stride_od, H, LQ,
                               HEAD_DIM, BLOCK_D, BLOCK_M, NUM_SPLITS, BLOCK_S)
                # Self-resetting: the next launch on this stream finds the ticket at 0 again.
                tl.atomic_xchg(ticket_ptr, 0)


@triton.jit
def _reduce_splits(
    PartM, PartL, PartAcc, Out, b, head, qi, row_valid,
    stride_ob, stride_oh, stride_om, stride_od, H, LQ,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    """The in-launch combine, run by the last split of a (sequence, head or kv head) to finish:
    the same formula as _paged_decode_combine, for all of the program's rows at once. Loads
    bypass L1 (.cg): the partials were written by other SMs during this launch."""
    base = ((b.to(tl.int64) * H + head) * LQ + qi) * NUM_SPLITS  # [BLOCK_M]
    splits = tl.arange(0, BLOCK_S)
    ms_mask = row_valid[:, None] & (splits < NUM_SPLITS)[None, :]
    m = tl.load(PartM + base[:, None] + splits[None, :], mask=ms_mask, other=float("-inf"),
                cache_modifier=".cg")
    l = tl.load(PartL + base[:, None] + splits[None, :], mask=ms_mask, other=0.0, cache_modifier=".cg")
    # A row that saw no key in any split (m = -inf everywhere) and padded rows take m_max = 0,
    # weight 0 and denominator 1, so they write zeros rather than NaN.
    m_max = tl.max(m, 1)
    m_max = tl.where(row_valid & (m_max > float("-inf")), m_max, 0.0)
    denom = tl.sum(tl.math.exp2(m - m_max[:, None]) * l, 1)
    denom = tl.where(denom == 0.0, 1.0, denom)
    offs_d = tl.arange(0, BLOCK_D)
    acc_mask = row_valid[:, None] & (offs_d < HEAD_DIM)[None, :]
    out = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    # The loads of one step do not depend on the previous step's sum, so unrolled steps overlap
    # their L2 round trips.
    for s in tl.range(0, NUM_SPLITS, loop_unroll_factor=4):
        m_s = tl.load(PartM + base + s, mask=row_valid, other=float("-inf"), cache_modifier=".cg")
        acc_s = tl.load(PartAcc + (base + s)[:, None] * HEAD_DIM + offs_d[None, :], mask=acc_mask,
                        other=0.0, cache_modifier=".cg")
        out += tl.math.exp2(m_s - m_max)[:, None] * acc_s
    out = out / denom[:, None]
    o_ptrs = (
        Out + b.to(tl.int64) * stride_ob + head.to(tl.int64)[:, None] * stride_oh
        + qi.to(tl.int64)[:, None] * stride_om + offs_d.to(tl.int64)[None, :] * stride_od
    )
    tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=acc_mask)


@triton.jit
def _paged_decode_combine(
    PartM, PartL, PartAcc, Out,
    stride_ob, stride_oh, stride_om, stride_od,
    H, LQ,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    # axis 0: one query row, (sequence, head, token) flattened
    row = tl.program_id(0).to(tl.int64)
    qi = row % LQ
    head = (row // LQ) % H
    b = row // (LQ * H)

    splits = tl.arange(0, BLOCK_S)
    s_valid = splits < NUM_SPLITS
    offs_d = tl.arange(0, BLOCK_D)
    d_valid = offs_d < HEAD_DIM
    m = tl.load(PartM + row * NUM_SPLITS + splits, mask=s_valid, other=float("-inf"))
    l = tl.load(PartL + row * NUM_SPLITS + splits, mask=s_valid, other=0.0)
    acc = tl.load(PartAcc + (row * NUM_SPLITS + splits)[:, None] * HEAD_DIM + offs_d[None, :],
                  mask=s_valid[:, None] & d_valid[None, :], other=0.0)
    # Splits that saw nothing (m = -inf) get weight 0; a row that saw no key at all (an empty or
    # clamped context, masked pages) writes zeros rather than NaN.
    m_max = tl.max(m, 0)
    m_max = tl.where(m_max > float("-inf"), m_max, 0.0)
    weight = tl.math.exp2(m - m_max)
    denom = tl.sum(weight * l, 0)
    out = tl.sum(acc * weight[:, None], 0) / tl.where(denom == 0.0, 1.0, denom)
    o_ptrs = Out + b * stride_ob + head * stride_oh + qi * stride_om + offs_d * stride_od
    tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=d_valid)


# ------------------------------------------------------------------------------------------------
# Problem, inputs, launcher
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PagedDecodeProblem:
    """One decode step: b sequences, each with ctx tokens of context (the same for all, so the
    FLOP and byte counts are exact) of which the last lq are the queries; q [b, h, lq, d];
    pages of block_size tokens, stored in q's dtype (cache_dtype "auto") or in fp8 with scales
    ("fp8_e4m3"). The factory's cache holds the pages the batch needs plus a quarter more (at
    least one), scattered at random."""

    b: int
    h: int
    hkv: int
    lq: int
    ctx: int
    d: int
    block_size: int = 16
    cache_dtype: str = optional_field("auto")

    def __post_init__(self):
        for name in ("b", "h", "hkv", "lq", "ctx", "d", "block_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be ≥ 1, got {getattr(self, name)}")
        object.__setattr__(self, "cache_dtype", _fp8.normalize_cache_dtype(self.cache_dtype))
        if self.h % self.hkv:
            raise ValueError(f"h={self.h} is not a multiple of hkv={self.hkv}")
        if self.lq > MAX_QUERY_TOKENS:
            raise ValueError(f"lq={self.lq} query tokens; decode supports at most {MAX_QUERY_TOKENS}")
        if self.lq > self.ctx:
            raise ValueError(f"lq={self.lq} query tokens do not fit in a context of ctx={self.ctx}")
        if not MIN_HEAD_DIM <= self.d <= MAX_HEAD_DIM:
            raise ValueError(f"head dim d={self.d} is not supported; use {MIN_HEAD_DIM}..{MAX_HEAD_DIM}")

    @property
    def group(self) -> int:
        return self.h // self.hkv

    @property
    def pages_per_sequence(self) -> int:
        return triton.cdiv(self.ctx, self.block_size)

    @property
    def num_blocks(self) -> int:
        used = self.b * self.pages_per_sequence
        return used + max(1, used // 4)


@dataclass
class PagedDecodeInputs:
    q: torch.Tensor             # [B, H, Lq, D]
    key_cache: torch.Tensor     # [num_blocks, block_size, Hkv, D]
    value_cache: torch.Tensor   # [num_blocks, block_size, Hkv, D]
    block_tables: torch.Tensor  # [B, max_blocks] int32
    context_lens: torch.Tensor  # [B] int32
    sm_scale: float
    k_scale: torch.Tensor | None = None  # fp8 caches: float32 [1] or [Hkv]
    v_scale: torch.Tensor | None = None


_Tensor = torch.Tensor
_FLOATS = (torch.float16, torch.bfloat16, torch.float32)


def _check_metadata(q, key_cache, value_cache, block_tables, context_lens, k_scale=None, v_scale=None) -> None:
    """Everything about the tensors that needs no device value (no sync): types, ranks, shapes,
    dtypes, devices, and an fp8 cache's scales. The common case is one cheap predicate (this runs
    on every decode step); only a call that fails it pays for finding the message."""
    if (type(q) is _Tensor and type(key_cache) is _Tensor and type(value_cache) is _Tensor
            and type(block_tables) is _Tensor and type(context_lens) is _Tensor):
        shape, cache_shape, table_shape = q.shape, key_cache.shape, block_tables.shape
        dtype, cache_dtype, device = q.dtype, key_cache.dtype, q.get_device()
        if (len(shape) == 4 and len(cache_shape) == 4 and len(table_shape) == 2
                and value_cache.shape == cache_shape and cache_shape[3] == shape[3]
                and MIN_HEAD_DIM <= shape[3] <= MAX_HEAD_DIM and 1 <= shape[2] <= MAX_QUERY_TOKENS
                and shape[0] > 0 and cache_shape[0] > 0 and cache_shape[1] > 0 and cache_shape[2] > 0
                and shape[1] > 0 and shape[1] % cache_shape[2] == 0 and table_shape[0] == shape[0] and table_shape[1] > 0
                and context_lens.dim() == 1 and context_lens.shape[0] == shape[0]
                and dtype in _FLOATS and value_cache.dtype == cache_dtype
                and block_tables.dtype == torch.int32 and context_lens.dtype == torch.int32
                and key_cache.get_device() == device and value_cache.get_device() == device
                and block_tables.get_device() == device and context_lens.get_device() == device
                and device >= 0
                and ((cache_dtype == dtype and k_scale is None and v_scale is None)
                     or (cache_dtype == _fp8.FP8 and _fp8.scales_fit(k_scale, cache_shape[2], device)
                         and _fp8.scales_fit(v_scale, cache_shape[2], device)))):
            return
    _explain_metadata(q, key_cache, value_cache, block_tables, context_lens, k_scale, v_scale)


def _explain_metadata(q, key_cache, value_cache, block_tables, context_lens, k_scale=None, v_scale=None) -> None:
    """The InputError naming what is wrong with the tensors (or nothing, e.g. for CPU tensors
    under the interpreter)."""
    named = (("q", q), ("key_cache", key_cache), ("value_cache", value_cache),
             ("block_tables", block_tables), ("context_lens", context_lens))
    for name, t in named:
        if not isinstance(t, torch.Tensor):
            raise InputError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if q.dim() != 4:
        raise InputError(f"q must be 4-D [B, heads, Lq, head_dim], got shape {list(q.shape)}")
    for name, t in (("key_cache", key_cache), ("value_cache", value_cache)):
        if t.dim() != 4:
            raise InputError(
                f"{name} must be 4-D [num_blocks, block_size, kv_heads, head_dim], got shape {list(t.shape)}"
            )
    device = q.device
    if not (key_cache.device == value_cache.device == block_tables.device == context_lens.device == device):
        raise InputError("q, the caches, block_tables and context_lens must be on one device; got "
                         + ", ".join(f"{n} on {t.device}" for n, t in named))
    if q.dtype not in _FLOATS:
        raise InputError(f"unsupported dtype {q.dtype}; use float16, bfloat16 or float32")
    if key_cache.dtype != value_cache.dtype:
        raise InputError(f"key_cache and value_cache must share one dtype; got {key_cache.dtype}, {value_cache.dtype}")
    unsupported = _fp8.unsupported_cache_dtype(key_cache.dtype)
    if unsupported:
        raise InputError(unsupported)
    if key_cache.dtype not in (q.dtype, _fp8.FP8):
        raise InputError(
            f"the caches must be in q's dtype ({q.dtype}) or fp8 (float8_e4m3fn, with k_scale and v_scale); "
            f"got {key_cache.dtype}"
        )
    if key_cache.shape != value_cache.shape:
        raise InputError(
            f"key_cache and value_cache shapes differ: {list(key_cache.shape)} vs {list(value_cache.shape)}"
        )
    b, h, lq, d = q.shape
    num_blocks, block_size, hkv, cache_d = key_cache.shape
    if cache_d != d:
        raise InputError(f"head dims differ: q has {d}, the cache has {cache_d}")
    if not MIN_HEAD_DIM <= d <= MAX_HEAD_DIM:
        raise InputError(f"head dim {d} is not supported; use {MIN_HEAD_DIM}..{MAX_HEAD_DIM}")
    require_head_groups(h, hkv, kv_name="the cache's kv")
    if not 1 <= lq <= MAX_QUERY_TOKENS:
        raise InputError(f"q holds {lq} query tokens per sequence; decode takes 1..{MAX_QUERY_TOKENS}")
    if b == 0:
        raise InputError("the batch is empty (B = 0)")
    if num_blocks == 0 or block_size == 0:
        raise InputError(f"the cache holds no slots (shape {list(key_cache.shape)})")
    if block_tables.dtype != torch.int32 or block_tables.dim() != 2 or block_tables.shape[0] != b:
        raise InputError(
            f"block_tables must be int32 [B={b}, max_blocks], got {block_tables.dtype} {list(block_tables.shape)}"
        )
    if block_tables.shape[1] == 0:
        raise InputError("block_tables has no pages (max_blocks = 0)")
    if context_lens.dtype != torch.int32 or context_lens.dim() != 1 or context_lens.shape[0] != b:
        raise InputError(f"context_lens must be int32 [B={b}], got {context_lens.dtype} {list(context_lens.shape)}")
    _fp8.explain_scales(key_cache.dtype, k_scale, v_scale, hkv, device)
    require_runnable_device(q)


def _check_values(q, key_cache, block_tables, context_lens, max_context_len: int | None,
                  k_scale=None, v_scale=None) -> int:
    """The check mode's value checks (a few reductions, one sync): block table entries in use
    inside the cache, Lq ≤ every context ≤ the table's capacity and ≤ max_context_len, and an fp8
    cache's scales positive and finite. Returns the longest context."""
    lq = q.shape[2]
    num_blocks, block_size = key_cache.shape[0], key_cache.shape[1]
    max_blocks = block_tables.shape[1]
    capacity = max_blocks * block_size
    lens = context_lens.to(torch.int64)
    pages_used = (lens.clamp(min=0) + block_size - 1) // block_size
    in_use = torch.arange(max_blocks, device=q.device)[None, :] < pages_used[:, None]
    bad_entries = in_use & ((block_tables < 0) | (block_tables >= num_blocks))
    summary = torch.stack([lens.max(), lens.min(), bad_entries.any().to(torch.int64),
                           _fp8.bad_scales(k_scale, v_scale, q.device)]).tolist()
    longest, shortest, any_bad_entry, bad_scale = summary
    if bad_scale:
        raise InputError(_fp8.BAD_SCALE_MESSAGE)
    if longest > capacity:
        raise InputError(
            f"a context of {longest} tokens exceeds the block table's capacity of {capacity} "
            f"({max_blocks} pages × {block_size})"
        )
    if max_context_len is not None and longest > max_context_len:
        raise InputError(f"a context of {longest} tokens exceeds max_context_len={max_context_len}")
    if shortest < lq:
        raise InputError(f"a context of {shortest} tokens is shorter than the {lq} query tokens it must hold")
    if any_bad_entry:
        seq, page = (int(i) for i in bad_entries.nonzero()[0].tolist())
        raise InputError(
            f"block_tables[{seq}, {page}] = {int(block_tables[seq, page])} is not a block of the cache; "
            f"valid blocks are 0..{num_blocks - 1}"
        )
    return int(longest)


def _block_m(rows: int) -> int:
    return max(16, triton.next_power_of_2(rows))


# One int32 ticket per (sequence, head axis) program column, per device and stream, zero between
# launches: the last split of each column resets its ticket, so no memset is launched per call.
# Kept per stream because two launches running at once must not share tickets.
_tickets: dict[tuple[str, int], torch.Tensor] = {}


def _stream_of(device: torch.device) -> int | None:
    """The current stream's handle on `device` (0 off the GPU), which the per-stream buffers are
    kept by; None while a CUDA graph is being captured there: the graph then gets buffers of its
    own (filled by nodes of the graph), so that a graph replayed on any stream never shares them
    with eager calls."""
    if device.type != "cuda":
        return 0
    if torch.cuda.is_current_stream_capturing():
        return None
    return _raw_stream(device.index if device.index is not None else _current_device())


def _ticket_buffer(device: torch.device, count: int) -> torch.Tensor:
    stream = _stream_of(device)
    if stream is None:
        return torch.zeros(count, dtype=torch.int32, device=device)
    key = (str(device), stream)
    buf = _tickets.get(key)
    if buf is None or buf.numel() < count:
        buf = torch.zeros(max(count, 1024), dtype=torch.int32, device=device)
        _tickets[key] = buf
    return buf


@dataclass(frozen=True)
class _Scratch:
    """The split partials of one launch: m and l [B, H, Lq, S], acc [B, H, Lq, S, D], fp32,
    views of one allocation; tickets for the in-launch combine."""

    part_m: torch.Tensor
    part_l: torch.Tensor
    part_acc: torch.Tensor
    tickets: torch.Tensor | None

    @classmethod
    def make(cls, b: int, h: int, lq: int, d: int, hkv: int, config: Config, device,
             own_tickets: bool = False) -> _Scratch | None:
        """own_tickets: zeroed tickets of this scratch's own (a plan's), not the ones shared per
        stream by the calls of the function."""
        splits = int(config["NUM_SPLITS"])
        if splits == 1:
            return None
        rows = b * h * lq * splits
        flat = torch.empty(rows * (d + 2), dtype=torch.float32, device=device)
        part_m = flat[:rows].view(b, h, lq, splits)
        part_l = flat[rows:2 * rows].view(b, h, lq, splits)
        part_acc = flat[2 * rows:].view(b, h, lq, splits, d)
        tickets = None
        if _fused_reduce(config, splits):
            pack = bool(config["PACK_GQA"]) and h // hkv > 1
            count = b * (hkv if pack else h)
            tickets = (torch.zeros(count, dtype=torch.int32, device=device) if own_tickets
                       else _ticket_buffer(torch.device(device), count))
        return cls(part_m, part_l, part_acc, tickets)


# The function's split partials, per (device, stream, thread, launch): a call's partials are
# written by its split kernel and read by its combine kernel, in stream order, before the next
# call on that stream writes them, so one buffer serves every call of one thread on one stream
# (another thread's launches could fall between a call's two). Allocating them per call cost
# the function a fresh allocation and three views on every decode step (28 → 18 µs of host time
# with the launches stubbed, benchmarks/host_path_cpu.py). At most 16 sets are kept — 2 MiB each at
# batch 64 with 28 heads and 2 splits; a batch that changes every step keeps replacing them.
_scratches: dict[tuple, _Scratch | None] = {}
_MAX_SCRATCHES = 16


def _shared_scratch(b: int, h: int, lq: int, d: int, hkv: int, config: Config, device: torch.device) -> _Scratch | None:
    stream = _stream_of(device)
    if stream is None:
        return _Scratch.make(b, h, lq, d, hkv, config, device)
    key = (device, stream, threading.get_ident(), b, h, lq, d, hkv, config)
    try:
        return _scratches[key]
    except KeyError:
        # Emptying the table frees buffers still in flight safely: the allocator reuses them in
        # stream order.
        return bounded_put(_scratches, key, _Scratch.make(b, h, lq, d, hkv, config, device), _MAX_SCRATCHES)


def _fused_reduce(config: Config, splits: int) -> bool:
    return bool(config["FUSED_REDUCE"]) and splits > 1


_SPLIT = DirectLauncher(_paged_decode_split)
_SPLIT_TENSORS = 12  # the split kernel's tensor arguments, ahead of its plain ones
# How block numbers outside the cache are kept from being followed: 2 (the default) clamps them
# into the cache, 1 masks their keys out; 0 trusts the table — only for
# benchmarks/paged_decode_guard_study.py, which measures what each costs.
PAGE_GUARD = [2]
_COMBINE = DirectLauncher(_paged_decode_combine)


@dataclass(frozen=True)
class _LaunchPlan:
    """What a launch derives from (config, shapes, dtype) alone, kept so that the steps of a
    decode loop do not recompute it: the grids (three ints each) and the kernels bound to their
    constexprs."""

    split_grid: tuple
    split: BoundLauncher
    fused: bool
    splits: int
    combine_grid: tuple | None
    combine: BoundLauncher | None
    page_guard: int
    rows_32: bool


def _launch_plan(config: Config, b: int, h: int, lq: int, d: int, hkv: int, block_size: int,
                 dtype: torch.dtype, cache_dtype: torch.dtype, page_guard: int, rows_32: bool) -> _LaunchPlan:
    group = h // hkv
    pack = bool(config["PACK_GQA"]) and group > 1
    splits = int(config["NUM_SPLITS"])
    fused = _fused_reduce(config, splits)
    block_d = triton.next_power_of_2(d)
    block_s = triton.next_power_of_2(splits)
    rows = group * lq if pack else lq
    split_constexprs = dict(
        PAGE_SIZE=block_size, HEAD_DIM=d, BLOCK_D=block_d, GROUP=group, BLOCK_M=_block_m(rows),
        BLOCK_N=int(config["BLOCK_N"]), NUM_SPLITS=splits, PACK_GQA=pack, FUSED_REDUCE=fused,
        BLOCK_S=block_s, IEEE_DOT=dtype == torch.float32, PAGE_GUARD=page_guard,
        KV_FP8=cache_dtype == _fp8.FP8, ROWS_32=rows_32,
        num_warps=int(config["num_warps"]), num_stages=int(config["num_stages"]),
    )
    combine_grid = combine = None
    if splits > 1 and not fused:
        # Not tuned: a [BLOCK_S, BLOCK_D] fp32 tile per row, one warp per 1,024 elements (≤ 4).
        combine_grid = (b * h * lq, 1, 1)
        combine = _COMBINE.bind(dict(HEAD_DIM=d, BLOCK_D=block_d, NUM_SPLITS=splits, BLOCK_S=block_s,
                                     num_warps=min(4, max(1, block_s * block_d // 1024))), 4)
    return _LaunchPlan((b, hkv if pack else h, splits), _SPLIT.bind(split_constexprs, _SPLIT_TENSORS), fused, splits,
                       combine_grid, combine, page_guard, rows_32)


# (config, shapes, dtypes, page guard, 32-bit rows) → the launch plan: what a repeated call would
# otherwise recompute.
_launch_plans = PlanCache(_launch_plan)
_ROWS_32_LIMIT = 2**31


def _rows_fit_32(block_size: int, key_cache: torch.Tensor, value_cache: torch.Tensor) -> bool:
    """Whether every row offset inside a page, (block_size − 1) × the slot stride, fits in 32 bits
    (the split kernel's ROWS_32)."""
    return (block_size - 1) * max(key_cache.stride(1), value_cache.stride(1)) < _ROWS_32_LIMIT


def _launch(q, key_cache, value_cache, block_tables, context_lens, sm_scale: float,
            out: torch.Tensor, config: Config, scratch: _Scratch | None = None,
            k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None) -> tuple:
    """Both launches; returns the launch plan and the scratch they used (the steady path keeps them)."""
    b, h, lq, d = q.shape
    block_size, hkv = key_cache.shape[1], key_cache.shape[2]
    dtype, cache_dtype = q.dtype, key_cache.dtype
    plan = _launch_plans.get(config, (b, h, lq, d, hkv, block_size, dtype, cache_dtype, PAGE_GUARD[0],
                                      _rows_fit_32(block_size, key_cache, value_cache)))
    if plan.splits > 1 and scratch is None:
        scratch = _shared_scratch(b, h, lq, d, hkv, config, q.device)
    _launch_planned(plan, q, key_cache, value_cache, block_tables, context_lens, sm_scale * LOG2E, out, scratch,
                    k_scale, v_scale)
    return plan, scratch


def _launch_planned(plan: _LaunchPlan, q, key_cache, value_cache, block_tables, context_lens, scale_log2: float,
                    out: torch.Tensor, scratch: _Scratch | None, k_scale, v_scale, dtypes: tuple | None = None,
                    fixed_combine: FixedLaunch | None = None) -> None:
    """The launches themselves, everything derived from shapes and config already in `plan`;
    scratch: the split partials, needed when the plan has more than one split; dtypes: the split's
    tensor dtypes, where the caller has checked them; fixed_combine: the combine over exactly this
    scratch and out, its arguments built once (a PagedDecodePlan's own)."""
    plan.split(plan.split_grid, _split_args(q, key_cache, value_cache, block_tables, context_lens, scale_log2, out,
                                            scratch, plan.fused, k_scale, v_scale), dtypes)
    if fixed_combine is not None:
        fixed_combine()
    elif plan.combine is not None:
        plan.combine(plan.combine_grid, _combine_args(scratch, out))


def _split_args(q, key_cache, value_cache, block_tables, context_lens, scale_log2: float, out: torch.Tensor,
                scratch: _Scratch | None, fused: bool, k_scale, v_scale) -> tuple:
    """The split kernel's runtime arguments, in its signature's order (the first 12 tensors)."""
    # The kernel reads sequence b's length at context_lens + b: a strided vector (an expanded one
    # has stride 0, and one storage element) goes to it as a contiguous copy, never read past its
    # storage.
    if context_lens.stride(0) != 1 and context_lens.shape[0] > 1:
        context_lens = context_lens.contiguous()
    if scratch is not None:
        part_m, part_l, part_acc = scratch.part_m, scratch.part_l, scratch.part_acc
    else:
        part_m = part_l = part_acc = out  # placeholders, never touched
    tickets = scratch.tickets if fused else context_lens  # a placeholder pointer if unused
    if k_scale is not None:
        scales = (k_scale, v_scale, _fp8.scale_stride(k_scale), _fp8.scale_stride(v_scale))
    else:
        scales = (context_lens, context_lens, 0, 0)  # placeholders, never read
    return (
        q, key_cache, value_cache, block_tables, context_lens,
        out, part_m, part_l, part_acc, tickets, scales[0], scales[1],
        *q.stride(), *key_cache.stride(), *value_cache.stride(), *block_tables.stride(), *out.stride(),
        scales[2], scales[3],
        q.shape[1], q.shape[2], key_cache.shape[0], block_tables.shape[1],
        scale_log2,
    )


def _combine_args(scratch: _Scratch, out: torch.Tensor) -> tuple:
    """The combine kernel's runtime arguments (the first 4 tensors)."""
    return (scratch.part_m, scratch.part_l, scratch.part_acc, out, *out.stride(), out.shape[1], out.shape[2])


def launch(inputs: PagedDecodeInputs, out: torch.Tensor, config: Config) -> None:
    """Run both kernels with a launch config, writing into `out` [B, H, Lq, D]. No validation."""
    _launch(inputs.q, inputs.key_cache, inputs.value_cache, inputs.block_tables, inputs.context_lens,
            inputs.sm_scale, out, config, None, inputs.k_scale, inputs.v_scale)


_memo = _dispatch.ConfigMemo("paged_decode_attention")


def _host_length(max_context_len) -> int:
    """max_context_len as the host int it must be; InputError otherwise. A device tensor was read
    back by int() (a hidden sync, and an error inside a CUDA graph capture; a tensor of several
    values failed deep inside torch), inf raised OverflowError, a string a TypeError naming
    nothing, and 10.7 was silently cut to 10."""
    if type(max_context_len) is int:
        return max_context_len
    wrong = "max_context_len must be a host int (the longest context, as the caller keeps it), got "
    if isinstance(max_context_len, (bool, torch.Tensor)):
        raise InputError(wrong + type(max_context_len).__name__)
    try:
        return operator.index(max_context_len)  # a numpy integer, say
    except TypeError:
        raise InputError(wrong + repr(max_context_len)) from None


def _checked_length(max_context_len, capacity: int) -> int | None:
    """max_context_len as a host int in 1..capacity (the block table's), None left as it is;
    InputError otherwise. Judged the same on the eager path and before a compiled call buckets
    it (a compiled call took 0, -5, True, 10.7 or a length past the capacity without a word)."""
    if max_context_len is None:
        return None
    max_context_len = _host_length(max_context_len)
    if not 1 <= max_context_len <= capacity:
        raise InputError(f"max_context_len={max_context_len} must be in 1..{capacity} (the block table's capacity)")
    return max_context_len


def _config_for(b, h, hkv, lq, d, block_size, ctx: int, config, dtype, cache_dtype: torch.dtype) -> Config:
    """The config for a batch whose longest context is at most ctx (bucketed, so that the steps
    of a decode loop share one lookup; a caller's own config is validated against ctx itself)."""
    ctx = max(ctx, lq)
    if config is None:
        ctx = _dispatch.bucket_up(ctx)
    stored = _fp8.cache_dtype_name(cache_dtype, dtype)
    return _memo.get(
        (b, h, hkv, lq, d, block_size, ctx, stored), config,
        lambda: PagedDecodeProblem(b=b, h=h, hkv=hkv, lq=lq, ctx=ctx, d=d, block_size=block_size,
                                   cache_dtype=stored), dtype,
    )


def paged_decode_attention(
    q: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    *,
    sm_scale: float | None = None,
    max_context_len: int | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    config: Config | dict | None = None,
    check: bool | None = None,
) -> torch.Tensor:
    """Decode attention of q [B, H, Lq ≤ 16, D] over paged caches [num_blocks, block_size, Hkv, D].

    The caches are in q's dtype, or fp8 (torch.float8_e4m3fn, vLLM's kv_cache_dtype="fp8") with
    k_scale and v_scale: float32 device tensors, one per cache ([] or [1]) or per kv head
    ([Hkv]); the cache holds K / k_scale and V / v_scale (see write_kv_cache), read as bytes and
    widened in the kernel, which accumulates in fp32.

    block_tables [B, max_blocks] int32: sequence b's logical page j is block block_tables[b, j]
    (entries past its context are not read and may hold anything). context_lens [B] int32: tokens
    of context per sequence, Lq ≤ len ≤ max_blocks·block_size; the queries are its last Lq tokens,
    causal among themselves. H a multiple of Hkv (GQA/MQA). sm_scale defaults to 1/√D.

    max_context_len: the longest context in the batch as the caller knows it on the host (vLLM
    keeps it there); it picks the config. None takes the block table's capacity, which is always
    safe but may pick a config for longer contexts than the batch has. No value is read back from
    the device and nothing is done that a CUDA graph cannot capture: context lengths past the
    table's capacity are clamped (rows that see no key get zeros) and block numbers outside the
    cache clamped into it inside the kernel: memory outside the caches is never read, and a
    sequence with a bad block number gets a wrong result, not a fault. check=True (or OMNITUNE_CHECK=1) validates the values first
    (one sync) and raises InputError for any of them. For a decode loop under CUDA graphs,
    PagedDecodePlan does the host work once. config: launch config; None looks one up in the
    tuned tables (omnitune.runtime). Returns [B, H, Lq, D] in q's dtype."""
    if _dispatch.compiling():
        _dispatch.require_compiled_check(check)
        capacity = block_tables.shape[1] * key_cache.shape[1]
        ctx = _checked_length(max_context_len, capacity)
        ctx = capacity if ctx is None else ctx
        return torch.ops.omnitune.paged_decode_attention(
            q, key_cache, value_cache, block_tables, context_lens, op_scale(sm_scale),
            # Bucketed here so that a compiled graph is specialised on a few values, not on
            # every length a decode loop passes through.
            _dispatch.traced_bucket_up(ctx), _dispatch.config_to_json(config), k_scale, v_scale,
        )
    return _decode(q, key_cache, value_cache, block_tables, context_lens, sm_scale, max_context_len, config,
                   check, k_scale, v_scale)


def _decode(q, key_cache, value_cache, block_tables, context_lens, sm_scale, max_context_len, config,
            check, k_scale=None, v_scale=None) -> torch.Tensor:
    signature = None
    checking = _dispatch.checking(check)
    if config is None and not checking and _SPLIT._direct:
        signature = _signature(q, key_cache, value_cache, block_tables, context_lens, sm_scale, max_context_len,
                               k_scale, v_scale)
        if signature is not None:
            out = _steady_decode(signature, q, key_cache, value_cache, block_tables, context_lens, k_scale, v_scale)
            if out is not None:
                return out
    _check_metadata(q, key_cache, value_cache, block_tables, context_lens, k_scale, v_scale)
    b, h, lq, d = q.shape
    block_size, hkv = key_cache.shape[1], key_cache.shape[2]
    capacity = block_tables.shape[1] * block_size
    max_context_len = _checked_length(max_context_len, capacity)
    sm_scale = softmax_scale(sm_scale, d)  # InputError for a tensor, a string, NaN or inf
    if checking:
        _check_values(q, key_cache, block_tables, context_lens, max_context_len, k_scale, v_scale)
    ctx = capacity if max_context_len is None else max_context_len
    cfg = _config_for(b, h, hkv, lq, d, block_size, ctx, config, q.dtype, key_cache.dtype)
    out = torch.empty((b, h, lq, d), dtype=q.dtype, device=q.device)
    plan, scratch = _launch(q, key_cache, value_cache, block_tables, context_lens, float(sm_scale), out, cfg, None,
                            k_scale, v_scale)
    if signature is not None:
        _remember_steady(signature, plan, scratch, q, key_cache, value_cache, block_tables, context_lens,
                         float(sm_scale), out, k_scale, v_scale)
    return out


# The steady path (omnitune.kernels._steady): a decode loop calls paged_decode_attention layer
# after layer, step after step, with tensors of the same metadata and a longest context that
# moves within one config bucket. A call's signature holds that metadata, sm_scale, the bucket of
# max_context_len (whose range it also checks), the page guard, and the thread, stream and device
# whose split partials the launch uses; a signature's first direct launch leaves here both C
# launches with every argument but the caller's addresses and the new output's. Not while a CUDA
# graph is captured (a graph gets partials of its own), nor with a config of the caller's own, in
# the check mode, under a launch hook, for strided context lengths (which go to the kernel as a
# copy) or after the tables were reloaded.
_steady: dict[tuple, tuple] = {}
_STEADY_ENTRIES = 256
_SCALAR_TYPES = (float, int)


def _signature(q, key_cache, value_cache, block_tables, context_lens, sm_scale, max_context_len,
               k_scale, v_scale) -> tuple | None:
    """The call's metadata as the steady path's key; None where the full path must judge it."""
    if not steady.plain(q, key_cache, value_cache, block_tables, context_lens):
        return None
    if q.dim() != 4 or key_cache.dim() != 4 or block_tables.dim() != 2 or context_lens.dim() != 1:
        return None
    scales = steady.scales_signature(k_scale, v_scale)
    if scales is False or not (sm_scale is None or type(sm_scale) in _SCALAR_TYPES):
        return None
    capacity = block_tables.shape[1] * key_cache.shape[1]
    if max_context_len is None:
        ctx = capacity
    elif type(max_context_len) is int and 1 <= max_context_len <= capacity:
        ctx = max_context_len
    else:
        return None  # the full path says what is wrong with it
    if q.is_cuda and torch.cuda.is_current_stream_capturing():
        return None
    device = launching._current_device()
    return (q.shape, key_cache.shape, value_cache.shape, block_tables.shape, context_lens.shape,
            q.stride(), key_cache.stride(), value_cache.stride(), block_tables.stride(), context_lens.stride(),
            q.dtype, key_cache.dtype, value_cache.dtype, block_tables.dtype, context_lens.dtype,
            q.get_device(), key_cache.get_device(), value_cache.get_device(), block_tables.get_device(),
            context_lens.get_device(), scales, sm_scale, _dispatch.bucket_up(max(ctx, q.shape[2])), PAGE_GUARD[0],
            threading.get_ident(), launching._raw_stream(device), device)


def _steady_decode(signature, q, key_cache, value_cache, block_tables, context_lens, k_scale, v_scale):
    """The output of a call whose signature a direct launch left in _steady; None where the full
    path must run it."""
    entry = _steady.get(signature)
    if not steady.usable(entry):
        return None
    _, shape, dtype, device, split_grid, split, combine_grid, combine, partials, _kept = entry
    qa, ka, va, ta, la = (q.data_ptr(), key_cache.data_ptr(), value_cache.data_ptr(), block_tables.data_ptr(),
                          context_lens.data_ptr())
    ks, vs = (la, la) if k_scale is None else (k_scale.data_ptr(), v_scale.data_ptr())  # _split_args' placeholders
    if steady.misaligned(qa, ka, va, ta, la, ks, vs):
        return None
    out = torch.empty(shape, dtype=dtype, device=device)
    o = out.data_ptr()
    if partials is None:
        pm = pl = pa = o  # one split: placeholders, never touched
        tickets = la
    else:
        pm, pl, pa, tickets = partials
        tickets = la if tickets is None else tickets
    stream = signature[-2]
    launch, before_args, tail = split
    launch(split_grid[0], split_grid[1], split_grid[2], stream, *before_args,
           qa, ka, va, ta, la, o, pm, pl, pa, tickets, ks, vs, *tail)
    if combine is not None:
        launch, before_args, tail = combine
        launch(combine_grid[0], combine_grid[1], combine_grid[2], stream, *before_args, pm, pl, pa, o, *tail)
    return out


def _remember_steady(signature, plan: _LaunchPlan, scratch: _Scratch | None, q, key_cache, value_cache,
                     block_tables, context_lens, sm_scale: float, out: torch.Tensor, k_scale, v_scale) -> None:
    """Keep the C launches of a call the bound launchers made directly, for its signature's next call."""
    if context_lens.stride(0) != 1 and context_lens.shape[0] > 1:
        return  # launched with a contiguous copy, not the caller's tensor
    device = signature[-1]
    args = _split_args(q, key_cache, value_cache, block_tables, context_lens, sm_scale * LOG2E, out, scratch,
                       plan.fused, k_scale, v_scale)
    split = steady.c_launch(plan.split, args, device, tensors=_SPLIT_TENSORS)
    if split is None:
        return
    combine = partials = None
    if scratch is not None:
        partials = (scratch.part_m.data_ptr(), scratch.part_l.data_ptr(), scratch.part_acc.data_ptr(),
                    scratch.tickets.data_ptr() if plan.fused else None)
    if plan.combine is not None:
        combine = steady.c_launch(plan.combine, _combine_args(scratch, out), device, tensors=4)
        if combine is None:
            return
    bounded_put(_steady, signature, (runtime_generation[0], out.shape, out.dtype, out.device, plan.split_grid, split,
                                     plan.combine_grid, combine, partials, scratch), _STEADY_ENTRIES)


class PagedDecodePlan:
    """Paged decode for one batch composition, planned once on the host, run many times.

        plan = PagedDecodePlan(batch=64, num_heads=28, num_kv_heads=4, head_dim=128,
                               block_size=16, max_blocks=256, max_context_len=4096,
                               dtype=torch.bfloat16, device="cuda")
        out = plan.run(q, key_cache, value_cache, block_tables, context_lens)

    plan (the constructor) picks the config for contexts of up to max_context_len tokens and
    allocates the split partials, the in-launch tickets and the output; run launches the kernels
    and nothing else, so it can be captured in a CUDA graph, and a replay stays correct when the
    context lengths (and block tables) change, as long as they stay within max_context_len and
    the table's capacity (lengths past the capacity are clamped in the kernel). run checks only
    that the tensors have the planned shapes; check=True validates their values too (a sync).
    cache_dtype: the caches' dtype, dtype itself (None) or torch.float8_e4m3fn, whose scales
    run then takes as k_scale and v_scale. Each plan owns its buffers: run one plan on one stream
    at a time."""

    def __init__(self, batch: int, num_heads: int, num_kv_heads: int, head_dim: int, block_size: int,
                 max_blocks: int, max_context_len: int, dtype: torch.dtype, device,
                 query_tokens: int = 1, sm_scale: float | None = None, config: Config | dict | None = None,
                 cache_dtype: torch.dtype | None = None):
        for name, value in (("batch", batch), ("num_heads", num_heads), ("num_kv_heads", num_kv_heads),
                            ("head_dim", head_dim), ("block_size", block_size), ("max_blocks", max_blocks),
                            ("max_context_len", max_context_len), ("query_tokens", query_tokens)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InputError(f"{name} must be a positive int, got {value!r}")
        if num_heads % num_kv_heads:
            raise InputError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
        if not 1 <= query_tokens <= MAX_QUERY_TOKENS:
            raise InputError(f"query_tokens={query_tokens}; decode takes 1..{MAX_QUERY_TOKENS}")
        if not MIN_HEAD_DIM <= head_dim <= MAX_HEAD_DIM:
            raise InputError(f"head dim {head_dim} is not supported; use {MIN_HEAD_DIM}..{MAX_HEAD_DIM}")
        if max_context_len > max_blocks * block_size:
            raise InputError(f"max_context_len={max_context_len} exceeds the block table's capacity of "
                             f"{max_blocks * block_size} ({max_blocks} pages × {block_size})")
        if not isinstance(dtype, torch.dtype):
            # "float16" was told "unsupported dtype float16; use float16, ..."
            raise InputError(f"dtype must be a torch.dtype (torch.float16, torch.bfloat16 or torch.float32), "
                             f"got {dtype!r}")
        if dtype not in (torch.float16, torch.bfloat16, torch.float32):
            raise InputError(f"unsupported dtype {dtype}; use float16, bfloat16 or float32")
        cache_dtype = dtype if cache_dtype is None else cache_dtype
        unsupported = _fp8.unsupported_cache_dtype(cache_dtype)
        if unsupported or cache_dtype not in (dtype, _fp8.FP8):
            raise InputError(unsupported or f"cache_dtype must be {dtype} or torch.float8_e4m3fn, got {cache_dtype}")
        self.cache_dtype = cache_dtype
        try:
            self.device = torch.device(device)
        except (RuntimeError, TypeError):  # "nope", 3.5: torch's own message names no argument
            raise InputError(f"device={device!r} is not a device; use a CUDA device such as 'cuda' or 'cuda:0'") from None
        if self.device.type not in ("cuda", "cpu"):
            # A meta plan failed at its first run, deep inside the launcher.
            raise InputError(f"device={device!r}: the kernels run on a CUDA device (or the CPU with TRITON_INTERPRET=1)")
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise InputError(f"device={device!r}: no CUDA GPU is visible here (the CPU runs the kernels with "
                             "TRITON_INTERPRET=1: device='cpu')")
        if self.device.type == "cuda" and self.device.index is None:
            # "cuda" means the current device; tensors report it with its index (cuda:0).
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.dtype = dtype
        self.q_shape = (batch, num_heads, query_tokens, head_dim)
        self.block_size, self.num_kv_heads, self.max_blocks = block_size, num_kv_heads, max_blocks
        self.max_context_len = max_context_len
        # As the function takes it: NaN, inf, a string or a tensor refused; a negative scale means the
        # default (the custom op, which run calls under torch.compile, reads it so: eager and compiled
        # runs of one plan once disagreed).
        self.sm_scale = softmax_scale(sm_scale, head_dim)
        self.config = _config_for(batch, num_heads, num_kv_heads, query_tokens, head_dim, block_size,
                                  max_context_len, config, dtype, cache_dtype)
        self._scratch = _Scratch.make(batch, num_heads, query_tokens, head_dim, num_kv_heads, self.config,
                                      self.device, own_tickets=True)
        self.out = torch.empty(self.q_shape, dtype=dtype, device=self.device)
        self._config_json = _dispatch.config_to_json(self.config)  # what the op takes under torch.compile
        # What run compares the tensors against, and launches with, computed once.
        self._scale_log2 = self.sm_scale * LOG2E
        self._table_shape = (batch, max_blocks)
        self._lens_shape = (batch,)
        # What get_device() says of a tensor on the plan's device; None (matching nothing, so
        # every call takes the checks one by one) for a device that is neither a GPU nor the CPU.
        self._device_index = {"cuda": self.device.index, "cpu": -1}.get(self.device.type)
        self._fp8 = cache_dtype == _fp8.FP8
        self._out_strides, self._out_address = self.out.stride(), self.out.data_ptr()
        self._split_dtypes: tuple | None = None
        self._replan(rows_32=True)  # the caches' slot strides are not known before run

    def run(self, q: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
            block_tables: torch.Tensor, context_lens: torch.Tensor, out: torch.Tensor | None = None,
            *, k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
            check: bool | None = None) -> torch.Tensor:
        """The attention of q over the paged caches into `out` (the plan's own buffer if None),
        which is returned. Capturable; no host sync. k_scale, v_scale: an fp8 cache's scales."""
        if _dispatch.compiling():
            _dispatch.require_compiled_check(check)
            result = torch.ops.omnitune.paged_decode_attention(
                q, key_cache, value_cache, block_tables, context_lens, self.sm_scale,
                _dispatch.traced_bucket_up(self.max_context_len), self._config_json, k_scale, v_scale)
            if out is not None:
                out.copy_(result)
                return out
            return result
        if not self._fits(q, key_cache, value_cache, block_tables, context_lens, out, k_scale, v_scale):
            self._explain_misfit(q, key_cache, value_cache, block_tables, context_lens, out, k_scale, v_scale)
        elif self._device_index < 0:
            # A CPU plan (the interpreter; never a serving path): get_device() says -1 for a meta
            # tensor too, so _fits cannot tell the two apart; the checks one by one can.
            self._explain_misfit(q, key_cache, value_cache, block_tables, context_lens, out, k_scale, v_scale)
        if _dispatch.checking(check):
            _check_values(q, key_cache, block_tables, context_lens, self.max_context_len, k_scale, v_scale)
        own_out = out is None
        if own_out:
            out = self.out
            if not self._out_as_planned():
                raise InputError("the plan's output buffer was resized or re-pointed since planning; "
                                 "pass an out tensor of your own, or make a new plan")
        elif out.stride(3) != 1:  # the combine's head-dim offsets are 32-bit (_host.INT32_OFFSETS)
            require_int32_offsets(out, (3,), "out")
        plan = self._plan
        rows_32 = _rows_fit_32(self.block_size, key_cache, value_cache)
        # Replanned where the page guard changed since planning (a study of the guards' cost) or
        # the caches' slot stride went past what 32-bit rows allow (or back).
        if plan.page_guard != PAGE_GUARD[0] or plan.rows_32 != rows_32:
            plan = self._replan(rows_32)
        if self._split_dtypes is None:
            # _fits fixes every tensor's dtype (the scratch is the plan's own), so the launch key's
            # dtypes are read once, from the first call's arguments.
            args = _split_args(q, key_cache, value_cache, block_tables, context_lens, self._scale_log2, out,
                               self._scratch, plan.fused, k_scale, v_scale)
            self._split_dtypes = tuple(arg.dtype for arg in args[:_SPLIT_TENSORS])
        # Over the plan's own partials and output, the combine's arguments never change.
        _launch_planned(plan, q, key_cache, value_cache, block_tables, context_lens, self._scale_log2, out,
                        self._scratch, k_scale, v_scale, self._split_dtypes,
                        self._fixed_combine if own_out else None)
        return out

    def _out_as_planned(self) -> bool:
        out = self.out
        return out.shape == self.q_shape and out.stride() == self._out_strides and out.data_ptr() == self._out_address

    def _replan(self, rows_32: bool) -> _LaunchPlan:
        b, h, lq, d = self.q_shape
        plan = self._plan = _launch_plans.get(self.config, (b, h, lq, d, self.num_kv_heads, self.block_size,
                                                            self.dtype, self.cache_dtype, PAGE_GUARD[0], rows_32))
        self._fixed_combine = (plan.combine.fixed(plan.combine_grid, _combine_args(self._scratch, self.out))
                               if plan.combine is not None else None)
        return plan

    def _fits(self, q, key_cache, value_cache, block_tables, context_lens, out, k_scale, v_scale) -> bool:
        """Whether the tensors are as planned, in one predicate (it runs on every decode step):
        true only where run's checks and _check_metadata's all pass (but for the CPU's
        require_runnable_device)."""
        device = self._device_index
        if not (type(q) is _Tensor and type(key_cache) is _Tensor and type(value_cache) is _Tensor
                and type(block_tables) is _Tensor and type(context_lens) is _Tensor):
            return False
        cache_shape = key_cache.shape
        return (q.shape == self.q_shape and q.dtype == self.dtype and q.get_device() == device
                and len(cache_shape) == 4 and cache_shape[0] > 0 and cache_shape[1] == self.block_size
                and cache_shape[2] == self.num_kv_heads and cache_shape[3] == self.q_shape[3]
                and value_cache.shape == cache_shape
                and key_cache.dtype == self.cache_dtype and value_cache.dtype == self.cache_dtype
                and key_cache.get_device() == device and value_cache.get_device() == device
                and block_tables.shape == self._table_shape and block_tables.dtype == torch.int32
                and block_tables.get_device() == device
                and context_lens.shape == self._lens_shape and context_lens.dtype == torch.int32
                and context_lens.get_device() == device
                and ((not self._fp8 and k_scale is None and v_scale is None)
                     or (self._fp8 and _fp8.scales_fit(k_scale, self.num_kv_heads, device)
                         and _fp8.scales_fit(v_scale, self.num_kv_heads, device)))
                and (out is None or (type(out) is _Tensor and out.shape == self.q_shape and out.dtype == self.dtype
                                     and out.get_device() == device)))

    def _explain_misfit(self, q, key_cache, value_cache, block_tables, context_lens, out, k_scale, v_scale) -> None:
        """run's checks one by one, for a call that failed _fits: the InputError naming what is not
        as planned (or nothing, e.g. for CPU tensors under the interpreter)."""
        # Types first: the comparisons below read .shape of each (AttributeError for a None).
        for name, t in (("q", q), ("key_cache", key_cache), ("value_cache", value_cache),
                        ("block_tables", block_tables), ("context_lens", context_lens)):
            if not isinstance(t, torch.Tensor):
                raise InputError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if out is not None and not isinstance(out, torch.Tensor):
            raise InputError(f"out must be None or a torch.Tensor, got {type(out).__name__}")
        if tuple(q.shape) != self.q_shape or q.dtype != self.dtype or q.device != self.device:
            raise InputError(f"q must be {self.dtype} {list(self.q_shape)} on {self.device} as planned, "
                             f"got {q.dtype} {list(q.shape)} on {q.device}")
        if tuple(key_cache.shape[1:3]) != (self.block_size, self.num_kv_heads) \
                or tuple(block_tables.shape) != (self.q_shape[0], self.max_blocks) \
                or key_cache.dtype != self.cache_dtype:
            raise InputError(
                f"planned for {self.cache_dtype} pages of {self.block_size} tokens × {self.num_kv_heads} kv heads "
                f"and block tables [{self.q_shape[0]}, {self.max_blocks}]; got a {key_cache.dtype} cache "
                f"{list(key_cache.shape)} and block tables {list(block_tables.shape)}"
            )
        _check_metadata(q, key_cache, value_cache, block_tables, context_lens, k_scale, v_scale)
        if out is not None and (tuple(out.shape) != self.q_shape or out.dtype != self.dtype
                                or out.device != self.device):
            raise InputError(f"out must be {self.dtype} {list(self.q_shape)} on {self.device}")


# ------------------------------------------------------------------------------------------------
# Spec: reference, inputs, model, config space
# ------------------------------------------------------------------------------------------------


# An fp8 factory cache's scales: keys drawn standard normal, values at half that, and 5σ of each
# mapped to 448 (a draw past it saturates, as with an engine's calibrated scale).
_FP8_K_SCALE, _FP8_V_SCALE = 5.0 / _fp8.FP8_MAX, 2.5 / _fp8.FP8_MAX


def make_inputs(problem: PagedDecodeProblem, dtype: torch.dtype, device, seed: int) -> PagedDecodeInputs:
    """Random q and cache contents; every sequence's pages drawn at random, without repeats, from
    a cache with spare blocks. Every cache slot that no sequence's context covers (spare blocks,
    the tail of each last page) holds +inf in both caches, so that a kernel reading one fails the
    check even where it masks the score (0 · inf = NaN in P·V). Not NaN: inputs stay comparable
    with torch.equal. An fp8 cache (no inf in e4m3) holds NaN there instead, and quantized
    values with per-tensor scales (vLLM's default); values are drawn at half the keys' scale."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    p = problem

    rand = seeded_rand(gen, device, dtype)  # drawn on the device, one sequence at a time

    pages = p.pages_per_sequence
    tables = torch.randperm(p.num_blocks, generator=gen)[: p.b * pages].view(p.b, pages).to(torch.int32)
    tables = tables.to(device)
    shape = (p.num_blocks, p.block_size, p.hkv, p.d)
    fp8 = p.cache_dtype == "fp8_e4m3"
    k_scale = v_scale = None
    if fp8:
        k_scale = torch.full((1,), _FP8_K_SCALE, dtype=torch.float32, device=device)
        v_scale = torch.full((1,), _FP8_V_SCALE, dtype=torch.float32, device=device)
        # Written as bytes: indexed assignment is not implemented for fp8 tensors everywhere.
        key_cache = torch.full(shape, 0x7F, dtype=torch.uint8, device=device)  # 0x7F: e4m3's NaN
        value_cache = key_cache.clone()
    else:
        key_cache = torch.full(shape, float("inf"), dtype=dtype, device=device)
        value_cache = torch.full_like(key_cache, float("inf"))
    positions = torch.arange(p.ctx, device=device)
    offsets = positions % p.block_size
    for seq in range(p.b):
        blocks = tables[seq].to(torch.int64)[positions // p.block_size]
        keys, values = rand(p.ctx, p.hkv, p.d), rand(p.ctx, p.hkv, p.d, scale=0.5)
        if fp8:
            keys = _fp8.quantize(keys, k_scale).view(torch.uint8)
            values = _fp8.quantize(values, v_scale).view(torch.uint8)
        key_cache[blocks, offsets] = keys
        value_cache[blocks, offsets] = values
    if fp8:
        key_cache, value_cache = key_cache.view(_fp8.FP8), value_cache.view(_fp8.FP8)
    return PagedDecodeInputs(
        q=rand(p.b, p.h, p.lq, p.d),
        key_cache=key_cache,
        value_cache=value_cache,
        block_tables=tables,
        context_lens=torch.full((p.b,), p.ctx, dtype=torch.int32, device=device),
        sm_scale=1.0 / math.sqrt(p.d),
        k_scale=k_scale,
        v_scale=v_scale,
    )


def new_output(inputs: PagedDecodeInputs) -> torch.Tensor:
    b, h, lq, d = inputs.q.shape
    return poisoned((b, h, lq, d), inputs.q.dtype, inputs.q.device)


def gather_context(cache: torch.Tensor, table_row: torch.Tensor, ctx: int, scale: torch.Tensor | None = None,
                   dtype: torch.dtype | None = None) -> torch.Tensor:
    """One sequence's first ctx tokens from a paged cache: [ctx, Hkv, D]. An fp8 cache's tokens
    are gathered as bytes and, with its scale, dequantized to `dtype`."""
    block_size = cache.shape[1]
    positions = torch.arange(ctx, device=cache.device)
    blocks = table_row.to(torch.int64)[positions // block_size]
    if cache.dtype != _fp8.FP8:
        return cache[blocks, positions % block_size]
    tokens = cache.view(torch.uint8)[blocks, positions % block_size].view(_fp8.FP8)
    return tokens if scale is None else _fp8.dequantize(tokens, scale, dtype or torch.float32)


def contiguous_context(inputs: PagedDecodeInputs, ctx: int, dtype: torch.dtype | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """Every sequence's first ctx tokens of K and V, as SDPA takes them: [B, Hkv, ctx, D] each (views
    of gathered copies; an fp8 cache's dequantized to `dtype`)."""
    tables = inputs.block_tables
    keys = torch.stack([gather_context(inputs.key_cache, tables[i], ctx, inputs.k_scale, dtype)
                        for i in range(tables.shape[0])])
    values = torch.stack([gather_context(inputs.value_cache, tables[i], ctx, inputs.v_scale, dtype)
                          for i in range(tables.shape[0])])
    return keys.transpose(1, 2), values.transpose(1, 2)


def reference(inputs: PagedDecodeInputs) -> torch.Tensor:
    """Gather each sequence's keys and values from the pages (an fp8 cache's dequantized: the
    values it stands for), then masked softmax attention in float64 on the CPU, float32 (no
    TF32) on a GPU."""
    q = inputs.q
    b, h, lq, d = q.shape
    hkv = inputs.key_cache.shape[2]
    group = h // hkv
    acc_dtype = torch.float64 if q.device.type == "cpu" else torch.float32
    lens = inputs.context_lens.tolist()
    out = torch.empty((b, h, lq, d), dtype=acc_dtype, device=q.device)
    prev_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        for bi, ctx in enumerate(lens):
            keys = gather_context(inputs.key_cache, inputs.block_tables[bi], ctx, inputs.k_scale, acc_dtype)
            values = gather_context(inputs.value_cache, inputs.block_tables[bi], ctx, inputs.v_scale, acc_dtype)
            keys = keys.to(acc_dtype).permute(1, 0, 2).repeat_interleave(group, dim=0)      # [H, ctx, D]
            values = values.to(acc_dtype).permute(1, 0, 2).repeat_interleave(group, dim=0)
            qpos = torch.arange(lq, device=q.device) + (ctx - lq)
            visible = torch.arange(ctx, device=q.device)[None, :] <= qpos[:, None]  # [lq, ctx]
            scores = torch.matmul(q[bi].to(acc_dtype), keys.transpose(1, 2)) * inputs.sm_scale
            scores = scores.masked_fill(~visible[None], float("-inf"))
            out[bi] = torch.matmul(torch.softmax(scores, dim=-1), values)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev_tf32
    return out


def visible_pairs(problem: PagedDecodeProblem) -> int:
    """(query, key) pairs per (sequence, head): Lq·ctx less the causal triangle among the queries."""
    p = problem
    return p.lq * p.ctx - p.lq * (p.lq - 1) // 2


def flops(problem: PagedDecodeProblem) -> float:
    # QKᵀ and PV, 2·D flops each per visible pair: 4·B·H·D·(Lq·ctx − Lq(Lq−1)/2).
    return 4.0 * problem.b * problem.h * problem.d * visible_pairs(problem)


def bytes_moved(problem: PagedDecodeProblem, dtype: torch.dtype) -> float:
    p = problem
    elt = element_bytes(dtype)
    kv = 2 * p.b * p.hkv * p.ctx * p.d * element_bytes(_fp8.cache_dtype_of(p.cache_dtype, dtype))
    q_and_out = 2 * p.b * p.h * p.lq * p.d * elt
    return float(kv + q_and_out + 4 * p.b * p.pages_per_sequence)


def _rows(problem: PagedDecodeProblem, config: Config) -> int:
    return problem.group * problem.lq if config["PACK_GQA"] and problem.group > 1 else problem.lq


def _check_shared_memory(problem, config, dtype, limits: DeviceLimits):
    # Q tile plus K and V tiles (in the cache's dtype) for each pipeline buffer: num_stages − 1
    # of each (at least one), as Triton's pipeliner allocates them for this loop on sm_90.
    elt, kv_elt = element_bytes(dtype), element_bytes(_fp8.cache_dtype_of(problem.cache_dtype, dtype))
    bd = triton.next_power_of_2(problem.d)
    buffers = max(1, int(config["num_stages"]) - 1)
    need = bd * (elt * _block_m(_rows(problem, config)) + kv_elt * buffers * 2 * int(config["BLOCK_N"]))
    have = limits.shared_memory_per_block_bytes
    if need > have:
        return f"needs ~{need // 1024} KiB of shared memory, the device has {have // 1024} KiB"
    return None


def _check_accumulator(problem, config, dtype, limits):
    # The fp32 accumulator lives in registers: past 128 floats per thread the compiler spills.
    per_thread = _block_m(_rows(problem, config)) * triton.next_power_of_2(problem.d) // (int(config["num_warps"]) * 32)
    if per_thread > 128:
        return f"accumulator needs {per_thread} fp32 registers per thread (> 128)"
    return None


def _check_pack(problem, config, dtype, limits):
    if config["PACK_GQA"] and problem.group == 1:
        return "PACK_GQA needs several query heads per kv head (h > hkv)"
    return None


def _check_block_n(problem, config, dtype, limits):
    useful = max(16, triton.next_power_of_2(problem.ctx))
    if int(config["BLOCK_N"]) > useful:
        return f"BLOCK_N={config['BLOCK_N']} exceeds the {problem.ctx}-token context (use ≤ {useful})"
    return None


def _check_empty_splits(problem, config, dtype, limits):
    # Splits are whole BLOCK_N tiles; with fewer tiles than splits some get no key and only cost
    # a launch slot and a round trip through the scratch buffers.
    splits, block_n = int(config["NUM_SPLITS"]), int(config["BLOCK_N"])
    if triton.cdiv(problem.ctx, block_n) < splits:
        return f"NUM_SPLITS={splits} of {block_n}-key tiles leaves splits of the {problem.ctx}-token context empty"
    return None


def _check_fused_reduce(problem, config, dtype, limits):
    # With one split there is nothing to combine: the two values would be the same program.
    if config["FUSED_REDUCE"] and int(config["NUM_SPLITS"]) == 1:
        return "FUSED_REDUCE has nothing to combine with NUM_SPLITS=1"
    return None


PARAMS = (
    Param("NUM_SPLITS", (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128),
          "contiguous key ranges per sequence (1 = no split, one launch); not only powers of two, so "
          "that a grid can fill whole waves of the SMs"),
    Param("BLOCK_N", (16, 32, 64, 128), "keys per inner-loop tile"),
    Param("num_warps", (1, 2, 4, 8), "warps per program"),
    Param("num_stages", (1, 2, 3, 4), "software-pipelining depth of the K/V loads"),
    Param("PACK_GQA", (False, True), "one program serves all query heads of a kv head"),
    Param("FUSED_REDUCE", (False, True),
          "combine the splits in the same launch (the last split to finish reduces) instead of a second kernel"),
)

CONSTRAINTS = (
    Constraint("shared_memory", _check_shared_memory, "Q tile + K/V tiles per stage must fit in shared memory"),
    Constraint("accumulator_registers", _check_accumulator, "fp32 accumulator ≤ 128 registers per thread"),
    Constraint("pack_gqa_needs_groups", _check_pack, "PACK_GQA only when h > hkv"),
    Constraint("block_n_exceeds_context", _check_block_n, "no key tile larger than the context"),
    Constraint("empty_splits", _check_empty_splits, "every split gets at least one key"),
    Constraint("fused_reduce_needs_splits", _check_fused_reduce, "FUSED_REDUCE only with NUM_SPLITS > 1"),
)

# The default split keeps at least this many keys per program, so that the partials' round trip
# (≈ (D + 2)·4 bytes per row and split) stays small next to the K/V read.
_MIN_KEYS_PER_SPLIT = 256
# Programs of a default tile that fit an SM at once (registers and shared memory, compiled for
# sm_90): 3 of the 16-bit tile of head dim 128 over 3 stages; 4 of a smaller one — head dim ≤ 64,
# the fp8 tile over 3 stages (96 registers, 54 KiB: benchmarks/decode_registers_sweep_offline.py),
# any tile over 2 stages. And the most splits the default takes (the search space's largest).
_PROGRAMS_PER_SM_3_STAGES = 3
_PROGRAMS_PER_SM_SMALLER_TILE = 4
# The same count for the tiles the default gives more query rows, head dim 128 (a padded 128),
# 3 stages, compiled for sm_90 (decode_registers_offline.py --rows,
# results/decode_default_tiles_offline.json): 32 rows over the 32-key tile and 2 warps take
# 43,008 B and 183 registers, so 5 fit an SM; 128 rows over the 64-key tile and 8 warps take
# 131,072 B, so one does. (64 rows: 2, where the rule keeps the 16-row tile's 3 — no problem of
# the studies or searches below tells the two apart.) Counted as 3, the 128-row grid overfilled
# its wave: at batch 4, h28/4, 16 query tokens, 9k context the H200's search
# (train_h200_round22_A.db.gz) timed 8 splits (128 programs) at 47.1 µs, 16 at 55.6 and 4 at
# 78.7; at batch 3, 12 tokens (decode_default_study_h200_round13_A.json) 8 splits beat 32 by 5%.
# The 32-row grid underfilled it: at batch 1, h40/8, 4 tokens, 40k, 64 splits (512 programs)
# took 50.0 µs, 32 took 58.5.
_PROGRAMS_PER_SM_32_ROWS = 5
_PROGRAMS_PER_SM_128_ROWS = 1
_MAX_DEFAULT_SPLITS = 128
# Where one split per sequence fills this many waves, 16-key tiles (round 13's study: 1.18x faster
# than 32-key ones at 2.6 waves, 1.5% slower at 1.9 waves and less).
_OVERFILL_WAVES_FOR_16_KEYS = 2


def _default_splits(problem: PagedDecodeProblem, programs: int, one_wave: int) -> int:
    """Splits doubled while the grid stays within one wave, up to 128, each keeping ≥ 256 keys."""
    splits = 1
    while splits * 2 <= _MAX_DEFAULT_SPLITS and programs * splits * 2 <= one_wave \
            and problem.ctx >= splits * 2 * _MIN_KEYS_PER_SPLIT:
        splits *= 2
    return splits


def default_config(problem: PagedDecodeProblem, dtype: torch.dtype) -> Config:
    """The untuned starting point, chosen by measurement on problems that are not held out
    (benchmarks/decode_default_study.py, results/decode_default_study_h200_round11.json): GQA
    packing whenever h > hkv; 64-key tiles (smaller only for short contexts); 3 stages; the
    splits doubled while the grid stays within one wave of the programs an SM holds at once —
    3 of the 16-bit tile of head dim 128 over 3 stages, 4 of a head dim ≤ 64 one or of the fp8
    one — up to 128 splits, each keeping ≥ 256 keys; where even one split per sequence overfills
    that wave (batch 64 × 8 kv heads), 32-key tiles over 2 warps, which an SM holds more of —
    16-key ones where it fills two waves or more. On the study's 20 problems on the H200 this rule
    picks a candidate within 5% of the fastest on 19 (worst 1.13x, geometric mean 1.01x), where
    the earlier default (2 stages, 4 programs an SM) was within 5% on 8 (worst 1.44x, mean 1.18x).
    By the number of query rows a program serves (GQA group × query tokens, padded to a power of
    two ≥ 16), round 13's study of the problems with ≥ 16 rows or an overfilled grid
    (results/decode_default_study_h200_round13_A.json, 18 problems): 32 rows take the 32-key tile
    over 2 warps (1.22–1.25x faster on three of four such problems, 1.026x slower on the fourth),
    128 rows take 8 warps (1.9–2.3x faster on all three); that rule is within 5% of the fastest
    candidate on 17 of the 18 (the worst 1.052x), where the round-11 rule was on 11 (worst 2.35x). A 128-program grid (batch 1, 128k, 32
    splits) read 45% of copy bandwidth there, 512-program grids 79–98%
    (benchmarks/results/paged_decode_guard_h200.json): a grid must fill the wave. The splits are
    combined by the second kernel, not in the same launch (FUSED_REDUCE saves that launch, but
    compiled for sm_90 it raises the split kernel's registers so that fewer programs fit an SM;
    whether it pays is for the search). The study held no fp8 problem: over fp8 the 3 stages and
    4 programs an SM follow the fp8 entries the searches chose (10 of the H200 table's 12 have 3
    stages).
    fp32 (the checking path) keeps 2 stages and 4 programs an SM; more warps, fewer stages or no
    packing wherever a constraint demands it. At head dim 128 the 32- and 128-row tiles split to
    the wave of their own tile (5 and 1 an SM: see _PROGRAMS_PER_SM_32_ROWS), not the 16-row one's."""
    p = problem
    pack = p.group > 1
    block_n = 64
    while block_n > 16 and block_n > p.ctx:
        block_n //= 2
    programs = p.b * (p.hkv if pack else p.h)
    sms = DeviceLimits().multiprocessors
    fp8 = p.cache_dtype != "auto"
    # (splits, BLOCK_N, num_warps, num_stages) in order of preference; then the 2-stage fallback.
    preferred: list[tuple[int, int, int, int]] = []
    if fp8:
        preferred.append((_default_splits(p, programs, _PROGRAMS_PER_SM_SMALLER_TILE * sms), block_n, 4, 3))
    elif dtype != torch.float32:
        # Tiles of head dim ≤ 64 take half the shared memory: 4 fit an SM over 3 stages too.
        wave = _wave_programs(p)
        splits = _default_splits(p, programs, wave)
        block_m = _block_m(p.group * p.lq if pack else p.lq)
        if programs * splits >= _OVERFILL_WAVES_FOR_16_KEYS * wave:
            preferred.append((splits, min(16, block_n), 2, 3))
        elif programs * splits > wave or block_m == 32:
            # An overfilled grid keeps its one split; 32 rows split to the wave of their own tile.
            own = splits if programs * splits > wave else _default_splits(p, programs, _wave_programs(p, block_m))
            preferred.append((own, min(32, block_n), 2, 3))
        elif block_m >= 128:
            preferred.append((_default_splits(p, programs, _wave_programs(p, block_m)), block_n, 8, 3))
        preferred.append((splits, block_n, 4, 3))
    fallback_splits = _default_splits(p, programs, _PROGRAMS_PER_SM_SMALLER_TILE * sms)
    preferred += [(fallback_splits, block_n, warps, stages) for warps in (4, 8) for stages in (2, 1)]
    for pack_gqa in ((True, False) if pack else (False,)):
        for splits, tile, warps, stages in preferred:
            cfg = Config(NUM_SPLITS=splits, BLOCK_N=tile, num_warps=warps, num_stages=stages,
                         PACK_GQA=pack_gqa, FUSED_REDUCE=False)
            if not SPEC.violations(p, cfg, dtype):
                return cfg
    return Config(NUM_SPLITS=1, BLOCK_N=16, num_warps=8, num_stages=1, PACK_GQA=False, FUSED_REDUCE=False)


def adapt_config(tuned: PagedDecodeProblem, problem: PagedDecodeProblem, config: Config) -> Config:
    """The config tuned for `tuned`, carried over to `problem` by the runtime's nearest rung: its
    split count scaled so that the grid keeps as many programs as the tuned one's — the split that
    filled the GPU there fills it here (32 splits tuned at batch 4 become 128 at batch 1) — to the
    nearest split count of the space, keeping at least as many keys per split as the default does
    (or as the tuned config did, if fewer); the rest as tuned. Carried over unchanged, the 32
    splits tuned at batch 4 read 39–67% of copy bandwidth at batch 1–2 with 32k–64k contexts on
    the H200, where the default's 64–128 read 64–89% (benchmarks/results/long_decode_h200.json)."""
    pack = bool(config["PACK_GQA"])
    splits = int(config["NUM_SPLITS"])

    def programs(p: PagedDecodeProblem) -> int:
        return p.b * (p.hkv if pack and p.group > 1 else p.h)

    wanted = splits * programs(tuned) / programs(problem)
    keys_per_split = min(_MIN_KEYS_PER_SPLIT, max(1, tuned.ctx // splits))
    most = max(1, min(problem.ctx // keys_per_split, triton.cdiv(problem.ctx, int(config["BLOCK_N"]))))
    choices = [c for c in SPEC.param("NUM_SPLITS").choices if c <= most] or [1]
    chosen = min(choices, key=lambda c: (abs(math.log2(c / wanted)), -c))
    adapted = config.replace(NUM_SPLITS=chosen, FUSED_REDUCE=bool(config["FUSED_REDUCE"]) and chosen > 1)
    # Where the tuned grid fit one wave and here even one split overfills it, the tuned tile does
    # not carry over: the default's smaller one does, as default_config takes it there (32 keys
    # over 2 warps, which an SM holds more of). In the default study (round 11) one split of
    # 64-key tiles over 4 warps was 1.27–1.29x the 32-key tile's time on the two such problems
    # (batch 64 × 8 kv heads, batch 128 × 4), and the best config at batch 64 × 4 (256 programs).
    # Where one split fills two waves or more, the default's 16-key tile (round 13).
    wave = _wave_programs(problem)
    if chosen == 1 and problem.cache_dtype == "auto" and programs(problem) > wave >= programs(tuned) * splits:
        tile = 16 if programs(problem) >= _OVERFILL_WAVES_FOR_16_KEYS * wave else 32
        if int(config["BLOCK_N"]) > tile:
            adapted = adapted.replace(BLOCK_N=tile, num_warps=2)
    return adapted


def _wave_programs(problem: PagedDecodeProblem, block_m: int = 16) -> int:
    """Programs of the 16-bit 3-stage tile default_config gives `block_m` query rows that one wave
    holds: at head dim 128 the 32- and 128-row tiles' own counts (head dim 256: one an SM at most),
    else the 16-row tile's."""
    padded_d = triton.next_power_of_2(problem.d)
    if block_m == 32 and padded_d == 128:
        per_sm = _PROGRAMS_PER_SM_32_ROWS
    elif block_m >= 128 and padded_d >= 128:
        per_sm = _PROGRAMS_PER_SM_128_ROWS
    else:
        per_sm = _PROGRAMS_PER_SM_3_STAGES if problem.d > 64 else _PROGRAMS_PER_SM_SMALLER_TILE
    return per_sm * DeviceLimits().multiprocessors


def _torch_baselines(problem: PagedDecodeProblem):
    """Gather the pages with PyTorch indexing, then SDPA with a boolean mask, for `omnitune bench`."""
    import torch.nn.functional as F

    def run(inputs: PagedDecodeInputs) -> torch.Tensor:
        q = inputs.q
        b, h, lq, d = q.shape
        hkv = inputs.key_cache.shape[2]
        ctx = problem.ctx  # the factory gives every sequence the same context
        keys, values = contiguous_context(inputs, ctx, q.dtype)
        mask = torch.arange(ctx, device=q.device)[None, :] <= (torch.arange(lq, device=q.device) + ctx - lq)[:, None]
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=inputs.sm_scale,
                                              enable_gqa=h != hkv)

    prepared: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def run_contiguous(inputs: PagedDecodeInputs) -> torch.Tensor:
        """SDPA over a contiguous cache: the pages are gathered (an fp8 cache's dequantized) once,
        outside the timed calls — what an engine without paging would read."""
        q = inputs.q
        b, h, lq, d = q.shape
        hkv = inputs.key_cache.shape[2]
        ctx = problem.ctx
        if id(inputs) not in prepared:
            prepared.clear()
            keys, values = contiguous_context(inputs, ctx, q.dtype)
            prepared[id(inputs)] = (keys.contiguous(), values.contiguous())
        keys, values = prepared[id(inputs)]
        if lq == 1:
            return F.scaled_dot_product_attention(q, keys, values, scale=inputs.sm_scale, enable_gqa=h != hkv)
        mask = torch.arange(ctx, device=q.device)[None, :] <= (torch.arange(lq, device=q.device) + ctx - lq)[:, None]
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=inputs.sm_scale,
                                              enable_gqa=h != hkv)

    return {"torch_gather_sdpa": run, "sdpa_contiguous_cache": run_contiguous}


SPEC = KernelSpec(
    name="paged_decode_attention",
    description="split-KV decode attention over a paged KV cache (block tables, GQA, Lq ≤ 16)",
    problem_type=PagedDecodeProblem,
    params=PARAMS,
    constraints=CONSTRAINTS,
    default_config=default_config,
    make_inputs=make_inputs,
    new_output=new_output,
    launch=launch,
    reference=reference,
    tolerance={torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 2e-2},
    flops=flops,
    bytes_moved=bytes_moved,
    match=MatchPolicy(exact=("h", "hkv", "d", "block_size"), max_ratio=4.0),
    aliases={"heads": ("h",), "kv_heads": ("hkv",)},
    example_problem=PagedDecodeProblem(b=2, h=4, hkv=2, lq=2, ctx=45, d=64, block_size=16),
    sample_problems=(
        PagedDecodeProblem(b=3, h=2, hkv=2, lq=1, ctx=1, d=32, block_size=16),    # no GQA, one key
        PagedDecodeProblem(b=1, h=7, hkv=1, lq=4, ctx=75, d=32, block_size=8),    # GQA 7, 10 pages
        PagedDecodeProblem(b=1, h=8, hkv=1, lq=16, ctx=20, d=128, block_size=16),  # 128 packed rows
        PagedDecodeProblem(b=1, h=4, hkv=1, lq=1, ctx=600, d=64, block_size=16),  # default splits 2
        PagedDecodeProblem(b=2, h=4, hkv=2, lq=2, ctx=70, d=64, block_size=16,     # fp8 cache, scales
                           cache_dtype="fp8_e4m3"),
    ),
    # Measured right after the default. An fp8 tile of 64 keys is half the bytes of a bf16 one, so
    # decode over fp8 needs more tiles in flight per SM: 128-key tiles over 3 stages, or 64-key
    # tiles over 3 stages now that the fp8 kernel fits four programs an SM (96 registers, 54 KiB of
    # shared memory compiled for sm_90: benchmarks/decode_registers_sweep_offline.py). And one
    # split over 3 stages: where the batch alone fills the GPU it launches once, no partials, no
    # combine — at batch 64, h28/4, 4k on the H200 128.1 µs as a graph against the two splits
    # the search had picked (130.5), 20.8 against 27.5 µs of host time in the same run
    # (benchmarks/results/decode_one_launch_h200_round11.json); TPE had not drawn it in 50 trials.
    known_good=(dict(BLOCK_N=64, num_stages=3, num_warps=4), dict(BLOCK_N=128, num_stages=3, num_warps=4),
                dict(NUM_SPLITS=1, FUSED_REDUCE=False, BLOCK_N=64, num_stages=3, num_warps=4)),
    baselines=_torch_baselines,
    prepared_baselines=frozenset({"sdpa_contiguous_cache"}),
    adapt=lambda tuned, problem, config: adapt_config(tuned, problem, config),  # by name: tests swap it
    module=__name__,
)


# ------------------------------------------------------------------------------------------------
# torch.library op: what torch.compile records for paged_decode_attention() and PagedDecodePlan.run
# (see omnitune.kernels._dispatch)
# ------------------------------------------------------------------------------------------------


@library_op("paged_decode_attention")
def _paged_decode_op(q: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                     block_tables: torch.Tensor, context_lens: torch.Tensor, sm_scale: float,
                     max_context_len: int, config: str, k_scale: torch.Tensor | None = None,
                     v_scale: torch.Tensor | None = None) -> torch.Tensor:
    """paged_decode_attention() as an op: sm_scale < 0 means 1/√D, config '' means look it up."""
    capacity = block_tables.shape[1] * key_cache.shape[1]
    return _decode(q, key_cache, value_cache, block_tables, context_lens, sm_scale,
                   min(max_context_len, capacity), _dispatch.config_from_json(config), None, k_scale, v_scale)


@_paged_decode_op.register_fake
def _paged_decode_fake(q, key_cache, value_cache, block_tables, context_lens, sm_scale, max_context_len, config,
                       k_scale=None, v_scale=None):
    return torch.empty(q.shape, dtype=q.dtype, device=q.device)

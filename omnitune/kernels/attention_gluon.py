"""Attention's BACKEND=gluon_pingpong: a FlashAttention-3-style forward for Hopper (sm_90) written
in Gluon (triton.experimental.gluon, shipped with Triton 3.6). Plain Triton 3.6 cannot express
ping-pong of two consumer warpgroups nor a warp-specialized loop that completes on sm_90
(docs/hopper.md, Findings, row 6); Gluon writes both by hand.

Imported only when a gluon_pingpong config is launched (omnitune.kernels.attention): importing
this module imports Gluon, which the attention module, and so the runtime, never does at import
time. The attention spec's constraints say which problems the kernel serves; `refusal` says which
tensors it can take, and the op runs a refused call with its own Triton kernel.

Problem: q [b, h, Lq, 128], k/v [b, hkv, Lk, 128] (GQA: h % hkv == 0), any lengths ≥ 1, bf16 or
fp16, causal (bottom-right aligned, as the Triton kernel: query i sees keys < i + 1 + Lk − Lq) or
not, or causal with image spans (a row inside a span [s, e) also sees up to e: still a prefix of
the keys per row, read from the span tensor in the kernel as the Triton kernel does), any
positive softmax scale, o [b, h, Lq, 128]. Q/O are [b·h·Lq, 128] and K/V [b·hkv·Lk, 128]
2-D views under host TMA descriptors; a program finds its rows at (batch·h + head)·Lq and its kv
head's at (batch·hkv + head // (h / hkv))·Lk. Tails: a key tile past Lk reads the next head's rows
(or, past the tensor's end, TMA's zeros) and masks them out of the softmax (their P is 0, so the
P·V GEMM adds 0·V: finite values, as every head's are, add nothing); a query tile past Lq computes
rows nobody reads and writes only its rows below Lq (a masked store from registers; whole halves
go out by TMA). Rows that see no key (causal, Lq > Lk) write zeros. Grid (b·h, ⌈Lq / 128⌉), walked
in sections of 8 (batch·head)s, each section's query blocks last-first and its heads fastest: a
wave reads the K/V of 8 heads, and under a causal mask a section's heaviest blocks start first.

The form (warp-specialized, gl.warp_specialize): a producer (the default partition, 4 warps at 40
registers, one thread issuing) loads both 64-row halves of Q and streams K/V into STAGES-deep
shared-memory rings, waiting on per-slot "empty" mbarriers (count 2: one arrive per consumer);
two consumer partitions of 4 warps at 232 registers own 64 query rows each and take turns on the
tensor cores through two "turn" mbarriers: a consumer waits for its turn, issues its S and P·V
wgmma, hands the turn over, and runs its softmax while the other's GEMMs run (FA3's ping-pong,
with the intra-warpgroup overlap inside each consumer: S = Q·Kⱼᵀ and O += Pⱼ₋₁·Vⱼ₋₁ are issued
together, and softmax(Sⱼ) runs while the P·V GEMM does). P is converted to the input dtype in
registers and fed as the register A operand of the P·V wgmma. O goes out through shared memory
(Q's buffer) and TMA.

benchmarks/gluon_attention_probe.py compiles it offline for sm_90 and checks and times it beside
SDPA's cuDNN backend (there, with a pipelined form without warp specialization);
benchmarks/results/gluon_attention_h100_round41_G2.json holds the H100 run.
"""

from __future__ import annotations

import functools

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from omnitune.kernels._gluon_target import GLUON_FIXED, GLUON_HEAD_DIM, GLUON_TUNED, gluon_device_refusal
from omnitune.kernels._host import LOG2E
from omnitune.kernels._launch import BoundLauncher, DirectLauncher
from omnitune.kernels._tma_launch import TmaLaunch

# What the kernel is written for, as the attention spec states it (omnitune/kernels/_gluon_target.py)
HEAD_DIM = GLUON_HEAD_DIM
TILE_ROWS = GLUON_FIXED["BLOCK_M"]  # query rows per program: two consumers of 64
HALF_ROWS = TILE_ROWS // 2
LAUNCH_WARPS = GLUON_FIXED["num_warps"]  # the producer's (the consumers' 8 warps come on top)
KEY_TILES = GLUON_TUNED["BLOCK_N"]  # the wgmma instruction shapes the consumers' layouts are written for
# (batch·head)s a section of the launch order (_sectioned_program). On an H100, through the op, in
# graphs of 30 calls (sustained load): b1 h24/24 16k with no mask 1.04x SDPA's cuDNN against 0.92–
# 0.95x walking every head at once, b2 h28/4 3,000 causal 1.05x against 1.02x, issue 15's other
# shapes within ±0.02x of it or above; in short graphs one run of two had h32/4 16k with no mask at
# 0.97x against 1.01x. Sections of 1–2 lose under a causal mask (the heavy blocks no longer lead).
# benchmarks/results/gluon_head_groups_h100*.json
L2_SECTION = gl.constexpr(8)
MIN_STAGES = 2  # the ring must hold the tile a consumer's P·V still reads and the next one's K
GL_DTYPES = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}


# ------------------------------------------------------------------------------------------------
# Device code. _online_softmax and _tile_coords are shared with the probe's pipelined form.
# ------------------------------------------------------------------------------------------------


@gluon.jit
def _online_softmax(s, m_i, l_i, qk_scale, key_ends, start_n, MASKED: gl.constexpr):
    """One K/V tile's step of the online softmax, in the exp2 domain (m is kept scaled by
    qk_scale = sm_scale·log2(e), which must be positive: the row max is taken before scaling).
    Returns P (fp32, S's layout), the new row max, the new row sum and alpha, the factor the
    running O must be multiplied by (exp2(m_old - m_new)). MASKED: row r sees keys < key_ends[r]
    only; a row that has seen none keeps m = -inf, and its exponents are taken against 0 instead
    (no -inf - -inf: P and alpha come out 0). Unmasked tiles come only after a masked tile 0
    that every row of the block saw part of, so their m is finite."""
    if MASKED:
        k_cols = start_n + gl.arange(0, s.shape[1], layout=gl.SliceLayout(0, s.type.layout))
        s = gl.where(key_ends[:, None] > k_cols[None, :], s, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
        m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
        m_use = m_new
    p = gl.exp2(s * qk_scale - m_use[:, None])
    alpha = gl.exp2(m_i - m_use)
    l_i = l_i * alpha + gl.sum(p, 1)
    return p, m_new, l_i, alpha


@gluon.jit
def _sectioned_program(SECTION: gl.constexpr):
    """This program's (batch·head, query block), the launch order (program_id(0) fastest) walking
    the grid (b·h, ⌈LQ / BLOCK_M⌉) in sections of SECTION (batch·head)s: a section's query blocks,
    the last (under a causal mask, the heaviest) first and its heads fastest, before the next
    section's. A wave then reads the K/V of SECTION heads, not of every head at once: with no GQA
    and long keys, every head's K/V is several times the L2, and the DRAM traffic that costs slows
    the clocks under sustained load (FlashAttention-3 walks its heads in L2-sized sections too).
    The last section takes the heads left."""
    n_bh = gl.num_programs(0)
    n_qb = gl.num_programs(1)
    pid = gl.program_id(1) * n_bh + gl.program_id(0)  # < b·h·LQ / 128 < 2³¹ (shape_refusal)
    per_section = SECTION * n_qb
    section = pid // per_section
    first = section * SECTION
    heads = gl.minimum(SECTION, n_bh - first)
    r = pid - section * per_section
    return first + r % heads, n_qb - 1 - r // heads


@gluon.jit
def _tile_coords(pid_bh, q_block, LQ, LK, H, HKV, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                 CAUSAL: gl.constexpr):
    """What (batch·head, query block) pid_bh, q_block reads. Q/O are [b·h·LQ, d] and K/V
    [b·hkv·LK, d] 2-D views: the rows of (batch, head) start at (batch·h + head)·LQ, those of its
    kv head at (batch·hkv + head // (h / hkv))·LK. n_tiles: the key tiles the block reads (at least
    one: a block that sees no key masks tile 0 wholly and writes zeros); n_full: those every row of
    the block sees whole (tile 0 is masked regardless)."""
    off_m = q_block * BLOCK_M
    batch = pid_bh // H
    kv_head = (pid_bh % H) // (H // HKV)
    q_row = pid_bh * LQ + off_m  # TMA coordinates are 32-bit: shape_refusal keeps the rows below 2³¹
    kv_row = (batch * HKV + kv_head) * LK
    if CAUSAL:
        # row i sees keys < i + 1 + LK - LQ (bottom-right aligned), clamped to [0, LK]
        key_end = gl.minimum(off_m + BLOCK_M + LK - LQ, LK)
        n_tiles = gl.maximum(gl.cdiv(key_end, BLOCK_N), 1)
        n_full = gl.minimum(gl.maximum(off_m + 1 + LK - LQ, 0), LK) // BLOCK_N
    else:
        n_tiles = gl.cdiv(LK, BLOCK_N)
        n_full = LK // BLOCK_N
    return off_m, q_row, kv_row, n_tiles, n_full


@gluon.jit
def _key_ends(q_rows, LQ, LK, span_row, stride_ss, stride_se, NUM_SPANS, MASK: gl.constexpr):
    """Per query row, the end of the keys it sees (every mask here shows a row a prefix of the
    keys): MASK 0, LK; 1 (causal, bottom-right), i + 1 + LK − LQ clamped to [0, LK]; 2 (image
    spans), that or, for a row whose key position lies inside a span [start, end) of its
    sequence, end clamped to LK — the Triton kernel's MASK_MODE 2, the spans read here so that a
    call needs no host work. span_row: the sequence's spans [NUM_SPANS, 2]."""
    if MASK == 0:
        return gl.zeros_like(q_rows) + LK
    ends = gl.minimum(gl.maximum(q_rows + 1 + LK - LQ, 0), LK)
    if MASK == 2:
        key_pos = q_rows + LK - LQ
        for i in range(NUM_SPANS):
            start = gl.load(span_row + i * stride_ss)
            end = gl.minimum(gl.load(span_row + i * stride_ss + stride_se), LK)
            # in [0, LK] whatever the spans hold (int64 ones compare as loaded): 32 bits as the rest
            seen = gl.where((key_pos >= start) & (key_pos < end), gl.maximum(end, 0), 0)
            ends = gl.maximum(ends, seen.to(gl.int32))
    return ends


@gluon.jit
def _span_tiles(off_m, LQ, LK, span_row, stride_ss, stride_se, NUM_SPANS, BLOCK_M: gl.constexpr,
                BLOCK_N: gl.constexpr):
    """(n_tiles, n_full) of a block of rows under image spans: the tiles up to its rows' largest
    key end (at least one), and those below the smallest (rows past LQ left out), as the Triton
    kernel bounds its key loop (a span can reach past the causal diagonal)."""
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    rows = off_m + gl.arange(0, BLOCK_M, layout=layout)
    ends = _key_ends(rows, LQ, LK, span_row, stride_ss, stride_se, NUM_SPANS, 2)
    valid = rows < LQ
    n_tiles = gl.maximum(gl.cdiv(gl.max(gl.where(valid, ends, 0), 0), BLOCK_N), 1)
    n_full = gl.min(gl.where(valid, ends, LK), 0) // BLOCK_N
    return n_tiles, n_full


@gluon.jit
def _pingpong_producer(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty,
                       turn, q_row, kv_row, n_tiles, BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
    """The default partition (4 warps, one thread issuing): gives consumer 0 the first turn, loads
    both 64-row halves of Q, then streams K/V tiles into the ring, each slot once both consumers
    have released it (a fresh barrier passes a wait for parity 1: the first STAGES waits don't block)."""
    HALF: gl.constexpr = q_desc.block_type.shape[0]
    mbarrier.arrive(turn.index(0))
    mbarrier.expect(q_bar, 2 * q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [q_row, 0], q_bar, q_smem.index(0))
    tma.async_copy_global_to_shared(q_desc, [q_row + HALF, 0], q_bar, q_smem.index(1))
    for j in range(n_tiles):
        slot = j % STAGES
        empty_phase = ((j // STAGES) & 1) ^ 1
        row = kv_row + j * BLOCK_N
        mbarrier.wait(k_empty.index(slot), empty_phase)
        mbarrier.expect(k_ready.index(slot), k_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [row, 0], k_ready.index(slot), k_smem.index(slot))
        mbarrier.wait(v_empty.index(slot), empty_phase)
        mbarrier.expect(v_ready.index(slot), v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(v_desc, [row, 0], v_ready.index(slot), v_smem.index(slot))


@gluon.jit
def _pingpong_step(j, q, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, turn, acc, p_op, m_i, l_i, qk_scale,
                   key_ends, s_zero, ME: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                   MASKED: gl.constexpr):
    """A consumer's tile j ≥ 1 in FA3's intra-warpgroup overlap: S = Q·Kⱼᵀ and O += Pⱼ₋₁·Vⱼ₋₁ are
    issued together, in this consumer's turn only (then handed to the other, whose softmax ran
    meanwhile), and softmax(Sⱼ) runs while the P·V GEMM does. On entry O is scaled to mⱼ₋₁ and
    p_op = exp2(Sⱼ₋₁ - mⱼ₋₁); on exit O (now holding tile j-1's term) is scaled to mⱼ and the
    returned P is exp2(Sⱼ - mⱼ). Ring slots are released by an arrive on their empty barriers
    instead of a CTA-wide barrier."""
    o_layout: gl.constexpr = acc.type.layout
    p_layout: gl.constexpr = p_op.type.layout
    slot = j % STAGES
    prev = (j - 1) % STAGES
    mbarrier.wait(turn.index(ME), j & 1)
    mbarrier.wait(k_ready.index(slot), (j // STAGES) & 1)
    s_tok = warpgroup_mma(q, k_smem.index(slot).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    mbarrier.wait(v_ready.index(prev), ((j - 1) // STAGES) & 1)
    o_tok = warpgroup_mma(p_op, v_smem.index(prev), acc, is_async=True)
    mbarrier.arrive(turn.index(1 - ME))
    # wgmma groups retire in order: with one left in flight, S (issued first) is done
    s = warpgroup_mma_wait(1, deps=(s_tok,))
    mbarrier.arrive(k_empty.index(slot))
    p, m_i, l_i, alpha = _online_softmax(s, m_i, l_i, qk_scale, key_ends, j * BLOCK_N, MASKED)
    p_next = gl.convert_layout(p.to(q.dtype), p_layout)
    # p_op stays a dependency until the P·V GEMM reading its registers has retired
    acc, p_op = warpgroup_mma_wait(0, deps=(o_tok, p_op))
    mbarrier.arrive(v_empty.index(prev))
    acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout), assert_trivial=True)[:, None]
    return acc, p_next, m_i, l_i


@gluon.jit
def _pingpong_consumer(o_desc, o_ptr, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty, turn,
                       q_row, off_m, n_tiles, n_full, qk_scale, LQ, LK, span_row, stride_ss, stride_se, NUM_SPANS,
                       ME: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, MASK: gl.constexpr):
    """Consumer ME (a worker partition of 4 warps): query rows off_m + 64·ME .. + 63. Both
    consumers walk the same tiles (the CTA's; consumer 0 may mask one tile wholly), so they take
    the same number of turns: turn j of consumer ME waits on turn[ME] for parity j & 1."""
    HALF: gl.constexpr = q_smem.shape[1]
    HEAD_D: gl.constexpr = q_smem.shape[2]
    dtype: gl.constexpr = q_smem.dtype
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_D, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    q = q_smem.index(ME)
    q_rows = off_m + ME * HALF + gl.arange(0, HALF, layout=gl.SliceLayout(1, s_layout))
    key_ends = _key_ends(q_rows, LQ, LK, span_row, stride_ss, stride_se, NUM_SPANS, MASK)
    s_zero = gl.zeros([HALF, BLOCK_N], gl.float32, s_layout)
    m_i = gl.full([HALF], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([HALF], gl.float32, gl.SliceLayout(1, s_layout))
    acc = gl.zeros([HALF, HEAD_D], gl.float32, o_layout)
    mbarrier.wait(q_bar, 0)

    # turn 0: tile 0's S, always masked (harmless where every row sees it whole; a key tail, the
    # causal diagonal or a span's end may fall in it); its P·V is issued by the first step (or the tail)
    mbarrier.wait(turn.index(ME), 0)
    mbarrier.wait(k_ready.index(0), 0)
    s_tok = warpgroup_mma(q, k_smem.index(0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    mbarrier.arrive(turn.index(1 - ME))
    s = warpgroup_mma_wait(0, deps=(s_tok,))
    mbarrier.arrive(k_empty.index(0))
    p, m_i, l_i, alpha = _online_softmax(s, m_i, l_i, qk_scale, key_ends, 0, True)
    p_op = gl.convert_layout(p.to(dtype), p_layout)
    for j in range(1, n_full):
        acc, p_op, m_i, l_i = _pingpong_step(j, q, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, turn, acc,
                                             p_op, m_i, l_i, qk_scale, key_ends, s_zero, ME, BLOCK_N, STAGES, False)
    for j in range(gl.maximum(n_full, 1), n_tiles):
        acc, p_op, m_i, l_i = _pingpong_step(j, q, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, turn, acc,
                                             p_op, m_i, l_i, qk_scale, key_ends, s_zero, ME, BLOCK_N, STAGES, True)
    # turn n_tiles: the last tile's P·V (the other consumer's last arrive on turn[0] goes unwaited)
    last = n_tiles - 1
    mbarrier.wait(turn.index(ME), n_tiles & 1)
    mbarrier.wait(v_ready.index(last % STAGES), (last // STAGES) & 1)
    o_tok = warpgroup_mma(p_op, v_smem.index(last % STAGES), acc, is_async=True)
    mbarrier.arrive(turn.index(1 - ME))
    acc, p_op = warpgroup_mma_wait(0, deps=(o_tok, p_op))

    # O = acc / l (0 where a row saw no key: its acc is 0 too). A whole half goes out through this
    # consumer's half of Q's buffer (its last reader has retired) and TMA; a half that crosses LQ
    # stores its rows below LQ from registers, so that no row of the next head is written.
    l_o = gl.convert_layout(l_i, gl.SliceLayout(1, o_layout), assert_trivial=True)
    o = (acc / gl.where(l_o == 0.0, 1.0, l_o)[:, None]).to(dtype)
    first = off_m + ME * HALF
    if first + HALF <= LQ:
        q.store(o)
        fence_async_shared()
        gl.thread_barrier()
        tma.async_copy_shared_to_global(o_desc, [q_row + ME * HALF, 0], q)
        tma.store_wait(0)
    else:
        rows = gl.arange(0, HALF, layout=gl.SliceLayout(1, o_layout))
        cols = gl.arange(0, HEAD_D, layout=gl.SliceLayout(0, o_layout))
        offsets = (q_row.to(gl.int64) + ME * HALF + rows)[:, None] * HEAD_D + cols[None, :]
        gl.store(o_ptr + offsets, o, mask=(first + rows < LQ)[:, None])


@gluon.jit
def _attn_fwd_pingpong(q_desc, k_desc, v_desc, o_desc, o_ptr, spans, stride_sb, stride_ss, stride_se, NUM_SPANS,
                       LQ, LK, H, HKV, qk_scale,
                       BLOCK_N: gl.constexpr, STAGES: gl.constexpr, MASK: gl.constexpr):
    """A 128-row output tile per program over 12 warps: a producer (the default partition, 4
    warps) and two consumers of 4 warps and 64 rows each that take turns on the tensor cores.
    Q/O descriptors are 64-row blocks (a consumer's half); launch with num_warps=4. MASK: 0 none,
    1 causal, 2 causal with image spans [b, NUM_SPANS, 2] (spans: a placeholder otherwise)."""
    HALF: gl.constexpr = q_desc.block_type.shape[0]
    HEAD_D: gl.constexpr = q_desc.block_type.shape[1]
    dtype: gl.constexpr = q_desc.dtype
    gl.static_assert(HALF == 64, "each consumer owns 64 query rows")
    pid_bh, q_block = _sectioned_program(L2_SECTION)
    off_m, q_row, kv_row, n_tiles, n_full = _tile_coords(pid_bh, q_block, LQ, LK, H, HKV, 2 * HALF, BLOCK_N,
                                                         MASK != 0)
    span_row = spans + (pid_bh // H).to(gl.int64) * stride_sb
    if MASK == 2:
        n_tiles, n_full = _span_tiles(off_m, LQ, LK, span_row, stride_ss, stride_se, NUM_SPANS, 2 * HALF, BLOCK_N)

    q_smem = gl.allocate_shared_memory(dtype, [2, HALF, HEAD_D], q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_D], v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=2)  # one arrive per consumer
        mbarrier.init(v_empty.index(i), count=2)
    mbarrier.init(turn.index(0), count=1)
    mbarrier.init(turn.index(1), count=1)
    fence_async_shared()
    gl.thread_barrier()  # every warp sees initialised barriers before any waits on one

    gl.warp_specialize([
        (_pingpong_producer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty,
                              v_empty, turn, q_row, kv_row, n_tiles, BLOCK_N, STAGES)),
        (_pingpong_consumer, (o_desc, o_ptr, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty,
                              turn, q_row, off_m, n_tiles, n_full, qk_scale, LQ, LK, span_row, stride_ss, stride_se,
                              NUM_SPANS, 0, BLOCK_N, STAGES, MASK)),
        (_pingpong_consumer, (o_desc, o_ptr, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty,
                              turn, q_row, off_m, n_tiles, n_full, qk_scale, LQ, LK, span_row, stride_ss, stride_se,
                              NUM_SPANS, 1, BLOCK_N, STAGES, MASK)),
    ], [4, 4], [232, 232])


# ------------------------------------------------------------------------------------------------
# Host
# ------------------------------------------------------------------------------------------------


class PingpongRefused(ValueError):
    """Tensors (or a device) the ping-pong kernel cannot take: the op runs the call with its own
    Triton kernel instead. No OmnituneError: in a search it is the trial's failure, not the
    search's (omnitune.measure.runner lets those through)."""


def shape_refusal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str | None:
    """Why the kernel does not compute this problem (shapes and dtypes only, no device), or None."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return f"q, k, v must be [b, heads, L, d]; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
    b, h, lq, d = q.shape
    if k.shape != v.shape or k.shape[0] != b or k.shape[3] != d:
        return (f"k and v must be [b, hkv, Lk, d] as q [b, h, Lq, d]; got q {tuple(q.shape)}, "
                f"k {tuple(k.shape)}, v {tuple(v.shape)}")
    if d != HEAD_DIM:
        return f"head dim must be {HEAD_DIM}, got {d}"
    hkv = k.shape[1]
    if q.numel() == 0 or k.numel() == 0:
        return f"q, k, v must not be empty; got {tuple(q.shape)}, {tuple(k.shape)}"
    if h % hkv:
        return f"query heads ({h}) must be a multiple of kv heads ({hkv})"
    if max(b * h * lq, b * hkv * k.shape[2]) >= 2**31:
        return f"more than 2³¹ rows of q or k (TMA coordinates are 32-bit); got {tuple(q.shape)}, {tuple(k.shape)}"
    if q.dtype not in GL_DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        return f"q, k, v must all be bf16 or all fp16; got {q.dtype}, {k.dtype}, {v.dtype}"
    return None


def _tma_ready(t: torch.Tensor) -> bool:
    """Contiguous in [b, heads, L, d] order (the kernel reads it as a [rows, d] view) at a
    16-byte aligned address (a TMA descriptor's base)."""
    return t.is_contiguous() and t.data_ptr() % 16 == 0


def refusal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, sm_scale: float,
            spans: torch.Tensor | None = None) -> str | None:
    """Why this call cannot run on the kernel (one line), or None: what the attention op checks
    per call before it launches, falling back to its Triton kernel on a reason. spans: the op's
    span tensor [b, S, 2] (int32 or int64, on q's device), its values unchecked as there."""
    if spans is not None and (spans.dim() != 3 or spans.shape[0] != q.shape[0] or spans.shape[2] != 2
                              or spans.dtype not in (torch.int32, torch.int64) or spans.device != q.device):
        return f"spans must be an int32/int64 [b, S, 2] tensor on q's device, got {tuple(spans.shape)} {spans.dtype}"
    why = shape_refusal(q, k, v)
    if why is not None:
        return why
    why = gluon_device_refusal(q)
    if why is not None:
        return why
    if k.device != q.device or v.device != q.device or out.device != q.device:
        return f"q, k, v and out must be on one device; got {q.device}, {k.device}, {v.device}, {out.device}"
    if not (_tma_ready(q) and _tma_ready(k) and _tma_ready(v)):
        return "q, k, v must be contiguous [b, heads, L, d] tensors at 16-byte aligned addresses"
    if out.shape != q.shape or out.dtype != q.dtype or not _tma_ready(out):
        return f"out must be a contiguous {tuple(q.shape)} {q.dtype} tensor at a 16-byte aligned address"
    if not sm_scale > 0:
        # the row max is taken before scaling (_online_softmax), and 0·(-inf) is NaN under a mask
        return f"sm_scale must be positive, got {sm_scale}"
    return None


@functools.cache
def _shared_layout(rows: int, d: int, dtype: torch.dtype):
    return gl.NVMMASharedLayout.get_default_for([rows, d], GL_DTYPES[dtype])


def descriptor(t: torch.Tensor, rows: int) -> TensorDescriptor:
    """A TMA descriptor of contiguous `t` as a 2-D [rows of all heads, d] view, moving `rows` rows
    a block (a 128-wide row block moves as two 64-column boxes: a 128-byte swizzle bounds a box's
    inner dimension). The view's shape and strides are given, not taken from a view op: TMA reads
    only the base address of the tensor, which `refusal` has checked is contiguous."""
    d = t.shape[-1]
    return TensorDescriptor(t, [t.numel() // d, d], [d, 1], [rows, d], _shared_layout(rows, d, t.dtype))


def _launch_parts(q, k, v, out, sm_scale: float, block_n: int, spans) -> tuple[tuple, tuple]:
    """(grid, runtime arguments) of one launch, each descriptor given as its view, (tensor, box
    rows): Q/O in 64-row halves (one per consumer), K/V in block_n-row tiles; then out also as a
    pointer (a tail half's masked store), the spans and their strides (out and zeros where there
    are none: never read) and the plain values."""
    b, h, lq, _ = q.shape
    span_args = (out, 0, 0, 0, 0) if spans is None else (spans, *spans.stride(), spans.shape[1])
    return (b * h, triton.cdiv(lq, TILE_ROWS), 1), ((q, HALF_ROWS), (k, block_n), (v, block_n), (out, HALF_ROWS),
                                                   out, *span_args, lq, k.shape[2], h, k.shape[1], sm_scale * LOG2E)


def _mask(causal: bool, spans) -> int:
    return 2 if spans is not None else int(bool(causal))


def _constexprs(block_n: int, stages: int, mask: int) -> dict:
    return dict(BLOCK_N=block_n, STAGES=stages, MASK=mask, num_warps=LAUNCH_WARPS)


def pingpong_launch_args(q, k, v, out, causal: bool, sm_scale: float, block_n: int, stages: int, spans=None):
    """(kernel, grid, positional args, keyword args) of one launch, nothing checked: q/k/v/out
    contiguous. The probe launches and compiles from these (offline too)."""
    grid, args = _launch_parts(q, k, v, out, sm_scale, block_n, spans)
    descriptors = tuple(descriptor(tensor, rows) for tensor, rows in args[:_DESCRIPTORS])
    return _attn_fwd_pingpong, grid, (*descriptors, *args[_DESCRIPTORS:]), _constexprs(block_n, stages,
                                                                                      _mask(causal, spans))


# Launched as the Triton kernels are (omnitune/kernels/_launch.py): the JIT's launch path re-binds
# and re-specialises every argument on every call, most of a call's host time; the first call of
# each (tile, stages, mask, argument kinds and shapes) takes it, later ones call the C launcher,
# with each view's encoded tensor map kept (omnitune/kernels/_tma_launch.py).
_PINGPONG = DirectLauncher(_attn_fwd_pingpong)
_DESCRIPTORS = 4  # Q, K, V, O
_OBJECTS = _DESCRIPTORS + 2  # the descriptors, out and the spans, ahead of the plain arguments


@functools.cache
def _bound(block_n: int, stages: int, mask: int) -> BoundLauncher:
    return _PINGPONG.bind(_constexprs(block_n, stages, mask), _OBJECTS)


@functools.cache
def _launcher(block_n: int, stages: int, mask: int) -> TmaLaunch:
    return TmaLaunch(_bound(block_n, stages, mask), descriptor, tuple(range(_DESCRIPTORS)))


def launch_pingpong(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, causal: bool,
                    sm_scale: float, block_n: int, stages: int, spans: torch.Tensor | None = None) -> None:
    """softmax(q·kᵀ·sm_scale, causal (bottom-right) or not)·v written into `out` [b, h, Lq, 128]
    (q's shape and dtype, contiguous); spans [b, S, 2]: image spans on top of the causal mask (as
    the op's mm_spans; causal must be set). PingpongRefused, before any GPU work, for a call
    `refusal` turns down or a tile the kernel is not written for (block_n 64 or 128, at least 2
    stages; whether the stages fit in shared memory is the attention spec's constraint)."""
    if spans is not None and spans.shape[1] == 0:
        spans = None  # no span: the plain causal mask
    if spans is not None and not causal:
        raise PingpongRefused("gluon_pingpong: image spans only change a causal mask")
    why = refusal(q, k, v, out, sm_scale, spans)
    if why is None and (block_n not in KEY_TILES or stages < MIN_STAGES):
        why = f"block_n must be one of {KEY_TILES} and stages at least {MIN_STAGES}; got {block_n}, {stages}"
    if why is not None:
        raise PingpongRefused(f"gluon_pingpong: {why}")
    grid, args = _launch_parts(q, k, v, out, sm_scale, block_n, spans)
    _launcher(block_n, stages, _mask(causal, spans))(grid, args)

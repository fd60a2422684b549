"""A FlashAttention-3-style forward for Hopper (sm_90) written in Gluon (triton.experimental.gluon,
shipped with Triton 3.6), as a probe: checked against PyTorch SDPA and timed beside SDPA's cuDNN
backend on one GPU run. docs/hopper.md (Findings, row 6) found that plain Triton 3.6 cannot express
ping-pong of two consumer warpgroups nor a warp-specialized loop that completes on sm_90; Gluon
writes both by hand.

Problem: q [b, h, L, 128], k/v [b, hkv, L, 128] (GQA: h % hkv == 0), bf16 or fp16, causal or not
(Lq = Lk, so top-left = bottom-right), softmax scale 1/sqrt(128), o [b, h, L, 128]. L must be a
multiple of 128 for form (a), which masks no tail (anything else is a ValueError, raised before any
GPU work); the library's ping-pong kernel, launched here too, takes any lengths (docs/ops.md).
Q/O are [b·h·L, 128] and K/V [b·hkv·L, 128] 2-D views under host TMA descriptors; a program finds
its kv head's rows as (batch·hkv + head // (h / hkv))·L. Grid (b·h, L / BLOCK_M), heads fastest and
query blocks last-first: under a causal mask the heaviest blocks start first.

Two forms (Variant.form):

a. "pipelined", no warp specialization: BLOCK_M = 128 over 8 warps (two warpgroups of 64 rows,
   NVMMADistributedLayout [3, 0] with warps [8, 1]) or 64 over 4. Q arrives once by TMA; K and V
   tiles stream through a STAGES-deep shared-memory ring each, every slot with an mbarrier the TMA
   completes (expect = the tile's bytes; the wait's parity flips at every wrap of the ring). With
   `overlap` (FA3's intra-warpgroup overlap) S = Q·Kⱼᵀ and O += Pⱼ₋₁·Vⱼ₋₁ are issued together as
   async wgmma, softmax(Sⱼ) runs while the P·V GEMM does (warpgroup_mma_wait(1) retires S first),
   then O is rescaled; without it (the "serial" rows) the order is FA2's. P is converted to the
   input dtype in registers and fed as the register A operand of the P·V wgmma. Causal: the tiles
   wholly below the diagonal run unmasked, then the diagonal tiles masked. TMA is issued by one
   thread of the CTA, so a slot is refilled after a CTA barrier, once both warpgroups are past it.
b. "pingpong", warp-specialized (gl.warp_specialize): a producer (the default partition, 4 warps
   at 40 registers, one thread issuing) loads both 64-row halves of Q and streams K/V into the
   rings, waiting on per-slot "empty" mbarriers (count 2: one arrive per consumer); two consumer
   partitions of 4 warps at 232 registers own 64 query rows each and take turns on the tensor
   cores through two "turn" mbarriers: a consumer waits for its turn, issues its S and P·V
   wgmma, hands the turn over, and runs its softmax while the other's GEMMs run (FA3's ping-pong,
   with the intra-warpgroup overlap inside each consumer). O goes out through shared memory
   (Q's buffer) and TMA in both forms. This form is the library's now
   (omnitune/kernels/attention_gluon.py, the attention op's BACKEND=gluon_pingpong), as are the
   pieces both forms share; the probe launches it through that module's pingpong_launch_args.

    python benchmarks/gluon_attention_probe.py --offline-compile --out /tmp/gluon_offline.json   # no GPU
    python benchmarks/gluon_attention_probe.py --out $OUT/gluon_attention_probe.json              # the GPU run
    python benchmarks/gluon_attention_probe.py --quick --variants pipelined_m128_n64_s3           # a subset

The GPU run, per shape (b1, h32/hkv4 and h24/24, L 8192 and 16384, causal and not; --quick: h32/4
L8192 only): each variant checked on two fresh random inputs against SDPA in fp32 math (output
poisoned with NaN first; pass: all finite and relative RMS error < 1e-2; max abs error recorded),
then every passing variant, SDPA cuDNN and omnitune's own attention kernel (its tables' nearest Triton
config, `library_call`) timed as CUDA-graph replays interleaved in rounds
(median): TFLOP/s (4·b·h·L²·d, halved when causal) and the ratio to cuDNN. A failing variant is
one line in its row. The JSON is rewritten after every shape. There is no hang guard: a variant
that never completes stops the run (leave it out with --variants).

Compiled offline for sm_90 (Triton 3.6.0, GPUTarget("cuda", 90, 32), signatures specialised as a
b1 h32/4 launch; registers from ptxas, non-causal / causal). Measured on an H100 (round 41,
docs/results.md): ping-pong at 128-key tiles 1.00–1.13x cuDNN on the eight shapes; the H200 not yet.

| variant | warps | registers | shared (B) |
|---|---:|---:|---:|
| serial_m128_n64_s2 | 8 | 124 / 128 | 98344 |
| pipelined_m128_n64_s2 | 8 | 138 / 148 | 98344 |
| pipelined_m128_n64_s3 | 8 | 138 / 148 | 131144 |
| pipelined_m128_n128_s2 | 8 | 188 / 211 | 163880 |
| pipelined_m128_n128_s3 | 8 | 186 / 209 | 229448 |
| pipelined_m64_n64_s2 | 4 | 138 / 158 | 81960 |
| pingpong_m128_n64_s2 | 12 | 168 → 40 / 232 | 98576 / 98592 |
| pingpong_m128_n64_s3 | 12 | 168 → 40 / 232 | 131408 / 131424 |
| pingpong_m128_n128_s2 | 12 | 168 → 40 / 232 | 164112 / 164128 |

Every variant compiles, each under sm_90's 232448 bytes of shared memory, with no stack, no local
memory and no ptxas warning (in particular no wgmma serialised for a register hazard, which would
silently undo the overlap). The PTX has wgmma.mma_async (m64n64k16 / m64n128k16; the overlap forms
wait_group 1, then 0), cp.async.bulk.tensor loads and stores (a 128-wide row block moves as two
64-column boxes: a 128-byte swizzle bounds a box's inner dimension) and mbarrier.try_wait loops.
Ping-pong's setmaxnreg takes the producer to 40 registers and the consumers to 232; its partitions
synchronise only through mbarriers and warpgroup-local named barriers (bar.sync 2/3, 128). Form (a)
synchronises its whole CTA often: besides the two CTA barriers per key tile the kernel asks for
(its TMA is issued by one thread), the compiler puts a CTA-wide bar.sync between each
mbarrier.expect and its TMA copy and one at the top of the loop: 5 per key tile in
pipelined_m128_n64_s3's loop. Nothing tried failed to compile.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from omnitune.kernels._host import LOG2E
from omnitune.kernels.attention_gluon import (  # what both forms share lives once, in the library
    HEAD_DIM,
    _online_softmax,
    _tile_coords,
    descriptor,
    pingpong_launch_args,
    shape_refusal,
)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hopper_probe_timing import Shape, write_json  # noqa: E402  (Shape: b, h, L, causal, hkv)

# ------------------------------------------------------------------------------------------------
# Form (a)'s own piece (the pieces both forms share, _online_softmax and _tile_coords, are the
# library's: omnitune/kernels/attention_gluon.py)
# ------------------------------------------------------------------------------------------------


@gluon.jit
def _load_tile(desc, smem, bars, kv_row, tile, n_tiles, BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
    """TMA load of K (or V) tile `tile` into its ring slot, completing the slot's barrier; skipped
    (predicated off) past the last tile. K and V have a ring and barriers each, so a K slot is
    refilled as soon as Q·Kᵀ is done with it and S can start before V lands."""
    slot = tile % STAGES
    pred = tile < n_tiles
    mbarrier.expect(bars.index(slot), desc.block_type.nbytes, pred=pred)
    tma.async_copy_global_to_shared(desc, [kv_row + tile * BLOCK_N, 0], bars.index(slot), smem.index(slot), pred=pred)


# ------------------------------------------------------------------------------------------------
# Form (a): pipelined, no warp specialization
# ------------------------------------------------------------------------------------------------


@gluon.jit
def _serial_step(j, q_smem, k_smem, v_smem, k_bars, v_bars, k_desc, v_desc, kv_row, n_tiles,
                 acc, m_i, l_i, qk_scale, key_ends, s_zero,
                 BLOCK_N: gl.constexpr, STAGES: gl.constexpr, MASKED: gl.constexpr):
    """Tile j in FA2's order: S = Q·Kⱼᵀ, softmax, O = O·alpha + P·Vⱼ, each GEMM waited for at once."""
    o_layout: gl.constexpr = acc.type.layout
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    slot = j % STAGES
    phase = (j // STAGES) & 1
    mbarrier.wait(k_bars.index(slot), phase)
    s = warpgroup_mma(q_smem, k_smem.index(slot).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    s = warpgroup_mma_wait(0, deps=(s,))
    # TMA is issued by one thread of the CTA: the slot is refilled once both warpgroups are past it
    gl.thread_barrier()
    _load_tile(k_desc, k_smem, k_bars, kv_row, j + STAGES, n_tiles, BLOCK_N, STAGES)
    p, m_i, l_i, alpha = _online_softmax(s, m_i, l_i, qk_scale, key_ends, j * BLOCK_N, MASKED)
    acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout), assert_trivial=True)[:, None]
    p_op = gl.convert_layout(p.to(k_desc.dtype), p_layout)
    mbarrier.wait(v_bars.index(slot), phase)
    acc = warpgroup_mma(p_op, v_smem.index(slot), acc, is_async=True)
    acc, p_op = warpgroup_mma_wait(0, deps=(acc, p_op))
    gl.thread_barrier()
    _load_tile(v_desc, v_smem, v_bars, kv_row, j + STAGES, n_tiles, BLOCK_N, STAGES)
    return acc, m_i, l_i


@gluon.jit
def _overlap_step(j, q_smem, k_smem, v_smem, k_bars, v_bars, k_desc, v_desc, kv_row, n_tiles,
                  acc, p_op, m_i, l_i, qk_scale, key_ends, s_zero,
                  BLOCK_N: gl.constexpr, STAGES: gl.constexpr, MASKED: gl.constexpr):
    """Tile j ≥ 1 in FA3's intra-warpgroup overlap: S = Q·Kⱼᵀ and O += Pⱼ₋₁·Vⱼ₋₁ are issued
    together and softmax(Sⱼ) runs while the P·V GEMM does. On entry O is scaled to mⱼ₋₁ and
    p_op = exp2(Sⱼ₋₁ - mⱼ₋₁); on exit O (now holding tile j-1's term) is scaled to mⱼ and the
    returned P is exp2(Sⱼ - mⱼ)."""
    o_layout: gl.constexpr = acc.type.layout
    p_layout: gl.constexpr = p_op.type.layout
    slot = j % STAGES
    prev = (j - 1) % STAGES
    mbarrier.wait(k_bars.index(slot), (j // STAGES) & 1)
    s_tok = warpgroup_mma(q_smem, k_smem.index(slot).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    mbarrier.wait(v_bars.index(prev), ((j - 1) // STAGES) & 1)
    o_tok = warpgroup_mma(p_op, v_smem.index(prev), acc, is_async=True)
    # wgmma groups retire in order: with one left in flight, S (issued first) is done
    s = warpgroup_mma_wait(1, deps=(s_tok,))
    gl.thread_barrier()  # Kⱼ is done in both warpgroups (TMA is issued by one thread of the CTA)
    _load_tile(k_desc, k_smem, k_bars, kv_row, j + STAGES, n_tiles, BLOCK_N, STAGES)
    p, m_i, l_i, alpha = _online_softmax(s, m_i, l_i, qk_scale, key_ends, j * BLOCK_N, MASKED)
    p_next = gl.convert_layout(p.to(k_desc.dtype), p_layout)
    # p_op stays a dependency until the P·V GEMM reading its registers has retired
    acc, p_op = warpgroup_mma_wait(0, deps=(o_tok, p_op))
    acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout), assert_trivial=True)[:, None]
    gl.thread_barrier()  # so is Vⱼ₋₁
    _load_tile(v_desc, v_smem, v_bars, kv_row, j - 1 + STAGES, n_tiles, BLOCK_N, STAGES)
    return acc, p_next, m_i, l_i


@gluon.jit
def _attn_fwd_pipelined(q_desc, k_desc, v_desc, o_desc, L, H, HKV, qk_scale,
                        BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
                        OVERLAP: gl.constexpr):
    """One [BLOCK_M, d] output tile per program, BLOCK_M / 16 warps (one warpgroup per 64 query
    rows; each issues its own wgmma). Q arrives once by TMA; K/V tiles stream through a
    STAGES-deep ring of shared-memory slots, each with an mbarrier that the TMA completes; a slot
    is refilled once every warp is past the GEMMs that read it."""
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[0]
    HEAD_D: gl.constexpr = q_desc.block_type.shape[1]
    dtype: gl.constexpr = q_desc.dtype
    NUM_WARPS: gl.constexpr = gl.num_warps()
    gl.static_assert(BLOCK_M == 16 * NUM_WARPS, "one warpgroup per 64 query rows")
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NUM_WARPS, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NUM_WARPS, 1],
                                                       instr_shape=[16, HEAD_D, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)

    # heads fastest, query blocks last-first (the order this form was measured in)
    off_m, q_row, kv_row, n_tiles, n_full = _tile_coords(gl.program_id(0), gl.num_programs(1) - 1 - gl.program_id(1),
                                                         L, L, H, HKV, BLOCK_M, BLOCK_N, CAUSAL)

    q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_D], q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_D], v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_bars.index(i), count=1)
        mbarrier.init(v_bars.index(i), count=1)
    fence_async_shared()
    gl.thread_barrier()  # every warp sees initialised barriers before any waits on one

    mbarrier.expect(q_bar, q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [q_row, 0], q_bar, q_smem)
    for i in gl.static_range(STAGES):
        _load_tile(k_desc, k_smem, k_bars, kv_row, i, n_tiles, BLOCK_N, STAGES)
        _load_tile(v_desc, v_smem, v_bars, kv_row, i, n_tiles, BLOCK_N, STAGES)

    # the causal mask's key ends (Lq = Lk here: row i sees keys < i + 1); tile 0 is masked only when causal
    key_ends = off_m + 1 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([BLOCK_M], gl.float32, gl.SliceLayout(1, s_layout))
    acc = gl.zeros([BLOCK_M, HEAD_D], gl.float32, o_layout)
    mbarrier.wait(q_bar, 0)

    if OVERLAP:
        # tile 0's S and softmax; its P·V is issued by the first step (or the tail). The mask is
        # applied whenever causal: on a tile below the diagonal it changes nothing.
        mbarrier.wait(k_bars.index(0), 0)
        s = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        s = warpgroup_mma_wait(0, deps=(s,))
        gl.thread_barrier()
        _load_tile(k_desc, k_smem, k_bars, kv_row, STAGES, n_tiles, BLOCK_N, STAGES)
        p, m_i, l_i, alpha = _online_softmax(s, m_i, l_i, qk_scale, key_ends, 0, CAUSAL)
        p_op = gl.convert_layout(p.to(dtype), p_layout)
        for j in range(1, n_full):
            acc, p_op, m_i, l_i = _overlap_step(j, q_smem, k_smem, v_smem, k_bars, v_bars, k_desc, v_desc, kv_row,
                                                n_tiles, acc, p_op, m_i, l_i, qk_scale, key_ends, s_zero,
                                                BLOCK_N, STAGES, False)
        for j in range(gl.maximum(n_full, 1), n_tiles):
            acc, p_op, m_i, l_i = _overlap_step(j, q_smem, k_smem, v_smem, k_bars, v_bars, k_desc, v_desc, kv_row,
                                                n_tiles, acc, p_op, m_i, l_i, qk_scale, key_ends, s_zero,
                                                BLOCK_N, STAGES, True)
        last = n_tiles - 1
        mbarrier.wait(v_bars.index(last % STAGES), (last // STAGES) & 1)
        acc = warpgroup_mma(p_op, v_smem.index(last % STAGES), acc, is_async=True)
        acc, p_op = warpgroup_mma_wait(0, deps=(acc, p_op))
    else:
        for j in range(0, n_full):
            acc, m_i, l_i = _serial_step(j, q_smem, k_smem, v_smem, k_bars, v_bars, k_desc, v_desc, kv_row, n_tiles,
                                         acc, m_i, l_i, qk_scale, key_ends, s_zero, BLOCK_N, STAGES, False)
        for j in range(n_full, n_tiles):
            acc, m_i, l_i = _serial_step(j, q_smem, k_smem, v_smem, k_bars, v_bars, k_desc, v_desc, kv_row, n_tiles,
                                         acc, m_i, l_i, qk_scale, key_ends, s_zero, BLOCK_N, STAGES, True)

    # O = acc / l, through shared memory (Q's buffer: every GEMM reading it has retired) and TMA
    l_o = gl.convert_layout(l_i, gl.SliceLayout(1, o_layout), assert_trivial=True)
    q_smem.store((acc / l_o[:, None]).to(dtype))
    fence_async_shared()
    gl.thread_barrier()
    tma.async_copy_shared_to_global(o_desc, [q_row, 0], q_smem)
    tma.store_wait(0)


# ------------------------------------------------------------------------------------------------
# Form (b): warp-specialized ping-pong, the library's (omnitune/kernels/attention_gluon.py:
# _attn_fwd_pingpong, attention's BACKEND=gluon_pingpong), launched here through its host helper
# ------------------------------------------------------------------------------------------------


# ------------------------------------------------------------------------------------------------
# Host
# ------------------------------------------------------------------------------------------------

FORMS = ("pipelined", "pingpong")


@dataclass(frozen=True)
class Variant:
    form: str          # "pipelined" (form a) or "pingpong" (form b)
    block_m: int
    block_n: int
    stages: int
    overlap: bool = True  # pipelined only: FA3's intra-warpgroup overlap (else FA2's serial order)

    @property
    def name(self) -> str:
        form = self.form if self.form == "pingpong" or self.overlap else "serial"
        return f"{form}_m{self.block_m}_n{self.block_n}_s{self.stages}"

    @property
    def num_warps(self) -> int:
        """The launch's num_warps: a warpgroup per 64 rows; ping-pong's default partition (the
        consumers' 8 warps come on top)."""
        return 4 if self.form == "pingpong" else self.block_m // 16


def _validate(q, k, v, block_m: int, block_n: int, stages: int, form: str) -> None:
    """Everything gluon_attention refuses, checked before any GPU work (it runs on CPU tensors):
    the problem's limits are the library's (shape_refusal), the tiles each form's."""
    if form not in FORMS:
        raise ValueError(f"form must be one of {FORMS}, not {form!r}")
    why = shape_refusal(q, k, v)
    if why is not None:
        raise ValueError(why)
    L = q.shape[2]
    if form != "pingpong" and (k.shape[2] != L or L % 128):
        # form (a) masks no tail: its Q/O and K/V views would read (and write) the next head's rows
        raise ValueError(f"{form}: Lq = Lk, a multiple of 128 (no tail masking); got Lq {L}, Lk {k.shape[2]}")
    if block_m not in (64, 128) or block_n not in (64, 128) or stages < 1:
        raise ValueError(f"block_m and block_n must be 64 or 128 and stages ≥ 1; got {block_m}, {block_n}, {stages}")
    if form == "pingpong" and (block_m != 128 or stages < 2):
        raise ValueError("pingpong: block_m must be 128 (two consumers of 64 rows) and stages ≥ 2")


def _launch_args(q, k, v, out, causal: bool, variant: Variant):
    """(kernel, grid, positional args, keyword args) of one launch: q/k/v/out as 2-D [rows, d]
    views under TMA descriptors; softmax scale 1/sqrt(d). Ping-pong's are the library's."""
    b, h, L, d = q.shape
    sm_scale = 1.0 / math.sqrt(d)
    if variant.form == "pingpong":
        return pingpong_launch_args(q, k, v, out, causal, sm_scale, variant.block_n, variant.stages)
    descs = (descriptor(q, variant.block_m), descriptor(k, variant.block_n), descriptor(v, variant.block_n),
             descriptor(out, variant.block_m))
    grid = (b * h, L // variant.block_m)
    constexprs = dict(BLOCK_N=variant.block_n, STAGES=variant.stages, CAUSAL=bool(causal), OVERLAP=variant.overlap)
    return (_attn_fwd_pipelined, grid, (*descs, L, h, k.shape[1], sm_scale * LOG2E),
            dict(constexprs, num_warps=variant.num_warps))


def run_variant(variant: Variant, q, k, v, out, causal: bool) -> None:
    """One launch of `variant` writing `out` (q's shape and dtype, contiguous); inputs validated."""
    _validate(q, k, v, variant.block_m, variant.block_n, variant.stages, variant.form)
    if out.shape != q.shape or out.dtype != q.dtype or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous {tuple(q.shape)} {q.dtype} tensor")
    kernel, grid, args, kwargs = _launch_args(q.contiguous(), k.contiguous(), v.contiguous(), out, causal, variant)
    kernel[grid](*args, **kwargs)


def gluon_attention(q, k, v, causal: bool, *, block_m: int = 128, block_n: int = 64, stages: int = 3,
                    form: str = "pipelined", overlap: bool = True) -> torch.Tensor:
    """softmax(q·kᵀ/√d, causal or not) · v for q [b, h, L, 128] and k/v [b, hkv, L, 128] (GQA:
    h % hkv == 0), bf16 or fp16, L a multiple of 128: o [b, h, L, 128] in q's dtype. The inputs
    are checked (ValueError) before anything touches a GPU; the launch needs an sm_90 GPU."""
    _validate(q, k, v, block_m, block_n, stages, form)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    run_variant(Variant(form, block_m, block_n, stages, overlap), q, k, v, out, causal)
    return out


# Shared memory is Q (BLOCK_M·d) plus STAGES K and V tiles (BLOCK_N·d each) in bf16, plus barriers;
# every config here fits sm_90's 232448 bytes per block (offline_compile reports each).
VARIANTS = [
    Variant("pipelined", 128, 64, 2, overlap=False),  # FA2's order: the plain reference point
    Variant("pipelined", 128, 64, 2),
    Variant("pipelined", 128, 64, 3),
    Variant("pipelined", 128, 128, 2),
    Variant("pipelined", 128, 128, 3),
    Variant("pipelined", 64, 64, 2),                   # 4 warps, ~82 KB: two programs per SM
    Variant("pingpong", 128, 64, 2),
    Variant("pingpong", 128, 64, 3),
    Variant("pingpong", 128, 128, 2),
    Variant("pingpong", 128, 128, 3),
]
SMEM_LIMIT = 232448  # sm_90's shared memory per block


# ------------------------------------------------------------------------------------------------
# Offline compile (no GPU)
# ------------------------------------------------------------------------------------------------


def _ptxas_notes(ptx: str) -> list[str]:
    """ptxas's warnings for this PTX (e.g. wgmma serialised because of a register hazard, which
    would silently undo the overlap): Triton discards ptxas's log unless a compile fails."""
    import subprocess
    import tempfile

    from cubin import BIN

    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        done = subprocess.run([os.path.join(BIN, "ptxas"), "-v", "--gpu-name=sm_90a", src, "-o", src + ".o"],
                              capture_output=True, text=True)
    return [line.strip() for line in done.stderr.splitlines()
            if "warning" in line.lower() or "serialized" in line or ("spill" in line and " 0 bytes spill" not in line)]


def compile_offline(variant: Variant, causal: bool):
    """`variant` compiled for sm_90 as a launch on b1 h32/hkv4 would specialise it (CPU tensors
    stand in for the GPU's: only dtype, shape and alignment count)."""
    import triton
    from hopper_features_offline import TARGET, _specialised_source
    from triton.experimental.gluon._runtime import GluonASTSource

    q = torch.empty(1, 32, 256, HEAD_DIM, dtype=torch.bfloat16)
    kv = torch.empty(1, 4, 256, HEAD_DIM, dtype=torch.bfloat16)
    kernel, _, args, kwargs = _launch_args(q, kv, kv, q, causal, variant)
    num_warps = kwargs.pop("num_warps")
    src = _specialised_source(kernel, args, kwargs)
    src = GluonASTSource(kernel, src.signature, src.constants, src.attrs)
    return triton.compile(src, target=TARGET, options={"num_warps": num_warps})


def offline_compile(variants=None) -> list[dict]:
    """Every variant, causal and not, compiled for sm_90: a row each, compiled or the compiler's
    one line; registers (ptxas, per thread: a warp-specialized kernel's starting count, then
    setmaxnreg), stack, shared memory, warps, and what the PTX holds."""
    import re

    from hopper_probe_evidence import evidence
    from hopper_probe_timing import _one_line

    rows = []
    for variant in variants or VARIANTS:
        for causal in (False, True):
            row = dict(variant=variant.name, causal=causal, **asdict(variant), launch_num_warps=variant.num_warps)
            started = time.perf_counter()
            try:
                kernel = compile_offline(variant, causal)
            except Exception as exc:  # the compiler's complaint is the finding
                row.update(compiled=False, error=_one_line(exc))
            else:
                e = evidence(kernel)
                ptx = kernel.asm["ptx"]
                row.update(compiled=True, registers=e["registers"], stack_bytes=e["stack_bytes"],
                           shared_bytes=e["shared_bytes"], fits_smem=e["shared_bytes"] <= SMEM_LIMIT,
                           num_warps_total=e["num_warps_total"], setmaxnreg=e["setmaxnreg"],
                           wgmma=e["ptx"]["wgmma.mma_async"], wgmma_shapes=e["wgmma_shapes"],
                           wgmma_wait_groups=sorted(set(re.findall(r"wgmma\.wait_group\.sync\.aligned (\d+)", ptx))),
                           tma_loads=len(re.findall(r"cp\.async\.bulk\.tensor\.\dd\.shared::cluster\.global", ptx)),
                           tma_stores=len(re.findall(r"cp\.async\.bulk\.tensor\.\dd\.global\.shared", ptx)),
                           mbarrier_waits=e["ptx"]["mbarrier.try_wait"],
                           cta_barriers=len(re.findall(r"\bbar\.sync\s+0;", ptx)),
                           local_memory=bool(re.search(r"\.local\b|ld\.local|st\.local", ptx)),
                           ptxas_notes=_ptxas_notes(ptx))
            row["compile_s"] = round(time.perf_counter() - started, 2)
            rows.append(row)
    return rows


def offline_table(rows: list[dict]) -> str:
    lines = ["| variant | causal | compiled | registers | stack | shared B | warps | wgmma waits | TMA ld/st | notes |",
             "|---|---|---|---:|---:|---:|---:|---|---|---|"]
    for r in rows:
        if not r["compiled"]:
            lines.append(f"| {r['variant']} | {r['causal']} | no | | | | | | | {r['error']} |")
            continue
        notes = ", ".join(r["ptxas_notes"] + (["over the smem limit"] if not r["fits_smem"] else [])
                          + (["local memory"] if r["local_memory"] else [])
                          + ([f"setmaxnreg {' / '.join(r['setmaxnreg'])}"] if r["setmaxnreg"] else []))
        lines.append(f"| {r['variant']} | {r['causal']} | yes | {r['registers']} | {r['stack_bytes']} | "
                     f"{r['shared_bytes']} | {r['num_warps_total']} | {','.join(r['wgmma_wait_groups'])} | "
                     f"{r['tma_loads']}/{r['tma_stores']} | {notes} |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------
# GPU: correctness against SDPA in fp32, then CUDA-graph timing beside SDPA's cuDNN backend
# ------------------------------------------------------------------------------------------------

REL_RMS_TOL = 1e-2  # pass: every element finite and the relative RMS error below this
ROUNDS = 5
QUICK_ROUNDS = 3
SEEDS = (1234, 5678)  # two fresh random inputs per shape: a race shows on one and not the other


SHAPES = [Shape(1, h, L, causal, hkv=hkv) for h, hkv in ((32, 4), (24, 24)) for L in (8192, 16384)
          for causal in (True, False)]
QUICK_SHAPES = [Shape(1, 32, 8192, True, hkv=4), Shape(1, 32, 8192, False, hkv=4)]


def make_inputs(shape: Shape, seed: int, device="cuda", dtype=torch.bfloat16):
    g = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(shape.b, shape.h, shape.L, HEAD_DIM, generator=g, device=device, dtype=dtype)
    k, v = (torch.randn(shape.b, shape.hkv, shape.L, HEAD_DIM, generator=g, device=device, dtype=dtype)
            for _ in range(2))
    return q, k, v


def reference(q, k, v, causal: bool) -> torch.Tensor:
    """SDPA in fp32 math (hopper_probe_timing's, a few heads at a time), K/V expanded to every
    query head for GQA."""
    from hopper_probe_timing import reference as sdpa_fp32

    group = q.shape[1] // k.shape[1]
    if group > 1:
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    return sdpa_fp32(q, k, v, causal)


def check(out, ref) -> dict:
    """hopper_probe_timing's error measures; passing here means finite and rel RMS < REL_RMS_TOL."""
    from hopper_probe_timing import compare

    errors = compare(out, ref)
    errors["correct"] = errors["nonfinite"] == 0 and errors["rel_rms_err"] < REL_RMS_TOL
    return errors


def cudnn_call(q, k, v, causal: bool):
    """(call, how) for SDPA's cuDNN backend: GQA through enable_gqa, else (refused) K/V expanded
    once here, outside the timed calls."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def call_with(k_, v_, **kwargs):
        def call():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(q, k_, v_, is_causal=causal, **kwargs)
        return call

    if q.shape[1] == k.shape[1]:
        return call_with(k, v), "no GQA"
    call = call_with(k, v, enable_gqa=True)
    try:
        call()
        torch.cuda.synchronize()
        return call, "enable_gqa"
    except (RuntimeError, TypeError):
        group = q.shape[1] // k.shape[1]
        return call_with(k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)), "K/V expanded"


def library_call(q, k, v, causal: bool):
    """(call, config) for omnitune's own attention kernel as the search would give it this shape:
    the nearest tuned Triton config in the tables for this card (the default where none), so the
    Gluon forms are timed beside the kernel they would join as well as beside cuDNN."""
    from omnitune.kernels import attention as att

    b, h, L, d = q.shape
    problem = att.AttentionProblem(b=b, h=h, hkv=k.shape[1], lq=L, lk=L, d=d, causal=causal)
    config = dict(att._triton_config(problem, q.dtype))
    return (lambda: att.attention(q, k, v, causal=causal, config=config)), config


# Timed beside the variants: (call maker, the row field its detail goes in)
BASELINES = {"sdpa_cudnn": (cudnn_call, "gqa"), "omnitune_kernel": (library_call, "config")}


def _row(shape: Shape, name: str, **fields) -> dict:
    return dict(shape=shape.name, b=shape.b, h=shape.h, hkv=shape.hkv, L=shape.L, d=HEAD_DIM, causal=shape.causal,
                variant=name, **fields)


def run_shape(shape: Shape, variants: list[Variant], rounds: int) -> list[dict]:
    """Each variant checked on two fresh inputs (output poisoned with NaN before every launch),
    then every passing one timed with cuDNN as CUDA-graph replays, interleaved in rounds."""
    from hopper_probe_timing import _one_line, timed_beside_cudnn

    rows = {v.name: _row(shape, v.name, kind="gluon", **asdict(v), checks=[]) for v in variants}
    rows.update({name: _row(shape, name, kind="baseline", checks=[]) for name in BASELINES})
    failed: set[str] = set()
    for seed in SEEDS:
        q, k, v = make_inputs(shape, seed)
        ref = reference(q, k, v, shape.causal)
        out = torch.empty_like(q)
        for variant in variants:
            if variant.name in failed:
                continue
            try:
                out.fill_(float("nan"))
                run_variant(variant, q, k, v, out, shape.causal)
                torch.cuda.synchronize()
            except Exception as exc:
                rows[variant.name]["status"] = f"failed: {_one_line(exc)}"
                failed.add(variant.name)
                continue
            rows[variant.name]["checks"].append(dict(seed=seed, **check(out, ref)))
        for name, (make_call, field) in BASELINES.items():  # checked as the variants are
            try:
                call, detail = make_call(q, k, v, shape.causal)
                got = call()
                torch.cuda.synchronize()
                rows[name][field] = detail
                rows[name]["checks"].append(dict(seed=seed, **check(got, ref)))
                del got
            except Exception as exc:
                rows[name]["status"] = f"failed: {_one_line(exc)}"
                failed.add(name)
        del q, k, v, ref, out
        torch.cuda.empty_cache()

    q, k, v = make_inputs(shape, SEEDS[0])
    out = torch.empty_like(q)
    calls = {}
    for name, row in rows.items():
        if name in failed:
            continue
        ok = len(row["checks"]) == len(SEEDS) and all(c["correct"] for c in row["checks"])
        row["status"] = "ok" if ok else "wrong"
        if name in BASELINES:  # timed even if outside the tolerance
            calls[name] = BASELINES[name][0](q, k, v, shape.causal)[0]
        elif ok:
            variant = next(v_ for v_ in variants if v_.name == name)
            calls[name] = (lambda variant=variant: run_variant(variant, q, k, v, out, shape.causal))
    timed_beside_cudnn(shape, calls, rows, rounds)
    del calls
    for row in rows.values():  # the worst of the two checks, for the table
        if row["checks"]:
            row["rel_rms_err"] = max(c["rel_rms_err"] for c in row["checks"])
            row["max_abs_err"] = max(c["max_abs_err"] for c in row["checks"])
    return list(rows.values())


def markdown(rows: list[dict]) -> str:
    from hopper_probe_timing import markdown as tables

    return tables(rows, heads="", names="Flops 4·b·h·L²·d, halved when causal. Names: pipelined / serial (form a, "
                  "with / without FA3's intra-warpgroup overlap), pingpong (form b); m = BLOCK_M, n = BLOCK_N, "
                  "s = stages.")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="write the rows as JSON here")
    parser.add_argument("--offline-compile", action="store_true",
                        help="no GPU: compile every variant for sm_90, print a table; exit 1 if none compiles")
    parser.add_argument("--quick", action="store_true", help="one shape per mask (b1 h32/4 L8192), three rounds")
    parser.add_argument("--variants", help="comma-separated variant names (default: all of VARIANTS)")
    parser.add_argument("--rounds", type=int, help=f"timing rounds (default {ROUNDS}, --quick {QUICK_ROUNDS})")
    args = parser.parse_args(argv)
    variants = VARIANTS
    if args.variants:
        wanted = {n.strip() for n in args.variants.split(",") if n.strip()}
        variants = [v for v in VARIANTS if v.name in wanted]
        if not variants:
            parser.error(f"--variants {args.variants!r} matches none of {[v.name for v in VARIANTS]}")
    if args.offline_compile:
        import triton

        rows = offline_compile(variants)
        print(offline_table(rows))
        if args.out:
            write_json(args.out, dict(what="Gluon FA3-style attention probe compiled offline for sm_90 (no GPU); "
                                       "speed not measured", triton=triton.__version__,
                                  target="GPUTarget('cuda', 90, 32)", smem_limit=SMEM_LIMIT, rows=rows))
        return 0 if any(r["compiled"] for r in rows) else 1
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU (or --offline-compile)")
    from hopper_probe_timing import environment

    started = time.perf_counter()
    env = environment()
    print(json.dumps(env), flush=True)
    rounds = args.rounds or (QUICK_ROUNDS if args.quick else ROUNDS)
    shapes = QUICK_SHAPES if args.quick else SHAPES
    rows: list[dict] = []
    for i, shape in enumerate(shapes):
        t = time.perf_counter()
        try:
            rows += run_shape(shape, variants, rounds)
        except Exception as exc:  # e.g. out of memory for the reference: the shape is one failed row
            from hopper_probe_timing import _one_line

            rows.append(_row(shape, "*", kind="shape", status=f"failed: {_one_line(exc)}"))
        print(f"{shape.name}: {time.perf_counter() - t:.1f} s", flush=True)
        if args.out:  # after every shape: a run cut short keeps what it measured
            write_json(args.out, dict(
                what="Gluon FA3-style attention probe (benchmarks/gluon_attention_probe.py) beside SDPA cuDNN",
                environment=env, rounds=rounds, quick=args.quick, partial=i + 1 < len(shapes),
                notes=[f"correct: every element finite and relative RMS error < {REL_RMS_TOL} against SDPA in fp32 "
                       f"math, on {len(SEEDS)} fresh random inputs, the output poisoned with NaN before each launch",
                       "ms: median over rounds of a CUDA-graph replay of launches_per_graph launches, divided by "
                       "them; every passing variant and cuDNN once per round, the order rotated",
                       "flops: 4·b·h·L²·d, half of it under a causal mask; vs_cudnn = cuDNN ms / row ms"],
                total_s=time.perf_counter() - started, rows=rows))
    print(markdown(rows))
    print(f"\ntotal {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

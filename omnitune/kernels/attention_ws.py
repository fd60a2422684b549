"""Attention in Hopper's warp-specialized form: the attention spec's WARP_SPEC configs.

One key loop under `tl.range(..., warp_specialize=True)`, which Triton 3.6 splits on sm_90 into a
producer warpgroup feeding TMA loads and two consumer warpgroups of 64 query rows each (BLOCK_M
128, 4 warps a warpgroup; docs/hopper.md has the probe that showed the split and what does not
compile). Q, K and V are read through tensor descriptors the kernel makes
(`tl.make_tensor_descriptor`): over host descriptors the same loop never finished on the H200.
Two key loops (unmasked, then the diagonal) do not compile with it, so under a causal mask every
tile is masked; without one, only when LK is not a multiple of BLOCK_N (EVEN_K false). Query
blocks run heaviest first under a causal mask.

Correctness record: round 10 found this form wrong at 3 stages (every shape, the probe's too:
the constraint keeps 2) and, in that round's search on the H200, at some 16k shapes with 2 stages,
which no later run reproduced: round 34 checked 960 launches on an H100 (8k and 16k, GQA and not,
causal and not, 64- and 128-key tiles, fresh inputs every launch, scratch fresh or kept, JIT or the
bound C launcher), all right (benchmarks/results/ws_attention_check_h100_round34_W.json). A
warp-specialized config is therefore served only for the problem it was checked on: the runtime
does not carry it to other shapes (attention.adapt_config).

The kernel lives in its own module so that the attention kernel's source hash, which the shipped
tables record, did not change with it (omnitune.source_hash hashes the jit functions a module
defines and those they call). The other side of that: the hash does not cover this kernel, so a
table entry that uses it is not flagged when it changes. Edit it, then search or
`omnitune verify` the entries with WARP_SPEC=1.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from omnitune.kernels._launch import DirectLauncher

LOG2E = 1.4426950408889634
BLOCK_M = 128
NUM_WARPS = 4


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


_ATTENTION_WS = DirectLauncher(_attention_fwd_ws)


def launch_plan(b: int, h: int, hkv: int, lq: int, d: int, causal: bool, even_k: bool, block_n: int,
                num_stages: int) -> tuple:
    """(grid, bound launcher) for one shape and config."""
    constexprs = {"HEAD_DIM": d, "GROUP": h // hkv, "BLOCK_M": BLOCK_M, "BLOCK_N": block_n, "CAUSAL": causal,
                  "EVEN_K": even_k, "num_warps": NUM_WARPS, "num_stages": num_stages}
    return (triton.cdiv(lq, BLOCK_M), b * h, 1), _ATTENTION_WS.bind(constexprs, 4)


def _flat_ready(t: torch.Tensor) -> torch.Tensor:
    # The descriptors flatten [B, H, L, D] to [B·H·L, D] from a 16-byte aligned base.
    return t if t.is_contiguous() and t.data_ptr() & 15 == 0 else t.contiguous()


def launch(q, k, v, out, sm_scale: float, grid: tuple, kernel) -> None:
    """The warp-specialized kernel on q [B, H, Lq, D], k and v [B, Hkv, Lk, D] into out."""
    q, k, v = _flat_ready(q), _flat_ready(k), _flat_ready(v)
    ensure_scratch_allocator()
    kernel(grid, (q, k, v, out, *out.stride(), q.shape[1], k.shape[1], q.shape[2], k.shape[2], sm_scale * LOG2E))


def _scratch(size: int, alignment: int, stream) -> torch.Tensor:
    # The descriptors the kernel makes live in global scratch that Triton asks for at each launch
    # (128 bytes per descriptor per program). From the caching allocator on the current stream, and
    # during a CUDA graph capture from the graph's pool: Triton keeps no reference past the launch,
    # and the stream orders the next user of the memory after this kernel.
    return torch.empty(size, dtype=torch.int8, device="cuda")


def ensure_scratch_allocator() -> None:
    """Kernels that make tensor descriptors need Triton's allocator, whose default raises. It is a
    context variable, so each thread (a new one starts from the default) gets ours once; an
    allocator the caller set is left alone."""
    try:
        from triton.runtime import _allocation
    except ImportError:  # pragma: no cover — a Triton without it allocates its own way
        return
    if _allocation._allocator.get() is _allocation._NULL_ALLOCATOR:
        triton.set_allocator(_scratch)

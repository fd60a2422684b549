"""What Triton 3.6 can express on sm_90, established by compiling for it on a machine without a GPU.

Each probe compiles one kernel for sm_90 (Triton's own compiler, its bundled ptxas; cuobjdump
reads the cubin) and reports whether it compiled (else the compiler's one-line diagnostic), what
the TTGIR and PTX contain (warp specialization and its partitions, wgmma, TMA, mbarriers,
setmaxnreg, named barriers), the registers per thread and the shared memory. Speed is not
measured: that needs the H200. docs/hopper.md reads the result.

The kernels are this file's own: a FlashAttention-style forward (a [BLOCK_M, 128] bf16 query
tile, a loop over K/V tiles with two tl.dot and an online softmax in exp2), a persistent
variant of it, and a plain (persistent or not) GEMM; plus omnitune's attention kernel itself,
compiled as its launcher would call it. As in benchmarks/decode_registers_offline.py the
signatures mimic the real calls' specialisation: pointers, row strides and lengths divisible by
16, unit innermost strides as constants.

Every probe runs in a child process: the compiler's diagnostics (MLIR errors, failed assertions)
go to the C++ stderr, which the parent reads for a failed probe's one line, and a compiler that
aborts takes only the child with it (Triton 3.6's wheel reports its assertions as a failed pass,
RuntimeError "PassManager::run failed"). A probe that fails to compile is a row like any other and
the script still exits 0.

    PYTHONPATH=$PWD python benchmarks/hopper_features_offline.py --out benchmarks/results/hopper_features_offline.json
    PYTHONPATH=$PWD python benchmarks/hopper_features_offline.py --only fa_ptr_m128_w8   # one probe, printed
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import mmap
import os
import re
import subprocess
import sys
import tempfile
import time

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
TARGET = GPUTarget("cuda", 90, 32)
HEAD_DIM = 128
NUM_SMS = 132  # the H200's SMs; a persistent grid's stride (a constexpr here, as a launcher would pass it)

# How the attention probe reads Q, K, V and writes O: (Q through a descriptor, K/V through
# descriptors, O through a descriptor, descriptors made in the kernel rather than on the host).
LOADS = {
    "ptr": (False, False, False, False),        # pointer loads and stores (the baseline)
    "host_kv": (False, True, False, False),     # K/V through host descriptors (omnitune's USE_TMA)
    "host_qkv": (True, True, False, False),     # Q, K, V through host descriptors, O stored through pointers
    "host_all": (True, True, True, False),      # Q, K, V and O through host descriptors
    "device_qkv": (True, True, False, True),    # Q, K, V through tl.make_tensor_descriptor, O through pointers
    "device_all": (True, True, True, True),     # Q, K, V and O through tl.make_tensor_descriptor
}


# ------------------------------------------------------------------------------------------------
# Kernels
# ------------------------------------------------------------------------------------------------


@triton.jit
def _kv_tile(K, V, kd, vd, row, offs_n, offs_d, stride_kn, stride_vn, KV_DESC: tl.constexpr):
    if not KV_DESC:
        k = tl.load(K + (row + offs_n)[:, None] * stride_kn + offs_d[None, :])
        v = tl.load(V + (row + offs_n)[:, None] * stride_vn + offs_d[None, :])
    else:
        k = kd.load([row, 0])
        v = vd.load([row, 0])
    return k, v


@triton.jit
def _softmax_step(q, k, v, acc, m_i, l_i, qk_scale, visible, MASKED: tl.constexpr):
    qk = tl.dot(q, tl.trans(k)) * qk_scale
    if MASKED:
        qk = tl.where(visible, qk, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    p = tl.math.exp2(qk - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    acc = tl.dot(p.to(v.dtype), v, acc)
    return acc, m_new, l_i


@triton.jit
def _descriptors(Q, K, V, Out, q_desc, k_desc, v_desc, o_desc, rows_q, rows_k,
                 stride_qm, stride_kn, stride_vn, stride_om,
                 HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, MAKE_DESC: tl.constexpr):
    if MAKE_DESC:
        qd = tl.make_tensor_descriptor(Q, shape=[rows_q, HEAD_DIM], strides=[stride_qm, 1],
                                       block_shape=[BLOCK_M, HEAD_DIM])
        kd = tl.make_tensor_descriptor(K, shape=[rows_k, HEAD_DIM], strides=[stride_kn, 1],
                                       block_shape=[BLOCK_N, HEAD_DIM])
        vd = tl.make_tensor_descriptor(V, shape=[rows_k, HEAD_DIM], strides=[stride_vn, 1],
                                       block_shape=[BLOCK_N, HEAD_DIM])
        od = tl.make_tensor_descriptor(Out, shape=[rows_q, HEAD_DIM], strides=[stride_om, 1],
                                       block_shape=[BLOCK_M, HEAD_DIM])
    else:
        qd = q_desc
        kd = k_desc
        vd = v_desc
        od = o_desc
    return qd, kd, vd, od


@triton.jit
def _attend_tile(Q, K, V, Out, qd, kd, vd, od, pid_m, pid_bh, LQ, LK,
                 stride_qm, stride_kn, stride_vn, stride_om, qk_scale,
                 HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 Q_DESC: tl.constexpr, KV_DESC: tl.constexpr, O_DESC: tl.constexpr,
                 WARP_SPEC: tl.constexpr, CAUSAL: tl.constexpr, WS_DIAG: tl.constexpr):
    """One [BLOCK_M, HEAD_DIM] output tile of one (batch, head): Q, K, V flattened to
    [batch·heads·L, HEAD_DIM]. CAUSAL (LQ = LK) 1: an unmasked loop below the diagonal block, then
    a masked loop over it, as omnitune's kernel splits its key loop (WARP_SPEC marks the first
    loop, WS_DIAG the second); 2: one loop up to the diagonal, every tile masked."""
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q_row = pid_bh * LQ + pid_m * BLOCK_M
    k_row = pid_bh * LK
    if not Q_DESC:
        q = tl.load(Q + (pid_bh * LQ + offs_m)[:, None] * stride_qm + offs_d[None, :])
    else:
        q = qd.load([q_row, 0])
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    if CAUSAL == 1:
        hi = pid_m * BLOCK_M
    elif CAUSAL == 2:
        hi = (pid_m + 1) * BLOCK_M
    else:
        hi = LK
    for start_n in tl.range(0, hi, BLOCK_N, warp_specialize=WARP_SPEC):
        k, v = _kv_tile(K, V, kd, vd, k_row + start_n, offs_n, offs_d, stride_kn, stride_vn, KV_DESC)
        visible = offs_m[:, None] >= (start_n + offs_n)[None, :]
        acc, m_i, l_i = _softmax_step(q, k, v, acc, m_i, l_i, qk_scale, visible, CAUSAL == 2)
    if CAUSAL == 1:
        for start_n in tl.range(pid_m * BLOCK_M, (pid_m + 1) * BLOCK_M, BLOCK_N, warp_specialize=WS_DIAG):
            k, v = _kv_tile(K, V, kd, vd, k_row + start_n, offs_n, offs_d, stride_kn, stride_vn, KV_DESC)
            visible = offs_m[:, None] >= (start_n + offs_n)[None, :]
            acc, m_i, l_i = _softmax_step(q, k, v, acc, m_i, l_i, qk_scale, visible, True)
    out = (acc / l_i[:, None]).to(tl.bfloat16)
    if not O_DESC:
        tl.store(Out + (pid_bh * LQ + offs_m)[:, None] * stride_om + offs_d[None, :], out)
    else:
        od.store([q_row, 0], out)


@triton.jit
def _fa_fwd(Q, K, V, Out, q_desc, k_desc, v_desc, o_desc,
            stride_qm, stride_kn, stride_vn, stride_om, LQ, LK, qk_scale,
            HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
            Q_DESC: tl.constexpr, KV_DESC: tl.constexpr, O_DESC: tl.constexpr, MAKE_DESC: tl.constexpr,
            WARP_SPEC: tl.constexpr, CAUSAL: tl.constexpr, WS_DIAG: tl.constexpr):
    """grid (LQ / BLOCK_M, batch·heads): one output tile per program."""
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    qd, kd, vd, od = _descriptors(Q, K, V, Out, q_desc, k_desc, v_desc, o_desc,
                                  tl.num_programs(1) * LQ, tl.num_programs(1) * LK,
                                  stride_qm, stride_kn, stride_vn, stride_om, HEAD_DIM, BLOCK_M, BLOCK_N, MAKE_DESC)
    _attend_tile(Q, K, V, Out, qd, kd, vd, od, pid_m, pid_bh, LQ, LK, stride_qm, stride_kn, stride_vn, stride_om,
                 qk_scale, HEAD_DIM, BLOCK_M, BLOCK_N, Q_DESC, KV_DESC, O_DESC, WARP_SPEC, CAUSAL, WS_DIAG)


@triton.jit
def _fa_fwd_persistent(Q, K, V, Out, q_desc, k_desc, v_desc, o_desc,
                       stride_qm, stride_kn, stride_vn, stride_om, LQ, LK, BH, qk_scale,
                       HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       Q_DESC: tl.constexpr, KV_DESC: tl.constexpr, O_DESC: tl.constexpr, MAKE_DESC: tl.constexpr,
                       NUM_SMS: tl.constexpr, FLATTEN: tl.constexpr,
                       WS_OUTER: tl.constexpr, WS_INNER: tl.constexpr):
    """grid (NUM_SMS,): each program walks the (query block, batch·head) tiles with stride NUM_SMS."""
    qd, kd, vd, od = _descriptors(Q, K, V, Out, q_desc, k_desc, v_desc, o_desc, BH * LQ, BH * LK,
                                  stride_qm, stride_kn, stride_vn, stride_om, HEAD_DIM, BLOCK_M, BLOCK_N, MAKE_DESC)
    n_m = tl.cdiv(LQ, BLOCK_M)
    for tile in tl.range(tl.program_id(0), n_m * BH, NUM_SMS, flatten=FLATTEN, warp_specialize=WS_OUTER):
        _attend_tile(Q, K, V, Out, qd, kd, vd, od, tile % n_m, tile // n_m, LQ, LK,
                     stride_qm, stride_kn, stride_vn, stride_om, qk_scale,
                     HEAD_DIM, BLOCK_M, BLOCK_N, Q_DESC, KV_DESC, O_DESC, WS_INNER, 0, False)


@triton.jit
def _gemm(A, B, C, a_desc, b_desc, c_desc, M, N, K, stride_am, stride_bn, stride_cm,
          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, MAKE_DESC: tl.constexpr,
          PERSISTENT: tl.constexpr, NUM_SMS: tl.constexpr, FLATTEN: tl.constexpr, WARP_SPEC: tl.constexpr):
    """C[M, N] = A[M, K] · B[N, K]ᵀ in bf16 with fp32 accumulation, through tensor descriptors
    (host ones, or made in the kernel with MAKE_DESC). PERSISTENT: grid (NUM_SMS,) over the output tiles,
    the tile loop carrying FLATTEN and WARP_SPEC; else one tile per program and WARP_SPEC on the
    K loop (the plain matmul loop warp specialization was written for)."""
    if MAKE_DESC:
        ad = tl.make_tensor_descriptor(A, shape=[M, K], strides=[stride_am, 1], block_shape=[BLOCK_M, BLOCK_K])
        bd = tl.make_tensor_descriptor(B, shape=[N, K], strides=[stride_bn, 1], block_shape=[BLOCK_N, BLOCK_K])
        cd = tl.make_tensor_descriptor(C, shape=[M, N], strides=[stride_cm, 1], block_shape=[BLOCK_M, BLOCK_N])
    else:
        ad = a_desc
        bd = b_desc
        cd = c_desc
    num_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    if PERSISTENT:
        for tile in tl.range(tl.program_id(0), tl.cdiv(M, BLOCK_M) * num_n, NUM_SMS, flatten=FLATTEN,
                             warp_specialize=WARP_SPEC):
            pid_m = tile // num_n
            pid_n = tile % num_n
            acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for ki in range(k_tiles):
                a = ad.load([pid_m * BLOCK_M, ki * BLOCK_K])
                b = bd.load([pid_n * BLOCK_N, ki * BLOCK_K])
                acc = tl.dot(a, b.T, acc)
            cd.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(tl.bfloat16))
    else:
        pid_m = tl.program_id(0) // num_n
        pid_n = tl.program_id(0) % num_n
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for ki in tl.range(0, k_tiles, warp_specialize=WARP_SPEC):
            a = ad.load([pid_m * BLOCK_M, ki * BLOCK_K])
            b = bd.load([pid_n * BLOCK_N, ki * BLOCK_K])
            acc = tl.dot(a, b.T, acc)
        cd.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(tl.bfloat16))


# ------------------------------------------------------------------------------------------------
# Gluon: warp specialization written by hand (the route to two consumer warpgroups in turns)
# ------------------------------------------------------------------------------------------------


def _gluon_kernel():
    """A skeleton of ping-pong in Gluon (triton.experimental.gluon, shipped with 3.6): the
    default partition (the kernel's num_warps) hands out the first turn; two worker partitions of
    4 warps each, with their own register budgets, take turns — each waits on its mbarrier, runs a
    wgmma on its half of the tile and arrives on the other's. That ordering is what ping-pong
    imposes (in FA3 one warpgroup's softmax runs while the other's MMAs do); here there is nothing
    between turns: it shows what compiles, not a kernel. Built lazily: Gluon is experimental."""
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, warpgroup_mma

    @gluon.jit
    def _consumer(a_smem, b_smem, bars, Out, ME: gl.constexpr, TURNS: gl.constexpr, BLOCK: gl.constexpr):
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                      instr_shape=[16, BLOCK, 16])
        acc = gl.zeros([64, BLOCK], gl.float32, mma)
        for turn in range(TURNS):
            mbarrier.wait(bars.index(ME), turn & 1)
            acc = warpgroup_mma(a_smem.index(ME), b_smem, acc)
            mbarrier.arrive(bars.index(1 - ME))
        rows = gl.arange(0, 64, gl.SliceLayout(1, mma)) + ME * 64
        cols = gl.arange(0, BLOCK, gl.SliceLayout(0, mma))
        gl.store(Out + rows[:, None] * BLOCK + cols[None, :], acc.to(gl.bfloat16))

    @gluon.jit
    def _default(bars):
        mbarrier.arrive(bars.index(0))  # the first turn goes to consumer 0

    @gluon.jit
    def _pingpong(A, B, Out, TURNS: gl.constexpr, BLOCK: gl.constexpr):
        smem: gl.constexpr = gl.NVMMASharedLayout.get_default_for([64, BLOCK], gl.bfloat16)
        load: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [gl.num_warps(), 1], [1, 0])
        rows = gl.arange(0, 64, gl.SliceLayout(1, load))
        cols = gl.arange(0, BLOCK, gl.SliceLayout(0, load))
        a_smem = gl.allocate_shared_memory(gl.bfloat16, [2, 64, BLOCK], smem)
        a_smem.index(0).store(gl.load(A + rows[:, None] * BLOCK + cols[None, :]))
        a_smem.index(1).store(gl.load(A + (rows + 64)[:, None] * BLOCK + cols[None, :]))
        b_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK, BLOCK], smem)
        b_smem.store(gl.load(B + gl.arange(0, BLOCK, gl.SliceLayout(1, load))[:, None] * BLOCK + cols[None, :]))
        bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        mbarrier.init(bars.index(0), count=1)
        mbarrier.init(bars.index(1), count=1)
        fence_async_shared()
        gl.warp_specialize([(_default, (bars,)),
                            (_consumer, (a_smem, b_smem, bars, Out, 0, TURNS, BLOCK)),
                            (_consumer, (a_smem, b_smem, bars, Out, 1, TURNS, BLOCK))],
                           [4, 4], [232, 232])

    return _pingpong


# ------------------------------------------------------------------------------------------------
# Probes
# ------------------------------------------------------------------------------------------------


# The problem of omnitune's H200 searches whose compiled registers the probe is checked against
# (benchmarks/results/search_trials_h200_round4.json).
OMNITUNE_PROBLEM = dict(b=1, h=28, hkv=4, lq=128, lk=256, d=HEAD_DIM)


def _probe(name, feature, kernel, **params):
    return dict(name=name, feature=feature, kernel=kernel, params=params)


def _fa(name, feature, loads="ptr", block_m=128, block_n=64, warps=8, stages=2, ws=False, causal=None,
        ws_diag=False, **opts):
    return _probe(name, feature, "fa", loads=loads, block_m=block_m, block_n=block_n, num_warps=warps,
                  num_stages=stages, warp_specialize=ws, causal=causal, ws_diag=ws_diag, **opts)


def _omnitune(name, block_m, warps, stages, use_tma, block_n=64):
    return _probe(name, "omnitune kernel", "omnitune", problem=OMNITUNE_PROBLEM, block_m=block_m, block_n=block_n,
                  num_warps=warps, num_stages=stages, use_tma=use_tma)


def probes() -> list[dict]:
    rows = [
        # 1 + 4. pointer loads: the baseline, and which tiles become wgmma
        _fa("fa_ptr_m128_w8", "baseline / wgmma", block_m=128, warps=8),
        _fa("fa_ptr_m128_w4", "baseline / wgmma", block_m=128, warps=4),
        _fa("fa_ptr_m128_n128_w8", "baseline / wgmma", block_m=128, block_n=128, warps=8),
        _fa("fa_ptr_m64_w4", "baseline / wgmma", block_m=64, warps=4, stages=3),
        _fa("fa_ptr_m64_w8", "baseline / wgmma", block_m=64, warps=8, stages=3),
        _fa("fa_ptr_m32_w4", "baseline / wgmma", block_m=32, warps=4, stages=3),
        _fa("fa_ptr_m16_w4", "baseline / wgmma", block_m=16, warps=4, stages=3),
        _fa("fa_ptr_m128_w8_s1", "baseline / wgmma", block_m=128, warps=8, stages=1),
        # 2. tensor descriptors: host (omnitune's USE_TMA: K/V only; or Q, K, V, O) and in-kernel
        _fa("fa_host_kv_m128_w8", "tensor descriptors (TMA)", loads="host_kv"),
        _fa("fa_host_all_m128_w8", "tensor descriptors (TMA)", loads="host_all"),
        _fa("fa_device_all_m128_w8", "tensor descriptors (TMA)", loads="device_all"),
        _fa("fa_host_kv_m64_w4", "tensor descriptors (TMA)", loads="host_kv", block_m=64, warps=4, stages=3),
        _fa("fa_device_all_m64_w4", "tensor descriptors (TMA)", loads="device_all", block_m=64, warps=4, stages=3),
        _fa("fa_host_kv_m128_w8_s3", "tensor descriptors (TMA)", loads="host_kv", stages=3),
        _fa("fa_device_all_m32_w4", "tensor descriptors (TMA)", loads="device_all", block_m=32, warps=4),
        _fa("fa_device_all_m64_w8", "tensor descriptors (TMA)", loads="device_all", block_m=64, warps=8),
        # 3. tl.range(..., warp_specialize=True)
        _fa("ws_ptr_m128_w4", "warp_specialize", ws=True, warps=4),
        _fa("ws_ptr_m64_w4", "warp_specialize", ws=True, block_m=64, warps=4),
        _fa("ws_host_kv_m128_w4", "warp_specialize", loads="host_kv", ws=True, warps=4),
        _fa("ws_host_qkv_m128_w4", "warp_specialize", loads="host_qkv", ws=True, warps=4),
        _fa("ws_host_all_m128_w4", "warp_specialize", loads="host_all", ws=True, warps=4),
        _fa("ws_host_all_m64_w4", "warp_specialize", loads="host_all", ws=True, block_m=64, warps=4),
        _fa("ws_device_qkv_m128_w4", "warp_specialize", loads="device_qkv", ws=True, warps=4),
        _fa("ws_device_all_m128_w4", "warp_specialize", loads="device_all", ws=True, warps=4),
        _fa("ws_device_all_m64_w4", "warp_specialize", loads="device_all", ws=True, block_m=64, warps=4),
        _fa("ws_device_all_m128_w8", "warp_specialize", loads="device_all", ws=True, warps=8),
        _fa("ws_device_all_m64_w8", "warp_specialize", loads="device_all", ws=True, block_m=64, warps=8),
        _fa("ws_device_all_m128_n128_w4", "warp_specialize", loads="device_all", ws=True, block_n=128, warps=4),
        _fa("ws_device_all_m128_w4_s3", "warp_specialize", loads="device_all", ws=True, warps=4, stages=3),
        _fa("ws_device_all_m128_w4_s1", "warp_specialize", loads="device_all", ws=True, warps=4, stages=1),
        _fa("ws_device_all_m256_w4", "warp_specialize", loads="device_all", ws=True, block_m=256, warps=4),
        _fa("ws_device_all_m32_w4", "warp_specialize", loads="device_all", ws=True, block_m=32, warps=4),
        _fa("ws_device_all_m128_n128_w4_s3", "warp_specialize", loads="device_all", ws=True, block_n=128, warps=4,
            stages=3),
        _fa("fa_device_all_m128_w8_causal", "tensor descriptors (TMA)", loads="device_all", causal="two_loops"),
        _fa("ws_device_all_m128_w4_causal_both", "warp_specialize", loads="device_all", ws=True, ws_diag=True,
            warps=4, causal="two_loops"),
        _fa("ws_device_all_m128_w4_causal_offdiag", "warp_specialize", loads="device_all", ws=True, warps=4,
            causal="two_loops"),
        _fa("ws_device_all_m128_w4_causal_diag", "warp_specialize", loads="device_all", ws_diag=True, warps=4,
            causal="two_loops"),
        _fa("ws_device_all_m128_w4_causal_one_loop", "warp_specialize", loads="device_all", ws=True, warps=4,
            causal="one_loop"),
        _fa("ws_host_kv_m128_w8", "warp_specialize", loads="host_kv", ws=True, warps=8),
        # 5. persistent grids
        _probe("persist_fa_device_all", "persistent", "fa_persistent", loads="device_all", block_m=128, block_n=64,
               num_warps=8, num_stages=2, flatten=False, ws_outer=False, ws_inner=False),
        _probe("persist_fa_device_all_flatten", "persistent", "fa_persistent", loads="device_all", block_m=128,
               block_n=64, num_warps=8, num_stages=2, flatten=True, ws_outer=False, ws_inner=False),
        _probe("persist_fa_device_all_ws_outer_w4", "persistent + warp_specialize", "fa_persistent",
               loads="device_all", block_m=128, block_n=64, num_warps=4, num_stages=2, flatten=False,
               ws_outer=True, ws_inner=False),
        _probe("persist_fa_device_all_flatten_ws_outer_w4", "persistent + warp_specialize", "fa_persistent",
               loads="device_all", block_m=128, block_n=64, num_warps=4, num_stages=2, flatten=True,
               ws_outer=True, ws_inner=False),
        _probe("persist_fa_device_all_ws_inner_w4", "persistent + warp_specialize", "fa_persistent",
               loads="device_all", block_m=128, block_n=64, num_warps=4, num_stages=2, flatten=False,
               ws_outer=False, ws_inner=True),
        _probe("gemm_host", "GEMM", "gemm", loads="host_all", block_m=128, block_n=128, block_k=64, num_warps=8,
               num_stages=3, persistent=False, flatten=False, warp_specialize=False),
        _probe("gemm_host_ws_w4", "GEMM + warp_specialize", "gemm", loads="host_all", block_m=128, block_n=128,
               block_k=64, num_warps=4, num_stages=3, persistent=False, flatten=False, warp_specialize=True),
        _probe("gemm_device_ws_w4", "GEMM + warp_specialize", "gemm", loads="device_all", block_m=128,
               block_n=128, block_k=64, num_warps=4, num_stages=3, persistent=False, flatten=False,
               warp_specialize=True),
        _probe("gemm_persist_host_flatten", "persistent GEMM", "gemm", loads="host_all", block_m=128, block_n=128,
               block_k=64, num_warps=8, num_stages=3, persistent=True, flatten=True, warp_specialize=False),
        _probe("gemm_persist_host_flatten_ws_w4", "persistent GEMM + warp_specialize", "gemm", loads="host_all",
               block_m=128, block_n=128, block_k=64, num_warps=4, num_stages=3, persistent=True, flatten=True,
               warp_specialize=True),
        _probe("gemm_persist_device_flatten_ws_w4", "persistent GEMM + warp_specialize", "gemm",
               loads="device_all", block_m=128, block_n=128, block_k=64, num_warps=4, num_stages=3,
               persistent=True, flatten=True, warp_specialize=True),
        _probe("gemm_persist_device_ws_w4", "persistent GEMM + warp_specialize", "gemm", loads="device_all",
               block_m=128, block_n=128, block_k=64, num_warps=4, num_stages=3, persistent=True, flatten=False,
               warp_specialize=True),
        # 6. anything else: launch options, omnitune's own kernel, Gluon, the compiler's passes
        _fa("opt_maxnreg128_m128_w8", "maxnreg", maxnreg=128),
        _fa("opt_maxnreg168_ws_device_all_m128_w4", "maxnreg + warp_specialize", loads="device_all", ws=True,
            warps=4, maxnreg=168),
        _fa("opt_num_ctas2_m128_w8", "num_ctas (clusters)", num_ctas=2),
        _omnitune("omnitune_attention_m64_w4_s3", 64, 4, 3, use_tma=False),
        _omnitune("omnitune_attention_tma_m64_w4_s3", 64, 4, 3, use_tma=True),
        _omnitune("omnitune_attention_m128_w4_s2", 128, 4, 2, use_tma=False),
        _omnitune("omnitune_attention_m128_w8_s2", 128, 8, 2, use_tma=False),
        _omnitune("omnitune_attention_tma_m128_w8_s2", 128, 8, 2, use_tma=True),
        _probe("gluon_pingpong_skeleton", "Gluon warp_specialize", "gluon", num_warps=4, num_stages=1, turns=4,
               block=128),
        _probe("compiler_passes", "compiler passes", "library"),
    ]
    return rows


# ------------------------------------------------------------------------------------------------
# Compiling one probe (in the child process)
# ------------------------------------------------------------------------------------------------


def _source(fn, pointers: dict, descriptors: dict, scalars: dict, constexprs: dict, aligned: set):
    names = fn.arg_names
    signature = {}
    for n in names:
        if n in constexprs:
            signature[n] = "constexpr"
        elif n in pointers:
            signature[n] = pointers[n]
        elif n in descriptors:
            signature[n] = descriptors[n]
        else:
            signature[n] = scalars.get(n, "i32")
    values = {(names.index(n),): v for n, v in constexprs.items()}
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in names
             if signature[n] != "constexpr" and (n in pointers or n in aligned)}
    return ASTSource(fn=fn, signature=signature, constexprs=values, attrs=attrs)


# The attention probe's masks: none, causal as omnitune splits it (an unmasked loop, then a
# masked one over the diagonal block), causal as one loop with every tile masked.
_CAUSAL = {None: 0, "two_loops": 1, "one_loop": 2}


def _descriptor_types(loads: str, blocks: dict) -> dict:
    """name → signature type: a host descriptor is spelled tensordesc<dtype[block shape]>; an
    unused descriptor argument is an i32 (the launcher passes 0)."""
    q, kv, o, made = LOADS[loads]
    host = set() if made else {n for n, used in (("q_desc", q), ("k_desc", kv), ("v_desc", kv), ("o_desc", o)) if used}
    return {n: (f"tensordesc<bf16[{', '.join(map(str, blocks[n]))}]>" if n in host else "i32") for n in blocks}


def _compile_fa(p: dict, persistent: bool):
    q, kv, o, made = LOADS[p["loads"]]
    bm, bn = p["block_m"], p["block_n"]
    blocks = {"q_desc": (bm, HEAD_DIM), "k_desc": (bn, HEAD_DIM), "v_desc": (bn, HEAD_DIM), "o_desc": (bm, HEAD_DIM)}
    constexprs = dict(HEAD_DIM=HEAD_DIM, BLOCK_M=bm, BLOCK_N=bn, Q_DESC=q, KV_DESC=kv, O_DESC=o, MAKE_DESC=made)
    if persistent:
        fn = _fa_fwd_persistent
        constexprs.update(NUM_SMS=NUM_SMS, FLATTEN=p["flatten"], WS_OUTER=p["ws_outer"], WS_INNER=p["ws_inner"])
    else:
        fn = _fa_fwd
        constexprs.update(WARP_SPEC=p["warp_specialize"], CAUSAL=_CAUSAL[p["causal"]], WS_DIAG=p["ws_diag"])
    pointers = {n: "*bf16" for n in ("Q", "K", "V", "Out")}
    aligned = {"stride_qm", "stride_kn", "stride_vn", "stride_om", "LQ", "LK"}
    return fn, _source(fn, pointers, _descriptor_types(p["loads"], blocks), {"qk_scale": "fp32"}, constexprs, aligned)


def _compile_gemm(p: dict):
    made = LOADS[p["loads"]][3]
    bm, bn, bk = p["block_m"], p["block_n"], p["block_k"]
    if not made:
        descriptors = {"a_desc": f"tensordesc<bf16[{bm}, {bk}]>", "b_desc": f"tensordesc<bf16[{bn}, {bk}]>",
                       "c_desc": f"tensordesc<bf16[{bm}, {bn}]>"}
    else:
        descriptors = {n: "i32" for n in ("a_desc", "b_desc", "c_desc")}
    constexprs = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, MAKE_DESC=made, PERSISTENT=p["persistent"],
                      NUM_SMS=NUM_SMS, FLATTEN=p["flatten"], WARP_SPEC=p["warp_specialize"])
    aligned = {"M", "N", "K", "stride_am", "stride_bn", "stride_cm"}
    return _gemm, _source(_gemm, {n: "*bf16" for n in "ABC"}, descriptors, {}, constexprs, aligned)


def _specialised_source(fn, args: tuple, constexprs: dict):
    """The ASTSource that Triton's JIT would build for these runtime arguments: each argument
    goes through the JIT's own specialiser (a tensor's dtype and 16-byte alignment, an int's
    width, whether it is 1 (then a constant) or divisible by 16, a host descriptor's dtype and
    block shape), as on a launch. Plain CPU tensors stand in for the GPU's: only their dtype and
    alignment count."""
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.nvidia.compiler import CUDABackend

    names = fn.arg_names
    signature, values, attrs = {}, {}, {}
    for i, (name, arg) in enumerate(zip(names, args)):
        kind, spec = native_specialize_impl(CUDABackend, arg, False, True, True)
        signature[name] = kind
        if kind == "constexpr":
            values[(i,)] = spec
        elif isinstance(spec, str) and spec:
            attrs[(i,)] = CUDABackend.parse_attr(spec)
    for name in names[len(args):]:
        signature[name] = "constexpr"
        values[(names.index(name),)] = constexprs[name]
    return ASTSource(fn=fn, signature=signature, constexprs=values, attrs=attrs)


def _compile_omnitune(p: dict):
    """omnitune's _attention_fwd with the arguments its own launcher passes (attention.launch,
    its kernel call intercepted), for the H200 searches' problem b=1, h=28 over hkv=4, lq=128,
    lk=256, d=128, bf16, no mask: the signature is the one a launch on the GPU specialises."""
    import torch

    from omnitune.kernels import attention
    from omnitune.spec import Config

    problem = attention.AttentionProblem(**p["problem"])
    inputs = attention.make_inputs(problem, torch.bfloat16, "cpu", 0)
    out = torch.empty_like(inputs.q)
    config = Config(BACKEND="triton", BLOCK_M=p["block_m"], BLOCK_N=p["block_n"], num_warps=p["num_warps"],
                    num_stages=p["num_stages"], PACK_GQA=p.get("pack_gqa", False), USE_TMA=p["use_tma"])
    calls = []
    real = attention._ATTENTION
    attention._ATTENTION = lambda grid, args, constexprs, objects: calls.append((args, dict(constexprs)))
    try:
        attention.launch(inputs, out, config)
    finally:
        attention._ATTENTION = real
    args, constexprs = calls[0]
    for option in ("num_warps", "num_stages"):
        constexprs.pop(option)
    fn = attention._attention_fwd
    return fn, _specialised_source(fn, args, constexprs)


def _compile_gluon(p: dict):
    fn = _gluon_kernel()
    from triton.experimental.gluon._runtime import GluonASTSource

    names = fn.arg_names
    signature = {"A": "*bf16", "B": "*bf16", "Out": "*bf16", "TURNS": "constexpr", "BLOCK": "constexpr"}
    constexprs = {(names.index("TURNS"),): p["turns"], (names.index("BLOCK"),): p["block"]}
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in ("A", "B", "Out")}
    return fn, GluonASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)


# Pass names looked for in libtriton: what the NVIDIA backend can run, and whether any of it
# is a ping-pong scheduler (the AMD backend's BlockPingpong is the only one named so).
_PASS_NAMES = ("nvgpu-warp-specialization", "tritongpu-automatic-warp-specialization", "tritongpu-fuse-nested-loops",
               "tritongpu-partition-scheduling", "tritongpu-optimize-partition-warps", "nvws-lower-warp-group",
               "TritonAMDGPUBlockPingpong")
_SOURCE_MARKERS = ("third_party/nvidia/hopper/lib/Transforms/WarpSpecialization/PingPong.cpp",
                   "third_party/amd/lib/TritonAMDGPUTransforms/BlockPingpong.cpp",
                   "third_party/nvidia/hopper/lib/Transforms/WarpSpecialization/WSDataPartition.cpp")


def _library_row() -> dict:
    """Which warp-specialization and ping-pong passes libtriton holds, and which options the sm_90
    pipeline hands the Hopper warp-specialization pass (read from the backend's source)."""
    from triton.backends.nvidia import compiler as nv

    path = os.path.join(os.path.dirname(triton.__file__), "_C", "libtriton.so")
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        passes = {n: data.find(n.encode()) >= 0 for n in _PASS_NAMES}
        sources = {s: data.find(s.encode()) >= 0 for s in _SOURCE_MARKERS}
        nvidia_pingpong = any(data.find(m) >= 0 for m in (b"nvidia/hopper/lib/Transforms/WarpSpecialization/PingPong",
                                                          b"doPingPong", b"pingpongAutoWS"))
    with open(nv.__file__) as f:
        lines = [line.strip() for line in f if "add_hopper_warpspec" in line or "add_warp_specialize(" in line]
    code = tl.range.__init__.__code__
    return {"passes_present": passes, "sources_present": sources, "nvidia_pingpong_present": nvidia_pingpong,
            "pipeline_calls": lines, "cuda_options": [f.name for f in dataclasses.fields(nv.CUDAOptions)],
            "range_arguments": list(code.co_varnames[1:code.co_argcount])}


# What is counted in the TTGIR and the PTX: name in the row → pattern.
_TTGIR_OPS = {
    "ttg.warp_specialize": r"ttg\.warp_specialize\(",
    "ttng.warp_group_dot": r"ttng\.warp_group_dot ",
    "tt.dot": r"tt\.dot ",
    "ttg.async_copy_global_to_local": r"ttg\.async_copy_global_to_local",
    "ttng.async_tma_copy_global_to_local": r"ttng\.async_tma_copy_global_to_local",
    "ttng.async_tma_copy_local_to_global": r"ttng\.async_tma_copy_local_to_global",
    "ttng.wait_barrier": r"ttng\.wait_barrier",
    "ttng.arrive_barrier": r"ttng\.arrive_barrier",
    "ttng.barrier_expect": r"ttng\.barrier_expect",
    "ttng.tensormap_create": r"ttng\.tensormap_create",
}
_PTX_OPS = {
    "wgmma.mma_async": r"wgmma\.mma_async",
    "wgmma.wait_group": r"wgmma\.wait_group",
    "mma.sync": r"\bmma\.sync",
    "cp.async.bulk.tensor": r"cp\.async\.bulk\.tensor",
    "cp.async (non-bulk)": r"cp\.async\.(?:ca|cg)\.shared",
    "mbarrier.try_wait": r"mbarrier\.try_wait",
    "mbarrier.arrive": r"mbarrier\.arrive",
    "setmaxnreg": r"setmaxnreg",
    "tensormap.replace": r"tensormap\.replace",
    "fence.proxy.tensormap": r"fence\.proxy\.tensormap",
}


def _count(text: str, patterns: dict) -> dict:
    return {name: len(re.findall(pattern, text)) for name, pattern in patterns.items()}


def _partitions(ttgir: str) -> list[dict]:
    """The warp_specialize regions of the TTGIR: per region (default, partition0, …) its warps,
    its dots with their accumulator shapes, and its TMA loads and stores."""
    start = ttgir.find("ttg.warp_specialize(")
    if start < 0:
        return []
    text = ttgir[start:]
    marks = [(m.start(), m.group(1)) for m in re.finditer(r"^\s*(default|partition\d+)[ ({]", text, re.M)]
    out = []
    for i, (pos, name) in enumerate(marks):
        body = text[pos:marks[i + 1][0] if i + 1 < len(marks) else len(text)]
        head = body.split("\n", 1)[0]
        warps = re.search(r"num_warps\((\d+)\)", head)
        out.append({
            "region": name,
            "num_warps": int(warps.group(1)) if warps else None,
            "dots": re.findall(r"ttng\.warp_group_dot .*-> tensor<(\d+x\d+)xf32", body),
            "tma_loads": body.count("ttng.async_tma_copy_global_to_local"),
            "tma_stores": body.count("ttng.async_tma_copy_local_to_global"),
            "pointer_stores": body.count("tt.store "),
        })
    return out


def _shared_buffers(ttgir: str) -> dict:
    """The tile buffers the compiler allocated in shared memory (a leading dimension is the number
    of copies a pipelined or warp-specialized loop rotates through), shape → count; barriers
    (i64) left out."""
    found: dict[str, int] = {}
    for m in re.finditer(r"ttg\.local_alloc[^\n]*?-> !ttg\.memdesc<([0-9x]+x(?:bf16|f16|f32|f8E4M3FN))", ttgir):
        found[m.group(1)] = found.get(m.group(1), 0) + 1
    return found


def _resources(kernel) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        text = subprocess.run([os.path.join(BIN, "cuobjdump"), "-res-usage", f.name],
                              capture_output=True, text=True).stdout
    found = re.search(r"REG:(\d+) STACK:(\d+)", text)
    return {"registers": int(found.group(1)) if found else None, "stack_bytes": int(found.group(2)) if found else None}


def evidence(kernel) -> dict:
    ttgir, ptx = kernel.asm["ttgir"], kernel.asm["ptx"]
    md = kernel.metadata
    req = re.search(r"requestedRegisters = array<i32: ([\d, ]+)>", ttgir)
    named = sorted({f"{m.group(1)} {m.group(2)},{m.group(3)}" for m in
                    re.finditer(r"\b(bar\.sync|bar\.arrive|barrier\.sync|barrier\.arrive)\s+(\d+),\s*(\d+);", ptx)})
    row = {
        "num_warps_total": md.num_warps,
        "shared_bytes": md.shared,
        "global_scratch_bytes": getattr(md, "global_scratch_size", 0),
        **_resources(kernel),
        "ttgir": _count(ttgir, _TTGIR_OPS),
        "ptx": _count(ptx, _PTX_OPS),
        "wgmma_shapes": sorted(set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)", ptx))),
        "mma_sync_shapes": sorted(set(re.findall(r"mma\.sync\.aligned\.(m\d+n\d+k\d+)", ptx))),
        "setmaxnreg": sorted({f"{m.group(1)} {m.group(2)}" for m in
                              re.finditer(r"setmaxnreg\.(inc|dec)\.sync\.aligned\.u32\s+(\d+)", ptx)}),
        "shared_buffers": _shared_buffers(ttgir),
        "requested_registers": [int(x) for x in req.group(1).split(",")] if req else None,
        "named_barriers": named,
        "maxnreg_directive": (re.search(r"\.maxnreg (\d+)", ptx) or [None, None])[1],
        "cluster_directive": bool(re.search(r"\.reqnctapercluster|\.explicitcluster", ptx)),
        "partitions": _partitions(ttgir),
    }
    return row


def compile_probe(probe: dict):
    p = probe["params"]
    kind = probe["kernel"]
    if kind == "fa":
        fn, src = _compile_fa(p, persistent=False)
    elif kind == "fa_persistent":
        fn, src = _compile_fa(p, persistent=True)
    elif kind == "gemm":
        fn, src = _compile_gemm(p)
    elif kind == "omnitune":
        fn, src = _compile_omnitune(p)
    elif kind == "gluon":
        fn, src = _compile_gluon(p)
    else:
        raise ValueError(kind)
    options = {k: p[k] for k in ("num_warps", "num_stages", "maxnreg", "num_ctas") if k in p}
    return triton.compile(src, target=TARGET, options=options)


def run_one(probe: dict) -> dict:
    """Compile one probe in this process; the row (compiled or not) as a dict."""
    p = probe["params"]
    row = {"name": probe["name"], "feature": probe["feature"], "kernel": probe["kernel"], **p}
    started = time.perf_counter()
    if probe["kernel"] == "library":
        row.update(compiled=None, **_library_row())
        return row
    try:
        kernel = compile_probe(probe)
    except Exception as exc:  # a compile error is the probe's finding
        lines = str(exc).strip().splitlines()
        row.update(compiled=False, error=f"{type(exc).__name__}: {lines[-1] if lines else ''}")
    else:
        row.update(compiled=True, **evidence(kernel))
        for region in row["partitions"]:
            if region["region"] == "default":  # the default region runs on the kernel's own warps
                region["num_warps"] = p.get("num_warps", 4)
    row["compile_s"] = round(time.perf_counter() - started, 2)
    return row


# ------------------------------------------------------------------------------------------------
# Driver (the parent process)
# ------------------------------------------------------------------------------------------------


def _diagnostic(stderr: str) -> str | None:
    """The compiler's first real complaint on stderr: an MLIR error or a failed assertion."""
    for line in stderr.splitlines():
        if "Assertion" in line:
            return re.sub(r"^.*?/(lib|third_party)/", r"\1/", line.strip())
    for line in stderr.splitlines():
        if "error:" in line and "Failures have been detected" not in line:
            return re.sub(r"^\S*/", "", line.strip())
    return None


def run_isolated(probe: dict, timeout: float = 300.0) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    cmd = [sys.executable, os.path.abspath(__file__), "--child", json.dumps(probe)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"name": probe["name"], "feature": probe["feature"], "kernel": probe["kernel"], **probe["params"],
                "compiled": False, "error": f"compile did not finish in {timeout:.0f} s"}
    row = None
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("{"):
            row = json.loads(line)
            break
    if row is None:  # the child died before printing its row
        row = {"name": probe["name"], "feature": probe["feature"], "kernel": probe["kernel"], **probe["params"],
               "compiled": False, "error": f"compiler process exited with {done.returncode}"}
    if row.get("compiled") is False:
        row["diagnostic"] = _diagnostic(done.stderr)
    return row


def summary(row: dict) -> str:
    if row.get("compiled") is None:
        return f"{row['name']}: nvidia ping-pong pass present: {row.get('nvidia_pingpong_present')}"
    if not row.get("compiled"):
        return f"{row['name']}: FAILED {row.get('diagnostic') or row.get('error')}"
    t, x = row["ttgir"], row["ptx"]
    mma = (f"wgmma {x['wgmma.mma_async']} {','.join(row['wgmma_shapes'])}" if x["wgmma.mma_async"]
           else f"mma.sync {x['mma.sync']} {','.join(row['mma_sync_shapes'])}")
    parts = [f"{row['name']}: {row['registers']} reg, {row['shared_bytes'] // 1024} KiB smem, "
             f"{row['num_warps_total']} warps", mma, f"TMA {x['cp.async.bulk.tensor']}",
             f"cp.async {x['cp.async (non-bulk)']}", f"mbarrier waits {x['mbarrier.try_wait']}"]
    if t["ttg.warp_specialize"]:
        regions = "; ".join(f"{p['region']}({p['num_warps']}w dots {'/'.join(p['dots']) or '-'} tma {p['tma_loads']})"
                            for p in row["partitions"])
        parts.append(f"WS [{regions}] setmaxnreg {row['setmaxnreg']}")
    return ", ".join(parts)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="write the rows as JSON here")
    parser.add_argument("--only", action="append", help="run only the probes of these names")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(run_one(json.loads(args.child))))
        return 0
    chosen = [p for p in probes() if not args.only or p["name"] in args.only]
    rows = []
    for probe in chosen:
        row = run_isolated(probe)
        rows.append(row)
        print(summary(row), flush=True)
    if args.out:
        result = {
            "what": "Triton features compiled offline for sm_90 (no GPU); speed not measured (needs the H200)",
            "triton": triton.__version__,
            "target": "cuda sm_90 (GPUTarget('cuda', 90, 32)), warp size 32",
            "notes": "ptx counts are static instruction counts in the PTX text (an unrolled or pipelined loop "
                     "repeats them), not executed counts; registers are ptxas's allocation (cuobjdump -res-usage); "
                     "a warp-specialized kernel starts at that count and setmaxnreg moves each warpgroup's",
            "rows": rows,
        }
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

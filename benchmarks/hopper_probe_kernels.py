"""The kernels benchmarks/hopper_features_offline.py compiles for sm_90: a FlashAttention-style
forward (pointer loads, host or in-kernel tensor descriptors, warp specialization, a persistent
grid), a GEMM, and a Gluon skeleton of ping-pong. Probes, not production kernels: compiled, never
launched."""

from __future__ import annotations

import triton
import triton.language as tl

HEAD_DIM = 128
NUM_SMS = 132  # the H200's SMs; a persistent grid's stride (a constexpr here, as a launcher would pass it)

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

"""A whole cross-modal attention layer: Q/K/V projections, attention, output projection.

    out = softmax((x_q Wqᵀ + bq)(x_kv Wkᵀ + bk)ᵀ · d^-½) (x_kv Wvᵀ + bv) Woᵀ + bo

x_q [B, Lq, hidden] is the querying modality (e.g. text), x_kv [B, Lk, hidden] the attended one
(e.g. image or video tokens). No mask: in cross-attention every query sees every attended token.
Wq [h·d, hidden], Wkv [2·hkv·d, hidden] (K rows, then V rows), Wo [hidden, h·d]; hidden need not
equal h·d. GQA: query head i reads kv head i // (h / hkv).

The tunable FUSION picks one of three paths; the search measures all of them, so the tuned table
says per problem whether fusion wins (and omnitune.kernels.layers falls back where it does not):
  none   the unfused layer: GEMMs through cuBLAS, attention through SDPA. The baseline, and the
         rollback path. Its other parameters are parked at fixed values (it ignores them), so a
         search measures it exactly once.
  q      the Q projection in the attention prologue: each program (query tile, batch·head)
         computes its Q tile x_q[b, tile, :] · Wq[head]ᵀ in BLOCK_K chunks of hidden, folds
         d^-½·log2(e) into it, then runs FlashAttention-2 (online softmax, exp2) over K/V and
         writes O [B, Lq, h, d]; the output projection is one cuBLAS GEMM.
  q_out  also the output projection in the epilogue: each program multiplies its normalized
         O tile [BLOCK_M, d] by its head's slice of Wo in BLOCK_O chunks of hidden and adds the
         partial products of all heads together IN THE SAME LAUNCH, with relaxed fp32 atomics
         into a workspace [B, Lq, hidden]. After a barrier, one acq_rel increment of a
         per-(batch, query tile) counter tells the last head to finish (it sees h − 1); that
         program takes the summed tile out of the workspace with atomic exchanges against zero,
         adds bo, writes the output in the model dtype and resets the counter. So the workspace
         is always left zeroed: no memset and no second launch per call.

The summed tile is read with atomics, not plain loads: atomics are performed where the other
programs' atomics were, plain loads measurably could be served a stale copy, and the exchange
zeroes the workspace in the same instruction (the measurements: docs/fusion.md, "Why the sums
are read with atomics").

The workspace (fp32 sums, int32 counters) is allocated zeroed once: by make_inputs for the spec,
and cached per (device, stream, B, Lq, hidden) by omnitune.kernels.layers. The counters are sized
for the smallest BLOCK_M, so one workspace serves every config. A launch that raises part-way
may leave it dirty; both owners zero it again before anything else uses it.

Why the K/V projection is NOT fused: x_kv · Wkvᵀ does not depend on the query. Fused into the
attention loop it would be recomputed by every query tile and by every query head of a GQA group:
cdiv(Lq, BLOCK_M) × h/hkv times the work (×7 on Qwen2.5-Omni-7B at Lq ≤ BLOCK_M, ×56 at Lq 512,
BLOCK_M 64). It is computed once per call by one cuBLAS GEMM into [B, Lk, 2·hkv·d], whose K and V
halves the attention reads through strides, without copies. Every path does this identically, so
the comparison between paths is fair; benchmarks/fused_layer_bench.py times this GEMM alone so
that its share of the layer is known.

Cached K/V (kv_cached=True). In a decode loop the attended modality (an image, a video) does not
change between steps, so production projects it once and reuses the result: the layer's inputs
then hold kv [B, Lk, 2·hkv·d] itself (bias applied) and no path runs the K/V GEMM. Without
that GEMM the layer is a different mix of work (its share measured: docs/fusion.md), so
kv_cached is part of the problem key and matched exactly by the runtime. The reference still projects x_kv itself, in its own precision.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from omnitune.errors import InputError, ShapeError
from omnitune.kernels._host import (
    INT32_OFFSETS,
    LOG2E,
    batch_slices,
    cdiv,
    offsets_pass_int32,
    seeded_rand,
    within_int32_offsets,
)
from omnitune.kernels._launch import BoundLauncher, DirectLauncher, PlanCache
from omnitune.spec import (
    Config,
    Constraint,
    DeviceLimits,
    KernelSpec,
    MatchPolicy,
    Param,
    element_bytes,
    poisoned,
    require_runnable_device,
)

HEAD_DIMS = (64, 128)
FUSIONS = ("none", "q", "q_out")
SMALLEST_BLOCK_M = 16  # counters are allocated per tile of this many rows, enough for any BLOCK_M


@triton.jit
def _dot(a, b, acc, IEEE_DOT: tl.constexpr):
    # fp32 inputs are checked with exact products; fp16/bf16 take the tensor cores as they are.
    if IEEE_DOT:
        return tl.dot(a, b, acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc)


@triton.jit
def _fence_gpu(x):
    """A GPU-scope acquire-release fence in every thread (Triton has no fence of its own). Before
    the arrival count, each thread's own atomics are then performed GPU-wide, not merely ordered
    by the CTA barrier; after it, the reads of the sums cannot be satisfied early."""
    return tl.inline_asm_elementwise("fence.acq_rel.gpu; mov.u32 $0, $1;", "=r,r", [x],
                                     dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _cross_attention_layer_fwd(
    XQ, WQ, BQ, KV, O, WO, BO, OUT, WS, COUNT,
    stride_xb, stride_xm, stride_xk,
    stride_wqn, stride_wqk,
    stride_kvb, stride_kvn, stride_kvc,
    stride_ob, stride_om, stride_oh, stride_od,
    stride_won, stride_wok,
    stride_outb, stride_outm, stride_outn,
    stride_wsb, stride_wsm, stride_wsn,
    H, HKV, LQ, LK, HIDDEN, COUNT_TILES,
    qk_scale,
    D: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_O: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    FUSE_OUT: tl.constexpr,
    IEEE_DOT: tl.constexpr,
    GPU_FENCE: tl.constexpr,
):
    # axis 0: query tile; axis 1: batch × query head. Neighbours on axis 0 share K/V in L2.
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    head = pid_bh % H
    hk = head // GROUP

    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_valid = rows < LQ
    offs_d = tl.arange(0, D)
    offs_k = tl.arange(0, BLOCK_K)

    # --- prologue: Q tile = x_q[b, rows, :] · Wq[head·D:(head+1)·D, :]ᵀ, hidden in BLOCK_K chunks
    x_ptrs = XQ + b.to(tl.int64) * stride_xb + rows[:, None] * stride_xm + offs_k[None, :] * stride_xk
    w_ptrs = WQ + (head * D + offs_d).to(tl.int64)[None, :] * stride_wqn + offs_k[:, None] * stride_wqk
    q = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    for _ in range(0, HIDDEN, BLOCK_K):  # hidden % BLOCK_K == 0 (a constraint): no column mask
        x = tl.load(x_ptrs, mask=row_valid[:, None], other=0.0)
        w = tl.load(w_ptrs)  # [BLOCK_K, D]: Wq's slice, transposed through the strides
        q = _dot(x, w, q, IEEE_DOT)
        x_ptrs += BLOCK_K * stride_xk
        w_ptrs += BLOCK_K * stride_wqk
    if HAS_BIAS:
        q += tl.load(BQ + head * D + offs_d).to(tl.float32)[None, :]
    # The softmax scale and log2(e) ride on Q, so each score tile needs no multiply before exp2.
    q = (q * qk_scale).to(XQ.dtype.element_ty)

    # --- FlashAttention-2 over all of K/V (no mask: every query sees every key) ---------------
    k_base = KV + b.to(tl.int64) * stride_kvb + (hk * D + offs_d)[None, :] * stride_kvc
    v_base = KV + b.to(tl.int64) * stride_kvb + ((HKV + hk) * D + offs_d)[None, :] * stride_kvc
    offs_n = tl.arange(0, BLOCK_N)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    for start_n in range(0, LK, BLOCK_N):
        n = start_n + offs_n
        n_valid = n < LK
        k = tl.load(k_base + n[:, None] * stride_kvn, mask=n_valid[:, None], other=0.0)
        v = tl.load(v_base + n[:, None] * stride_kvn, mask=n_valid[:, None], other=0.0)
        qk = _dot(q, tl.trans(k), tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), IEEE_DOT)
        qk = tl.where(n_valid[None, :], qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))  # finite: every tile holds at least one key
        p = tl.math.exp2(qk - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = _dot(p.to(v.dtype), v, acc * alpha[:, None], IEEE_DOT)
        m_i = m_new
    o = acc / l_i[:, None]

    if not FUSE_OUT:
        o_ptrs = (O + b.to(tl.int64) * stride_ob + rows[:, None] * stride_om + head * stride_oh
                  + offs_d[None, :] * stride_od)
        tl.store(o_ptrs, o.to(O.dtype.element_ty), mask=row_valid[:, None])
    else:
        # --- epilogue: this head's share of out = O · Wo[:, head·D:(head+1)·D]ᵀ, summed over heads
        o = o.to(WO.dtype.element_ty)
        offs_o = tl.arange(0, BLOCK_O)
        wo_ptrs = WO + offs_o.to(tl.int64)[None, :] * stride_won + (head * D + offs_d)[:, None] * stride_wok
        ws_tile = WS + b.to(tl.int64) * stride_wsb + rows[:, None] * stride_wsm
        for start_o in range(0, HIDDEN, BLOCK_O):  # hidden % BLOCK_O == 0 (a constraint)
            wo = tl.load(wo_ptrs)  # [D, BLOCK_O]
            part = _dot(o, wo, tl.zeros([BLOCK_M, BLOCK_O], dtype=tl.float32), IEEE_DOT)
            tl.atomic_add(ws_tile + (start_o + offs_o)[None, :] * stride_wsn, part,
                          mask=row_valid[:, None], sem="relaxed")
            wo_ptrs += BLOCK_O * stride_won
        # Every thread's adds are issued before the one release below; the last head to arrive
        # then sees all h heads' sums (its acquire pairs with every other head's release).
        if GPU_FENCE:
            _fence_gpu(pid_m)
        tl.debug_barrier()
        counter = COUNT + b * COUNT_TILES + pid_m
        arrived = tl.atomic_add(counter, 1, sem="acq_rel")
        if arrived == H - 1:
            if GPU_FENCE:
                _fence_gpu(pid_m)
            out_tile = OUT + b.to(tl.int64) * stride_outb + rows[:, None] * stride_outm
            # The sums are exchanged for zeros as raw 32-bit words (Triton's interpreter has no
            # float exchange): read where the atomics were performed, and the workspace left zeroed.
            ws_words = ws_tile.to(tl.pointer_type(tl.int32), bitcast=True)
            zeros = tl.zeros([BLOCK_M, BLOCK_O], dtype=tl.int32)
            for start_o in range(0, HIDDEN, BLOCK_O):
                cols = start_o + offs_o
                words = tl.atomic_xchg(ws_words + cols[None, :] * stride_wsn, zeros,
                                       mask=row_valid[:, None], sem="relaxed")
                total = words.to(tl.float32, bitcast=True)
                if HAS_BIAS:
                    total += tl.load(BO + cols).to(tl.float32)[None, :]
                tl.store(out_tile + cols[None, :] * stride_outn, total.to(OUT.dtype.element_ty),
                         mask=row_valid[:, None])
            tl.atomic_xchg(counter, 0, sem="relaxed")


# ------------------------------------------------------------------------------------------------
# Problem, inputs, paths
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CrossAttentionLayerProblem:
    """One layer call: x_q [b, lq, hidden] attends to x_kv [b, lk, hidden] with h query heads and
    hkv kv heads of dim d; bias: the projections carry biases."""

    b: int
    lq: int
    lk: int
    hidden: int
    h: int
    hkv: int
    d: int
    bias: bool = False
    kv_cached: bool = False
    """The inputs hold the projected K/V [b, lk, 2·hkv·d]; the layer skips the K/V GEMM."""

    def __post_init__(self):
        for name in ("b", "lq", "lk", "hidden", "h", "hkv", "d"):
            if getattr(self, name) < 1:
                raise ShapeError(f"{name} must be ≥ 1, got {getattr(self, name)}")
        if self.h % self.hkv:
            raise ShapeError(f"h={self.h} is not a multiple of hkv={self.hkv}")
        if self.d not in HEAD_DIMS:
            raise ShapeError(f"head dim d={self.d} is not supported; use one of {HEAD_DIMS}")

    @property
    def group(self) -> int:
        return self.h // self.hkv


@dataclass
class Workspace:
    """The fused epilogue's cross-head sums and arrival counters; zero between launches."""

    sums: torch.Tensor      # [B, Lq, hidden] float32
    counters: torch.Tensor  # [B · cdiv(Lq, SMALLEST_BLOCK_M)] int32

    @classmethod
    def zeroed(cls, b: int, lq: int, hidden: int, device) -> Workspace:
        return cls(
            torch.zeros((b, lq, hidden), dtype=torch.float32, device=device),
            torch.zeros((b * triton.cdiv(lq, SMALLEST_BLOCK_M),), dtype=torch.int32, device=device),
        )

    def rezero(self) -> None:
        self.sums.zero_()
        self.counters.zero_()


@dataclass
class LayerInputs:
    x_q: torch.Tensor
    x_kv: torch.Tensor | None  # None when kv is given (the layer with cached K/V)
    wq: torch.Tensor
    wkv: torch.Tensor | None   # likewise
    wo: torch.Tensor
    bq: torch.Tensor | None
    bkv: torch.Tensor | None
    bo: torch.Tensor | None
    h: int
    hkv: int
    workspace: Workspace | None  # needed by FUSION=q_out only
    sm_scale: float
    kv: torch.Tensor | None = None
    """The projected K/V [B, Lk, 2·hkv·d] (K rows, then V rows, bias applied), computed once
    and reused: every path reads it instead of projecting x_kv."""

    @property
    def d(self) -> int:
        return self.wq.shape[0] // self.h


def check_head_counts(h, hkv) -> None:
    """heads and kv_heads as the layer takes them: ints, h a positive multiple of hkv (InputError
    otherwise). Also judged before a compiled call, whose op schema reads True as 1."""
    # bool is an int subclass: heads=True was taken as one head.
    if (not isinstance(h, int) or not isinstance(hkv, int) or isinstance(h, bool) or isinstance(hkv, bool)
            or h < 1 or hkv < 1 or h % hkv):
        raise InputError(f"heads={h!r} must be a positive multiple of kv_heads={hkv!r}")


def check_inputs(x_q, x_kv, wq, wkv, wo, bq, bkv, bo, h: int, hkv: int, kv=None) -> CrossAttentionLayerProblem:
    """The problem these tensors describe; InputError for anything the layer cannot run on.

    K/V come from exactly one source: x_kv projected by wkv (and bkv), or kv, that projection
    already made (cached K/V, kv_cached=True). With kv, x_kv, wkv and bkv must be None: the layer
    would not read them, and checking that they still agree with kv would cost the GEMM that
    caching saves."""
    cached = kv is not None
    if cached:
        extra = [n for n, t in (("x_kv", x_kv), ("wkv", wkv), ("bkv", bkv)) if t is not None]
        if extra:
            raise InputError(f"kv replaces x_kv, wkv and bkv (it is their projection): pass "
                             f"{', '.join(extra)} as None when kv is given")
        named = {"x_q": x_q, "kv": kv, "wq": wq, "wo": wo}
    else:
        if x_kv is None or wkv is None:
            raise InputError("K/V need a source: give x_kv and wkv, or kv (x_kv already projected, "
                             "e.g. by omnitune.kernels.layers.project_kv)")
        named = {"x_q": x_q, "x_kv": x_kv, "wq": wq, "wkv": wkv, "wo": wo}
    for name, t in named.items():
        if not isinstance(t, torch.Tensor):
            raise InputError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    source_name, source = ("kv", kv) if cached else ("x_kv", x_kv)
    if x_q.dim() != 3 or source.dim() != 3:
        raise InputError(f"x_q and {source_name} must be 3-D [B, L, hidden], got {list(x_q.shape)} "
                         f"and {list(source.shape)}")
    b, lq, hidden = x_q.shape
    if cached and kv.shape[0] != b:
        raise InputError(f"kv {list(kv.shape)} has batch {kv.shape[0]}, x_q {list(x_q.shape)} has {b}")
    if not cached and (x_kv.shape[0] != b or x_kv.shape[2] != hidden):
        raise InputError(f"x_kv {list(x_kv.shape)} does not match x_q {list(x_q.shape)} in batch and hidden")
    check_head_counts(h, hkv)
    if wq.dim() != 2 or wq.shape[1] != hidden or wq.shape[0] % h:
        raise InputError(f"wq must be [heads·d, hidden={hidden}], got {list(wq.shape)}")
    d = wq.shape[0] // h
    if d not in HEAD_DIMS:
        raise InputError(f"head dim {d} (wq rows / heads) is not supported; use one of {HEAD_DIMS}")
    if cached and kv.shape[2] != 2 * hkv * d:
        raise InputError(f"kv's last dim must be 2·kv_heads·d = {2 * hkv * d} (K rows, then V rows), "
                         f"got {list(kv.shape)}")
    expected = {"wo": (hidden, h * d)} if cached else {"wkv": (2 * hkv * d, hidden), "wo": (hidden, h * d)}
    for name, shape in expected.items():
        if tuple(named[name].shape) != shape:
            raise InputError(f"{name} must be {list(shape)}, got {list(named[name].shape)}")
    biases = {"bq": (bq, h * d), "bo": (bo, hidden)}
    if not cached:  # cached K/V carry bkv already
        biases = {"bq": biases["bq"], "bkv": (bkv, 2 * hkv * d), "bo": biases["bo"]}
    given = [n for n, (t, _) in biases.items() if t is not None]
    if given and len(given) != len(biases):
        raise InputError(f"give all of {', '.join(biases)} or none of them (got only {', '.join(given)})"
                         + ("; kv already holds bkv" if cached else ""))
    for name, (t, size) in biases.items():
        if t is not None and (not isinstance(t, torch.Tensor) or tuple(t.shape) != (size,)):
            raise InputError(f"{name} must be a tensor of shape [{size}]")
    tensors = [t for t in (*named.values(), bq, bkv, bo) if t is not None]
    if len({t.device for t in tensors}) != 1:
        raise InputError("all tensors must be on one device")
    if x_q.device.type == "meta":
        # Refused on every path: the fused kernel refused meta tensors while the unfused path
        # returned a meta tensor, so the answer hung on which path the tuned table chose.
        raise InputError("tensors are on meta; the layer runs on a CUDA device (or the CPU)")
    if len({t.dtype for t in tensors}) != 1:
        raise InputError("all tensors must have one dtype")
    if x_q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise InputError(f"unsupported dtype {x_q.dtype}; use float16, bfloat16 or float32")
    lk = source.shape[1]
    if lq == 0 or lk == 0 or hidden == 0:
        raise InputError("sequence lengths and hidden must be ≥ 1")
    return CrossAttentionLayerProblem(b=b, lq=lq, lk=lk, hidden=hidden, h=h, hkv=hkv, d=d,
                                      bias=bq is not None, kv_cached=cached)


def kv_projection(x_kv: torch.Tensor, wkv: torch.Tensor, bkv: torch.Tensor | None) -> torch.Tensor:
    """[B, Lk, 2·hkv·d]: K then V of every kv head, by one GEMM. What every path runs per call,
    and what cached K/V hold (made once by the same GEMM)."""
    return F.linear(x_kv, wkv, bkv)


def project_kv(inputs: LayerInputs) -> torch.Tensor:
    """The K/V every path reads: the cached tensor when the inputs hold one (no GEMM), otherwise
    x_kv projected now."""
    if inputs.kv is not None:
        return inputs.kv
    return kv_projection(inputs.x_kv, inputs.wkv, inputs.bkv)


def unfused(inputs: LayerInputs, out: torch.Tensor | None = None) -> torch.Tensor:
    """The layer through PyTorch: cuBLAS GEMMs and SDPA (GQA without expanding K/V where SDPA
    allows it). The baseline and the rollback path. With `out` (the spec's launcher), the output
    projection writes into it: what a search times for FUSION=none is then what the op runs, not
    that plus a copy (a launch of its own: with it, the same calls timed 1.001–1.07x PyTorch's on
    the layer's held-out set, round 16)."""
    b, lq, _ = inputs.x_q.shape
    h, hkv, d = inputs.h, inputs.hkv, inputs.d
    q = F.linear(inputs.x_q, inputs.wq, inputs.bq).view(b, lq, h, d).transpose(1, 2)
    kv = project_kv(inputs)
    kv = kv.reshape(b, kv.shape[1], 2, hkv, d)  # a view, unless a caller's cached kv is oddly strided
    k, v = kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2)
    o = _sdpa(q, k, v, inputs.sm_scale)
    if out is None:
        return F.linear(o.transpose(1, 2).reshape(b, lq, h * d), inputs.wo, inputs.bo)
    _project_out(o.transpose(1, 2).reshape(b * lq, h * d), inputs.wo, inputs.bo, out)
    return out


def _project_out(o2d: torch.Tensor, wo: torch.Tensor, bo: torch.Tensor | None, out: torch.Tensor) -> None:
    """out = o2d · woᵀ + bo: one GEMM (the bias in its epilogue) straight into a contiguous `out`;
    into any other through a copy."""
    rows, hidden = o2d.shape[0], wo.shape[0]
    if not out.is_contiguous():
        out.copy_(F.linear(o2d, wo, bo).view(out.shape))
    elif bo is not None:
        torch.addmm(bo, o2d, wo.t(), out=out.view(rows, hidden))
    else:
        torch.mm(o2d, wo.t(), out=out.view(rows, hidden))


def _sdpa(q, k, v, scale):
    if q.shape[1] == k.shape[1]:
        return F.scaled_dot_product_attention(q, k, v, scale=scale)
    try:
        return F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True)
    except (TypeError, RuntimeError):  # a torch or backend without GQA support
        group = q.shape[1] // k.shape[1]
        return F.scaled_dot_product_attention(
            q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), scale=scale)


_LAYER = DirectLauncher(_cross_attention_layer_fwd)
_LAYER_TENSORS = 10  # the kernel's tensor arguments, ahead of its plain ones


def _launch_plan(config: Config, d: int, group: int, has_bias: bool, dtype: torch.dtype,
                 on_gpu: bool) -> BoundLauncher:
    """The fused kernel bound to its constexprs: what `kernel[grid](...)` would rebind, re-key
    and re-specialise on every call (most of the layer's host time: the JIT's launch path)."""
    fuse_out = config["FUSION"] == "q_out"
    constexprs = dict(D=d, GROUP=group, BLOCK_M=int(config["BLOCK_M"]), BLOCK_N=int(config["BLOCK_N"]),
                      BLOCK_K=int(config["BLOCK_K"]), BLOCK_O=int(config["BLOCK_O"]),
                      HAS_BIAS=has_bias, FUSE_OUT=fuse_out, IEEE_DOT=dtype == torch.float32,
                      # the interpreter runs programs one by one: no inline PTX
                      GPU_FENCE=fuse_out and on_gpu,
                      num_warps=int(config["num_warps"]), num_stages=int(config["num_stages"]))
    return _LAYER.bind(constexprs, _LAYER_TENSORS)


# (config, head dim, GQA group, bias, dtype, device kind) → the bound kernel.
_launch_plans = PlanCache(_launch_plan)


def launch_fused(inputs: LayerInputs, out: torch.Tensor, config: Config) -> None:
    """Run a fused path (FUSION 'q' or 'q_out'), writing out [B, Lq, hidden]."""
    require_runnable_device(inputs.x_q)
    fuse_out = config["FUSION"] == "q_out"
    x_q, wq, wo = inputs.x_q, inputs.wq, inputs.wo
    b, lq, hidden = x_q.shape
    h, hkv, d = inputs.h, inputs.hkv, inputs.d
    kv = project_kv(inputs)
    lk = kv.shape[1]
    # Rows (query and key) and channels are 32-bit offsets in the kernel (_host.INT32_OFFSETS):
    # inputs too far apart go as contiguous copies; lengths past them even so are not the fused
    # kernel's (a ValueError, which the layer answers with its unfused path).
    if (lq * max(hidden, h * d) >= INT32_OFFSETS or lk * kv.shape[2] >= INT32_OFFSETS
            or offsets_pass_int32(out, (1, 2))):
        raise ValueError(f"{lq} query rows × {hidden} channels, or {lk} keys × {kv.shape[2]}, pass the fused "
                         "kernel's 32-bit offsets")
    x_q, kv = within_int32_offsets(x_q, (1, 2), "x_q"), within_int32_offsets(kv, (1, 2), "kv")
    ws = inputs.workspace
    if fuse_out and ws is None:
        raise InputError("FUSION=q_out needs a workspace (Workspace.zeroed)")
    # Without the fused epilogue the workspace is never touched: `out` stands in for its pointers.
    sums, counters = (ws.sums, ws.counters) if fuse_out else (out, out)
    o = out if fuse_out else torch.empty((b, lq, h, d), dtype=x_q.dtype, device=x_q.device)
    has_bias = inputs.bq is not None
    # The kernel reads biases as dense vectors; an absent one is a placeholder, never read.
    bq, bo = (inputs.bq.contiguous(), inputs.bo.contiguous()) if has_bias else (wq, wq)
    kernel = _launch_plans.get(config, (d, h // hkv, has_bias, x_q.dtype, x_q.is_cuda))
    count_tiles = cdiv(lq, SMALLEST_BLOCK_M)

    def run(batch, x_q, kv, o, out, sums, counters):
        kernel((cdiv(lq, int(config["BLOCK_M"])), batch * h, 1), (
            x_q, wq, bq, kv, o, wo, bo,
            out, sums, counters,
            *x_q.stride(), *wq.stride(), *kv.stride(),
            *(o.stride() if not fuse_out else (0, 0, 0, 0)),
            *wo.stride(), *out.stride(), *sums.stride(),
            h, hkv, lq, lk, hidden, count_tiles,
            inputs.sm_scale * LOG2E,
        ))

    try:
        if (slices := batch_slices(b, h)) is None:
            run(b, x_q, kv, o, out, sums, counters)
        else:
            # The grid holds b·h programs along y, which CUDA bounds: a batch past it runs in
            # batch slices of views (its counters too: a sequence's are count_tiles in a row).
            for rows in slices:
                counter_rows = slice(rows.start * count_tiles, rows.stop * count_tiles) if fuse_out else rows
                run(rows.stop - rows.start, x_q[rows], kv[rows], o[rows], out[rows], sums[rows],
                    counters[counter_rows])
    except BaseException:
        if fuse_out:  # a launch stopped part-way may have left partial sums behind
            ws.rezero()
        raise
    if not fuse_out:
        _project_out(o.view(b * lq, h * d), wo, inputs.bo, out)


def launch(inputs: LayerInputs, out: torch.Tensor, config: Config) -> None:
    """The spec's launcher: the path the config's FUSION names."""
    if config["FUSION"] == "none":
        unfused(inputs, out)
    else:
        launch_fused(inputs, out, config)


# ------------------------------------------------------------------------------------------------
# Spec: inputs, reference, model, config space
# ------------------------------------------------------------------------------------------------


def make_inputs(problem: CrossAttentionLayerProblem, dtype: torch.dtype, device, seed: int) -> LayerInputs:
    gen = torch.Generator(device="cpu").manual_seed(seed)
    p = problem

    rand = seeded_rand(gen, device, dtype)

    # Weights scaled by hidden^-½ (as initialized models are) keep activations O(1) in fp16.
    w = 1.0 / math.sqrt(p.hidden)
    inputs = LayerInputs(
        x_q=rand(p.b, p.lq, p.hidden),
        x_kv=rand(p.b, p.lk, p.hidden),
        wq=rand(p.h * p.d, p.hidden, scale=w),
        wkv=rand(2 * p.hkv * p.d, p.hidden, scale=w),
        wo=rand(p.hidden, p.h * p.d, scale=1.0 / math.sqrt(p.h * p.d)),
        bq=rand(p.h * p.d, scale=0.5) if p.bias else None,
        bkv=rand(2 * p.hkv * p.d, scale=0.5) if p.bias else None,
        bo=rand(p.hidden, scale=0.5) if p.bias else None,
        h=p.h,
        hkv=p.hkv,
        workspace=Workspace.zeroed(p.b, p.lq, p.hidden, device),
        sm_scale=1.0 / math.sqrt(p.d),
    )
    if p.kv_cached:
        # Projected once, as a decode loop does before its first step; x_kv and Wkv stay for the
        # reference, which projects them itself.
        inputs.kv = kv_projection(inputs.x_kv, inputs.wkv, inputs.bkv)
    return inputs


def new_output(inputs: LayerInputs) -> torch.Tensor:
    return poisoned(inputs.x_q.shape, inputs.x_q.dtype, inputs.x_q.device)


def reference(inputs: LayerInputs) -> torch.Tensor:
    """The layer in plain matmuls and softmax — float64 on the CPU, float32 without TF32 on a
    GPU — one sequence at a time so that long ones fit; independent of both paths. It projects
    x_kv itself even when the inputs hold cached K/V (it checks that they are the projection);
    only inputs without x_kv (the layer's, with kv given) are taken from kv."""
    acc = torch.float64 if inputs.x_q.device.type == "cpu" else torch.float32
    b, lq, hidden = inputs.x_q.shape
    h, hkv, d = inputs.h, inputs.hkv, inputs.d
    group = h // hkv

    def up(t):
        return None if t is None else t.to(acc)

    wq, wkv, wo, bq, bkv, bo = map(up, (inputs.wq, inputs.wkv, inputs.wo, inputs.bq, inputs.bkv, inputs.bo))
    out = torch.empty((b, lq, hidden), dtype=acc, device=inputs.x_q.device)
    prev_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        for i in range(b):
            q = inputs.x_q[i].to(acc) @ wq.T
            if inputs.x_kv is not None:
                kv = inputs.x_kv[i].to(acc) @ wkv.T + (bkv if bkv is not None else 0.0)
            else:
                kv = inputs.kv[i].to(acc)
            if bq is not None:
                q = q + bq
            q = q.view(lq, h, d).transpose(0, 1)                        # [h, lq, d]
            k = kv[:, :hkv * d].view(-1, hkv, d).transpose(0, 1)        # [hkv, lk, d]
            v = kv[:, hkv * d:].view(-1, hkv, d).transpose(0, 1)
            k = k.repeat_interleave(group, 0)
            v = v.repeat_interleave(group, 0)
            probs = torch.softmax((q @ k.transpose(1, 2)) * inputs.sm_scale, dim=-1)
            o = (probs @ v).transpose(0, 1).reshape(lq, h * d)
            out[i] = o @ wo.T + (bo if bo is not None else 0.0)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev_tf32
    return out


def flops(problem: CrossAttentionLayerProblem) -> float:
    """The whole layer: Q, K/V (unless cached) and output projections, and QKᵀ and PV of attention."""
    p = problem
    q_proj = 2.0 * p.b * p.lq * p.hidden * p.h * p.d
    kv_proj = 0.0 if p.kv_cached else 2.0 * p.b * p.lk * p.hidden * 2 * p.hkv * p.d
    attention = 4.0 * p.b * p.h * p.lq * p.lk * p.d
    out_proj = 2.0 * p.b * p.lq * p.h * p.d * p.hidden
    return q_proj + kv_proj + attention + out_proj


def bytes_moved(problem: CrossAttentionLayerProblem, dtype: torch.dtype) -> float:
    """The least HBM traffic any implementation needs: both inputs and all weights read once,
    the output written once (intermediates assumed to stay on chip). With cached K/V the layer
    reads kv [B, Lk, 2·hkv·d] instead of x_kv, Wkv and bkv."""
    p = problem
    kv_width = 2 * p.hkv * p.d
    attended = p.b * p.lk * (kv_width if p.kv_cached else p.hidden)  # kv, or x_kv
    activations = p.b * p.lq * p.hidden * 2 + attended  # x_q, out, and the attended side
    weights = p.h * p.d * p.hidden * 2 + (0 if p.kv_cached else kv_width * p.hidden)  # Wq, Wo, Wkv
    biases = (p.h * p.d + p.hidden + (0 if p.kv_cached else kv_width)) if p.bias else 0
    return float((activations + weights + biases) * element_bytes(dtype))


# The unfused path ignores every tile parameter; they are parked at these values with
# FUSION="none" (unfused_is_one_config), and BLOCK_O at its value with FUSION="q", so that a
# search never measures the same path twice. Fixed values rather than the problem's default, so
# that the parked config is the same for every problem and default_config need not consult itself.
# BLOCK_M=16 fits every problem, so a user's {"FUSION": "q"} completes (over the unfused default) to
# a valid fused config.
PARKED = {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 64, "BLOCK_O": 64, "num_warps": 4, "num_stages": 2}
UNFUSED = {"FUSION": "none", **PARKED}


def park_ignored(config: Config) -> Config:
    """The config with the parameters its path ignores at their parked values."""
    if config["FUSION"] == "none":
        return config.replace(**PARKED)
    if config["FUSION"] == "q":
        return config.replace(BLOCK_O=PARKED["BLOCK_O"])
    return config


def _fused(config: Config) -> bool:
    return config["FUSION"] != "none"


def shared_memory_bytes(problem: CrossAttentionLayerProblem, config: Config, dtype: torch.dtype) -> int:
    """Estimate: the resident Q tile, plus the largest of the three phases' staged tiles — the
    prologue's x and Wq chunks, the loop's K and V tiles, the epilogue's Wo chunk and O tile."""
    elt = element_bytes(dtype)
    bm, bn, bk, bo = (int(config[k]) for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "BLOCK_O"))
    stages, d = int(config["num_stages"]), problem.d
    prologue = stages * (bm * bk + d * bk)
    loop = stages * 2 * bn * d
    epilogue = (bo * d + bm * d) if config["FUSION"] == "q_out" else 0
    return elt * (bm * d + max(prologue, loop, epilogue))


def _check_shared_memory(problem, config, dtype, limits: DeviceLimits):
    if not _fused(config):
        return None
    need = shared_memory_bytes(problem, config, dtype)
    if need > limits.shared_memory_per_block_bytes:
        return f"needs ~{need // 1024} KiB of shared memory, the device has {limits.shared_memory_per_block_bytes // 1024} KiB"
    return None


def _check_hidden_chunks(problem, config, dtype, limits):
    # The prologue and epilogue loops over hidden carry no column mask.
    if _fused(config) and problem.hidden % int(config["BLOCK_K"]):
        return f"hidden={problem.hidden} is not a multiple of BLOCK_K={config['BLOCK_K']}"
    if config["FUSION"] == "q_out" and problem.hidden % int(config["BLOCK_O"]):
        return f"hidden={problem.hidden} is not a multiple of BLOCK_O={config['BLOCK_O']}"
    return None


def _check_block_m(problem, config, dtype, limits):
    useful = max(16, triton.next_power_of_2(problem.lq))
    if _fused(config) and int(config["BLOCK_M"]) > useful:
        return f"BLOCK_M={config['BLOCK_M']} exceeds the {problem.lq} query rows (use ≤ {useful})"
    return None


def _check_unfused_is_one_config(problem, config, dtype, limits):
    if config["FUSION"] == "none":
        off = [k for k, v in PARKED.items() if config[k] != v]
        if off:
            return f"FUSION=none ignores {', '.join(off)}; they must be parked at " + \
                ", ".join(f"{k}={PARKED[k]}" for k in off)
    elif config["FUSION"] == "q" and config["BLOCK_O"] != PARKED["BLOCK_O"]:
        return f"FUSION=q ignores BLOCK_O; it must be parked at {PARKED['BLOCK_O']}"
    return None


PARAMS = (
    Param("FUSION", FUSIONS, "none: cuBLAS+SDPA; q: Q projection fused; q_out: and the output projection"),
    Param("BLOCK_M", (16, 32, 64, 128), "query rows per program"),
    Param("BLOCK_N", (32, 64, 128), "keys per attention-loop tile"),
    Param("BLOCK_K", (32, 64, 128), "hidden chunk of the fused Q projection"),
    Param("BLOCK_O", (64, 128), "hidden chunk of the fused output projection (q_out)"),
    Param("num_warps", (4, 8), "warps per program"),
    Param("num_stages", (1, 2, 3), "software-pipelining depth of the loads"),
)

CONSTRAINTS = (
    Constraint("shared_memory", _check_shared_memory, "Q tile + the largest phase's staged tiles fit in shared memory"),
    Constraint("hidden_chunks", _check_hidden_chunks, "hidden a multiple of BLOCK_K (and of BLOCK_O for q_out)"),
    Constraint("block_m_exceeds_rows", _check_block_m, "no query tile larger than the query rows"),
    Constraint("unfused_is_one_config", _check_unfused_is_one_config,
               "parameters a path ignores are parked, so each path is measured once per setting that matters"),
)

def default_config(problem: CrossAttentionLayerProblem, dtype: torch.dtype) -> Config:
    """The unfused path: what measured fastest on most shapes (docs/fusion.md, "Results"), so a
    problem nobody tuned runs that, and fusion is used only where a search measured that it wins."""
    return Config(UNFUSED)


def fused_config(problem: CrossAttentionLayerProblem, dtype: torch.dtype, fusion: str = "q") -> Config:
    """A valid config of a fused path sized to the problem (the search's first fused candidates,
    tests, benchmarks); the unfused path when no fused config is valid (e.g. hidden not a
    multiple of 32)."""
    preferred = fusion
    block_m = min(64, max(16, triton.next_power_of_2(problem.lq)))
    for fusion in dict.fromkeys((preferred, "q")):
        for block_k in (64, 32, 128):
            for block_o in ((64, 128) if fusion == "q_out" else (PARKED["BLOCK_O"],)):
                for stages in (2, 1):
                    cfg = Config(FUSION=fusion, BLOCK_M=block_m, BLOCK_N=64, BLOCK_K=block_k,
                                 BLOCK_O=block_o, num_warps=4, num_stages=stages)
                    if not SPEC.violations(problem, cfg, dtype):
                        return cfg
    return Config(UNFUSED)


def _baselines(problem: CrossAttentionLayerProblem):
    return {"unfused (cuBLAS+SDPA)": unfused}


SPEC = KernelSpec(
    name="cross_attention_layer",
    description="Cross-modal attention layer: Q/KV/O projections + attention, fused or unfused (rollback)",
    problem_type=CrossAttentionLayerProblem,
    params=PARAMS,
    constraints=CONSTRAINTS,
    default_config=default_config,
    make_inputs=make_inputs,
    new_output=new_output,
    launch=launch,
    reference=reference,
    tolerance={torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 3e-2},
    flops=flops,
    bytes_moved=bytes_moved,
    # A tuned entry is lent across at most 2x of batch (4x of the other dimensions): fusion wins
    # narrowly where it wins (1.05-1.10x at b2 lq4 lk2k on the H200) and loses badly at a larger
    # batch (0.30x at b8 lq1 lk4k with cached K/V: benchmarks/results/fused_layer_kv_cached_h200.json),
    # since each fused program reads its head's Wq slice and its kv head's K/V once per batch
    # element and query head. The presets tune decode-like problems at batch 2 and 8.
    match=MatchPolicy(exact=("hidden", "h", "hkv", "d", "bias", "kv_cached"), max_ratio=4.0,
                      ratio_overrides={"b": 2.0}),
    aliases={"l": ("lq", "lk"), "heads": ("h",), "kv_heads": ("hkv",)},
    # The default is the unfused path; then the fused configs that were fastest in the H200 sweep of
    # benchmarks/fused_layer_bench.py: decode-like (16-row tiles) and long-context (64-row tiles).
    known_good=(
        {"FUSION": "q", "BLOCK_M": 16, "BLOCK_N": 128, "BLOCK_K": 128, "num_warps": 8, "num_stages": 3},
        {"FUSION": "q", "BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 128, "num_warps": 4, "num_stages": 3},
    ),
    park_ignored=park_ignored,
    rollback_config={"FUSION": "none"},
    example_problem=CrossAttentionLayerProblem(b=2, lq=5, lk=19, hidden=128, h=4, hkv=2, d=64, bias=True),
    sample_problems=(
        # hidden ≠ h·d and not a multiple of 64; one kv head for two query heads
        CrossAttentionLayerProblem(b=1, lq=20, lk=33, hidden=96, h=2, hkv=1, d=64),
        CrossAttentionLayerProblem(b=1, lq=3, lk=7, hidden=128, h=1, hkv=1, d=128, bias=True),
        # a decode step over cached K/V
        CrossAttentionLayerProblem(b=2, lq=1, lk=21, hidden=128, h=4, hkv=2, d=64, bias=True, kv_cached=True),
    ),
    baselines=_baselines,
    module=__name__,
)

"""Fused cross-modal attention: FlashAttention-2 forward with online softmax.

Algorithm. Each program owns BLOCK_M query rows of one (batch, head) — or, with PACK_GQA, of one
(batch, kv head), its rows drawn from all GROUP query heads that share that kv head, so K and V
are read once per group instead of GROUP times (what decode-like calls with few query rows need).
It streams K/V in BLOCK_N tiles, keeping the running row max m, the running denominator l and the
fp32 accumulator in registers; scores use exp2 with sm_scale·log2(e) folded into one multiply.

Masks. Every mask we support makes each query row see a *prefix* of the keys, [0, limit):
  - none:   limit = Lk
  - causal: limit = clamp(i + 1 + Lk − Lq, 0, Lk)   (bottom-right aligned, as FlashAttention)
  - spans:  causal, except that a row inside an image/video span [s, e) also sees up to e,
            so limit = max(causal limit, e). A span mask is therefore still a prefix mask.
A row's visible set being a prefix lets a block of rows split its key loop in two: tiles below the
block's smallest limit need no mask at all (the off-diagonal part), and only tiles between the
smallest and largest limit pay for the mask (the diagonal part); both parts take one tile step,
_attend_tile, the mask a constexpr of it. Rows that see no key (Lq > Lk, causal) output zeros,
as FlashAttention does.

Grid. axis 0: query row blocks, heaviest first under a causal mask (so the long programs start
early and the tail is short); axis 1: batch × (query heads, or kv heads with PACK_GQA). Programs
adjacent on axis 0 share K/V, which keeps them in L2.

Constexprs. BLOCK_M, BLOCK_N: tile sizes. HEAD_DIM: the real head dim; BLOCK_D: it rounded up to
a power of two (80 and 96 pad to 128 inside the kernel, masked). GROUP: query heads per kv head.
MASK_MODE: 0 none, 1 causal, 2 per-row limits read from a tensor (span masks). USE_TMA: K/V
tiles through Hopper's tensor-memory accelerator (host-side tensor descriptors) instead of
pointer loads. IEEE_DOT: exact fp32 products for fp32 inputs (the checking path).

Memory traffic model: Q read once, K and V read once per (query block, head or group) — from L2
after the first — and O written once: bytes = (2·B·H·Lq + 2·B·Hkv·Lk)·D·elt at the ideal.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as _F
import triton
import triton.language as tl
from torch.nn.attention import SDPBackend as _SDPBackend
from torch.nn.attention import sdpa_kernel as _sdpa_kernel

from omnitune.errors import InputError, one_line
from omnitune.kernels import _dispatch
from omnitune.kernels._gluon_target import (
    GLUON_FIXED,
    GLUON_HEAD_DIM,
    GLUON_PINGPONG,
    GLUON_TUNED,
    gluon_device_refusal,
)
from omnitune.kernels._host import (
    LOG2E,
    batch_slices,
    flag,
    op_scale,
    require_head_groups,
    seeded_rand,
    softmax_scale,
    within_int32_offsets,
)
from omnitune.kernels._launch import DirectLauncher, PlanCache, bounded_put
from omnitune.kernels._library import library_op
from omnitune.kernels._tma_launch import TmaLaunch
from omnitune.runtime import _device_limits
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

SUPPORTED_HEAD_DIMS = (64, 80, 96, 128, 256)


@triton.jit
def _attend_tile(
    q, acc, m_i, l_i, start_n, limit, LK, qk_scale,
    b, hk, k_desc, v_desc, k_base, v_base,
    stride_kn, stride_kd, stride_vn, stride_vd,
    offs_n, offs_d, d_valid,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    USE_TMA: tl.constexpr,
    IEEE_DOT: tl.constexpr,
    MASKED: tl.constexpr,
):
    """One K/V tile [start_n, start_n + BLOCK_N) of the online softmax: the accumulator, the
    running max and the running denominator after it. MASKED (the diagonal part): keys at or past
    a row's limit, and past LK, are masked; an unmasked tile (every row sees every key) pays for
    neither. Inlined by Triton, so each loop compiles as if written out."""
    n = start_n + offs_n
    if USE_TMA:
        k = k_desc.load([b, hk, start_n, 0]).reshape(BLOCK_N, BLOCK_D)
        v = v_desc.load([b, hk, start_n, 0]).reshape(BLOCK_N, BLOCK_D)
    else:
        if MASKED:
            kv_mask = (n < LK)[:, None] & d_valid[None, :]
        else:
            kv_mask = d_valid[None, :]
        k = tl.load(k_base + n[:, None] * stride_kn + offs_d[None, :] * stride_kd, mask=kv_mask, other=0.0)
        v = tl.load(v_base + n[:, None] * stride_vn + offs_d[None, :] * stride_vd, mask=kv_mask, other=0.0)
    if IEEE_DOT:
        qk = tl.dot(q, tl.trans(k), input_precision="ieee")
    else:
        qk = tl.dot(q, tl.trans(k))
    if MASKED:
        qk = tl.where(n[None, :] < limit[:, None], qk * qk_scale, float("-inf"))
    else:
        qk = qk * qk_scale
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    if MASKED:
        # A row that has seen no key yet keeps m = -inf; subtract 0 instead so exp2 gives 0, not NaN.
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_safe = m_new
    p = tl.math.exp2(qk - m_safe[:, None])
    alpha = tl.math.exp2(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    if IEEE_DOT:
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision="ieee")
    else:
        acc = tl.dot(p.to(v.dtype), v, acc)
    return acc, m_new, l_i


@triton.jit
def _attention_fwd(
    Q, K, V, Out, Spans,
    k_desc, v_desc,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_om, stride_od,
    stride_sb, stride_ss, stride_se, NUM_SPANS,
    H, HKV, LQ, LK,
    qk_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MASK_MODE: tl.constexpr,
    PACK_GQA: tl.constexpr,
    USE_TMA: tl.constexpr,
    IEEE_DOT: tl.constexpr,
):
    # axis 0: block of query rows (reversed under a mask: heaviest blocks first)
    # axis 1: batch × head (or batch × kv head when PACK_GQA)
    pid_m = tl.program_id(0)
    if MASK_MODE != 0:
        pid_m = tl.num_programs(0) - 1 - pid_m
    pid_bh = tl.program_id(1)
    if PACK_GQA:
        b = pid_bh // HKV
        hk = pid_bh % HKV
        total_rows = GROUP * LQ
    else:
        b = pid_bh // H
        hk = (pid_bh % H) // GROUP
        total_rows = LQ

    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_valid = rows < total_rows
    if PACK_GQA:
        head = hk * GROUP + rows // LQ
        qpos = rows % LQ
    else:
        head = (pid_bh % H) + rows * 0
        qpos = rows
    offs_d = tl.arange(0, BLOCK_D)
    d_valid = offs_d < HEAD_DIM

    # --- per-row visible key limit: row i sees keys [0, limit_i) -------------------------------
    if MASK_MODE == 0:
        limit = tl.where(row_valid, LK, 0)
    elif MASK_MODE == 1:
        limit = tl.minimum(tl.maximum(qpos + 1 + LK - LQ, 0), LK)
        limit = tl.where(row_valid, limit, 0)
    else:
        # Span masks: causal, and a row inside a span [start, end) also sees up to end. The
        # spans are read here, not turned into per-row limits on the host: the call then needs
        # no host work or copy per call and can be captured in a CUDA graph. Ends are clamped
        # to LK, so whatever the span tensor holds no key past the sequence is read.
        limit = tl.minimum(tl.maximum(qpos + 1 + LK - LQ, 0), LK)
        key_pos = qpos + LK - LQ
        span_row = Spans + b.to(tl.int64) * stride_sb
        for s in range(NUM_SPANS):
            start = tl.load(span_row + s * stride_ss)
            end = tl.minimum(tl.load(span_row + s * stride_ss + stride_se), LK)
            inside = (key_pos >= start) & (key_pos < end)
            limit = tl.maximum(limit, tl.where(inside, end, 0))
        limit = tl.where(row_valid, limit, 0)
    lo_unmasked = (tl.min(tl.where(row_valid, limit, LK), axis=0) // BLOCK_N) * BLOCK_N
    hi = tl.max(limit, axis=0)

    # --- Q tile, loaded once -------------------------------------------------------------------
    q_ptrs = (
        Q + b.to(tl.int64) * stride_qb + head.to(tl.int64)[:, None] * stride_qh
        + qpos[:, None] * stride_qm + offs_d[None, :] * stride_qd
    )
    q = tl.load(q_ptrs, mask=row_valid[:, None] & d_valid[None, :], other=0.0)

    k_base = K + b.to(tl.int64) * stride_kb + hk.to(tl.int64) * stride_kh
    v_base = V + b.to(tl.int64) * stride_vb + hk.to(tl.int64) * stride_vh
    offs_n = tl.arange(0, BLOCK_N)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    # --- off-diagonal part: every row of the block sees every key of these tiles -------------
    for start_n in range(0, lo_unmasked, BLOCK_N):
        acc, m_i, l_i = _attend_tile(
            q, acc, m_i, l_i, start_n, limit, LK, qk_scale, b, hk, k_desc, v_desc, k_base, v_base,
            stride_kn, stride_kd, stride_vn, stride_vd, offs_n, offs_d, d_valid,
            BLOCK_N, BLOCK_D, USE_TMA, IEEE_DOT, MASKED=False,
        )

    # --- diagonal part: tiles where some rows of the block stop seeing keys ------------------
    for start_n in range(lo_unmasked, hi, BLOCK_N):
        acc, m_i, l_i = _attend_tile(
            q, acc, m_i, l_i, start_n, limit, LK, qk_scale, b, hk, k_desc, v_desc, k_base, v_base,
            stride_kn, stride_kd, stride_vn, stride_vd, offs_n, offs_d, d_valid,
            BLOCK_N, BLOCK_D, USE_TMA, IEEE_DOT, MASKED=True,
        )

    # --- epilogue: rows that saw no key write zeros ------------------------------------------
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    out = acc / l_safe[:, None]
    o_ptrs = (
        Out + b.to(tl.int64) * stride_ob + head.to(tl.int64)[:, None] * stride_oh
        + qpos[:, None] * stride_om + offs_d[None, :] * stride_od
    )
    tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=row_valid[:, None] & d_valid[None, :])


# ------------------------------------------------------------------------------------------------
# Problem, inputs, launcher
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AttentionProblem:
    """One attention call: q [b, h, lq, d], k/v [b, hkv, lk, d].

    `spans` image/video spans of `span_len` tokens each are laid evenly through the key sequence
    (bidirectional inside each span, causal elsewhere); spans=0 means a plain mask."""

    b: int
    h: int
    hkv: int
    lq: int
    lk: int
    d: int
    causal: bool = False
    spans: int = 0
    span_len: int = 0

    def __post_init__(self):
        for name in ("b", "h", "hkv", "lq", "lk", "d"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be ≥ 1, got {getattr(self, name)}")
        if self.h % self.hkv:
            raise ValueError(f"h={self.h} is not a multiple of hkv={self.hkv}")
        if self.d not in SUPPORTED_HEAD_DIMS:
            raise ValueError(f"head dim d={self.d} is not supported; use one of {SUPPORTED_HEAD_DIMS}")
        if self.spans < 0 or self.span_len < 0:
            raise ValueError("spans and span_len must be ≥ 0")
        if (self.spans > 0) != (self.span_len > 0):
            raise ValueError("give spans and span_len together")
        if self.spans and not self.causal:
            raise ValueError("image spans only change a causal mask; add causal=1")
        if self.spans * self.span_len > self.lk:
            raise ValueError(f"{self.spans} spans of {self.span_len} tokens do not fit in lk={self.lk}")

    @property
    def group(self) -> int:
        return self.h // self.hkv

    def span_ranges(self) -> list[tuple[int, int]]:
        """The [start, end) key ranges of the spans, spread evenly with text between them."""
        if not self.spans:
            return []
        gap = (self.lk - self.spans * self.span_len) // (self.spans + 1)
        return [(gap * (i + 1) + self.span_len * i, gap * (i + 1) + self.span_len * (i + 1)) for i in range(self.spans)]


@dataclass
class AttentionInputs:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    causal: bool
    sm_scale: float
    spans: torch.Tensor | None = None  # [B, S, 2] integer [start, end) key ranges; span masks only


# Host-side span lists turned into device tensors, per (spans, device): a serving loop that passes
# the same Python lists every call copies them to the GPU once. Bounded; a CUDA graph capture
# can only use a cached one (a copy cannot be captured), so captured code should pass a tensor.
_SPAN_TENSORS_KEPT = 256
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_span_tensors: dict[tuple, torch.Tensor] = {}


def _span_bound(x) -> int:
    """A span bound that is not a plain int, as an int. operator.index, not int(): int() cut 0.5
    to 0 and read "3" as 3 without a word. But operator.index takes True as 1, and a bool is no
    position: refused, as a bool tensor is."""
    if isinstance(x, bool) or (isinstance(x, torch.Tensor) and x.dtype == torch.bool):
        raise InputError("mm_spans must hold (start, end) pairs of ints, not booleans")
    return operator.index(x)


def span_tensor(spans: Sequence[Sequence[tuple[int, int]]] | torch.Tensor, b: int, device) -> torch.Tensor:
    """mm_spans as the kernel reads them: an integer tensor [B, S, 2] on the inputs' device.
    A tensor is taken as it is (metadata checked, nothing copied); lists (one list of [start, end)
    ranges per sequence, lengths may differ) are converted once and cached."""
    if isinstance(spans, torch.Tensor):
        if spans.dim() != 3 or spans.shape[0] != b or spans.shape[2] != 2:
            raise InputError(f"mm_spans tensor must be [B={b}, S, 2], got {list(spans.shape)}")
        if spans.dtype not in (torch.int32, torch.int64):
            raise InputError(f"mm_spans tensor must be int32 or int64, got {spans.dtype}")
        if spans.device != torch.device(device):
            raise InputError(f"mm_spans is on {spans.device}, q on {device}")
        return spans
    if isinstance(spans, (str, bytes)) or not isinstance(spans, Sequence):
        raise InputError(f"mm_spans must be a tensor [B, S, 2] or one list of (start, end) per sequence, "
                         f"got {type(spans).__name__}")
    if len(spans) != b:
        raise InputError(f"mm_spans has {len(spans)} entries but the batch has {b} sequences")
    try:
        # A plain int is its own key; anything else goes through _span_bound. Bools are refused
        # while the key is built, before the lookup: (True, 5) == (1, 5) with the same hash, so a
        # bool list would otherwise be served the entry its int twin left. The type test costs what
        # the operator.index call it replaces did.
        key = (tuple(tuple((s if type(s) is int else _span_bound(s), e if type(e) is int else _span_bound(e))
                           for s, e in seq) for seq in spans), str(device))
    except (TypeError, ValueError) as exc:
        raise InputError(f"mm_spans must hold (start, end) pairs of ints: {exc}") from None
    if torch.compiler.is_compiling():
        # Traced by Dynamo: the lists are constants the graph is specialised on, so the tensor is
        # made in the graph; no memo (Dynamo would guard on its size: a new graph each new list).
        return torch.tensor(_padded_span_rows(key[0]), dtype=torch.int32, device=device)
    found = _span_tensors.get(key)
    if found is not None:
        return found
    if torch.device(device).type == "cuda" and torch.cuda.is_current_stream_capturing():
        raise InputError("mm_spans given as lists cannot be copied to the GPU inside a CUDA graph "
                         "capture; pass an int32 tensor [B, S, 2] on the GPU")
    host = torch.tensor(_padded_span_rows(key[0]), dtype=torch.int32)
    return bounded_put(_span_tensors, key, host.to(device), _SPAN_TENSORS_KEPT)


def _padded_span_rows(rows: tuple) -> list:
    """One list of [start, end] pairs per sequence, padded with empty [0, 0] spans to the longest
    (at least one); a value outside int32, which the kernel reads, is an InputError (torch's copy
    failed with "value cannot be converted to type int32 without overflow"). Checked where a
    tensor is made: a cached list passes without it."""
    if any(not _INT32_MIN <= x <= _INT32_MAX for seq in rows for pair in seq for x in pair):
        raise InputError(f"mm_spans holds a value outside int32 ({_INT32_MIN}..{_INT32_MAX}); spans are "
                         "[start, end) key positions")
    width = max([len(seq) for seq in rows] + [1])  # not max(..., default=): Dynamo traces this
    return [[list(pair) for pair in seq] + [[0, 0]] * (width - len(seq)) for seq in rows]


def row_limits(spans: torch.Tensor, lq: int, lk: int) -> torch.Tensor:
    """Per query row, the end of its visible key prefix under a causal mask with bidirectional
    spans [B, S, 2] — what the kernel computes, ends clamped to Lk as there: [B, Lq] int64."""
    span_t = spans.to(torch.int64)
    starts, ends = span_t[..., 0], span_t[..., 1].clamp(max=lk)
    qpos = torch.arange(lq, device=spans.device, dtype=torch.int64) + (lk - lq)
    causal = (qpos + 1).clamp(0, lk)
    if spans.shape[1] == 0:  # no spans: the causal prefix alone (amax over nothing has no answer)
        return causal[None, :].expand(spans.shape[0], lq)
    inside = (qpos[None, :, None] >= starts[:, None, :]) & (qpos[None, :, None] < ends[:, None, :])
    span_end = torch.where(inside, ends[:, None, :], torch.zeros_like(inside, dtype=torch.int64)).amax(dim=2)
    return torch.maximum(causal[None, :], span_end)


def _check_span_values(spans: torch.Tensor, lk: int) -> None:
    """The check mode's span check: 0 ≤ start ≤ end ≤ Lk everywhere (one sync)."""
    starts, ends = spans[..., 0], spans[..., 1]
    if bool(((starts < 0) | (ends > lk) | (starts > ends)).any()):
        raise InputError(f"mm_spans must be [start, end) ranges with 0 ≤ start ≤ end ≤ Lk={lk}")


_Tensor = torch.Tensor
_FLOATS = (torch.float16, torch.bfloat16, torch.float32)


def _check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Shapes, dtypes and devices (no sync). The common case is one cheap predicate; only a call
    that fails it pays for finding the message."""
    if type(q) is _Tensor and type(k) is _Tensor and type(v) is _Tensor:
        qs, ks = q.shape, k.shape
        dtype, device = q.dtype, q.get_device()
        if (len(qs) == 4 and len(ks) == 4 and v.shape == ks and ks[0] == qs[0] and ks[3] == qs[3]
                and qs[3] in SUPPORTED_HEAD_DIMS and qs[0] > 0 and qs[1] > 0 and ks[1] > 0 and qs[1] % ks[1] == 0
                and qs[2] > 0 and ks[2] > 0
                and dtype in _FLOATS and k.dtype == dtype and v.dtype == dtype
                and k.get_device() == device and v.get_device() == device and device >= 0):
            return
    _explain_inputs(q, k, v)


def _explain_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise InputError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise InputError(f"{name} must be 4-D [B, heads, L, D], got shape {list(t.shape)}")
    if not (q.device == k.device == v.device):
        raise InputError(f"q, k, v are on different devices: {q.device}, {k.device}, {v.device}")
    if not (q.dtype == k.dtype == v.dtype):
        raise InputError(f"q, k, v have different dtypes: {q.dtype}, {k.dtype}, {v.dtype}")
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise InputError(f"unsupported dtype {q.dtype}; use float16, bfloat16 or float32")
    if k.shape != v.shape:
        raise InputError(f"k and v shapes differ: {list(k.shape)} vs {list(v.shape)}")
    b, h, _, d = q.shape
    bk, hkv, _, dk = k.shape
    if bk != b:
        raise InputError(f"batch sizes differ: q has {b}, k/v have {bk}")
    if dk != d:
        raise InputError(f"head dims differ: q has {d}, k/v have {dk}")
    if d not in SUPPORTED_HEAD_DIMS:
        raise InputError(f"head dim {d} is not supported; use one of {SUPPORTED_HEAD_DIMS}")
    if b == 0:
        raise InputError("the batch is empty (B = 0)")
    require_head_groups(h, hkv)
    if q.shape[2] == 0 or k.shape[2] == 0:
        raise InputError("sequence lengths must be ≥ 1")
    require_runnable_device(q)


def _tma_ok(t: torch.Tensor) -> bool:
    """A contiguous last dim, 16-byte aligned strides (those of size-1 dims too: the descriptor
    takes them all) and base: what a tensor descriptor needs."""
    elt = t.element_size()
    return t.stride(-1) == 1 and all((s * elt) % 16 == 0 for s in t.stride()[:-1]) and t.data_ptr() % 16 == 0


_ATTENTION = DirectLauncher(_attention_fwd)
try:
    from triton.tools.tensor_descriptor import TensorDescriptor as _TensorDescriptor
except ImportError:  # a Triton without host tensor descriptors: USE_TMA configs fail to launch
    _TensorDescriptor = None


def _grid(b: int, h: int, hkv: int, lq: int, block_m: int, pack: bool) -> tuple:
    """The kernel's grid: query tiles × (batch · kv heads when GQA is packed, else · heads)."""
    rows = (h // hkv) * lq if pack else lq
    return (triton.cdiv(rows, block_m), b * (hkv if pack else h), 1)


def _launch_plan(config: Config, b: int, h: int, hkv: int, lq: int, d: int, mask_mode: int,
                 dtype: torch.dtype) -> tuple:
    group = h // hkv
    block_d = triton.next_power_of_2(d)
    block_m, block_n = int(config["BLOCK_M"]), int(config["BLOCK_N"])
    pack = bool(config["PACK_GQA"]) and group > 1
    use_tma = bool(config["USE_TMA"])
    grid = _grid(b, h, hkv, lq, block_m, pack)
    constexprs = dict(HEAD_DIM=d, BLOCK_D=block_d, GROUP=group, BLOCK_M=block_m, BLOCK_N=block_n,
                      MASK_MODE=mask_mode, PACK_GQA=pack, USE_TMA=use_tma, IEEE_DOT=dtype == torch.float32,
                      num_warps=int(config["num_warps"]), num_stages=int(config["num_stages"]))
    # Without TMA the two descriptor arguments are plain zeros, keyed with the other ints, so the
    # bound launcher's objects are all tensors (its fast key); with TMA they are K's and V's views,
    # their encoded tensor maps kept by address and shape (omnitune/kernels/_tma_launch.py).
    if not use_tma:
        return grid, _ATTENTION.bind(constexprs, 5), None
    return grid, TmaLaunch(_ATTENTION.bind(constexprs, 7), _kv_descriptor, (5, 6)), (1, 1, block_n, block_d)


def _kv_descriptor(t: torch.Tensor, block: tuple) -> _TensorDescriptor:
    """K's or V's [b, hkv, Lk, d] tensor descriptor, loading `block` tiles (from its own shape and
    strides alone, as a kept tensor map requires)."""
    return _TensorDescriptor(t, list(t.shape), list(t.stride()), list(block))


# (config, shapes, mask mode, dtype) → grid, bound kernel and TMA block: what a repeated call
# would otherwise recompute.
_launch_plans = PlanCache(_launch_plan)


def _causal_lower_right(lq: int, lk: int):
    """SDPA's bottom-right causal mask. Imported on first use: torch.nn.attention.bias imports
    torch._dynamo (~1.3 s), which nothing else of this module's import needs."""
    from torch.nn.attention.bias import causal_lower_right

    return causal_lower_right(lq, lk)


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, sm_scale: float,
         backend: str) -> torch.Tensor:
    """The same attention through PyTorch's SDPA (BACKEND sdpa or sdpa_cudnn): GQA without
    expanding K/V, causal bottom-right aligned as this kernel is (torch's lower-right CausalBias
    when Lq ≠ Lk; SDPA's is_causal is top-left)."""
    lq, lk = q.shape[2], k.shape[2]
    kwargs = {"scale": sm_scale, "enable_gqa": q.shape[1] != k.shape[1]}
    if causal and lq > lk:
        # The first lq - lk rows see no key: zeros, as this kernel writes (SDPA would give NaN);
        # the last lk rows are a square causal problem over every key.
        out = q.new_zeros(q.shape)
        out[:, :, lq - lk:] = sdpa(q[:, :, lq - lk:], k, v, True, sm_scale, backend)
        return out
    if causal and lq != lk:
        kwargs["attn_mask"] = _causal_lower_right(lq, lk)
    else:
        kwargs["is_causal"] = causal
    # cuDNN only on CUDA tensors: elsewhere (the CPU interpreter) SDPA's own dispatch stands in,
    # so that a table for a GPU reads the same on any machine.
    if backend == "sdpa_cudnn" and q.is_cuda:
        saved = _SDP_FLAGS.only_cudnn()
        try:
            return _F.scaled_dot_product_attention(q, k, v, **kwargs)
        finally:
            _SDP_FLAGS.restore(saved)
    return _F.scaled_dot_product_attention(q, k, v, **kwargs)


class _SdpFlags:
    """torch.nn.attention.sdpa_kernel([CUDNN_ATTENTION]) at a fraction of its host cost: the same
    global flags set and restored, by their C setters directly. The context manager takes ~26 µs a
    call on the H200's host (an untuned 2,048-row prefill through the op: 61.4 µs of host time
    against SDPA's own 24.4, benchmarks/results/ops_bench_h200_round13_D.json) — a generator, a
    list of backends deduplicated and the current flags read by name each time; this, 1.7 µs
    against 14.3 on the development CPU. The caller keeps what only_cudnn() saved and hands it to
    restore(), so that calls in several threads each restore what they found. Falls back to the
    public context manager on a torch whose flags are not found. Under torch.compile the op is
    opaque (its torch.library op), so no graph sees these calls."""

    def __init__(self):
        names = getattr(torch.nn.attention, "_backend_names", None)
        try:
            self.flags = [(getattr(torch._C, f"_get_{n}_sdp_enabled"), getattr(torch._C, f"_set_sdp_use_{n}"),
                           n == "cudnn") for n in names]
        except (AttributeError, TypeError):
            self.flags = None

    def only_cudnn(self):
        if self.flags is None:
            manager = _sdpa_kernel([_SDPBackend.CUDNN_ATTENTION])
            manager.__enter__()
            return manager
        saved = [get() for get, _, _ in self.flags]
        for _, set_flag, wanted in self.flags:
            set_flag(wanted)
        return saved

    def restore(self, saved) -> None:
        if self.flags is None:
            saved.__exit__(None, None, None)
            return
        for (_, set_flag, _), was in zip(self.flags, saved, strict=True):
            set_flag(was)


_SDP_FLAGS = _SdpFlags()


def launch(inputs: AttentionInputs, out: torch.Tensor, config: Config) -> torch.Tensor | None:
    """Run the config's backend: the kernel (or the Gluon one) writes into `out` [B, H, Lq, D]; an
    SDPA backend returns its own output (copying it into `out` would charge the search a copy the
    op never makes). A call the Gluon kernel cannot take raises (the search's trial fails): the
    search measures the backend its config names, never a stand-in."""
    backend = config.get("BACKEND", "triton")
    if backend == GLUON_PINGPONG:
        # ValueErrors, not InputErrors: the trial's failure, not the search's
        if (why := gluon_device_refusal(inputs.q)) is not None:
            raise ValueError(f"BACKEND={GLUON_PINGPONG} {why}")
        _gluon().launch_pingpong(inputs.q, inputs.k, inputs.v, out, inputs.causal, inputs.sm_scale,
                                 int(config["BLOCK_N"]), int(config["num_stages"]), inputs.spans)
        return None
    if backend != "triton":
        return sdpa(inputs.q, inputs.k, inputs.v, inputs.causal, inputs.sm_scale, backend)
    _launch(inputs.q, inputs.k, inputs.v, inputs.causal, inputs.sm_scale, inputs.spans, out, config)
    return None


def _gluon():
    """omnitune.kernels.attention_gluon, imported on the first launch of a gluon config on an
    sm_90 GPU: importing it imports Gluon, which this module (and so the runtime) does not at
    import time, nor a machine that cannot run it."""
    from omnitune.kernels import attention_gluon

    return attention_gluon


def _launch(q, k, v, causal: bool, sm_scale: float, spans: torch.Tensor | None, out: torch.Tensor,
            config: Config) -> None:
    """This kernel with a (Triton) config, writing into `out`. No validation. A batch whose
    (batch · heads) would pass a grid's y bound is launched in batch slices (views: no copy), one
    launch each, so that a batch of thousands of short sequences (a vision encoder's windows)
    runs as any other."""
    b, h, lq, d = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    if spans is not None and spans.shape[1] > 0:
        mask_mode, span_arg, span_strides, num_spans = 2, spans, spans.stride(), spans.shape[1]
    else:
        # q is a placeholder pointer, never read
        mask_mode, span_arg, span_strides, num_spans = (1 if causal else 0), q, (0, 0, 0), 0
    grid, kernel, tma_block = _launch_plans.get(config, (b, h, hkv, lq, d, mask_mode, q.dtype))
    # the grid's y is b · (heads, or kv heads with GQA packed): _grid's rule, read off the plan
    if (slices := batch_slices(b, grid[1] // b)) is not None:
        for rows in slices:
            _launch(q[rows], k[rows], v[rows], causal, sm_scale, None if spans is None else spans[rows], out[rows],
                    config)
        return
    if tma_block is not None:
        # TMA needs a contiguous last dim and 16-byte aligned strides; copy views that are not.
        if not _tma_ok(k):
            k = k.contiguous()
        if not _tma_ok(v):
            v = v.contiguous()
        k_desc, v_desc = (k, tma_block), (v, tma_block)
    else:
        k_desc = v_desc = 0
    kernel(grid, (
        q, k, v, out, span_arg,
        k_desc, v_desc,
        *q.stride(), *k.stride(), *v.stride(), *out.stride(),
        *span_strides, num_spans,
        h, hkv, lq, lk,
        sm_scale * LOG2E,
    ))


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    sm_scale: float | None = None,
    config: Config | dict | None = None,
    mm_spans: Sequence[Sequence[tuple[int, int]]] | torch.Tensor | None = None,
    check: bool | None = None,
) -> torch.Tensor:
    """softmax(q kᵀ · sm_scale) v, FlashAttention-2 style, in one Triton kernel.

    q: [B, H, Lq, D]; k, v: [B, Hkv, Lk, D] with H a multiple of Hkv (GQA/MQA); any strides.
    causal: bottom-right aligned when Lq ≠ Lk. mm_spans: per sequence, [start, end) key ranges of
    image/video tokens that see each other both ways (requires causal): an integer tensor
    [B, S, 2] on q's device (read by the kernel: no host work, capturable in a CUDA graph), or one
    list of ranges per sequence (copied to the GPU once per distinct list, then cached). Span ends
    past Lk are clamped in the kernel; check=True (or OMNITUNE_CHECK=1) validates the spans first
    (one sync). config: launch config; None looks one up in the tuned tables (omnitune.runtime),
    falling back to the default. Returns [B, H, Lq, D] in q's dtype. Under torch.compile this
    calls torch.ops.omnitune.attention (spans as a tensor)."""
    if type(causal) is not bool:
        causal = flag(causal, "causal")  # InputError for a string, an int, a tensor, None
    if check is not None:
        # Validated on every call, not only where spans use it: check="no" or check=2 was otherwise
        # taken without a word. Identity checks for True and False; None's environment read waits
        # until spans need it.
        check = _dispatch.checking(check)
    if _dispatch.compiling():
        _dispatch.require_compiled_check(check)
        spans = None if mm_spans is None else span_tensor(mm_spans, q.shape[0], q.device)
        return torch.ops.omnitune.attention(q, k, v, spans, bool(causal), op_scale(sm_scale),
                                            _dispatch.config_to_json(config))
    return _attention(q, k, v, causal, sm_scale, config, mm_spans, check)


_memo = _dispatch.ConfigMemo("attention")


# Call identities whose table entry named an SDPA backend that then refused them (a shape or
# build its kernels do not support): run by this kernel for the rest of the process. Bounded, as
# every host cache here: a server's prompt lengths are endless (one dropped is asked again).
_sdpa_refused: dict[tuple, None] = {}
_REFUSALS_KEPT = 1024


def _refuse_sdpa(identity: tuple, exc: Exception) -> None:
    if identity not in _sdpa_refused:
        bounded_put(_sdpa_refused, identity, None, _REFUSALS_KEPT)
        _warn_refused(identity, one_line(exc, 200), "from now on")


# (backend, reason) pairs already logged: one line per reason, not one per shape it holds for.
_refusals_logged: dict[tuple, None] = {}


def _warn_refused(identity: tuple, why: str, when: str) -> None:
    import logging

    if (identity[8], why) in _refusals_logged:
        return
    bounded_put(_refusals_logged, (identity[8], why), None, _REFUSALS_KEPT)
    logging.getLogger("omnitune.runtime").warning(
        "attention: BACKEND=%s refused b=%s,h=%s,hkv=%s,lq=%s,lk=%s,d=%s,causal=%d %s (%s); this kernel runs "
        "such calls %s", identity[8], *identity[:6], int(identity[6]), identity[7], why, when)


# Call identities whose table entry named the Gluon kernel and that it failed to launch (no Gluon
# in this Triton, a compile error): this kernel runs them for the rest of the process. A call
# whose tensors it cannot take (not contiguous, not an sm_90 GPU) goes to this kernel that time.
_gluon_failed: dict[tuple, None] = {}


def _pingpong_ran(q, k, v, out, causal: bool, sm_scale: float, spans, config: Config, identity: tuple) -> bool:
    """Whether the Gluon ping-pong kernel took the call and wrote `out`; if not, the caller runs
    this kernel. Nothing here syncs: the kernel's checks read metadata, on the host."""
    if identity in _gluon_failed:
        return False
    if (why := gluon_device_refusal(q)) is None:
        try:
            gluon = _gluon()
        except Exception as exc:  # noqa: BLE001 — no Gluon (or another one) in this Triton
            bounded_put(_gluon_failed, identity, None, _REFUSALS_KEPT)
            _warn_refused(identity, one_line(exc, 200), "from now on")
            return False
        try:
            gluon.launch_pingpong(q, k, v, out, causal, sm_scale, int(config["BLOCK_N"]), int(config["num_stages"]),
                                  spans)
            return True
        except gluon.PingpongRefused as exc:
            why = str(exc)
        except Exception as exc:  # noqa: BLE001 — a kernel that cannot launch must not end the caller's inference
            bounded_put(_gluon_failed, identity, None, _REFUSALS_KEPT)
            _warn_refused(identity, one_line(exc, 200), "from now on")
            return False
    _warn_refused(identity, why, "whenever that holds")
    return False


def _triton_config(problem: AttentionProblem, dtype: torch.dtype) -> Config:
    """A config of this kernel for a problem whose table entry chose another backend that cannot
    take the call (spans under SDPA, SDPA's refusal, tensors the Gluon kernel cannot read): the
    nearest tuned Triton config valid for it, else the default."""
    if torch.cuda.is_available():
        from omnitune import runtime
        from omnitune.trial import device_key

        key = device_key(torch.cuda.get_device_name(torch.cuda.current_device()))
        for cfg in runtime.nearest_configs(SPEC, problem, dtype, key, most=8):
            if cfg.get("BACKEND", "triton") == "triton":
                return cfg
    return default_config(problem, dtype)


def _attention(q, k, v, causal, sm_scale, config, mm_spans, check) -> torch.Tensor:
    _check_inputs(q, k, v)
    # Rows and head-dim elements are 32-bit offsets in the kernel's pointer loads (_host.INT32_OFFSETS);
    # a contiguous q bounds the output's too, which has its layout.
    q, k, v = (within_int32_offsets(t, (2, 3), name) for t, name in ((q, "q"), (k, "k"), (v, "v")))
    b, h, lq, d = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    sm_scale = softmax_scale(sm_scale, d)  # InputError for a tensor, a string, NaN or inf
    spans = None
    if mm_spans is not None:
        if not causal:
            raise InputError("mm_spans only change a causal mask; pass causal=True")
        spans = span_tensor(mm_spans, b, q.device)
        if _dispatch.checking(check):
            _check_span_values(spans, lk)
    causal = bool(causal)
    cfg = _memo.get((b, h, hkv, lq, lk, d, causal), config,
                    lambda: AttentionProblem(b=b, h=h, hkv=hkv, lq=lq, lk=lk, d=d, causal=causal), q.dtype)
    backend = cfg.get("BACKEND", "triton")
    out = None
    if backend != "triton":
        identity = (b, h, hkv, lq, lk, d, causal, q.dtype, backend)
        if backend == GLUON_PINGPONG:
            out = torch.empty((b, h, lq, d), dtype=q.dtype, device=q.device)
            if _pingpong_ran(q, k, v, out, causal, float(sm_scale), spans, cfg, identity):
                return out
        elif spans is None and identity not in _sdpa_refused:
            try:
                return sdpa(q, k, v, causal, float(sm_scale), backend)
            except RuntimeError as exc:  # a backend that refuses this call: the kernel runs it
                _refuse_sdpa(identity, exc)
        # SDPA would need a dense mask for the spans (or refused), or the Gluon kernel could not
        # take the call: this kernel runs it, with the nearest tuned Triton config.
        cfg = _memo.get(("triton", b, h, hkv, lq, lk, d, causal), None, None, q.dtype, default=lambda: _triton_config(
            AttentionProblem(b=b, h=h, hkv=hkv, lq=lq, lk=lk, d=d, causal=causal), q.dtype))
    if out is None:
        out = torch.empty((b, h, lq, d), dtype=q.dtype, device=q.device)
    _launch(q, k, v, causal, float(sm_scale), spans, out, cfg)
    return out


# ------------------------------------------------------------------------------------------------
# Spec: reference, inputs, model, config space
# ------------------------------------------------------------------------------------------------


def make_inputs(problem: AttentionProblem, dtype: torch.dtype, device, seed: int) -> AttentionInputs:
    gen = torch.Generator(device="cpu").manual_seed(seed)
    p = problem

    rand = seeded_rand(gen, device, dtype)

    spans = None
    if p.spans:
        spans = torch.tensor([p.span_ranges()] * p.b, dtype=torch.int32).to(device)
    return AttentionInputs(
        q=rand(p.b, p.h, p.lq, p.d),
        k=rand(p.b, p.hkv, p.lk, p.d),
        v=rand(p.b, p.hkv, p.lk, p.d),
        causal=p.causal,
        sm_scale=1.0 / math.sqrt(p.d),
        spans=spans,
    )


def new_output(inputs: AttentionInputs) -> torch.Tensor:
    b, h, lq, d = inputs.q.shape
    return poisoned((b, h, lq, d), inputs.q.dtype, inputs.q.device)


def _limits_of(inputs: AttentionInputs) -> torch.Tensor:
    b, _, lq, _ = inputs.q.shape
    lk = inputs.k.shape[2]
    if inputs.spans is not None and inputs.spans.shape[1] > 0:
        return row_limits(inputs.spans, lq, lk)
    qpos = torch.arange(lq, device=inputs.q.device) + (lk - lq)
    lim = (qpos + 1).clamp(0, lk) if inputs.causal else torch.full_like(qpos, lk)
    return lim[None, :].expand(b, lq)


def reference(inputs: AttentionInputs) -> torch.Tensor:
    """Masked softmax attention in float64 on the CPU, float32 (no TF32) on a GPU; processed one
    (batch, kv head) at a time so that long sequences fit. Rows that see no key are zeros."""
    q, k, v = inputs.q, inputs.k, inputs.v
    b, h, lq, d = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    group = h // hkv
    acc_dtype = torch.float64 if q.device.type == "cpu" else torch.float32
    limits = _limits_of(inputs)
    keys = torch.arange(lk, device=q.device)
    out = torch.empty((b, h, lq, d), dtype=acc_dtype, device=q.device)
    prev_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        for bi in range(b):
            visible = keys[None, :] < limits[bi][:, None]  # [lq, lk]
            any_visible = visible.any(dim=1)
            for hk in range(hkv):
                qs = q[bi, hk * group:(hk + 1) * group].to(acc_dtype)  # [group, lq, d]
                ks = k[bi, hk].to(acc_dtype)
                vs = v[bi, hk].to(acc_dtype)
                scores = torch.matmul(qs, ks.T) * inputs.sm_scale
                scores = scores.masked_fill(~visible[None], float("-inf"))
                probs = torch.softmax(scores, dim=-1)
                probs = torch.where(any_visible[None, :, None], probs, torch.zeros_like(probs))
                out[bi, hk * group:(hk + 1) * group] = torch.matmul(probs, vs)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev_tf32
    return out


def visible_pairs(problem: AttentionProblem) -> int:
    """Number of (query, key) pairs the mask lets through, per (batch, head)."""
    p = problem
    if not p.causal:
        return p.lq * p.lk
    if p.spans:
        return int(row_limits(torch.tensor([p.span_ranges()], dtype=torch.int64), p.lq, p.lk).sum())
    qpos = torch.arange(p.lq, dtype=torch.int64) + (p.lk - p.lq)
    return int((qpos + 1).clamp(0, p.lk).sum())


def flops(problem: AttentionProblem) -> float:
    # Two matmuls (QKᵀ and PV) of 2·D flops per visible pair; masked pairs are not counted.
    return 4.0 * problem.b * problem.h * problem.d * visible_pairs(problem)


def bytes_moved(problem: AttentionProblem, dtype: torch.dtype) -> float:
    p = problem
    elt = element_bytes(dtype)
    return float((2 * p.b * p.h * p.lq + 2 * p.b * p.hkv * p.lk) * p.d * elt)


def _block_d(problem: AttentionProblem) -> int:
    return triton.next_power_of_2(problem.d)


def _rows(problem: AttentionProblem, config: Config) -> int:
    return problem.group * problem.lq if config["PACK_GQA"] and problem.group > 1 else problem.lq


def _shared_memory_bytes(problem: AttentionProblem, config: Config, dtype: torch.dtype) -> int:
    # Q tile, plus K and V tiles for each pipeline stage. Matches the Triton FA2 kernel measured
    # on the H200 (2026-11-29): the 4 configs of a 36-config grid this model puts over 227 KiB
    # (BLOCK_N=128, 4 stages, D=128, bf16) were exactly the ones that failed to launch.
    elt = element_bytes(dtype)
    bd = _block_d(problem)
    return elt * (int(config["BLOCK_M"]) * bd + int(config["num_stages"]) * 2 * int(config["BLOCK_N"]) * bd)


# Backends: this kernel, PyTorch's SDPA (as it dispatches, or forced to cuDNN), or the Gluon
# ping-pong kernel for Hopper (omnitune/kernels/attention_gluon.py) — measured by the search like
# any config, so a table records per problem whichever was fastest, and the op dispatches to it.
# An SDPA config ignores the kernel's parameters: they are parked.
# The Gluon kernel's fixed and tuned parameters and head dim: GLUON_FIXED, GLUON_TUNED,
# GLUON_HEAD_DIM (omnitune/kernels/_gluon_target.py, which its module reads too).
BACKENDS = ("triton", "sdpa", "sdpa_cudnn", GLUON_PINGPONG)
PARKED = dict(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1, PACK_GQA=False, USE_TMA=False)
# Shared memory beyond the Q tile and the K/V ring: its mbarriers, rounded up.
GLUON_SMEM_EXTRA_BYTES = 1024


def _triton_only(check):
    """A constraint of the Triton kernel's: an SDPA or Gluon config has no tiles of its to break."""
    def checked(problem, config, dtype, limits):
        return check(problem, config, dtype, limits) if config.get("BACKEND", "triton") == "triton" else None
    return checked


def runs_gluon(config: Config) -> bool:
    """Whether a config runs the Gluon ping-pong kernel."""
    return config.get("BACKEND", "triton") == GLUON_PINGPONG


def _gluon_only(check):
    """A constraint of the Gluon ping-pong kernel's."""
    def checked(problem, config, dtype, limits):
        return check(problem, config, dtype, limits) if runs_gluon(config) else None
    return checked


def park_ignored(config: Config) -> Config:
    """The config with the parameters its backend ignores at their parked values (the Gluon
    kernel's at its fixed ones: its BLOCK_N and num_stages are its own)."""
    backend = config.get("BACKEND", "triton")
    if backend == "triton":
        return config
    return config.replace(**(GLUON_FIXED if backend == GLUON_PINGPONG else PARKED))


def _check_backend(problem, config, dtype, limits):
    backend = config.get("BACKEND", "triton")
    if backend == "triton":
        return None
    if backend == GLUON_PINGPONG:
        off = [k for k, v in GLUON_FIXED.items() if config[k] != v]
        if off:
            return f"BACKEND={backend} is written for " + ", ".join(f"{k}={GLUON_FIXED[k]}" for k in off) + \
                " (one config per BLOCK_N and num_stages)"
        untuned = [k for k, choices in GLUON_TUNED.items() if config[k] not in choices]
        if untuned:
            return f"BACKEND={backend} takes " + ", ".join(f"{k} in {GLUON_TUNED[k]}" for k in untuned)
        return None
    off = [k for k, v in PARKED.items() if config[k] != v]
    if off:
        return f"BACKEND={backend} ignores {', '.join(off)}; they must be parked at " + \
            ", ".join(f"{k}={PARKED[k]}" for k in off)
    if problem.spans:
        return f"BACKEND={backend} cannot express image spans without a dense mask (only triton)"
    return None


def _check_gluon_device(problem, config, dtype, limits):
    major, minor = tuple(limits.compute_capability)[:2]
    if major != 9:
        # wgmma and setmaxnreg are sm_90a's; sm_100 and later are untested
        return f"BACKEND={GLUON_PINGPONG} is written for sm_90 (Hopper's wgmma), the device is sm_{major}{minor}"
    return None


def _check_gluon_dtype(problem, config, dtype, limits):
    if dtype not in (torch.float16, torch.bfloat16):
        return f"BACKEND={GLUON_PINGPONG} takes fp16 or bf16 (16-bit wgmma operands), not {str(dtype).split('.')[-1]}"
    return None


def _check_gluon_head_dim(problem, config, dtype, limits):
    if problem.d != GLUON_HEAD_DIM:
        return f"BACKEND={GLUON_PINGPONG} is written for head dim {GLUON_HEAD_DIM}, not {problem.d}"
    return None


def _gluon_shared_memory_bytes(problem: AttentionProblem, config: Config, dtype: torch.dtype) -> int:
    """The Q tile, STAGES K and V tiles, and the barriers (the offline compiles' shared memory,
    benchmarks/gluon_attention_probe.py, is within GLUON_SMEM_EXTRA_BYTES above the tiles)."""
    tiles = int(config["BLOCK_M"]) + int(config["num_stages"]) * 2 * int(config["BLOCK_N"])
    return element_bytes(dtype) * tiles * problem.d + GLUON_SMEM_EXTRA_BYTES


def _shared_memory_fits(bytes_needed, what: str):
    """A constraint: the shared memory a backend's kernel needs (bytes_needed(problem, config,
    dtype)) within the device's per block."""
    def check(problem, config, dtype, limits: DeviceLimits):
        need = bytes_needed(problem, config, dtype)
        if need > limits.shared_memory_per_block_bytes:
            return (f"{what}needs ~{need // 1024} KiB of shared memory, the device has "
                    f"{limits.shared_memory_per_block_bytes // 1024} KiB")
        return None
    return check


_check_shared_memory = _shared_memory_fits(_shared_memory_bytes, "")
_check_gluon_shared_memory = _shared_memory_fits(
    _gluon_shared_memory_bytes, f"BACKEND={GLUON_PINGPONG} (Q tile + num_stages K/V tiles) ")


def interpret_refusal(config: Config) -> str | None:
    """Why a config cannot run under Triton's CPU interpreter, or None: the interpreter runs
    @triton.jit functions, and the Gluon kernel's are Gluon's, written for an sm_90 GPU's wgmma."""
    return "Gluon kernel, needs an sm_90 GPU" if runs_gluon(config) else None


# The Gluon kernel's module (which imports Gluon, so the spec never imports it) and the facts it is
# written for: code its configs run, so the source hash covers it, read from the files. Only the
# tables holding Gluon configs go stale at an edit to it (KernelSpec.runs_extra_sources).
GLUON_SOURCE_MODULES = ("omnitune.kernels.attention_gluon", "omnitune.kernels._gluon_target")

# The Gluon ping-pong kernel's measured winner, 128-key tiles and 2 stages: on the H100 (b1 h32/4
# and h24/24, L 8k and 16k, causal and not, bf16, d=128) 1.00-1.13x SDPA's cuDNN backend's speed,
# where 64-key tiles gave 0.86-1.01x and this kernel (its nearest tuned configs) 0.81-0.92x
# (benchmarks/results/gluon_attention_h100_round41_G2.json). Known-good for the search; the
# benchmarks that time the Gluon kernel give it.
GLUON_WINNER = {"BACKEND": GLUON_PINGPONG, "BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 4, "num_stages": 2,
                "PACK_GQA": False, "USE_TMA": False}


def _check_accumulator(problem, config, dtype, limits):
    # The fp32 accumulator lives in registers: past 128 floats per thread the compiler spills
    # (255 registers is the hard cap, and the scores tile and Q need room too).
    per_thread = int(config["BLOCK_M"]) * _block_d(problem) // (int(config["num_warps"]) * 32)
    if per_thread > 128:
        return f"accumulator needs {per_thread} fp32 registers per thread (> 128)"
    return None


def _check_block_m(problem, config, dtype, limits):
    rows = _rows(problem, config)
    useful = max(16, triton.next_power_of_2(rows))
    if int(config["BLOCK_M"]) > useful:
        return f"BLOCK_M={config['BLOCK_M']} exceeds the {rows} query rows per program (use ≤ {useful})"
    return None


def _check_pack(problem, config, dtype, limits):
    if config["PACK_GQA"] and problem.group == 1:
        return "PACK_GQA needs several query heads per kv head (h > hkv)"
    return None


def _check_tma(problem, config, dtype, limits):
    if config["USE_TMA"] and tuple(limits.compute_capability) < (9, 0):
        return "USE_TMA needs compute capability 9.0 (Hopper) or newer"
    return None


PARAMS = (
    Param("BACKEND", BACKENDS, "triton: this kernel; sdpa: PyTorch SDPA as it dispatches; sdpa_cudnn: "
          "SDPA's cuDNN backend; gluon_pingpong: the Gluon ping-pong kernel for Hopper (sm_90, d=128; "
          "BLOCK_N and num_stages its tunables)", missing="triton"),
    Param("BLOCK_M", (16, 32, 64, 128), "query rows per program"),
    Param("BLOCK_N", (16, 32, 64, 128), "keys per inner-loop tile"),
    Param("num_warps", (4, 8), "warps per program"),
    Param("num_stages", (1, 2, 3, 4), "software-pipelining depth of the K/V loads"),
    Param("PACK_GQA", (False, True), "one program serves all query heads of a kv head"),
    Param("USE_TMA", (False, True), "load K/V tiles through tensor descriptors (Hopper TMA)"),
)

CONSTRAINTS = (
    Constraint("backend_parks_the_rest", _check_backend,
               "an SDPA backend parks the kernel's parameters (one config per backend) and takes no spans, the "
               "Gluon one fixes all but BLOCK_N and num_stages"),
    Constraint("gluon_needs_sm90", _gluon_only(_check_gluon_device), "the Gluon kernel is written for sm_90"),
    Constraint("gluon_16_bit", _gluon_only(_check_gluon_dtype), "the Gluon kernel takes fp16 or bf16"),
    Constraint("gluon_head_dim_128", _gluon_only(_check_gluon_head_dim), "the Gluon kernel is written for d=128"),
    Constraint("gluon_shared_memory", _gluon_only(_check_gluon_shared_memory),
               "the Gluon kernel's Q tile + K/V ring must fit in shared memory"),
    Constraint("shared_memory", _triton_only(_check_shared_memory),
               "Q tile + K/V tiles per stage must fit in shared memory"),
    Constraint("accumulator_registers", _triton_only(_check_accumulator),
               "fp32 accumulator ≤ 128 registers per thread"),
    Constraint("block_m_exceeds_rows", _triton_only(_check_block_m), "no block larger than the query rows it serves"),
    Constraint("pack_gqa_needs_groups", _triton_only(_check_pack), "PACK_GQA only when h > hkv"),
    Constraint("tma_needs_hopper", _triton_only(_check_tma), "tensor descriptors need sm_90+"),
)


def _tma_here() -> bool:
    """Whether the default may load through TMA: whether the device the runtime checks configs
    against has tensor memory access (sm_90+; without a GPU, the H200 the defaults are chosen for)."""
    return tuple(_device_limits().compute_capability) >= (9, 0)


# Query-light tiles over long key ranges take 128-key tiles. A program of ≤ 32 query rows does
# little work per K/V tile (its scores tile is 16–32 × BLOCK_N), so its key loop is bound by the
# loads in flight, not by the tensor cores; where the grid has no more programs than the SMs each
# SM holds one program whichever tile it takes, so the 128-key tile puts twice the bytes in flight
# and halves the loop's iterations. From the H200's recorded trials behind the shipped table
# (results/search_trials_h200_round4.json and search_trials_h200.json; none held out; measured
# on earlier kernel sources, as the TMA rule's were), at the default's other parameters (4 warps,
# 3 stages, TMA), 128-key tiles against 64:
#   16-row tiles, one query over 4,096 and 16,384 keys at batch 4 (h28/4; 16 programs packed, 112
#     not): 0.639x, 0.654x and 0.657x the time — the best config of this kernel each search found;
#   at batch 64 (256 programs, two a SM at 64-key tiles and ~100 KiB of shared memory): 1.008x
#     (4,096 keys), neutral; 1,792 programs (not packed): 1.185x slower — hence ≤ the SMs;
#   32-row tiles, b1 h28/4 128 queries over 256 keys, 112 programs (the exhaustive sweep): 0.905x
#     and 0.908x (packed or not); at 672 and 896 programs (765 rows with a span; b8 128 queries
#     over 1,152 keys): 1.09–1.12x and 1.04x slower.
# 64-row tiles do not take it: 128-key tiles at 64 rows and 4 warps were slower on every shape of
# those files but one (1.03x unpacked and 1.00x packed at 56 programs over 256 keys, 1.87x for b8
# 128 causal queries over 1,152 keys, 1.14–1.25x on prefill), their scores tile taking 64 registers
# a thread beside the accumulator's 64.
# With fewer stages the wide tile lost (2 stages: 1.08x and 1.15x the 64-key tile's 3-stage time
# at batch 4), so where 3 stages of it do not fit (fp32, d=256) the default keeps 64 keys. The
# measured key ranges were 4,096 and 16,384 (256 at 32 rows); at least 1,024 keys (8 tiles, a
# 3-stage pipeline past its fill) is asked, as the small-grid SDPA rule below asks.
WIDE_KEY_TILE_MAX_ROWS = 32
WIDE_KEY_TILE_MIN_KEYS = 1024
# Except over much longer key ranges: in the attention default study's training problems
# (benchmarks/results/attention_default_study_h200_round15_A.json, none held out) the 64-row tile
# over 128 keys (4 warps, 3 stages, TMA) was the fastest candidate on all three span-free problems
# of 16,000-20,000 keys with no more programs than the SMs: 173.6 against the 64-key tile's 205.5
# µs (b1 h28/4, 64 queries over 20,000 keys, 28 programs), 147.8 against 171.1 (b1 h64/8, 128
# causal queries over 16,000, 128 programs), 146.7 against 171.9 (b1 h32/8, 256 over 16,000, 128
# programs), where SDPA took 263.5, 230.2 and 193.4. With more programs than the SMs it lost
# (b1 h16/2, 640 causal queries over 24,000 keys, 160 programs: 409.9 against 347.7).
WIDE_KEY_TILE_64_ROWS_MIN_KEYS = 16000


# Long causal prefill: 128-row tiles over 128 keys, 8 warps. Every entry of the shipped H200 table
# with image spans and 8,192 or more query rows (9 of 9: h16/2, h28/4 and h32/4, 8,192-8,510
# rows, 1 or 16 spans, bf16 and fp16, head dim 128; 22-68 trials each, none held out) is that
# tile, at 1.04-1.20x the 64×64 default's speed; at 640-765 rows the same searches kept 64×64
# (7 of 8; the eighth 64×32). The span-free ones of that length went to SDPA, as untuned
# span-free prefill does (below): for them this is the kernel's own answer, the search's baseline.
LONG_PREFILL_MIN_QUERIES = 8192


# GQA packing (one program's rows drawn from all query heads of a kv head) in the default: where
# there are fewer query rows than a 64-row tile, and — from the attention default study's training
# problems (benchmarks/results/attention_default_study_h200_round15_A.json, none held out) — up to
# 191 rows where packing pads fewer rows: b24 h28/4 80 causal queries over 3,300 keys and fp16 b8
# h24/8 160 over 2,500 took 1/1.36 and 1/1.38 of the unpacked default's time (10x and 4.4x the
# SMs of programs); 80 rows unpacked pad to 128 per head, packed 560 rows to 576. Longer prefill
# keeps one head per tile (no measurement says otherwise; a tile across two heads' causal ranges
# would walk the longer one).
PACK_GQA_MAX_QUERIES = 191


def _packing_pays(problem: AttentionProblem, block_m: int = 64) -> bool:
    """Whether the default packs the query heads of a kv head into one program's rows (above)."""
    if problem.group == 1:
        return False
    if problem.lq < block_m:
        return True

    def padded(rows: int) -> int:  # rows rounded up to whole tiles
        return -(-rows // block_m) * block_m

    fewer_padded_rows = padded(problem.lq * problem.group) < problem.group * padded(problem.lq)
    return problem.lq <= PACK_GQA_MAX_QUERIES and fewer_padded_rows


def _base_default(problem: AttentionProblem, dtype: torch.dtype) -> Config:
    """64×64 tiles, 4 warps, 3 stages, TMA where the device has it; smaller tiles, fewer stages or
    pointer loads only where the problem or the device demands it."""
    pack = _packing_pays(problem)
    tma_choices = (True, False) if _tma_here() else (False,)
    for block_m in (64, 32, 16):
        for stages in (3, 2, 1):
            for tma in tma_choices:
                cfg = Config(BACKEND="triton", BLOCK_M=block_m, BLOCK_N=64, num_warps=4, num_stages=stages,
                             PACK_GQA=pack, USE_TMA=tma)
                if not SPEC.violations(problem, cfg, dtype):
                    return cfg
    return Config(BACKEND="triton", BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1, PACK_GQA=pack, USE_TMA=False)


def _long_causal_prefill(problem: AttentionProblem) -> bool:
    """Causal prefill of ≥ 8,192 query rows at head dim 128 (the shapes LONG_PREFILL_MIN_QUERIES
    was measured on; none at other head dims)."""
    return problem.causal and problem.lq >= LONG_PREFILL_MIN_QUERIES and problem.d == 128


# The default's first-choice tile, and the one it takes for long causal prefill (with the plain
# tile's stages).
_PLAIN_TILE = {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3}
_LONG_PREFILL_TILE = {"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8}


def _has_tile(config: Config, tile: dict) -> bool:
    return all(int(config[name]) == value for name, value in tile.items())


def _is_plain_tile(base: Config) -> bool:
    """Whether _base_default gave its first choice, 64×64 over 4 warps and 3 stages (nothing about
    the problem or the device forced a smaller tile or fewer stages)."""
    return _has_tile(base, _PLAIN_TILE)


def _wide_key_tile(problem: AttentionProblem, base: Config) -> bool:
    """Whether the default's tile is query-light over a long key range, or a 64-row tile over a
    much longer one, on a grid no larger than the SMs (see WIDE_KEY_TILE_MAX_ROWS)."""
    rows = int(base["BLOCK_M"])
    min_keys = WIDE_KEY_TILE_MIN_KEYS if rows <= WIDE_KEY_TILE_MAX_ROWS else WIDE_KEY_TILE_64_ROWS_MIN_KEYS
    return (rows <= 64 and int(base["BLOCK_N"]) == 64 and int(base["num_warps"]) == 4
            and int(base["num_stages"]) == 3 and problem.lk >= min_keys
            and _programs(problem, base) <= _device_limits().multiprocessors)


def default_config(problem: AttentionProblem, dtype: torch.dtype) -> Config:
    """The untuned starting point: 64×64 tiles, 4 warps, 3 stages (why: docs/results.md, "Why the
    defaults"); GQA packing when there are fewer query rows than a tile; K/V through tensor
    descriptors (TMA) where the device has them; 128-key tiles for tiles of ≤ 32 query rows over
    ≥ 1,024 keys, or of 64 over ≥ 16,000, on a grid no larger than the SMs (WIDE_KEY_TILE_MAX_ROWS
    above says why); 128×128 tiles over 8 warps for causal prefill of ≥ 8,192 query rows at head
    dim 128 (LONG_PREFILL_MIN_QUERIES); smaller tiles, fewer stages or pointer loads only where
    the problem or the device demands it.

    TMA: in the H200's recorded trials (results/sweep_trials_h200.json, search_trials_h200*.json:
    the searches behind the shipped table, none of them held out), the default's tile with TMA was
    faster than without on 8 of the 9 problems where both were measured (5–14%: prefill with and
    without spans, cross-attention, 128-row chunks); the ninth (1,024 queries over 256 keys) is
    answered by SDPA where untuned. Every config of this kernel the shipped table's searches chose
    loads through TMA (7 of 7)."""
    base = _base_default(problem, dtype)
    if (_long_causal_prefill(problem) and _is_plain_tile(base)
            and (long := _larger_tile(problem, dtype, base, **_LONG_PREFILL_TILE)) is not None):
        return long
    if _wide_key_tile(problem, base) and (wide := _larger_tile(problem, dtype, base, BLOCK_N=128)) is not None:
        return wide
    return base


def _larger_tile(problem: AttentionProblem, dtype: torch.dtype, base: Config, **changes) -> Config | None:
    """`base` with `changes`, through its loads or else through pointers: the first that breaks no
    constraint (a larger tile's TMA descriptors may not fit where pointer loads do), else None."""
    for tma in dict.fromkeys((bool(base["USE_TMA"]), False)):
        config = base.replace(USE_TMA=tma, **changes)
        if not SPEC.violations(problem, config, dtype):
            return config
    return None


def adapt_config(tuned: AttentionProblem, problem: AttentionProblem, config: Config) -> Config:
    """The config tuned for `tuned`, carried over to `problem` by the runtime's nearest rung: the
    long causal prefill tile (128×128 over 8 warps), tuned at ≥ LONG_PREFILL_MIN_QUERIES rows, is
    not carried below that length — there it takes the plain 64×64 tile over 4 warps and 3 stages,
    as default_config does, its loads and packing as tuned. The default's threshold is where the
    evidence for that tile lies (the shipped H200 table: all 9 entries with image spans at 8,192+
    rows chose it, 7 of 8 at 640–765 rows kept 64×64); carried down to 3,000 rows it took 1.073x the
    64×64 tile's time on the held-out set (round 28 D: b1 h16/2 with 2 spans, lent from 8,510 rows).
    Anything else is carried as tuned — a gluon_pingpong config too: where it does not fit the
    problem (another head dim, dtype or device) its constraints refuse it, as the runtime checks
    every carried config."""
    long_tile = str(config.get("BACKEND", "triton")) == "triton" and _has_tile(config, _LONG_PREFILL_TILE)
    if long_tile and _long_causal_prefill(tuned) and problem.causal and not _long_causal_prefill(problem):
        return config.replace(**_PLAIN_TILE)
    return config


# Where no tuned shape answers, span-free problems of two kinds go to PyTorch's SDPA as it
# dispatches. Long prefill: on the H200 its backends won every span-free shape of 1,024 or more
# query rows that the shipped table holds (12 of 12: h24/24, h28/4 and h32/4, 1k–16k, causal or
# not, bf16; each search re-timed SDPA beside its best configs of this kernel), and at 2,048 query
# rows, a shape no table holds, SDPA took 74.5 µs as a graph where this kernel's default took 85.8
# (benchmarks/results/ops_bench_h200_round12_A.json). And a grid of fewer programs than the GPU has
# SMs, each walking a long key range — this kernel does not split the keys: the table's two such
# shapes (batch 4, h28/4, one query over 4,096 and 16,384 keys: 16 programs) went to cuDNN, 3.0x
# and 5.5x faster than this kernel's default, where at batch 64 (256 programs) this kernel won;
# over 256 keys (b1 lq128, 56 programs) it won too. 1,024 keys lies between the measured points.
# Non-causal only, as those shapes were: causal with Lq < Lk takes SDPA's lower-right mask, and on
# the held-out set (round 13, fp16 b16 h16/2, 4 queries over 3,000 keys) SDPA took 3.7x the time
# of this kernel's tuned config there — the rule's first form had reached that far and was cut
# back to what its data covers. Elsewhere, and wherever spans need this kernel, its own default.
# From 768 query rows, not 1,024: in the attention default study's training problems (span-free,
# Lq = Lk, none held out: benchmarks/results/attention_default_study_h200_round15_A.json) SDPA took
# 1/1.14 and 1/1.15 of this kernel's default time at 768 and 896 rows (non-causal b2 h24/24;
# causal fp16 b4 h32/8), tied at 640 and 512 (1.003, 1.023) and lost at 576 (d=64, non-causal:
# 0.83) and with Lq < Lk (256–640 queries over 16k–24k keys: 0.49–0.89). The runtime answers a
# bucket of lengths by its bound (quarter octaves: 640, 768, ...), so from 641 rows on.
# The small-grid rule holds for query-light tiles (≤ 32 rows: the one-query shapes it was drawn
# from). Over 64-row tiles the same study's two such problems went the other way: SDPA took 263.5
# and 193.4 µs where this kernel's 128-key tile took 173.6 and 146.7 (b1 h28/4, 64 queries over
# 20,000 keys; b1 h32/8, 256 over 16,000: WIDE_KEY_TILE_64_ROWS_MIN_KEYS).
SDPA_UNTUNED_MIN_QUERIES = 768
SDPA_UNTUNED_MIN_KEYS_FEW_PROGRAMS = 1024


def _programs(problem: AttentionProblem, config: Config) -> int:
    """The kernel's grid size for `config`."""
    p = problem
    tiles, heads, _ = _grid(p.b, p.h, p.hkv, p.lq, int(config["BLOCK_M"]), bool(config["PACK_GQA"]) and p.group > 1)
    return tiles * heads


def untuned_config(problem: AttentionProblem, dtype: torch.dtype) -> Config:
    """PyTorch's SDPA for span-free long prefill (≥ 768 query rows) and for non-causal grids of
    query-light tiles too small to fill the SMs over ≥ 1,024 keys, else the default config: the
    runtime's answer for an attention problem nothing tuned answers (see above)."""
    default = default_config(problem, dtype)
    if not problem.spans:
        few_programs = (not problem.causal and problem.lk >= SDPA_UNTUNED_MIN_KEYS_FEW_PROGRAMS
                        and int(default["BLOCK_M"]) <= WIDE_KEY_TILE_MAX_ROWS
                        and _programs(problem, default) < _device_limits().multiprocessors)
        if problem.lq >= SDPA_UNTUNED_MIN_QUERIES or few_programs:
            sdpa_config = Config(BACKEND="sdpa", **PARKED)
            if not SPEC.violations(problem, sdpa_config, dtype):
                return sdpa_config
    return default


def _sdpa_baselines(problem: AttentionProblem):
    """PyTorch SDPA per backend, for `omnitune bench`. A plain causal mask with Lq ≠ Lk goes
    through torch's lower-right CausalBias (SDPA's is_causal is top-left aligned); span masks
    through a dense boolean mask, the only way SDPA can express them. Where a backend refuses
    GQA, K/V are expanded to all heads once, outside the timed calls."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def make(backend):
        prepared: dict[str, object] = {}

        def call(q, k, v, gqa, scale, inputs):
            kwargs = {"scale": scale}
            if gqa:
                kwargs["enable_gqa"] = True
            lq, lk = q.shape[2], k.shape[2]
            if inputs.spans is not None:
                if "mask" not in prepared:
                    keys = torch.arange(lk, device=q.device)
                    prepared["mask"] = (keys[None, None, :] < _limits_of(inputs)[:, :, None])[:, None]
                return F.scaled_dot_product_attention(q, k, v, attn_mask=prepared["mask"], **kwargs)
            if inputs.causal and lq != lk:
                return F.scaled_dot_product_attention(q, k, v, attn_mask=_causal_lower_right(lq, lk), **kwargs)
            return F.scaled_dot_product_attention(q, k, v, is_causal=inputs.causal, **kwargs)

        def run(inputs: AttentionInputs) -> torch.Tensor:
            q, k, v = inputs.q, inputs.k, inputs.v
            gqa = q.shape[1] != k.shape[1]
            with sdpa_kernel([backend]):
                if gqa and prepared.get("expand") is None:
                    try:
                        return call(q, k, v, True, inputs.sm_scale, inputs)
                    except (RuntimeError, TypeError):
                        group = q.shape[1] // k.shape[1]
                        prepared["expand"] = (k.repeat_interleave(group, 1), v.repeat_interleave(group, 1))
                if gqa:
                    k, v = prepared["expand"]
                return call(q, k, v, False, inputs.sm_scale, inputs)

        return run

    return {
        "sdpa_flash": make(SDPBackend.FLASH_ATTENTION),
        "sdpa_cudnn": make(SDPBackend.CUDNN_ATTENTION),
        "sdpa_efficient": make(SDPBackend.EFFICIENT_ATTENTION),
    }


SPEC = KernelSpec(
    name="attention",
    description="FlashAttention-2 forward: cross/self, causal or image-span masks, GQA/MQA",
    problem_type=AttentionProblem,
    params=PARAMS,
    constraints=CONSTRAINTS,
    default_config=default_config,
    untuned_config=untuned_config,
    make_inputs=make_inputs,
    new_output=new_output,
    launch=launch,
    reference=reference,
    tolerance={torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 2e-2},
    flops=flops,
    bytes_moved=bytes_moved,
    # Lent within 4× per dimension: the presets' tuned problems then cover realistic traffic
    # between them (tests/test_presets.py). Within 2× the held-out set would score 28 of 32 instead
    # of 27 (benchmarks/coverage_rescore.py over coverage_attention_h200_round28_D.json), but short
    # prompts of 228-1,806 rows would be left to the default: not adopted.
    match=MatchPolicy(exact=("d", "causal", "h", "hkv"), max_ratio=4.0),
    adapt=adapt_config,
    aliases={"l": ("lq", "lk"), "heads": ("h",), "kv_heads": ("hkv",)},
    # The fastest of a hand-picked list on the H200 for long prefill (543–567 TFLOP/s, bf16, D=128;
    # benchmarks/results/attention_bench_h200.json), and the best small-tile TMA config there.
    park_ignored=park_ignored,
    backends=({"BACKEND": "sdpa"}, {"BACKEND": "sdpa_cudnn"}),
    known_good=(
        {"BACKEND": "sdpa"},
        {"BACKEND": "sdpa_cudnn"},
        {"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8, "num_stages": 3, "USE_TMA": True},
        {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3, "USE_TMA": True},
        {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3, "USE_TMA": True},
        GLUON_WINNER,  # dropped by the constraints wherever the Gluon kernel does not run
    ),
    example_problem=AttentionProblem(b=2, h=4, hkv=2, lq=33, lk=47, d=64, causal=True),
    sample_problems=(
        AttentionProblem(b=1, h=2, hkv=2, lq=1, lk=20, d=80),
        AttentionProblem(b=1, h=3, hkv=1, lq=24, lk=24, d=96, causal=True, spans=1, span_len=9),
        AttentionProblem(b=1, h=2, hkv=1, lq=40, lk=30, d=256, causal=True),
    ),
    baselines=_sdpa_baselines,
    interpret_refusal=interpret_refusal,
    extra_source_modules=GLUON_SOURCE_MODULES,
    runs_extra_sources=runs_gluon,
    module=__name__,
)


# ------------------------------------------------------------------------------------------------
# torch.library op: what torch.compile records for attention() (see omnitune.kernels._dispatch)
# ------------------------------------------------------------------------------------------------


@library_op("attention")
def _attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mm_spans: torch.Tensor | None,
                  causal: bool, sm_scale: float, config: str) -> torch.Tensor:
    """attention() as an op: sm_scale < 0 means 1/√D, config '' means look it up (else JSON)."""
    return _attention(q, k, v, causal, sm_scale, _dispatch.config_from_json(config), mm_spans, None)


@_attention_op.register_fake
def _attention_fake(q, k, v, mm_spans, causal, sm_scale, config):
    return torch.empty(q.shape, dtype=q.dtype, device=q.device)

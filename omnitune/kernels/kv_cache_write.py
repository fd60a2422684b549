"""Paged KV-cache write: scatter the new tokens' keys and values into vLLM-layout caches.

Algorithm. key and value [T, Hkv, D] land in key_cache and value_cache
[num_blocks, block_size, Hkv, D] at slot_mapping[t] = block · block_size + offset. A negative slot
is padding: that token is neither read nor written. It is a pure copy, so the result is bitwise
exact. Slots must be distinct (as vLLM guarantees); two tokens sharing a slot race, and which one
lands is undefined.

Grid. axis 0: blocks of BLOCK_T tokens; axis 1: blocks of BLOCK_H kv heads. Each program moves a
[BLOCK_T, BLOCK_H, D] tile of keys and one of values: one slot load per token, then both tiles
loaded before either is stored, so that 2 · BLOCK_T · BLOCK_H · D elements are in flight per program.

Constexprs. BLOCK_T: tokens per program. BLOCK_H: kv heads per program. HEAD_DIM: the real head
dim; BLOCK_D: it rounded up to a power of two (masked inside the kernel when they differ).

Why these knobs (reasoned, not yet measured on a GPU). Head dim is the innermost, contiguous axis
of every tensor involved, so with a unit stride (Triton specialises strides equal to 1) and D·elt a
multiple of 16 bytes each thread moves 16-byte vectors. A large scatter (65,536 tokens × 8 heads ×
128, bf16: 256 MiB moved) is bandwidth-bound and wants many bytes in flight per SM: a tile of
BLOCK_T=8 tokens × 8 heads × 128 is 16 KiB per tensor, 32 KiB of loads outstanding per program,
eight 16-byte vectors per thread per tensor with 4 warps — and 8,192 programs rather than 524,288
one-row ones. The 64-token decode step is launch-bound: a small grid of light programs (BLOCK_T=1,
one program per token) finishes in one wave. There is no loop, so num_stages has nothing to
pipeline and is not a parameter.

Memory traffic model: per written token, its keys and values read once and written once
(4 · Hkv · D · elt bytes), plus every token's slot (8 bytes for int64). Padding tokens cost only
their slot.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from omnitune.errors import InputError
from omnitune.kernels import _dispatch, _fp8
from omnitune.kernels._fp8 import kv_cache_scale, round_to_e4m3  # noqa: F401  (kv_cache_scale: public)
from omnitune.kernels._host import (
    offsets_pass_int32,
    require_int32_offsets,
    seeded_rand,
    within_int32_offsets,
)
from omnitune.kernels import _launch as launching
from omnitune.kernels._launch import DirectLauncher, PlanCache, bounded_put
from omnitune.kernels._library import library_op
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
    relative_error,
    require_runnable_device,
)

SLOT_DTYPES = (torch.int32, torch.int64)
# Fraction of the factory's tokens that are padding (slot −1): 1 in PAD_EVERY.
PAD_EVERY = 8


@triton.jit
def _kv_cache_write(
    Key, Value, KeyCache, ValueCache, SlotMapping, KScale, VScale,
    stride_kt, stride_kh, stride_kd,
    stride_vt, stride_vh, stride_vd,
    stride_kcb, stride_kcs, stride_kch, stride_kcd,
    stride_vcb, stride_vcs, stride_vch, stride_vcd,
    stride_ks, stride_vs,
    T, HKV, BLOCK_SIZE, CAPACITY,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_H: tl.constexpr,
    QUANTIZE: tl.constexpr,
    EXACT_ROUNDING: tl.constexpr,
):
    # axis 0: block of BLOCK_T tokens; axis 1: block of BLOCK_H kv heads
    pid_t = tl.program_id(0)
    pid_h = tl.program_id(1)

    tokens = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    # Out-of-range tokens read as padding; int64 before any multiplication: caches exceed 2^31 elements.
    slots = tl.load(SlotMapping + tokens, mask=tokens < T, other=-1).to(tl.int64)
    # A slot past the cache is skipped like padding: whatever the slot mapping holds, nothing
    # outside the cache is written (the check mode reports such slots before launching).
    written = (slots >= 0) & (slots < CAPACITY)
    cache_block = slots // BLOCK_SIZE
    block_offset = slots % BLOCK_SIZE

    heads = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
    dims = tl.arange(0, BLOCK_D)
    mask = written[:, None, None] & (heads < HKV)[None, :, None]
    if BLOCK_D != HEAD_DIM:
        mask = mask & (dims < HEAD_DIM)[None, None, :]

    t64 = tokens.to(tl.int64)[:, None, None]
    h3 = heads[None, :, None]
    d3 = dims[None, None, :]
    k = tl.load(Key + t64 * stride_kt + h3 * stride_kh + d3 * stride_kd, mask=mask)
    v = tl.load(Value + t64 * stride_vt + h3 * stride_vh + d3 * stride_vd, mask=mask)
    if QUANTIZE:
        # fp8 caches hold x · (1 / scale), saturated at ±448 and rounded to the nearest e4m3
        # value: bit for bit what PyTorch's quantize gives. One correctly rounded reciprocal per
        # head (div_rn: Triton's `/` is approximate), then a multiply per element — a division
        # per element made this copy compute-bound (39% of copy bandwidth on the H200).
        head_valid = heads < HKV
        k_inv = tl.math.div_rn(1.0, tl.load(KScale + heads * stride_ks, mask=head_valid, other=1.0))
        v_inv = tl.math.div_rn(1.0, tl.load(VScale + heads * stride_vs, mask=head_valid, other=1.0))
        k = tl.minimum(tl.maximum(k.to(tl.float32) * k_inv[None, :, None], -448.0), 448.0)
        v = tl.minimum(tl.maximum(v.to(tl.float32) * v_inv[None, :, None], -448.0), 448.0)
        if EXACT_ROUNDING:
            # Triton's interpreter casts to fp8 wrongly (omnitune/kernels/_fp8.py); the GPU's
            # conversion instruction rounds to nearest even itself.
            k = round_to_e4m3(k)
            v = round_to_e4m3(v)
        k = k.to(KeyCache.dtype.element_ty)
        v = v.to(ValueCache.dtype.element_ty)

    blk = cache_block[:, None, None]
    off = block_offset[:, None, None]
    tl.store(KeyCache + blk * stride_kcb + off * stride_kcs + h3 * stride_kch + d3 * stride_kcd, k, mask=mask)
    tl.store(ValueCache + blk * stride_vcb + off * stride_vcs + h3 * stride_vch + d3 * stride_vcd, v, mask=mask)


# ------------------------------------------------------------------------------------------------
# Problem, inputs, launcher
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KVCacheWriteProblem:
    """One cache write: t new tokens of hkv heads × d into a cache of pages of block_size tokens,
    stored in the activations' dtype (cache_dtype "auto") or quantized to fp8 ("fp8_e4m3").

    The cache holds the pages the t tokens need plus a quarter more (at least one spare page), so
    the slots scatter through a cache that is not full."""

    t: int
    hkv: int
    d: int
    block_size: int = 16
    cache_dtype: str = optional_field("auto")

    def __post_init__(self):
        for name in ("t", "hkv", "d", "block_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be ≥ 1, got {getattr(self, name)}")
        object.__setattr__(self, "cache_dtype", _fp8.normalize_cache_dtype(self.cache_dtype))

    @property
    def num_blocks(self) -> int:
        pages = triton.cdiv(self.t, self.block_size)
        return pages + max(1, pages // 4)

    @property
    def padded_tokens(self) -> int:
        """How many of the factory's tokens are padding (slot −1)."""
        return self.t // PAD_EVERY


@dataclass
class KVCacheWriteInputs:
    key: torch.Tensor             # [T, Hkv, D]
    value: torch.Tensor           # [T, Hkv, D]
    initial_caches: torch.Tensor  # [2, num_blocks, block_size, Hkv, D]: key cache, value cache
    slot_mapping: torch.Tensor    # [T], int64; −1 = padding
    k_scale: torch.Tensor | None = None  # fp8 caches: float32 [1] or [Hkv]
    v_scale: torch.Tensor | None = None


def _check_metadata(key, value, key_cache, value_cache, slot_mapping, k_scale=None, v_scale=None) -> None:
    """Everything about the tensors that needs no device value (no sync): types, ranks, shapes,
    dtypes, devices, and an fp8 cache's scales. The common case is one cheap predicate (this runs
    on every call); only a call that fails it pays for finding the message."""
    if steady.plain(key, value, key_cache, value_cache, slot_mapping):
        shape, cache_shape = key.shape, key_cache.shape
        dtype, cache_dtype, device = key.dtype, key_cache.dtype, key.get_device()
        if (len(shape) == 3 and len(cache_shape) == 4 and value.shape == shape and value_cache.shape == cache_shape
                and cache_shape[2] == shape[1] and cache_shape[3] == shape[2]
                and shape[1] > 0 and shape[2] > 0 and cache_shape[1] > 0
                and slot_mapping.dim() == 1 and slot_mapping.shape[0] == shape[0]
                and value.dtype == dtype and value_cache.dtype == cache_dtype
                and slot_mapping.dtype in SLOT_DTYPES
                and value.get_device() == device and key_cache.get_device() == device
                and value_cache.get_device() == device and slot_mapping.get_device() == device
                and device >= 0
                and ((cache_dtype == dtype and k_scale is None and v_scale is None)
                     or (cache_dtype == _fp8.FP8 and dtype in _QUANTIZABLE
                         and _fp8.scales_fit(k_scale, shape[1], device)
                         and _fp8.scales_fit(v_scale, shape[1], device)))):
            return
    _explain_metadata(key, value, key_cache, value_cache, slot_mapping, k_scale, v_scale)


_QUANTIZABLE = (torch.float16, torch.bfloat16, torch.float32)


def _explain_metadata(key, value, key_cache, value_cache, slot_mapping, k_scale=None, v_scale=None) -> None:
    """The InputError naming what is wrong with the tensors (or nothing, e.g. for CPU tensors
    under the interpreter)."""
    named = (("key", key), ("value", value), ("key_cache", key_cache), ("value_cache", value_cache),
             ("slot_mapping", slot_mapping))
    for name, t in named:
        if not isinstance(t, torch.Tensor):
            raise InputError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    for name, t in (("key", key), ("value", value)):
        if t.dim() != 3:
            raise InputError(f"{name} must be 3-D [T, kv_heads, head_dim], got shape {list(t.shape)}")
    for name, t in (("key_cache", key_cache), ("value_cache", value_cache)):
        if t.dim() != 4:
            raise InputError(
                f"{name} must be 4-D [num_blocks, block_size, kv_heads, head_dim], got shape {list(t.shape)}"
            )
    devices = {t.device for _, t in named}
    if len(devices) > 1:
        raise InputError("key, value, key_cache, value_cache and slot_mapping must be on one device; got "
                         + ", ".join(f"{n} on {t.device}" for n, t in named))
    if key.dtype != value.dtype or key_cache.dtype != value_cache.dtype:
        raise InputError(
            f"key and value must share one dtype, and the two caches one; got {key.dtype}, {value.dtype}, "
            f"{key_cache.dtype}, {value_cache.dtype}"
        )
    unsupported = _fp8.unsupported_cache_dtype(key_cache.dtype)
    if unsupported:
        raise InputError(unsupported)
    if key_cache.dtype != key.dtype and not (key_cache.dtype == _fp8.FP8 and key.dtype in _QUANTIZABLE):
        raise InputError(
            f"the caches must be in key/value's dtype ({key.dtype}) or fp8 (float8_e4m3fn, quantized on write); "
            f"got {key_cache.dtype}"
        )
    if slot_mapping.dtype not in SLOT_DTYPES:
        raise InputError(f"slot_mapping must be int64 or int32, got {slot_mapping.dtype}")
    if key.shape != value.shape:
        raise InputError(f"key and value shapes differ: {list(key.shape)} vs {list(value.shape)}")
    if key_cache.shape != value_cache.shape:
        raise InputError(
            f"key_cache and value_cache shapes differ: {list(key_cache.shape)} vs {list(value_cache.shape)}"
        )
    t, hkv, d = key.shape
    num_blocks, block_size, cache_hkv, cache_d = key_cache.shape
    if (hkv, d) != (cache_hkv, cache_d):
        raise InputError(
            f"key/value have {hkv} kv heads × head dim {d}, the cache has {cache_hkv} × {cache_d}"
        )
    if hkv == 0 or d == 0:
        raise InputError(f"key/value have {hkv} kv heads × head dim {d}; both must be ≥ 1")
    if block_size == 0:
        raise InputError(f"the caches' block_size is 0 (shape {list(key_cache.shape)}); it must be ≥ 1")
    if slot_mapping.dim() != 1 or slot_mapping.shape[0] != t:
        raise InputError(
            f"slot_mapping must be 1-D with one slot per token ({t}), got shape {list(slot_mapping.shape)}"
        )
    _fp8.explain_scales(key_cache.dtype, k_scale, v_scale, hkv, key.device)
    require_runnable_device(key)


def _check_values(key, key_cache, slot_mapping, k_scale=None, v_scale=None) -> None:
    """The check mode's value checks: every slot inside the cache, no slot (padding aside) given
    to two tokens, and an fp8 cache's scales positive and finite (a few reductions, one sync)."""
    if key.shape[0] == 0:
        return
    num_blocks, block_size = key_cache.shape[0], key_cache.shape[1]
    capacity = num_blocks * block_size
    largest, duplicate, bad_scale = torch.stack([slot_mapping.max().to(torch.int64),
                                                 _duplicate_slot(slot_mapping),
                                                 _fp8.bad_scales(k_scale, v_scale, key.device)]).tolist()
    if bad_scale:
        raise InputError(_fp8.BAD_SCALE_MESSAGE)
    if largest >= capacity:
        raise InputError(
            f"slot_mapping holds slot {largest}, past the cache's {capacity} slots "
            f"({num_blocks} blocks × {block_size}); valid slots are 0..{capacity - 1}, negative = skip"
        )
    if duplicate >= 0:
        raise InputError(
            f"slot_mapping gives slot {duplicate} to more than one token; slots must be distinct "
            "(only negative padding slots may repeat): two writes to one slot race"
        )


def _duplicate_slot(slot_mapping: torch.Tensor) -> torch.Tensor:
    """The largest slot that two or more tokens share, as an int64 scalar on the device, −1 if
    none: sorted, a repeat is an entry equal to its neighbour. Negative slots are padding (never
    written), so they may repeat."""
    ordered = slot_mapping.to(torch.int64).sort().values
    repeated = (ordered[1:] == ordered[:-1]) & (ordered[1:] >= 0)
    return torch.where(repeated, ordered[1:], -1).amax() if ordered.shape[0] > 1 else ordered.new_full((), -1)


_WRITE = DirectLauncher(_kv_cache_write)


def _launch_plan(config: Config, t: int, hkv: int, d: int, quantize: bool) -> tuple:
    """(grid, bound kernel) for (config, T, Hkv, D, quantize): what a repeated call would
    otherwise recompute."""
    block_t, block_h = int(config["BLOCK_T"]), int(config["BLOCK_H"])
    grid = (triton.cdiv(t, block_t), triton.cdiv(hkv, block_h), 1)
    constexprs = dict(HEAD_DIM=d, BLOCK_D=triton.next_power_of_2(d), BLOCK_T=block_t, BLOCK_H=block_h,
                      QUANTIZE=quantize, EXACT_ROUNDING=quantize and _fp8.INTERPRETED,
                      num_warps=int(config["num_warps"]))
    return grid, _WRITE.bind(constexprs, 7)


_launch_plans = PlanCache(_launch_plan)


def _launch(key, value, key_cache, value_cache, slot_mapping, config: Config, k_scale=None,
            v_scale=None) -> tuple | None:
    """Launch the write; returns (grid, bound kernel, arguments) as launched, None for no tokens."""
    t, hkv, d = key.shape
    if t == 0:
        return None
    num_blocks, block_size = key_cache.shape[0], key_cache.shape[1]
    quantize = k_scale is not None
    grid, write = _launch_plans.get(config, (t, hkv, d, quantize))
    if quantize:
        scales = (k_scale, v_scale, _fp8.scale_stride(k_scale), _fp8.scale_stride(v_scale))
    else:
        scales = (key, key, 0, 0)  # placeholders, never read
    args = (
        key, value, key_cache, value_cache, slot_mapping, scales[0], scales[1],
        *key.stride(), *value.stride(), *key_cache.stride(), *value_cache.stride(), scales[2], scales[3],
        t, hkv, block_size, num_blocks * block_size,
    )
    write(grid, args)
    return grid, write, args


def launch(inputs: KVCacheWriteInputs, out: torch.Tensor, config: Config) -> None:
    """Write the inputs' tokens into `out` [2, num_blocks, block_size, Hkv, D] (key cache, value
    cache), in place. No validation: the spec's inputs are well-formed by construction."""
    _launch(inputs.key, inputs.value, out[0], out[1], inputs.slot_mapping, config, inputs.k_scale, inputs.v_scale)


def write_kv_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    config: Config | dict | None = None,
    check: bool | None = None,
) -> None:
    """Scatter key and value [T, Hkv, D] into key_cache and value_cache [num_blocks, block_size,
    Hkv, D] in place, token t at slot slot_mapping[t] = block · block_size + offset (int64 or
    int32; negative = padding, skipped). Slots must be distinct. Any strides.

    fp8 caches (torch.float8_e4m3fn, vLLM's kv_cache_dtype="fp8"): the tokens are quantized on
    write, x · (1 / scale) saturated at ±448 and rounded to nearest even; k_scale and v_scale are
    float32 device tensors, one per cache ([] or [1]) or one per kv head ([Hkv]) — see
    kv_cache_scale. Other caches are in key/value's dtype and take no scales.

    No host sync and nothing a CUDA graph cannot capture: shapes, dtypes and devices are checked
    on the host (InputError); a slot past the cache is skipped inside the kernel, so nothing
    outside the caches is ever written. check=True (or OMNITUNE_CHECK=1) also validates the slot
    values before anything is written (one sync), raising InputError with the caches untouched.
    config: launch config; None looks one up in the tuned tables (omnitune.runtime), falling back
    to the default. Under torch.compile this calls torch.ops.omnitune.write_kv_cache."""
    if _dispatch.compiling():
        _dispatch.require_compiled_check(check)
        torch.ops.omnitune.write_kv_cache(key, value, key_cache, value_cache, slot_mapping,
                                          _dispatch.config_to_json(config), k_scale, v_scale)
        return
    _write(key, value, key_cache, value_cache, slot_mapping, config, check, k_scale, v_scale)


_memo = _dispatch.ConfigMemo("kv_cache_write")


def _write(key, value, key_cache, value_cache, slot_mapping, config, check, k_scale=None, v_scale=None) -> None:
    signature = None
    checking = _dispatch.checking(check)
    if config is None and _WRITE._direct and not checking:
        signature = _signature(key, value, key_cache, value_cache, slot_mapping, k_scale, v_scale)
        if signature is not None and _steady_launch(signature, key, value, key_cache, value_cache, slot_mapping,
                                                    k_scale, v_scale):
            return
    _check_metadata(key, value, key_cache, value_cache, slot_mapping, k_scale, v_scale)
    if checking:
        _check_values(key, key_cache, slot_mapping, k_scale, v_scale)
    t, hkv, d = key.shape
    if t == 0:
        return
    # Heads and head-dim elements are 32-bit offsets in the kernel (_host.INT32_OFFSETS).
    for name, cache in (("key_cache", key_cache), ("value_cache", value_cache)):
        require_int32_offsets(cache, (2, 3), name)
    if offsets_pass_int32(key, (1, 2)) or offsets_pass_int32(value, (1, 2)):
        key, value = within_int32_offsets(key, (1, 2), "key"), within_int32_offsets(value, (1, 2), "value")
        signature = None  # launched with copies, not the caller's tensors
    # The kernel reads slot t at slot_mapping + t: a strided mapping (an expanded one has stride 0,
    # and one storage element) goes to it as a contiguous copy, never read past its storage.
    if t > 1 and slot_mapping.stride(0) != 1:
        slot_mapping, signature = slot_mapping.contiguous(), None
    block_size = key_cache.shape[1]
    cache_dtype = _fp8.cache_dtype_name(key_cache.dtype, key.dtype)
    # Token counts are bucketed for the tables (a decode step's count moves with the batch); a
    # caller's own config is validated against the real count.
    tokens = t if config is not None else _dispatch.bucket_up(t)
    cfg = _memo.get(
        (tokens, hkv, d, block_size, cache_dtype), config,
        lambda: KVCacheWriteProblem(t=tokens, hkv=hkv, d=d, block_size=block_size, cache_dtype=cache_dtype),
        key.dtype,
    )
    launched = _launch(key, value, key_cache, value_cache, slot_mapping, cfg, k_scale, v_scale)
    if signature is not None:
        _remember_steady(signature, *launched)


# The steady state of a serving engine: the same caches written, step after step, from tensors of
# the same shapes. A call's signature holds every piece of tensor metadata that the checks, the
# config lookup and the launch read (types, shapes, strides, dtypes, devices, the scales'), and the
# current device: the same signature passes the same checks, finds the same config and plan, and
# launches the same binary with the same arguments but the tensors' addresses. So the first call
# of a signature that the bound launcher sent down its direct path leaves here that C launch with
# every argument but the addresses, and a later call of that signature reads its metadata once
# and launches, where the full path reads it three times (checks, lookup, launch key) through
# five frames. Calls with a config of their own, in the check mode, under a launch hook, with an
# address off a 16-byte boundary, or after the tables were reloaded take the full path.
_steady: dict[tuple, tuple] = {}
_STEADY_ENTRIES = 256


def _signature(key, value, key_cache, value_cache, slot_mapping, k_scale, v_scale) -> tuple | None:
    """The call's metadata as the steady path's key (see _steady); None for an argument that is
    not a plain tensor (a subclass, None, anything else), which the full path judges."""
    if not steady.plain(key, value, key_cache, value_cache, slot_mapping):
        return None
    scales = steady.scales_signature(k_scale, v_scale)
    if scales is False:
        return None
    return (key.shape, value.shape, key_cache.shape, value_cache.shape, slot_mapping.shape,
            key.stride(), value.stride(), key_cache.stride(), value_cache.stride(), slot_mapping.stride(),
            key.dtype, value.dtype, key_cache.dtype, value_cache.dtype, slot_mapping.dtype,
            key.get_device(), value.get_device(), key_cache.get_device(), value_cache.get_device(),
            slot_mapping.get_device(), scales, launching._current_device())


def _steady_launch(signature, key, value, key_cache, value_cache, slot_mapping, k_scale, v_scale) -> bool:
    """Launch a call whose signature a direct launch left in _steady; False where the full path must."""
    entry = _steady.get(signature)
    if not steady.usable(entry):
        return False
    k, v, kc, vc, slots = (key.data_ptr(), value.data_ptr(), key_cache.data_ptr(), value_cache.data_ptr(),
                           slot_mapping.data_ptr())
    ks, vs = (k, k) if k_scale is None else (k_scale.data_ptr(), v_scale.data_ptr())  # see _launch's placeholders
    if steady.misaligned(k, v, kc, vc, slots, ks, vs):
        return False
    _, launch, grid, before_args, tail = entry
    launch(grid[0], grid[1], grid[2], launching._raw_stream(signature[-1]), *before_args, k, v, kc, vc, slots, ks, vs,
           *tail)
    return True


def _remember_steady(signature, grid, write, args) -> None:
    """Keep the C launch of a call the bound launcher made directly, for its signature's next call."""
    kept = steady.c_launch(write, args, signature[-1], tensors=7)
    if kept is not None:
        launch, before_args, tail = kept
        bounded_put(_steady, signature, (runtime_generation[0], launch, grid, before_args, tail), _STEADY_ENTRIES)


# ------------------------------------------------------------------------------------------------
# Spec: reference, inputs, model, config space
# ------------------------------------------------------------------------------------------------


def make_inputs(problem: KVCacheWriteProblem, dtype: torch.dtype, device, seed: int) -> KVCacheWriteInputs:
    """Random keys, values and cache contents; distinct random slots through the whole cache, with
    every PAD_EVERY-th token (at random positions) turned into padding (−1). An fp8 cache gets
    per-tensor scales from the new tokens (amax / 448, different for keys and values: values
    are drawn at half the keys' scale) and starts out holding quantized random values."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    p = problem

    rand = seeded_rand(gen, device, dtype)

    capacity = p.num_blocks * p.block_size
    slots = torch.randperm(capacity, generator=gen)[: p.t].to(torch.int64)
    padded = torch.randperm(p.t, generator=gen)[: p.padded_tokens]
    slots[padded] = -1
    key, value = rand(p.t, p.hkv, p.d), rand(p.t, p.hkv, p.d, scale=0.5)
    caches = rand(2, p.num_blocks, p.block_size, p.hkv, p.d)
    k_scale = v_scale = None
    if p.cache_dtype == "fp8_e4m3":
        k_scale, v_scale = kv_cache_scale(key), kv_cache_scale(value)
        caches = torch.stack([_fp8.quantize(caches[0], k_scale), _fp8.quantize(caches[1] * 0.5, v_scale)])
    return KVCacheWriteInputs(key=key, value=value, initial_caches=caches, slot_mapping=slots.to(device),
                              k_scale=k_scale, v_scale=v_scale)


def _slots_view(caches: torch.Tensor) -> torch.Tensor:
    """[2, num_blocks · block_size, Hkv, D] over the caches, as bytes for fp8 ones (indexed
    assignment is not implemented for fp8 tensors everywhere; bytes move the same bits)."""
    flat = caches.view(2, -1, *caches.shape[-2:])
    return flat.view(torch.uint8) if caches.dtype == _fp8.FP8 else flat


def _as_cache(x: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """New tokens as the cache stores them (quantized for an fp8 cache), in _slots_view's dtype."""
    if scale is None:
        return x
    return _fp8.quantize(x, scale).view(torch.uint8)


def new_output(inputs: KVCacheWriteInputs) -> torch.Tensor:
    """A fresh copy of the initial caches with every slot the kernel must write set to NaN: a
    slot it skips stays NaN, a write anywhere else changes data the reference keeps."""
    out = inputs.initial_caches.clone()
    valid = inputs.slot_mapping[inputs.slot_mapping >= 0]
    flat = _slots_view(out)
    flat[:, valid] = 0x7F if out.dtype == _fp8.FP8 else float("nan")  # 0x7F: e4m3's NaN
    return out


def reference(inputs: KVCacheWriteInputs) -> torch.Tensor:
    """The caches after the write, [2, num_blocks, block_size, Hkv, D], by PyTorch indexing (and
    PyTorch's quantization for an fp8 cache)."""
    expected = inputs.initial_caches.clone()
    flat = _slots_view(expected)
    keep = inputs.slot_mapping >= 0
    slots = inputs.slot_mapping[keep]
    flat[0, slots] = _as_cache(inputs.key[keep], inputs.k_scale)
    flat[1, slots] = _as_cache(inputs.value[keep], inputs.v_scale)
    return expected


def bitwise_mismatch(out: torch.Tensor, ref: torch.Tensor) -> float:
    """0.0 when out and ref are bitwise equal; otherwise their relative error, or inf where that
    is not positive (NaN left behind, −0.0 for +0.0): any difference fails a tolerance of 0."""
    if out.shape != ref.shape or out.dtype != ref.dtype:
        return float("inf")
    if torch.equal(out.contiguous().view(torch.uint8), ref.contiguous().view(torch.uint8)):
        return 0.0
    err = relative_error(out, ref)
    return err if err > 0.0 else float("inf")


def flops(problem: KVCacheWriteProblem) -> float:
    return 0.0  # a copy: TrialResult.tflops stays 0, TB/s is the figure


def bytes_moved(problem: KVCacheWriteProblem, dtype: torch.dtype) -> float:
    """Keys and values read in dtype and written in the cache's dtype, plus the slots."""
    p = problem
    read, written_bytes = element_bytes(dtype), element_bytes(_fp8.cache_dtype_of(p.cache_dtype, dtype))
    written = p.t - p.padded_tokens
    slot_bytes = 8 * p.t  # the factory's int64 slot_mapping
    return float(2 * written * p.hkv * p.d * (read + written_bytes) + slot_bytes)


def _tile_elements(problem: KVCacheWriteProblem, config: Config) -> int:
    return int(config["BLOCK_T"]) * int(config["BLOCK_H"]) * triton.next_power_of_2(problem.d)


def _check_block_t(problem, config, dtype, limits):
    useful = triton.next_power_of_2(problem.t)
    if int(config["BLOCK_T"]) > useful:
        return f"BLOCK_T={config['BLOCK_T']} exceeds the {problem.t} tokens (use ≤ {useful})"
    return None


def _check_block_h(problem, config, dtype, limits):
    useful = triton.next_power_of_2(problem.hkv)
    if int(config["BLOCK_H"]) > useful:
        return f"BLOCK_H={config['BLOCK_H']} exceeds the {problem.hkv} kv heads (use ≤ {useful})"
    return None


def _check_registers(problem, config, dtype, limits):
    # Key and value tiles are both held in registers between load and store (in fp32 while an
    # fp8 cache's values are rounded); past 128 32-bit registers per thread for them the
    # compiler spills to local memory.
    elt = 4 if problem.cache_dtype == "fp8_e4m3" else element_bytes(dtype)
    threads = int(config["num_warps"]) * 32
    per_thread = 2 * _tile_elements(problem, config) * elt // (4 * threads)
    if per_thread > 128:
        return f"key and value tiles need {per_thread} registers per thread (> 128)"
    return None


def _check_idle_threads(problem, config, dtype, limits):
    # More than one warp for a tile that does not give each thread one 16-byte vector only adds
    # idle threads (one warp is always allowed: tiny problems have no other choice).
    elt = element_bytes(dtype)
    vectors = _tile_elements(problem, config) * elt // 16
    threads = int(config["num_warps"]) * 32
    if int(config["num_warps"]) > 1 and vectors < threads:
        return f"a tile of {vectors} 16-byte vectors leaves threads idle with {config['num_warps']} warps"
    return None


PARAMS = (
    Param("BLOCK_T", (1, 2, 4, 8, 16, 32, 64), "tokens per program"),
    Param("BLOCK_H", (1, 2, 4, 8, 16), "kv heads per program"),
    Param("num_warps", (1, 2, 4, 8, 16), "warps per program"),
)

CONSTRAINTS = (
    Constraint("block_t_exceeds_tokens", _check_block_t, "no token block larger than the tokens"),
    Constraint("block_h_exceeds_heads", _check_block_h, "no head block larger than the kv heads"),
    Constraint("tile_registers", _check_registers, "key + value tiles ≤ 128 registers per thread"),
    Constraint("idle_threads", _check_idle_threads, "several warps only with a 16-byte vector per thread"),
)

# Elements of one tensor's tile per program that the default aims for: 8,192 (16 KiB in bf16) keeps
# 32 KiB of key+value loads in flight per program, eight 16-byte vectors per thread with 4 warps.
_TARGET_TILE_ELEMENTS = 8192


def default_config(problem: KVCacheWriteProblem, dtype: torch.dtype) -> Config:
    """The untuned starting point (reasoned, not measured): all heads of a token in one program
    (up to 1,024 elements per token); then as many tokens per program as reach ~8,192 elements,
    but never so many that the grid falls under two programs per SM (a small decode step keeps
    one token per program and finishes in one wave); one warp per 2,048 elements."""
    limits = DeviceLimits()
    block_d = triton.next_power_of_2(problem.d)
    block_h = min(triton.next_power_of_2(problem.hkv), max(1, 1024 // block_d))
    head_blocks = triton.cdiv(problem.hkv, block_h)
    block_t = 1
    while (
        block_t * 2 * block_h * block_d <= _TARGET_TILE_ELEMENTS
        and triton.cdiv(problem.t, block_t * 2) * head_blocks >= 2 * limits.multiprocessors
        and block_t * 2 <= 64
    ):
        block_t *= 2
    warps = min(8, max(1, block_t * block_h * block_d // 2048))
    while warps >= 1:
        cfg = Config(BLOCK_T=block_t, BLOCK_H=block_h, num_warps=warps)
        if not SPEC.violations(problem, cfg, dtype):
            return cfg
        warps //= 2
    return Config(BLOCK_T=block_t, BLOCK_H=block_h, num_warps=1)


def _index_copy_baselines(problem: KVCacheWriteProblem):
    """PyTorch index_copy_ into the flattened caches (vLLM's fallback path; an fp8 cache's tokens
    quantized by PyTorch first, inside the timing), for `omnitune bench`. The padding is filtered
    out and the output buffer made once per inputs, outside the timing."""
    prepared: dict[int, tuple] = {}

    def run(inputs: KVCacheWriteInputs) -> torch.Tensor:
        if id(inputs) not in prepared:
            keep = inputs.slot_mapping >= 0
            prepared.clear()
            prepared[id(inputs)] = (
                inputs.initial_caches.clone(), inputs.slot_mapping[keep], inputs.key[keep], inputs.value[keep]
            )
        caches, slots, key, value = prepared[id(inputs)]
        flat = _slots_view(caches)
        flat[0].index_copy_(0, slots, _as_cache(key, inputs.k_scale))
        flat[1].index_copy_(0, slots, _as_cache(value, inputs.v_scale))
        return caches

    return {"torch_index_copy": run}


SPEC = KernelSpec(
    name="kv_cache_write",
    description="paged KV-cache write: scatter new keys/values into vLLM-layout caches by slot",
    problem_type=KVCacheWriteProblem,
    params=PARAMS,
    constraints=CONSTRAINTS,
    default_config=default_config,
    make_inputs=make_inputs,
    new_output=new_output,
    launch=launch,
    reference=reference,
    tolerance={torch.float32: 0.0, torch.float16: 0.0, torch.bfloat16: 0.0},
    flops=flops,
    bytes_moved=bytes_moved,
    match=MatchPolicy(exact=("hkv", "d"), max_ratio=4.0),
    aliases={"tokens": ("t",), "kv_heads": ("hkv",)},
    example_problem=KVCacheWriteProblem(t=37, hkv=2, d=64, block_size=16),
    sample_problems=(
        KVCacheWriteProblem(t=1, hkv=1, d=64),                  # one token, one head
        KVCacheWriteProblem(t=24, hkv=3, d=32, block_size=5),   # odd heads and block size
        KVCacheWriteProblem(t=10, hkv=2, d=80, block_size=4),   # head dim padded to 128 in the tile
        KVCacheWriteProblem(t=19, hkv=3, d=64, block_size=8, cache_dtype="fp8_e4m3"),  # quantized on write
    ),
    baselines=_index_copy_baselines,
    compare=bitwise_mismatch,
    module=__name__,
)


# ------------------------------------------------------------------------------------------------
# torch.library op: what torch.compile records for write_kv_cache() (see omnitune.kernels._dispatch)
# ------------------------------------------------------------------------------------------------


@library_op("write_kv_cache", mutates_args=("key_cache", "value_cache"))
def _write_kv_cache_op(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                       value_cache: torch.Tensor, slot_mapping: torch.Tensor, config: str,
                       k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None) -> None:
    """write_kv_cache() as an op, the caches written in place; config '' means look it up."""
    _write(key, value, key_cache, value_cache, slot_mapping, _dispatch.config_from_json(config), None,
           k_scale, v_scale)


@_write_kv_cache_op.register_fake
def _write_kv_cache_fake(key, value, key_cache, value_cache, slot_mapping, config, k_scale=None, v_scale=None):
    return None

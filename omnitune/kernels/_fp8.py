"""fp8 KV caches: the storage format, its scales, and the rounding the kernels share.

Format — vLLM's `kv_cache_dtype="fp8"` (`"fp8_e4m3"`): a cache tensor of `torch.float8_e4m3fn`
holds x / scale — computed as x · (1 / scale) in float32, the reciprocal correctly rounded —
saturated at ±448, the largest finite e4m3 value, and rounded to nearest (ties to even); the
value it stands for is stored · scale. A scale is a float32 tensor on the cache's
device, one per cache (shape [] or [1], as vLLM's `layer._k_scale`) or one per kv head ([Hkv]).
A device tensor rather than a Python float, so that an engine can compute or update it on the
GPU without a sync and a CUDA graph captures its address, not its value. `kv_cache_scale` makes
one from data: amax / 448.

Rounding: on the GPU the conversion instruction rounds to nearest even (cvt.rn.satfinite),
checked bit for bit against PyTorch by the gpu-marked tests. Triton's interpreter, which the CPU
tests run, casts to fp8 wrongly — it drops the carry when the mantissa rounds up (31.7 → 16
instead of 32) — so there the kernels first round in fp32 arithmetic (`round_to_e4m3`, tested
on every code and tie against PyTorch), which makes the cast that follows exact.

e5m2 (vLLM's `fp8_e5m2`) and the fnuz flavours are refused with a clear error: e4m3 is what
vLLM, FlashInfer and FlashAttention-3 read for KV caches on Hopper, and one flavour keeps one
tolerance and one set of tables.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from omnitune.errors import InputError

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
# Whether kernels run under Triton's interpreter (decided before any kernel module is imported).
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
# The problem field's values: "auto" stores the cache in the activations' dtype.
CACHE_DTYPES = {"auto": None, "fp8_e4m3": FP8}
_CACHE_DTYPE_ALIASES = {"fp8": "fp8_e4m3", "fp8_e4m3fn": "fp8_e4m3", "float8_e4m3fn": "fp8_e4m3"}
_OTHER_FP8 = {
    getattr(torch, name): name
    for name in ("float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu")
    if hasattr(torch, name)
}
# Smallest scale kv_cache_scale returns: an all-zero tensor must not give a zero scale.
_MIN_SCALE = 1e-12


def normalize_cache_dtype(name: str) -> str:
    """A problem's cache_dtype in its canonical spelling ('auto' or 'fp8_e4m3'); ValueError
    naming the choices otherwise."""
    if not isinstance(name, str):
        raise ValueError(f"cache_dtype must be a string, got {type(name).__name__}")
    key = _CACHE_DTYPE_ALIASES.get(name.strip().lower(), name.strip().lower())
    if key not in CACHE_DTYPES:
        raise ValueError(f"cache_dtype={name!r} is not supported; use auto (the activations' dtype) "
                         "or fp8_e4m3 (alias fp8)")
    return key


def cache_dtype_of(name: str, dtype: torch.dtype) -> torch.dtype:
    """The torch dtype of a cache stored as `name` for activations of `dtype`."""
    return CACHE_DTYPES[name] or dtype


def cache_dtype_name(cache: torch.dtype, dtype: torch.dtype) -> str:
    """The problem field's value for a cache of torch dtype `cache` beside activations of `dtype`."""
    return "fp8_e4m3" if cache == FP8 and dtype != FP8 else "auto"


def unsupported_cache_dtype(dtype: torch.dtype) -> str | None:
    """Why a cache of this dtype cannot be fp8 here (None for e4m3 or a non-fp8 dtype)."""
    if dtype in _OTHER_FP8:
        return (f"{_OTHER_FP8[dtype]} caches are not supported; fp8 caches are float8_e4m3fn "
                "(vLLM's kv_cache_dtype='fp8' / 'fp8_e4m3')")
    if dtype == torch.uint8:
        return ("a uint8 cache is ambiguous (vLLM stores both fp8 flavours as uint8); pass "
                "cache.view(torch.float8_e4m3fn) for an e4m3 cache")
    return None


def kv_cache_scale(x: torch.Tensor, *, per_head: bool = False) -> torch.Tensor:
    """The scale that maps x's largest magnitude to 448, float32 on x's device, with no sync:
    one for the whole tensor (shape [1]), or with per_head one per kv head (x [..., Hkv, D] →
    [Hkv]). Values past it later saturate at ±448 · scale."""
    if per_head:
        amax = x.detach().abs().float().flatten(0, -3).amax(dim=(0, 2))
    else:
        amax = x.detach().abs().float().amax().reshape(1)
    return (amax / FP8_MAX).clamp_min(_MIN_SCALE)


def _per_head(scale: torch.Tensor) -> torch.Tensor:
    """A scale shaped to broadcast over [..., Hkv, D]."""
    return scale.reshape(-1, 1)


def quantize(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x [..., Hkv, D] in the cache format (the PyTorch reference of the kernels' quantizer):
    x · (1 / scale) in float32, saturated at ±448, then cast to e4m3 (nearest, ties to even)."""
    y = x.float() * (1.0 / _per_head(scale).float())
    return y.clamp(-FP8_MAX, FP8_MAX).to(FP8)


def dequantize(x8: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """What a cache holding x8 [..., Hkv, D] stands for, in dtype (exact in float32 and float64)."""
    return x8.to(dtype) * _per_head(scale).to(dtype)


def scale_stride(scale: torch.Tensor) -> int:
    """The stride between kv heads' scales: 0 for one scale, the tensor's own for one per head."""
    return 0 if scale.numel() == 1 else scale.stride(0)


def scales_fit(scale, hkv: int, device: int) -> bool:
    """The one cheap predicate over a scale that needs no device value (every call runs it)."""
    return (type(scale) is torch.Tensor and scale.dtype == torch.float32 and scale.get_device() == device
            and (scale.dim() == 0 or (scale.dim() == 1 and scale.shape[0] in (1, hkv))))


def explain_scales(cache_dtype: torch.dtype, k_scale, v_scale, hkv: int, device: torch.device) -> None:
    """The InputError naming what is wrong with a call's scales, or nothing if they are right."""
    if cache_dtype != FP8:
        if k_scale is not None or v_scale is not None:
            raise InputError(f"k_scale/v_scale were given for a {cache_dtype} cache; scales belong to fp8 "
                             "(float8_e4m3fn) caches")
        return
    for name, scale in (("k_scale", k_scale), ("v_scale", v_scale)):
        if scale is None:
            raise InputError(f"an fp8 cache needs {name}: a float32 tensor of shape [] / [1] (per tensor) or "
                             f"[{hkv}] (per kv head), e.g. omnitune.kernels.kv_cache_write.kv_cache_scale(key)")
        if not isinstance(scale, torch.Tensor):
            raise InputError(f"{name} must be a torch.Tensor on the cache's device, got {type(scale).__name__} "
                             "(a device tensor: graphs capture its address, and no sync reads it)")
        if scale.dtype != torch.float32:
            raise InputError(f"{name} must be float32, got {scale.dtype}")
        if scale.device != device:
            raise InputError(f"{name} is on {scale.device}, the cache on {device}")
        if not (scale.dim() == 0 or (scale.dim() == 1 and scale.shape[0] in (1, hkv))):
            raise InputError(f"{name} has shape {list(scale.shape)}; use [] or [1] (per tensor) or [{hkv}] "
                             "(one per kv head)")


BAD_SCALE_MESSAGE = ("k_scale and v_scale must be positive and finite (the cache holds x / scale); "
                     "see kv_cache_scale")


def bad_scales(k_scale, v_scale, device) -> torch.Tensor:
    """The check mode's scale check, on the device (the caller reads it back with its other checks,
    in its one sync): 1 where a scale is zero, negative or not finite — a zero scale quantizes every
    token to ±448 or NaN, a NaN one poisons every output — else 0, as an int64 scalar."""
    if k_scale is None or v_scale is None:  # no fp8 cache (the metadata checks judged the pair)
        return torch.zeros((), dtype=torch.int64, device=device)
    bad = [~(torch.isfinite(s) & (s > 0)).all() for s in (k_scale, v_scale)]
    return (bad[0] | bad[1]).to(torch.int64)


@triton.jit
def round_to_e4m3(y):
    """fp32 y rounded to the nearest e4m3 value (ties to even), saturated at ±448, still fp32:
    the cast to fp8 that follows is exact (see the module doc)."""
    y = tl.minimum(tl.maximum(y, -448.0), 448.0)
    bits = y.to(tl.int32, bitcast=True)
    sign = bits & -2147483648  # 0x80000000
    a = tl.abs(y)
    a_bits = a.to(tl.int32, bitcast=True)
    # Normal e4m3 (|y| ≥ 2^-6): keep 3 of fp32's 23 mantissa bits, ties to even. A carry out of
    # the mantissa moves into the exponent, as it must (|y| ≤ 448 never reaches the sign bit).
    normal = (a_bits + 0x7FFFF + ((a_bits >> 20) & 1)) & -1048576  # & ~0xFFFFF
    # Subnormal e4m3 (|y| < 2^-6): multiples of 2^-9. Adding 1.5·2^14 puts the units of 2^-9 in
    # the sum's last mantissa bit, so fp32's own rounding of the add (to nearest even) rounds.
    subnormal = ((a + 24576.0) - 24576.0).to(tl.int32, bitcast=True)
    magnitude = tl.where(a < 0.015625, subnormal, normal)
    return (magnitude | sign).to(tl.float32, bitcast=True)

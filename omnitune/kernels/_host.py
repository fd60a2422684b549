"""What the kernel modules share outside their device code: constants their launchers use and
the seeded inputs their specs make.

Nothing here may be read by a `@triton.jit` function: the source hash tables record covers the
jit functions and the constants they read (omnitune/source_hash.py), and a constant moved out of
a kernel's module would drop out of that hash. Host code only."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence

import torch

from omnitune.coerce import describe
from omnitune.errors import InputError

# log2(e): the launchers fold it into the softmax scale, so that the kernels use exp2.
LOG2E = 1.4426950408889634


def softmax_scale(sm_scale, d: int) -> float:
    """A caller's sm_scale as the launchers take it: None, or a negative value (what the custom ops
    pass for None), is 1/√d. Anything but a finite real number is an InputError here: a string or a
    tensor failed deep inside (`'<' not supported`, `Boolean value of Tensor ... ambiguous`), a
    one-element device tensor was read back with a hidden sync, and NaN or inf made every output
    NaN without a word. A plain float or int costs two type checks."""
    if sm_scale is None:
        return 1.0 / math.sqrt(d)
    if type(sm_scale) is not float and type(sm_scale) is not int:
        if isinstance(sm_scale, bool) or not isinstance(sm_scale, numbers.Real):
            raise InputError(f"sm_scale must be a float (or None for 1/sqrt(head_dim)), got {type(sm_scale).__name__}")
        sm_scale = float(sm_scale)
    if not math.isfinite(sm_scale):
        raise InputError(f"sm_scale={sm_scale!r} is not finite; pass a positive float, or None for 1/sqrt(head_dim)")
    return 1.0 / math.sqrt(d) if sm_scale < 0 else float(sm_scale)


def op_scale(sm_scale) -> float:
    """A caller's sm_scale as the custom ops take it, which is what a public function passes on
    under torch.compile: -1.0 for None (the ops read a negative scale as 1/√d), else the number
    itself. It is judged first as softmax_scale judges it, so that a compiled call refuses what an
    eager one refuses: float() alone read "0.1" as 0.1 and True as 1.0 without a word."""
    if sm_scale is None:
        return -1.0
    softmax_scale(sm_scale, 1)  # the InputError for a string, a bool, a tensor, NaN or inf
    return float(sm_scale)


def flag(value, name: str, allowed: str = "a bool (True or False)") -> bool:
    """A caller's boolean argument (causal=...) as a bool: a Python bool, a numpy bool, or the int 0
    or 1 (as a shape string writes it). Anything else is an InputError saying `name` must be
    `allowed`: bool("no") is True, so a string, another number or a tensor (whose truth value is a
    hidden sync) was taken without a word. A plain bool costs one type check."""
    if type(value) is bool:
        return value
    if type(value) is int and value in (0, 1):
        return bool(value)
    kind = type(value)
    if kind.__module__ == "numpy" and kind.__name__ in ("bool_", "bool"):
        return bool(value)
    raise InputError(f"{name} must be {allowed}, got {describe(value)} ({type(value).__name__})")


def require_head_groups(h: int, hkv: int, q_name: str = "q", kv_name: str = "k/v") -> None:
    """GQA's shape: h query heads in equal groups over hkv ≥ 1 kv heads (zero heads, or a count
    that does not divide, is an InputError naming both)."""
    if h <= 0 or hkv <= 0 or h % hkv:
        raise InputError(f"{q_name} heads ({h}) must be a positive multiple of {kv_name} heads ({hkv})")


def cdiv(a: int, b: int) -> int:
    """⌈a / b⌉ for the host's per-call paths: triton.cdiv is a ConstexprFunction whose host call
    costs ~2.7 µs (the development CPU), where this costs a division."""
    return -(-a // b)


# Triton passes an integer argument below 2^31 as a 32-bit one, so a kernel's index × stride is a
# 32-bit product unless the kernel widens the index first (the kernels here do for batches, heads
# of a batch and cache pages, not everywhere): a view whose rows, heads or head-dim elements lie
# 2^31 elements or more apart would wrap past the tensor there. The host sees such a view from its
# metadata alone: an input then goes to the kernel as a contiguous copy, an output is refused.
INT32_OFFSETS = 2**31
_TRITON_INT32_ARGS = 2**31  # the integers Triton passes as 32-bit: below this


def offsets_pass_int32(tensor: torch.Tensor, dims: Sequence[int]) -> bool:
    """Whether a kernel's offsets along `dims` of `tensor` — each index × a stride Triton passes as
    32-bit, summed — can reach INT32_OFFSETS elements (a stride of 2^31 or more is passed as 64-bit)."""
    shape, strides = tensor.shape, tensor.stride()  # once each: attention reads three tensors a call
    total = 0
    for dim in dims:
        size, stride = shape[dim], strides[dim]
        if size > 1 and stride < _TRITON_INT32_ARGS:
            total += (size - 1) * stride
    return total >= INT32_OFFSETS


def within_int32_offsets(tensor: torch.Tensor, dims: Sequence[int], name: str) -> torch.Tensor:
    """An input whose offsets along `dims` pass 32 bits (offsets_pass_int32) as a contiguous copy,
    else itself; InputError where even the copy's would (a tensor too long for the kernel)."""
    if not offsets_pass_int32(tensor, dims):
        return tensor
    tensor = tensor.contiguous()
    if offsets_pass_int32(tensor, dims):
        raise InputError(f"{name} {list(tensor.shape)} is too large for the kernel: its offsets along dims "
                         f"{', '.join(map(str, dims))} pass 2^31 elements")
    return tensor


def require_int32_offsets(tensor: torch.Tensor, dims: Sequence[int], name: str) -> None:
    """InputError for an output (written in place, so never copied) whose offsets along `dims`
    pass 32 bits (offsets_pass_int32)."""
    if offsets_pass_int32(tensor, dims):
        raise InputError(f"{name} {list(tensor.shape)} with strides {list(tensor.stride())} puts elements 2^31 or "
                         f"more apart along dims {', '.join(map(str, dims))}, past the kernel's 32-bit offsets "
                         "there; give a view whose elements there lie closer (e.g. a contiguous tensor)")


# CUDA's bound on a grid's y and z sizes (x takes 2³¹ − 1): a launch past it fails ("invalid
# argument") instead of running.
MAX_GRID_Y = 65535


def batch_slices(b: int, per_sequence: int) -> list[slice] | None:
    """None where a grid whose y size is b·per_sequence fits MAX_GRID_Y; else the batch slices, in
    order, whose launches each fit it (the launcher runs one per slice, on batch-sliced views).
    InputError where one sequence alone is past it."""
    limit = MAX_GRID_Y
    if b * per_sequence <= limit:
        return None
    if per_sequence > limit:
        raise InputError(f"{per_sequence} heads a sequence: more than a launch's grid holds ({limit})")
    step = limit // per_sequence
    return [slice(start, min(start + step, b)) for start in range(0, b, step)]


# Set in the search's precompile workers, which launch each candidate once only to fill Triton's
# disk cache: there the values do not matter, not even their seed.
_draw_on_target = False


def draw_on_target(enabled: bool = True) -> None:
    """From now on (in this process) seeded_rand draws on its target device without its seed: for
    inputs whose values nobody checks."""
    global _draw_on_target
    _draw_on_target = enabled


def seeded_rand(gen: torch.Generator, device=None, dtype: torch.dtype | None = None) -> Callable[..., torch.Tensor]:
    """`rand(*shape, scale=1.0)`: standard normal draws, times `scale`, on `device` in `dtype`
    (None: left as drawn, float32 on the CPU), one tensor after another from `gen`'s seed.

    Drawn where they land: on the CPU from `gen` itself, on a GPU from a generator of that device
    seeded with a number drawn from `gen`. Drawn in float32 and then cast, so a seed gives the same
    numbers for every dtype and on every run of one kind of device; a GPU's numbers are not the
    CPU's. Drawing on the CPU and copying was reproducible across devices too, but a 64-sequence
    16k-token decode cache (a billion floats) then took ~10 s of a search's setup on the H200's host
    (round 18), and the copies ran on the GPU outside a lane's GPU lock."""
    target = torch.device("cpu" if device is None else device)
    if target.type == "cpu":
        source = gen
    else:
        # Drawn from `gen`, not its seed reused: two closures over one generator draw different numbers.
        source = torch.Generator(device=target).manual_seed(int(torch.randint(2**62, (1,), generator=gen)))

    def rand(*shape: int, scale: float = 1.0) -> torch.Tensor:
        if _draw_on_target:
            t = torch.randn(shape, dtype=torch.float32, device=target)
        else:
            t = torch.randn(shape, generator=source, dtype=torch.float32, device=target)
        if scale != 1.0:
            t = t * scale
        return t.to(dtype=dtype) if dtype is not None else t

    return rand

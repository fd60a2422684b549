"""The ops' steady path: a call whose tensor metadata — its signature — an earlier call launched
directly is launched again with only its tensors' addresses read.

A serving engine calls each op step after step with tensors of the same shapes, strides, dtypes
and devices; only their addresses (and the values in them) change. Such a call passes the same
checks, finds the same config and launch plan and launches the same binary with the same plain
arguments. So the first call of a signature that the bound launcher sent down its direct path
leaves here what the C launcher takes besides the addresses, and a later call reads its metadata
once (into the signature) and launches. Every op keeps its own table, keyed by its own signature
(omnitune.kernels.kv_cache_write, omnitune.kernels.paged_decode_attention); this module holds
what they share: the signature's pieces, the C launch kept, and when a kept one may be used.
"""

from __future__ import annotations

import functools
import operator

import torch

from omnitune.kernels import _launch as launching
from omnitune.runtime import _generation as runtime_generation

Tensor = torch.Tensor
_reduce, _or = functools.reduce, operator.or_


def plain(a, b, c, d, e) -> bool:
    """Whether the five tensor arguments every op here takes are plain tensors (not a subclass,
    not None): the only kind a signature describes; anything else takes the full path. Five
    named arguments, not *args: this runs on every call, and a loop over a tuple costs more."""
    return type(a) is Tensor and type(b) is Tensor and type(c) is Tensor and type(d) is Tensor and type(e) is Tensor


def scales_signature(k_scale, v_scale):
    """The fp8 scales' part of a signature: None without scales, False for arguments the full path
    must judge (one scale without the other, not tensors)."""
    if k_scale is None and v_scale is None:
        return None
    if type(k_scale) is Tensor and type(v_scale) is Tensor:
        return (k_scale.shape, k_scale.stride(), k_scale.dtype, k_scale.get_device(),
                v_scale.shape, v_scale.stride(), v_scale.dtype, v_scale.get_device())
    return False


def usable(entry) -> bool:
    """Whether a kept entry (its first field the runtime's cache generation when it was kept) may
    launch: not after the tables were reloaded (the config may differ), not under a launch hook
    (the JIT's path calls it)."""
    return entry is not None and entry[0] == runtime_generation[0] and not launching._hooked()


def misaligned(a: int, b: int, c: int, d: int, e: int, f: int, g: int) -> bool:
    """Whether any of a call's seven addresses is off a 16-byte boundary: the binaries were
    compiled for aligned ones."""
    return bool((a | b | c | d | e | f | g) & 15)


def c_launch(bound: launching.BoundLauncher, args: tuple, device: int, tensors: int) -> tuple | None:
    """(the C launch function, the arguments it takes before the kernel's, the plain arguments and
    constexpr values it takes after the first `tensors` ones) for a launch of `args` the bound
    launcher made directly; None where it did not, or where an address is misaligned."""
    entry = bound.c_entry(args, device)
    if entry is None:
        return None
    launch, before_args, addresses, constexpr_values = entry
    if _reduce(_or, addresses[:tensors], 0) & 15:
        return None
    return launch, before_args, (*args[tensors:], *constexpr_values)

"""Tensor helpers every kernel module uses: the relative error its check compares, element sizes
for byte models, the check that a tensor's device can run a Triton kernel, NaN-poisoned output
buffers. Only the standard library and torch (the runtime reads specs on the hot path)."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

import torch

from omnitune.errors import InputError


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """‖out − ref‖ / ‖ref‖ in float64; NaN or Inf anywhere in out gives inf."""
    o = out.detach().to(torch.float64)
    r = ref.detach().to(torch.float64)
    if o.shape != r.shape:
        return math.inf
    if not torch.isfinite(o).all():
        return math.inf
    denom = torch.linalg.vector_norm(r).item()
    num = torch.linalg.vector_norm(o - r).item()
    if denom == 0.0:
        return 0.0 if num == 0.0 else math.inf
    return num / denom


def element_bytes(dtype: torch.dtype) -> int:
    """Bytes per element of a dtype, for byte models and shared-memory estimates."""
    return torch.empty((), dtype=dtype).element_size()


def require_runnable_device(t: torch.Tensor) -> None:
    """A Triton kernel runs on a CUDA tensor, or on a CPU tensor only under Triton's interpreter
    (TRITON_INTERPRET=1, set before the kernel module was imported)."""
    if t.device.type not in ("cuda", "cpu"):
        # A meta tensor (or another backend's) has no memory a kernel could read: said here, not
        # as NotImplementedError/RuntimeError from deep inside Triton's launcher.
        raise InputError(f"tensors are on {t.device}; the kernels run on a CUDA device (or the CPU with "
                         "TRITON_INTERPRET=1)")
    if t.device.type == "cpu" and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        raise InputError("tensors are on the CPU; move them to a CUDA device (or set TRITON_INTERPRET=1)")
    if t.device.type == "cpu" and t.dtype == torch.bfloat16:
        # Refused, not run: Triton's interpreter computes bf16 wrongly, and silently.
        raise InputError("bf16 tensors on the CPU: Triton's interpreter computes bf16 wrongly; use float16 or "
                         "float32 there, bf16 on a GPU")


def poisoned(shape: Sequence[int], dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """An output buffer filled with NaN, so that any element a kernel fails to write fails the check."""
    return torch.full(tuple(shape), float("nan"), dtype=dtype, device=device)

"""What the kernel modules share outside their device code: constants their launchers use and
the seeded inputs their specs make.

Nothing here may be read by a `@triton.jit` function: the source hash tables record covers the
jit functions and the constants they read (omnitune/source_hash.py), and a constant moved out of
a kernel's module would drop out of that hash. Host code only."""

from __future__ import annotations

from collections.abc import Callable

import torch

# log2(e): the launchers fold it into the softmax scale, so that the kernels use exp2.
LOG2E = 1.4426950408889634


def seeded_rand(gen: torch.Generator, device=None, dtype: torch.dtype | None = None) -> Callable[..., torch.Tensor]:
    """`rand(*shape, scale=1.0)`: standard normal draws from `gen`, times `scale`, on `device` in
    `dtype` (None: left as drawn, float32 on the CPU).

    Drawn on the CPU in float32 whatever the target, then moved: make_inputs gives the same
    numbers on every device and for every dtype, one tensor after another from one seed."""

    def rand(*shape: int, scale: float = 1.0) -> torch.Tensor:
        t = torch.randn(shape, generator=gen, dtype=torch.float32)
        if scale != 1.0:
            t = t * scale
        return t.to(device=device, dtype=dtype)

    return rand

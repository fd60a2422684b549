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


def cdiv(a: int, b: int) -> int:
    """⌈a / b⌉ for the host's per-call paths: triton.cdiv is a ConstexprFunction whose host call
    costs ~2.7 µs (the development CPU), where this costs a division."""
    return -(-a // b)


# Set in the search's precompile workers, which launch each candidate once only to fill Triton's
# disk cache: there the values do not matter, and drawing them on the CPU (what makes inputs
# reproducible across devices) took seconds per worker at decode's largest shapes — 64 sequences
# of 16k tokens are a billion floats per cache, drawn by 14 workers at once — while the measuring
# process waited for their binaries.
_draw_on_target = False


def draw_on_target(enabled: bool = True) -> None:
    """From now on (in this process) seeded_rand draws on its target device, without its seed:
    for inputs whose values nobody checks."""
    global _draw_on_target
    _draw_on_target = enabled


def seeded_rand(gen: torch.Generator, device=None, dtype: torch.dtype | None = None) -> Callable[..., torch.Tensor]:
    """`rand(*shape, scale=1.0)`: standard normal draws from `gen`, times `scale`, on `device` in
    `dtype` (None: left as drawn, float32 on the CPU).

    Drawn on the CPU in float32 whatever the target, then moved: make_inputs gives the same
    numbers on every device and for every dtype, one tensor after another from one seed (unless
    draw_on_target() was called: then on the device, from its own generator)."""

    def rand(*shape: int, scale: float = 1.0) -> torch.Tensor:
        if _draw_on_target:
            t = torch.randn(shape, dtype=torch.float32, device=device)
        else:
            t = torch.randn(shape, generator=gen, dtype=torch.float32)
        if scale != 1.0:
            t = t * scale
        return t.to(device=device, dtype=dtype)

    return rand

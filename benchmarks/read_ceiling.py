"""The fastest one-launch read of N bytes this project's Triton can write: the ceiling any one
kernel that reads a long-context decode's K/V bytes can reach on this GPU, attention or not.

A read kernel with nothing to compute: every program sums its share of a flat bf16 buffer into
fp32 and stores one number (so that nothing is optimised away). Two shapes of schedule, each over
a small grid of tile sizes, warps and programs: a grid-stride loop (programs × tiles of BLOCK
elements, pipelined over `stages`), and one tile per program (as many programs as tiles). Each
variant is checked against torch.sum before it is timed. benchmarks/long_decode_parts.py times the
variants beside the decode call of the same bytes and keeps the best.

    from read_ceiling import read_variants     # {name: callable}, each reading `flat` once
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton
import triton.language as tl


@triton.jit
def _read_strided(x_ptr, out_ptr, n, BLOCK: tl.constexpr, STAGES: tl.constexpr):
    pid = tl.program_id(0)
    step = tl.num_programs(0) * BLOCK
    acc = tl.zeros([BLOCK], tl.float32)
    for start in tl.range(pid * BLOCK, n, step, num_stages=STAGES):
        offsets = start + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + offsets, mask=offsets < n, other=0.0).to(tl.float32)
    tl.store(out_ptr + pid, tl.sum(acc, axis=0))


@triton.jit
def _read_one_tile(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offsets = pid * BLOCK + tl.arange(0, BLOCK)
    values = tl.load(x_ptr + offsets, mask=offsets < n, other=0.0).to(tl.float32)
    tl.store(out_ptr + pid, tl.sum(values, axis=0))


# (programs per SM, elements per tile, warps, stages): a grid that is a whole number of waves at
# 2–16 programs an SM, tiles of 8–32 KiB of bf16.
STRIDED = [(per_sm, block, warps, 3) for per_sm in (2, 4, 8, 16) for block in (4096, 8192)
           for warps in (4, 8)] + [(4, 8192, 8, 2), (4, 8192, 8, 4), (8, 4096, 4, 4)]
ONE_TILE = [(8192, 8), (16384, 8), (16384, 16)]


def read_variants(flat: torch.Tensor, partials: torch.Tensor) -> dict[str, Callable[[], torch.Tensor]]:
    """Each variant as a call that reads all of `flat` (1-D bf16) and returns its per-program
    sums (a view of `partials`, fp32, large enough for the biggest grid)."""
    n = flat.numel()
    sms = torch.cuda.get_device_properties(flat.device).multi_processor_count
    variants: dict[str, Callable[[], torch.Tensor]] = {}
    for per_sm, block, warps, stages in STRIDED:
        programs = min(per_sm * sms, triton.cdiv(n, block))

        def strided(programs=programs, block=block, warps=warps, stages=stages):
            _read_strided[(programs,)](flat, partials, n, BLOCK=block, STAGES=stages, num_warps=warps)
            return partials[:programs]

        variants[f"read_strided_p{per_sm}x_b{block}_w{warps}_s{stages}"] = strided
    for block, warps in ONE_TILE:
        programs = triton.cdiv(n, block)
        if programs > partials.numel():
            continue

        def one_tile(programs=programs, block=block, warps=warps):
            _read_one_tile[(programs,)](flat, partials, n, BLOCK=block, num_warps=warps)
            return partials[:programs]

        variants[f"read_one_tile_b{block}_w{warps}"] = one_tile
    return variants


def check(variants: dict[str, Callable[[], torch.Tensor]], flat: torch.Tensor) -> dict[str, float]:
    """Each variant's relative error against torch.sum of `flat` in fp64."""
    expected = flat.double().sum().item()
    scale = flat.double().abs().sum().item() or 1.0
    return {name: abs(fn().double().sum().item() - expected) / scale for name, fn in variants.items()}

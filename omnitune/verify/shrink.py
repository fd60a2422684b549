"""Small problems for checking a tuned config on the CPU (--interpret).

Triton's interpreter runs every program instance in numpy: a shipped entry's problem (a 16k
context, a batch of 64) would take hours there. The derived problem keeps the fields the kernel's
MatchPolicy matches exactly (head counts, head dim, masks: what the config was chosen for) and
halves the others in turn, the least halved first so that their proportions (prompt against
context, say) survive, while the entry's config stays valid for it (a BLOCK_M of 128 keeps at
least 65 query rows, a split count its keys) — until its modelled cost is under a budget. No
dimension but the batch goes below one more than the config's largest tile (BLOCK_* values), so
that every loop still takes more than one trip. bf16 becomes fp16: the interpreter computes bf16
wrongly.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from omnitune.errors import OmnituneError
from omnitune.spec import Config, DeviceLimits, KernelSpec

# The cost is FLOPs plus BYTE_WEIGHT per byte moved: the interpreter moves data element by element
# through numpy per program, far slower per byte than its dots per FLOP (a 4 MB KV-cache write
# took 7 s where 30 MFLOP of attention took 2). About a second or two per launch at the budget.
INTERPRET_BUDGET = 3e7
BYTE_WEIGHT = 50.0
BATCH_FIELD = "b"
INTERPRET_DTYPES = (torch.float32, torch.float16)


def interpret_dtype(spec: KernelSpec, dtype: torch.dtype) -> torch.dtype:
    """The dtype to check an entry of `dtype` with under the interpreter."""
    if dtype in INTERPRET_DTYPES and dtype in spec.dtypes:
        return dtype
    for candidate in (torch.float16, torch.float32):
        if candidate in spec.dtypes:
            return candidate
    return dtype


def small_problem(spec: KernelSpec, problem: Any, config: Config, dtype: torch.dtype,
                  budget: float = INTERPRET_BUDGET, limits: DeviceLimits | None = None) -> Any:
    """`problem` with its soft dimensions halved in turn until its cost is under `budget`,
    `config` staying valid for it; `problem` itself if already small."""
    limits = limits or DeviceLimits()
    blocks = [int(v) for k, v in config.items() if k.startswith("BLOCK_") and isinstance(v, int)
              and not isinstance(v, bool)]
    tile = max([16] + blocks)
    original = dataclasses.asdict(problem)
    soft = [f.name for f in dataclasses.fields(problem) if f.name not in spec.match.exact
            and isinstance(original[f.name], int) and not isinstance(original[f.name], bool)
            and original[f.name] > 1]
    # A batch may go down to 1; any other dimension keeps more than one tile (two loop trips).
    lowest = {n: 1 if n == BATCH_FIELD else min(original[n], tile + 1) for n in soft}
    current, cost = problem, _cost(spec, problem, dtype)
    while cost > budget:
        moves = []
        for name in sorted(soft, key=lambda n: -getattr(current, n) / original[n]):  # least halved first
            moves.append({name: getattr(current, name) // 2})
        # Halving every dimension at once keeps related ones consistent (16 spans of an image each
        # within the context) where halving one alone breaks the problem's own rules.
        moves.append({n: max(lowest[n], getattr(current, n) // 2) for n in soft})
        for change in moves:
            if any(v < lowest[n] for n, v in change.items()) or all(getattr(current, n) == v for n, v in change.items()):
                continue
            candidate = _valid(spec, current, change, config, dtype, limits)
            if candidate is not None and _cost(spec, candidate, dtype) < cost:
                current, cost = candidate, _cost(spec, candidate, dtype)
                break
        else:
            break
    return current


def _valid(spec: KernelSpec, problem: Any, change: dict, config: Config, dtype: torch.dtype,
           limits: DeviceLimits) -> Any:
    try:
        candidate = dataclasses.replace(problem, **change)
    except (ValueError, TypeError, OmnituneError):  # the problem's own rules forbid it
        return None
    return None if spec.violations(candidate, config, dtype, limits) else candidate


def _cost(spec: KernelSpec, problem: Any, dtype: torch.dtype) -> float:
    return float(spec.flops(problem)) + BYTE_WEIGHT * float(spec.bytes_moved(problem, dtype))

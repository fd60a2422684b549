"""Part 4, memory pressure (GPU): each kernel at its preset's largest shape, through the public op.

The largest shape of a kernel is its preset problem with the longest context (lk, ctx, or the
tokens written, t), the largest batch among those: the decode step at batch 64 over 16k tokens
for attention and paged decode, the 16k-token prompt's KV-cache write, and the long-video problem
(1 × 256 queries over 16k video tokens) for the cross-attention layer. Its inputs are allocated
and the op called once with the config the tables give it; it passes when every allocation
succeeds and the output agrees with the reference. The peak of torch's allocator
(max_memory_allocated: inputs, output and the op's workspaces) is reported against the GPU's
memory, and warns above PEAK_WARN of it.
"""

from __future__ import annotations

import gc
from collections.abc import Sequence
from typing import Any

import torch

from omnitune.errors import first_line, one_line
from omnitune.presets import PresetProblem
from omnitune.spec import dtype_name
from omnitune.verify import traffic
from omnitune.verify.numerics import lost_context
from omnitune.verify.verdict import Check, Status

PART = "memory"
CONTEXT_FIELDS = ("lk", "ctx", "t", "n")
PEAK_WARN = 0.9
GIB = 2**30


def largest(problems: Sequence[PresetProblem]) -> PresetProblem:
    """The preset problem with the longest context, then the largest batch."""
    def size(p: PresetProblem) -> tuple[int, int]:
        context = max((getattr(p.problem, f) for f in CONTEXT_FIELDS if hasattr(p.problem, f)), default=0)
        return context, getattr(p.problem, "b", 1)

    return max(problems, key=size)


def check_memory(preset_problem: PresetProblem, dtype: torch.dtype, seed: int = 1) -> Check:
    from omnitune.registry import get_spec
    from omnitune.runtime import lookup

    spec = get_spec(preset_problem.kernel)
    problem = preset_problem.problem
    found = lookup(spec.name, problem, dtype=dtype)
    total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    details: dict[str, Any] = {
        "problem": spec.problem_key(problem), "role": preset_problem.role, "dtype": dtype_name(dtype),
        "config": found.config.as_dict(), "rung": str(found.rung), "total_bytes": total,
    }
    subject = f"{spec.problem_key(problem)} ({preset_problem.role})"
    _release()
    torch.cuda.reset_peak_memory_stats()
    details["allocated_before_bytes"] = torch.cuda.memory_allocated()
    op = out = None
    try:
        op = traffic.build(preset_problem, dtype, "cuda", seed)
        out = op.call()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
        details.update({"peak_bytes": peak, "peak_gib": peak / GIB, "total_gib": total / GIB,
                        "peak_fraction": peak / total})
        error, tolerance = op.compare(out, op.reference())
        details.update({"rel_error": error, "tolerance": tolerance})
    except torch.cuda.OutOfMemoryError as exc:
        return Check(PART, subject, Status.FAIL, f"out of memory: {first_line(exc)}", spec.name, details)
    except Exception as exc:  # noqa: BLE001 — any failure at the largest shape is this check's
        details["context_lost"] = lost_context(exc)
        return Check(PART, subject, Status.FAIL, one_line(exc), spec.name, details)
    finally:
        op = out = None  # the inputs and output go before the next kernel's largest shape
        _release()
    figures = f"peak {details['peak_gib']:.2f} of {details['total_gib']:.1f} GiB ({details['peak_fraction']:.1%})"
    if not error <= tolerance:
        return Check(PART, subject, Status.FAIL, f"wrong result: relative error {error:.3g} > {tolerance:g}; {figures}",
                     spec.name, details)
    status = Status.WARN if details["peak_fraction"] > PEAK_WARN else Status.PASS
    return Check(PART, subject, status, figures + f", rel error {error:.2e}", spec.name, details)


def _release() -> None:
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()

"""How well the tables cover a model preset's problems, and what to tune next.

Each problem of the preset (omnitune/presets.py) is looked up as a call would be
(omnitune.runtime.explain): which rung answers it, how far the tuned problem that answers is, and
what the tables' predictor expects the answer's config to cost (its time ÷ the best on the tuned
problems nearest to it). The gap is largest where no tuned problem is near: problems answered by
the default come first, then those predicted, then those lent a nearest entry, each group by the
expected ratio (unknown first) and then by distance, farthest first; problems tuned exactly have
no gap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from omnitune.presets import ModelPreset, preset_problems
from omnitune.registry import get_spec
from omnitune.runtime import Rung, explain
from omnitune.runtime._format import search_command
from omnitune.spec import dtype_name

_GAP_ORDER = {Rung.DEFAULT: 3, Rung.PREDICTOR: 2, Rung.NEAREST: 1, Rung.EXACT: 0}


@dataclass(frozen=True)
class CoverageRow:
    """One problem of a preset, as the tables answer it."""

    kernel: str
    problem_key: str
    role: str
    dtype: str
    rung: Rung
    why: str
    matched_key: str | None
    distance: float | None
    expected_ratio: float | None
    """The predictor's expected time ÷ best of the answer's config (1.0 when tuned exactly;
    None without a predictor that has neighbours for it)."""
    order: int
    """The problem's place in the preset (ties keep it)."""
    tuned_on: str | None = None
    """The device key of the GPU whose table answered when that is not this GPU but one of the same
    chip (omnitune.trial.same_chip_keys); None for this GPU's own table or the default."""

    @property
    def command(self) -> str:
        """The search that closes this gap."""
        return search_command(self.kernel, self.problem_key, self.dtype)

    @property
    def gap_key(self) -> tuple:
        """Sorts the largest gap first."""
        unknown = math.inf
        return (-_GAP_ORDER[self.rung], -(self.expected_ratio if self.expected_ratio is not None else unknown),
                -(self.distance if self.distance is not None else unknown), self.order)


def coverage(preset: ModelPreset, kernels: tuple[str, ...], dtype: torch.dtype, device_name: str) -> list[CoverageRow]:
    """Every problem the preset gives these kernels, largest gap first."""
    rows = []
    for kernel in kernels:
        spec = get_spec(kernel)
        for problem in preset_problems(preset, kernel):
            found = explain(kernel, problem.problem, dtype, device_name)
            answer = found.lookup
            rows.append(CoverageRow(
                kernel=kernel, problem_key=spec.problem_key(problem.problem), role=problem.role,
                dtype=dtype_name(dtype), rung=answer.rung, why=found.why,
                matched_key=answer.matched_key or found.closest, distance=answer.distance,
                expected_ratio=found.expected_ratio, order=len(rows),
                tuned_on=found.tuned_on,
            ))
    return sorted(rows, key=lambda r: r.gap_key)

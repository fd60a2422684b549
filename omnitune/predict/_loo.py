"""Leave one problem out: how well the predictor would have done on each tuned problem had it not
been tuned — fit on the others (of the same kernel, dtype and device), predict it as the runtime
would, and read the predicted config's time from the held-out problem's own stored trials.

The figure per problem is a measured time ratio: the chosen config's median time on the held-out
problem ÷ that problem's best (1.0: the predictor found the winner; None: the search never ran
that config there, so the trials cannot say). Beside it, the same ratio for what the other rungs
would have chosen: the kernel's default config, and the nearest rung (the winner of the nearest
other problem that the MatchPolicy allows and whose config is valid here).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from omnitune import store
from omnitune.predict._fit import KEEP, NEIGHBOURS, Measured, block_of, measured_problems, point_of
from omnitune.runtime._chain import predict_with
from omnitune.runtime._predictor import parse_predictor
from omnitune.spec import DTYPES, Config, DeviceLimits, KernelSpec


@dataclass(frozen=True)
class HeldOut:
    """One tuned problem, predicted from the others."""

    kernel: str
    device_key: str
    dtype: str
    problem_key: str
    rung: str
    """'predictor' when the predictor chose a config, else 'default' (it had no neighbours, or none
    of their configs is expected to beat the default or is valid here)."""
    config: str
    """The chosen config's label."""
    ratio: float | None
    """Its measured time here ÷ the best here; None if the search never ran it here."""
    expected_ratio: float | None
    """What the predictor expected that ratio to be (from the neighbours)."""
    neighbours: tuple[str, ...]
    default_ratio: float | None
    """The default config's measured ratio here (None: not measured)."""
    nearest_key: str | None
    """The problem whose winner the nearest rung would give (None: none within the MatchPolicy)."""
    nearest_ratio: float | None


def leave_one_out(db_path: str | Path, kernel: str, *, neighbours: int = NEIGHBOURS, keep: int = KEEP,
                  limits: DeviceLimits | None = None) -> list[HeldOut]:
    """Every tuned problem of `kernel` in the results database, held out in turn (see the module doc)."""
    from omnitune.registry import get_spec

    return leave_one_out_trials(get_spec(kernel), store.read_trials(db_path, kernel), neighbours=neighbours,
                                keep=keep, limits=limits)


def leave_one_out_trials(spec: KernelSpec, trials: pd.DataFrame, *, neighbours: int = NEIGHBOURS, keep: int = KEEP,
                         limits: DeviceLimits | None = None) -> list[HeldOut]:
    """leave_one_out over a frame of trials (omnitune.store.read_trials' columns)."""
    limits = limits or DeviceLimits()
    rows = trials[trials["kernel"] == spec.name]
    held: list[HeldOut] = []
    for device_key, on_device in rows.groupby("device_key", sort=True):
        measured = measured_problems(spec, on_device)
        for key, target in measured.items():
            others = {k: m for k, m in measured.items() if k != key and m.dtype == target.dtype}
            held.append(_held_out(spec, str(device_key), target, others, neighbours, keep, limits))
    return held


def _held_out(spec: KernelSpec, device_key: str, target: Measured, others: dict[str, Measured], neighbours: int,
              keep: int, limits: DeviceLimits) -> HeldOut:
    dtype = DTYPES[target.dtype]
    problem = spec.problem_from_mapping(target.problem)
    predictor, _, _ = parse_predictor(block_of(spec, {k: point_of(m, keep) for k, m in others.items()}, neighbours), spec)
    predicted = predict_with(spec, problem, dtype, [(None, predictor)], [problem], limits)
    default = spec.default_config(problem, dtype)
    if predicted.lookup is not None:
        rung, config, expected = "predictor", predicted.lookup.config, predicted.lookup.expected_ratio
    else:
        rung, config, expected = "default", default, None
    nearest_key, nearest_config = _nearest(spec, problem, dtype, others, limits)
    return HeldOut(
        kernel=spec.name, device_key=device_key, dtype=target.dtype, problem_key=spec.problem_key(problem),
        rung=rung, config=config.label(), ratio=target.ratio(config), expected_ratio=expected,
        neighbours=predicted.ranking.keys if predicted.ranking is not None else (),
        default_ratio=target.ratio(default), nearest_key=nearest_key,
        nearest_ratio=target.ratio(nearest_config) if nearest_config is not None else None,
    )


def _nearest(spec: KernelSpec, problem, dtype, others: dict[str, Measured],
             limits: DeviceLimits) -> tuple[str | None, Config | None]:
    """What the nearest rung would answer from the others' winners, as the runtime ranks entries."""
    ranked = []
    for key, m in others.items():
        distance = spec.match.distance(problem, spec.problem_from_mapping(m.problem))
        if distance is not None:
            ranked.append((distance, key, min(m.times, key=lambda c: (m.times[c], c.label()))))
    for _, key, config in sorted(ranked, key=lambda r: r[:2]):
        if not spec.violations(problem, config, dtype, limits):
            return key, config
    return None, None


def summary(held: Sequence[HeldOut]) -> dict[str, object]:
    """Per choice (the predictor's, the default's, the nearest rung's): on how many problems its
    config was measured, and the geometric mean of its measured ratios there; then the predictor
    against the default on the problems where both were measured, and how often the predictor
    chose the best config."""
    def rung(ratios) -> dict[str, object]:
        found = [r for r in ratios if r is not None]
        return {"measured": len(found), "geomean_ratio": _geomean(found)}

    both = [h for h in held if h.ratio is not None and h.default_ratio is not None]
    return {
        "problems": len(held),
        "predictor_answered": sum(h.rung == "predictor" for h in held),
        "predicted_best": sum(h.ratio is not None and h.ratio <= 1.0 + 1e-9 for h in held),
        "predicted": rung(h.ratio for h in held),
        "default": rung(h.default_ratio for h in held),
        "nearest": rung(h.nearest_ratio for h in held),
        "paired_with_default": {"problems": len(both), "predicted_geomean": _geomean([h.ratio for h in both]),
                                "default_geomean": _geomean([h.default_ratio for h in both])},
    }


def _geomean(values: Sequence[float]) -> float | None:
    return math.exp(statistics.fmean(math.log(v) for v in values)) if values else None

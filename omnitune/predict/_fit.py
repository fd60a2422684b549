"""Fitting the predictor: from the results database's trials to a table's predictor block.

Every ok trial of every tuned problem counts, not only the winners: per problem (kernel × dtype ×
device), each config's best median time over the search's own trials (the finalists' re-timings
repeat configs the search measured, at other times: left out), divided by that problem's best —
the "time ratios" the runtime ranks candidates by (omnitune/runtime/_predictor.py). Deterministic:
points sorted by key, configs by ratio then label, ratios rounded to 4 decimals.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import pandas as pd

from omnitune.report import search_trials
from omnitune.runtime._format import entry_key
from omnitune.runtime._predictor import KIND, MAX_CONFIGS_PER_POINT, BlockError, default_features, parse_predictor
from omnitune.spec import Config, KernelSpec

NEIGHBOURS = 3
"""Tuned problems a prediction is made from (the nearest three: the problems on either side of a
new one along the dimension it differs in, and one more)."""
KEEP = 64
"""Configs kept per problem, fastest first: every config of a search of up to 64 trials (about 8 KB
of table per problem: the 6 attention problems of benchmarks/results/search_trials_h200.json, 63
configs each, make a 49 KB table)."""
_DIGITS = 4


@dataclass(frozen=True)
class Measured:
    """The ok search trials of one tuned problem: each config's best median time."""

    key: str
    dtype: str
    problem: dict[str, Any]
    """The problem's fields as the trials stored them (what an entry's "problem" holds)."""
    times: dict[Config, float]

    @property
    def best_ms(self) -> float:
        return min(self.times.values())

    def ratio(self, config: Config) -> float | None:
        """The config's time ÷ this problem's best; None if it was not measured (ok) here."""
        time_ms = self.times.get(config)
        return None if time_ms is None else time_ms / self.best_ms


def measured_problems(spec: KernelSpec, trials: pd.DataFrame) -> dict[str, Measured]:
    """Per entry key, the ok search trials of each problem in `trials` (one kernel, one device),
    sorted by key. Rows whose problem or config this spec cannot read (another version's) are
    left out."""
    rows = search_trials(trials) if not trials.empty else trials
    rows = rows[(rows["status"] == "ok") & rows["time_ms"].notna()]
    found: dict[str, Measured] = {}
    for (dtype, problem_json), group in rows.groupby(["dtype", "problem_json"], sort=True):
        try:
            fields = json.loads(problem_json)
            key = entry_key(dtype, spec.problem_key(spec.problem_from_mapping(fields)))
        except Exception:  # noqa: BLE001 — a problem of another version of the spec
            continue
        times: dict[Config, float] = dict(found[key].times) if key in found else {}
        for config_json, time_ms in zip(group["config_json"], group["time_ms"]):
            try:
                config = spec.coerce_config(json.loads(config_json), strict=True)
            except Exception:  # noqa: BLE001 — a config of another version of the space
                continue
            time_ms = float(time_ms)
            if math.isfinite(time_ms) and time_ms > 0 and time_ms < times.get(config, math.inf):
                times[config] = time_ms
        if times:
            found[key] = Measured(key, dtype, fields, times)
    return dict(sorted(found.items()))


def point_of(measured: Measured, keep: int = KEEP) -> dict[str, Any]:
    """One point of a predictor block: the problem, its dtype and its `keep` fastest configs'
    time ratios (by label); never more than the runtime reads (MAX_CONFIGS_PER_POINT)."""
    best = measured.best_ms
    ranked = sorted((max(1.0, round(t / best, _DIGITS)), c.label())
                    for c, t in measured.times.items())[:min(keep, MAX_CONFIGS_PER_POINT)]
    return {"dtype": measured.dtype, "problem": measured.problem, "time_ratios": dict((label, r) for r, label in ranked)}


def block_of(spec: KernelSpec, points: dict[str, dict], neighbours: int = NEIGHBOURS) -> dict[str, Any]:
    """A predictor block holding `points` (by entry key), with the spec's features."""
    features, match = default_features(spec)
    return {"kind": KIND, "neighbours": neighbours, "features": list(features), "match": list(match),
            "points": dict(sorted(points.items()))}


def fit_block(spec: KernelSpec, trials: pd.DataFrame, *, neighbours: int = NEIGHBOURS,
              keep: int = KEEP) -> dict[str, Any] | None:
    """The predictor block for one kernel × device's trials; None when no problem has an ok
    trial. Points the runtime would not read are left out (validated with its own parser)."""
    points = {key: point_of(m, keep) for key, m in measured_problems(spec, trials).items()}
    if not points:
        return None
    block = block_of(spec, points, neighbours)
    _, bad, _ = parse_predictor(block, spec)
    for key, _ in bad:
        del block["points"][key]
    return block if block["points"] else None


def merge_blocks(new: dict | None, existing: Any, spec: KernelSpec | None) -> tuple[dict | None, list[tuple[str, str]]]:
    """`new` with the points of `existing` whose keys it lacks, as export merges entries; points
    the runtime would skip are dropped, and returned as (key, why). A whole existing block that
    cannot be read is dropped (key "predictor") in favour of `new`."""
    if existing is None:
        return new, []
    if spec is None:  # a user's kernel not importable here: nothing to validate against
        return (new if new is not None else existing), []
    try:
        parse_predictor(existing, spec)
    except BlockError as exc:
        return new, [("predictor", f"the block {exc}")]
    header = new if new is not None else existing
    kept = {k: v for k, v in existing["points"].items() if new is None or k not in new["points"]}
    merged = {**header, "points": {**kept, **(new["points"] if new is not None else {})}}
    _, bad, _ = parse_predictor({**header, "points": kept}, spec)
    for key, _ in bad:
        del merged["points"][key]
    merged["points"] = dict(sorted(merged["points"].items()))
    return (merged if merged["points"] else None), bad

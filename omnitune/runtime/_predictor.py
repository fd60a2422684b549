"""The predictor block of a tuned table: a config for a problem that no entry answers, predicted
from every config measured on the tuned problems nearest to it.

A table's optional top-level "predictor" block (tuned_configs/README.md) holds, per tuned problem
(a "point", keyed like an entry), the median time of each config its search measured divided by
that problem's best ("time ratios": 1.0 for the winner, 1.3 for a config 30% slower). For a new
problem the runtime takes the `neighbours` nearest points of the same dtype whose `match` fields
are equal, at a distance that sums |difference| over the block's `features`: each numeric field's
log2 (values below 1 continue linearly: 0 → -1) and, for "flops_per_byte", the log2 of the
kernel's arithmetic intensity (spec.flops / spec.bytes_moved). Each candidate config (any config
measured on a neighbour) gets an expected time ratio, the mean over the neighbours weighted by
4**-distance (a neighbour twice as far along one dimension counts a quarter, so the nearest ones
decide and the others break ties), a neighbour that did not measure it counting the median ratio
of its own configs. The chain takes the lowest expected
ratio whose config is valid for the problem, and only if it is lower than the expected ratio of
the problem's own default config — over the neighbours that measured that config; where none
did, how far from their best their own defaults ran (the default rule's record nearby) — and
otherwise the default answers; where neither is known, the default answers too. (Counting the
default at the neighbours' median where they did not measure it let any of their configs beat a
default they never ran: after the paged-decode default changed, the predictor then answered 20 of
30 held-out problems, most of them slower than the default,
benchmarks/results/coverage_paged_decode_h200_round11_D.json.)

Plain data, nothing executed: the block is validated like entries (strict values, configs of the
kernel's space, keys that match their problems); a block that cannot be used whole is ignored
with one log line, bad points are skipped with one more (see _tables.predictor_of). Standard
library and torch only: the runtime imports this on a production hot path.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from omnitune.coerce import describe
from omnitune.runtime._adapt import carried_over
from omnitune.runtime._keyed import keyed_problem
from omnitune.spec import Config, KernelSpec, field_kind

KIND = "nearest_problems"
INTENSITY = "flops_per_byte"
"""The feature that is no problem field: log2 of the kernel's FLOPs per byte moved."""

# A lookup carries every config of each neighbour over to its problem (about 60 µs each): these
# bound that work to 16 × 256 configs, so a hostile block cannot stall each new bucket for
# seconds. Export writes 3 neighbours × a point's 64 fastest (omnitune.predict).
MAX_NEIGHBOURS = 16
MAX_CONFIGS_PER_POINT = 256
MAX_RATIO = 1e6
_MAX_LABEL = 2000


class BlockError(Exception):
    """A predictor block that cannot be used at all; the message completes 'the block ...'."""


class UnknownKind(BlockError):
    """A block of a kind this omnitune does not read (a later one's, say): not corrupt."""


@dataclass(frozen=True)
class Point:
    """One tuned problem of a predictor block, validated."""

    key: str
    dtype: torch.dtype
    problem: Any
    vector: tuple[float, ...]
    matched: tuple
    ratios: Mapping[Config, float]
    typical: float
    """The median of its time ratios: what a config it did not measure is expected to cost."""


@dataclass(frozen=True)
class Ranking:
    """The neighbours of one problem and the candidate configs they give, best first."""

    neighbours: tuple[tuple[float, Point], ...]
    """(distance, point), nearest first."""
    ratios: tuple[Mapping[Config, float], ...] = ()
    """Per neighbour, its time ratios keyed by its configs as carried over to the ranked problem
    by the kernel's rule (runtime._adapt: a paged-decode split count that filled the GPU on a
    neighbour keeps filling it here); empty: the configs as measured."""

    def _ratios_of(self, index: int) -> Mapping[Config, float]:
        return self.ratios[index] if self.ratios else self.neighbours[index][1].ratios

    def estimate(self, config: Config) -> float:
        """The expected time ÷ best of `config` on these neighbours (one that did not measure it
        counting its median ratio)."""
        return self._weighted(self._ratios_of(index).get(config, point.typical)
                              for index, (_, point) in enumerate(self.neighbours))

    def measured_estimate(self, config: Config) -> float | None:
        """The expected time ÷ best of `config` over the neighbours that measured it (weighted as
        in estimate), or None where none did."""
        return self._weighted(self._ratios_of(index).get(config) for index in range(len(self.neighbours)))

    def own_defaults_estimate(self, spec: KernelSpec, dtype: torch.dtype) -> float | None:
        """How far from their best the neighbours' own default configs (the kernel's default rule
        as it stands, applied to each neighbour's problem) ran, weighted as in estimate, over the
        neighbours that measured theirs; None where none did."""
        return self._weighted(_own_default_ratio(spec, point, dtype) for _, point in self.neighbours)

    def _weighted(self, ratios: Iterable[float | None]) -> float | None:
        """The mean of one ratio per neighbour (None: that neighbour has none), each weighted
        4^−(its distance − the nearest's); None where no neighbour has one."""
        total = weights = 0.0
        nearest = self.neighbours[0][0]
        for (distance, _), ratio in zip(self.neighbours, ratios):
            if ratio is not None:
                weight = 4.0 ** (nearest - distance)  # relative to the nearest: never all underflowing to 0
                total += weight * ratio
                weights += weight
        return total / weights if weights else None

    def candidates(self) -> list[tuple[float, Config]]:
        """Every config a neighbour measured, as (expected ratio, config), lowest first (ties: by label)."""
        seen = {config for index in range(len(self.neighbours)) for config in self._ratios_of(index)}
        return sorted(((self.estimate(c), c) for c in seen), key=lambda sc: (sc[0], sc[1].label()))

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(point.key for _, point in self.neighbours)


@dataclass(frozen=True)
class Predictor:
    """A validated predictor block."""

    neighbours: int
    features: tuple[str, ...]
    match: tuple[str, ...]
    points: tuple[Point, ...]

    def rank(self, spec: KernelSpec, problem: Any, dtype: torch.dtype) -> Ranking | None:
        """The ranking for `problem`, or None when no point applies (another dtype, other match
        fields) or its features cannot be computed. Never raises."""
        try:
            vector = features_of(spec, problem, dtype, self.features)
            matched = tuple(getattr(problem, name) for name in self.match)
        except Exception:  # noqa: BLE001 — a spec's FLOP model on an extreme problem: no prediction
            return None
        near = sorted(
            ((sum(abs(a - b) for a, b in zip(vector, p.vector)), p.key, p)
             for p in self.points if p.dtype == dtype and p.matched == matched),
            key=lambda c: c[:2],
        )[: self.neighbours]
        if not near:
            return None
        neighbours = tuple((distance, point) for distance, _, point in near)
        if spec.adapt is None:
            return Ranking(neighbours)
        return Ranking(neighbours, tuple(_carried_over_ratios(spec, point, problem) for _, point in neighbours))


def _own_default_ratio(spec: KernelSpec, point: Point, dtype: torch.dtype) -> float | None:
    """The ratio a point measured for its own problem's untuned answer (its default config unless
    the kernel names another), None if it did not."""
    try:
        return point.ratios.get(spec.untuned_answer(point.problem, dtype))
    except Exception:  # noqa: BLE001 — a default rule that cannot judge the point: it tells nothing
        return None


def _carried_over_ratios(spec: KernelSpec, point: Point, problem: Any) -> dict[Config, float]:
    """A point's time ratios keyed by its configs carried over to `problem`; where two configs
    land on one, the better ratio stands for it."""
    ratios: dict[Config, float] = {}
    for config, ratio in point.ratios.items():
        config = carried_over(spec, point.problem, problem, config) or config
        ratios[config] = min(ratio, ratios.get(config, ratio))
    return ratios


def features_of(spec: KernelSpec, problem: Any, dtype: torch.dtype, names: tuple[str, ...]) -> tuple[float, ...]:
    """The feature vector of a problem (see the module doc); raises what the spec's FLOP and byte
    models raise, or ValueError for a non-finite figure."""
    values = []
    for name in names:
        if name == INTENSITY:
            moved = float(spec.bytes_moved(problem, dtype))
            value = float(spec.flops(problem)) / moved if moved > 0 else 0.0
        else:
            value = float(getattr(problem, name))
        if not math.isfinite(value):
            raise ValueError(f"{name} is not finite")
        values.append(math.log2(value) if value >= 1 else value - 1.0)
    return tuple(values)


def default_features(spec: KernelSpec) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(features, match) as export writes them: every numeric problem field and the arithmetic
    intensity; every other field (flags, names) must be equal."""
    fields = spec.problem_fields()
    numeric = tuple(f.name for f in fields if field_kind(f) in ("int", "float"))
    return (*numeric, INTENSITY), tuple(f.name for f in fields if f.name not in numeric)


def parse_label(spec: KernelSpec, label: str) -> Config:
    """A config from its label (Config.label: sorted `name=value`, flags 0/1), spelled exactly so;
    parameters a label lacks take their `missing` value. ValueError or ConfigError says why not."""
    if not isinstance(label, str) or not label or len(label) > _MAX_LABEL:
        raise ValueError(f"config label {describe(label)} is not a config's label")
    values: dict[str, Any] = {}
    for part in label.split(" "):
        name, sep, text = part.partition("=")
        if not sep or name in values:
            raise ValueError(f"config label {describe(label)} is not name=value pairs, each named once")
        values[name] = spec.param(name).coerce(text)
    if Config(values).label() != label:
        raise ValueError(f"config label {describe(label)} is not spelled as omnitune writes it")
    return spec.coerce_config(values, strict=True)


def parse_predictor(raw: Any, spec: KernelSpec) -> tuple[Predictor, list[tuple[str, str]], int]:
    """The block validated: (predictor of its valid points, [(key, why)] of the bad ones, how many
    points it holds). BlockError when the block cannot be used whole (UnknownKind for a block of
    another kind)."""
    if not isinstance(raw, dict):
        raise BlockError(f"is a JSON {type(raw).__name__}, not an object")
    if raw.get("kind") != KIND:
        raise UnknownKind(f"is of kind {describe(raw.get('kind'))}; this omnitune reads {KIND!r}")
    neighbours = raw.get("neighbours")
    if type(neighbours) is not int or not 1 <= neighbours <= MAX_NEIGHBOURS:
        raise BlockError(f"has neighbours {describe(neighbours)}, not an integer from 1 to {MAX_NEIGHBOURS}")
    numeric = {f.name for f in spec.problem_fields() if field_kind(f) in ("int", "float")}
    features = _names(raw.get("features"), "features", numeric | {INTENSITY}, spec)
    if not features:
        raise BlockError("has no features")
    match = _names(raw.get("match"), "match", {f.name for f in spec.problem_fields()}, spec)
    points_raw = raw.get("points")
    if not isinstance(points_raw, dict):
        raise BlockError("has no 'points' object")
    points, bad = [], []
    labels: dict[str, Config] = {}  # the same configs recur from point to point: each label parsed once
    for key in sorted(points_raw):
        try:
            points.append(_point(key, points_raw[key], spec, features, match, labels))
        except KeyError as exc:
            bad.append((key, f"it lacks {describe(exc.args[0])}"))
        except Exception as exc:  # noqa: BLE001 — untrusted input, and a spec author's problem type
            bad.append((key, str(exc) or type(exc).__name__))
    return Predictor(neighbours, features, match, tuple(points)), bad, len(points_raw)


def unusable_block(exc: Exception) -> str:
    """What parse_predictor's failure says of the block, completing 'the block ...': a BlockError's
    own words, anything else (a spec author's problem type, say) by its type and message. The
    runtime's warning and verify's compat check give the same words."""
    return str(exc) if isinstance(exc, BlockError) else f"cannot be read ({type(exc).__name__}: {exc})"


def _names(value: Any, what: str, allowed: set[str], spec: KernelSpec) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(n, str) for n in value) or len(set(value)) != len(value):
        raise BlockError(f"has {what} {describe(value)}, not a list of distinct names")
    unknown = [n for n in value if n not in allowed]
    if unknown:
        raise BlockError(f"names {what} {describe(unknown[0])}, which is not one of {spec.name}'s "
                         f"({', '.join(sorted(allowed))})")
    return tuple(value)


def _point(key: str, raw: Any, spec: KernelSpec, features: tuple[str, ...], match: tuple[str, ...],
           labels: dict[str, Config]) -> Point:
    dtype, problem = keyed_problem(key, raw, spec)
    measured = raw["time_ratios"]
    if not isinstance(measured, dict) or not 1 <= len(measured) <= MAX_CONFIGS_PER_POINT:
        raise TypeError(f"its 'time_ratios' is not an object of 1 to {MAX_CONFIGS_PER_POINT} configs")
    ratios: dict[Config, float] = {}
    for label, ratio in measured.items():
        config = labels.get(label) if isinstance(label, str) else None
        if config is None:
            config = labels[label] = parse_label(spec, label)
        if type(ratio) not in (int, float) or not 1.0 <= ratio <= MAX_RATIO:  # NaN fails too
            raise ValueError(f"the time ratio {describe(ratio)} of {describe(label, 80)} is not a number "
                             f"from 1 to {MAX_RATIO:g}")
        if config in ratios:
            raise ValueError(f"it names the config {config.label()!r} twice")
        ratios[config] = float(ratio)
    vector = features_of(spec, problem, dtype, features)
    matched = tuple(getattr(problem, name) for name in match)
    return Point(key, dtype, problem, vector, matched, ratios, statistics.median(ratios.values()))

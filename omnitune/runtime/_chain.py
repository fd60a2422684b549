"""The lookup chain: exact key → nearest tuned problem → a config predicted from the tuned problems
nearest to it (a table's predictor block, _predictor.py) → the kernel's default config, resolved
once per bucket of problems (see _buckets.py) and, where one answer cannot serve a whole bucket,
once per problem. The nearest and predictor rungs read bf16 entries for fp16 and back where a
dtype's own have nothing near (SIBLING_DTYPES). Nothing here returns a config that breaks a
constraint of the problem asked."""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from omnitune.runtime._adapt import carried_over, outside_space
from omnitune.runtime._buckets import Bucketing
from omnitune.runtime._format import entry_key, search_command
from omnitune.runtime._predictor import Predictor, Ranking
from omnitune.runtime._tables import Table, TableEntry, predictor_of, warn_entry_once, warn_once
from omnitune.spec import Config, DeviceLimits, KernelSpec, dtype_name


class Rung(str, enum.Enum):
    """Which step of the chain answered."""

    EXACT = "exact"          # this very (problem, dtype) was tuned on this device
    NEAREST = "nearest"      # a tuned problem close enough under the kernel's MatchPolicy
    PREDICTOR = "predictor"  # none close enough: predicted from the nearest tuned problems' trials
    DEFAULT = "default"      # nothing applicable: the kernel's untuned default

    def __str__(self) -> str:
        # 'exact', not 'Rung.EXACT', in f-strings and messages.
        return self.value


@dataclass(frozen=True)
class Lookup:
    """The config chosen for one call, and where it came from."""

    config: Config
    rung: Rung
    source: Path | None = None
    """The table file the config was read from; None for the default."""
    matched_key: str | None = None
    """The entry key ('<dtype>|<problem_key>') that answered (for a predicted config, the nearest
    tuned problem it was predicted from); None for the default."""
    distance: float | None = None
    """MatchPolicy distance to the matched problem: 0.0 when exact; for a nearest match, from the
    problem's bucket bound (its bucketed fields rounded up), which answers for the whole bucket;
    for a predicted config, the predictor's distance (its features' summed |log2 difference|) to
    the nearest tuned problem; None for the default."""
    neighbours: tuple[str, ...] = ()
    """For a predicted config: the keys of the tuned problems it was predicted from, nearest first."""
    expected_ratio: float | None = None
    """For a predicted config: its expected time ÷ best on those problems (1.0: fastest on each)."""
    tuned_config: Config | None = None
    """For a nearest match whose config the kernel's rule adapted (KernelSpec.adapt): the matched
    entry's config as it was tuned; None otherwise."""


@dataclass(frozen=True)
class Impossible:
    """No config of the kernel's space satisfies its constraints for a problem: looking the
    problem up raises InputError with this message (cached like an answer, so that a caller
    repeating the call does not search the space again)."""

    message: str


class Bucket:
    """The answers for one bucket: its tuned problems exactly, every other problem `shared` —
    or, where no one config is valid throughout the bucket (shared None), each problem apart."""

    __slots__ = ("exact", "shared", "values")

    def __init__(self, exact: dict[tuple, Lookup], shared: Lookup | None, values: Callable[[Any], tuple]):
        self.exact = exact
        self.shared = shared
        self.values = values

    def pick(self, problem: Any) -> Lookup | None:
        """The answer for `problem`, or None when it must be resolved on its own."""
        if self.exact:
            found = self.exact.get(self.values(problem))
            if found is not None:
                return found
        return self.shared


def resolve_bucket(
    spec: KernelSpec, bucketing: Bucketing, problem: Any, dtype: torch.dtype | None, check_dtype: torch.dtype,
    tables: Sequence[Table], limits: DeviceLimits,
) -> Lookup | Bucket:
    """The answers for the bucket of `problem` (a validated problem; dtype None: no table applies,
    the default is checked at check_dtype). A bare Lookup when one answer serves the whole bucket."""
    bucket_key = bucketing.key(problem)
    exact: dict[tuple, Lookup] = {}
    for table in tables:  # precedence order: the first table whose entry is valid wins
        for entry in table.entries.values():
            if entry.dtype != dtype or bucketing.key(entry.problem) != bucket_key:
                continue
            values = bucketing.values(entry.problem)
            if values not in exact and _fits(spec, table, entry, entry.problem, dtype, limits):
                exact[values] = Lookup(entry.config, Rung.EXACT, table.path, entry.key, 0.0)
    shared = _shared_answer(spec, bucketing, problem, dtype, check_dtype, tables, limits)
    if not exact and shared is not None:
        return shared
    return Bucket(exact, shared, bucketing.values)


# The 16-bit float formats stand in for each other where a problem's own dtype has no tuned shape
# near it: fp16 and bf16 take the same bytes per element and the same tensor-core instructions at
# the same rate on every GPU that has both, and the kernels compute softmax and accumulate in fp32
# either way — a config's speed follows the shape, not which of the two formats it reads. A
# borrowed config is still judged by every constraint at the dtype asked.
SIBLING_DTYPES = {torch.float16: torch.bfloat16, torch.bfloat16: torch.float16}


def dtypes_to_borrow(dtype: torch.dtype) -> tuple[torch.dtype, ...]:
    """The dtypes whose entries may answer a lookup in `dtype`, its own first."""
    sibling = SIBLING_DTYPES.get(dtype)
    return (dtype,) if sibling is None else (dtype, sibling)


def resolve_problem(
    spec: KernelSpec, problem: Any, dtype: torch.dtype | None, check_dtype: torch.dtype,
    tables: Sequence[Table], limits: DeviceLimits,
) -> Lookup | Impossible:
    """The chain for one problem whose bucket has no shared answer (and that was not tuned)."""
    if dtype is not None:
        found = _nearest_or_predicted(spec, problem, problem, (problem,), dtype, tables, limits, own_exact=False)
        if found is not None:
            return found
    return safe_default(spec, problem, check_dtype, limits)


def _nearest_or_predicted(
    spec: KernelSpec, target: Any, problem: Any, corners: Sequence[Any], dtype: torch.dtype, tables: Sequence[Table],
    limits: DeviceLimits, *, own_exact: bool,
) -> Lookup | None:
    """The nearest rung, then the predictor, for `target` (a problem, or its bucket's bound):
    from the entries of `dtype` itself, then of its sibling (SIBLING_DTYPES). own_exact: whether
    the entry of target itself in `dtype` may answer (a bucket's bound, not a problem's own)."""
    for source in dtypes_to_borrow(dtype):
        include = own_exact or source is not dtype
        for distance, table, entry in ranked_entries(spec, target, source, tables, include_exact=include):
            found = _nearest(spec, table, entry, target, problem, corners, dtype, limits, distance)
            if found is not None:
                return found
    for source in dtypes_to_borrow(dtype):
        predicted = predict(spec, target, source, tables, corners, limits).lookup
        if predicted is not None and (source is dtype or _valid_at(spec, predicted.config, corners, dtype, limits)):
            return predicted
    return None


def ranked_entries(
    spec: KernelSpec, problem: Any, dtype: torch.dtype, tables: Sequence[Table], *, include_exact: bool = True
) -> list[tuple[float, Table, TableEntry]]:
    """Every entry of the same dtype that the spec's MatchPolicy lets `problem` use, nearest first
    (ties: the earlier table, then the key), as (distance, table, entry)."""
    key = entry_key(dtype_name(dtype), spec.problem_key(problem))
    candidates: list[tuple[float, int, str, Table, TableEntry]] = []
    for precedence, table in enumerate(tables):
        for entry in table.entries.values():
            if entry.dtype != dtype or (entry.key == key and not include_exact):
                continue
            distance = spec.match.distance(problem, entry.problem)
            if distance is not None:
                candidates.append((distance, precedence, entry.key, table, entry))
    candidates.sort(key=lambda c: c[:3])
    return [(distance, table, entry) for distance, _, _, table, entry in candidates]


def safe_default(spec: KernelSpec, problem: Any, dtype: torch.dtype, limits: DeviceLimits) -> Lookup | Impossible:
    """The kernel's default config if it is valid for `problem`; else the first config of the
    space (parameters and choices in their declared order, so the smallest tiles and fewest
    warps first) that breaks no constraint; else Impossible. A default that breaks its own
    kernel's constraints (kv_cache_write's for d ≥ 32,769 did) is a bug in the spec, warned about
    once per kernel and constraint; the config returned is still a valid one."""
    try:
        default = spec.untuned_answer(problem, dtype)
        broken = outside_space(spec, default) or spec.violations(problem, default, dtype, limits)
    except Exception as exc:  # noqa: BLE001 — a spec's default for an extreme problem: not this call's end
        default, broken = None, [("default_config", f"{type(exc).__name__}: {exc}")]
    if not broken:
        return Lookup(default, Rung.DEFAULT)
    name, reason = broken[0]
    problem_key = spec.problem_key(problem)
    for config in spec.all_configs():
        if _valid_at(spec, config, (problem,), dtype, limits):
            warn_once(
                ("broken default", spec.name, name),
                f"the default {spec.name} config breaks {name} for {problem_key} ({dtype_name(dtype)}): {reason}; "
                f"using {config.label()}, the first config of its space that breaks no constraint (and so for "
                f"any problem where the default breaks {name})",
            )
            return Lookup(config, Rung.DEFAULT)
    return Impossible(
        f"{spec.name} cannot run {problem_key} in {dtype_name(dtype)}: no config of its space satisfies its "
        f"constraints (the default breaks {name}: {reason})"
    )


def _shared_answer(
    spec: KernelSpec, bucketing: Bucketing, problem: Any, dtype: torch.dtype | None, check_dtype: torch.dtype,
    tables: Sequence[Table], limits: DeviceLimits,
) -> Lookup | None:
    """The first candidate, ranked by distance from the bucket's bound, whose config is valid at
    every corner of the bucket; else the bound's default config if it is; else None."""
    try:
        bound = bucketing.bound(problem)
        corners = bucketing.corners(problem)
    except Exception:  # noqa: BLE001 — a corner the problem type rejects (e.g. lq > ctx there)
        return None
    if dtype is not None:
        found = _nearest_or_predicted(spec, bound, problem, corners, dtype, tables, limits, own_exact=True)
        if found is not None:
            return found
    try:
        default = spec.untuned_answer(bound, check_dtype)
    except Exception:  # noqa: BLE001 — left to safe_default, problem by problem
        return None
    if outside_space(spec, default) or not _valid_at(spec, default, corners, check_dtype, limits):
        return None
    return Lookup(default, Rung.DEFAULT)


@dataclass(frozen=True)
class Predicted:
    """What the predictor rung made of one problem: its answer, or why it gave none."""

    lookup: Lookup | None
    why_not: str = ""
    ranking: Ranking | None = None
    default_ratio: float = math.inf
    """The default config's expected time ÷ best on the neighbours that measured it (inf: not
    valid throughout; nan: none measured it)."""


def predict(
    spec: KernelSpec, problem: Any, dtype: torch.dtype, tables: Sequence[Table], corners: Sequence[Any],
    limits: DeviceLimits,
) -> Predicted:
    """The predictor rung for `problem` (a bucket's bound, or a problem of its own), from the
    tables' predictor blocks in precedence order (see predict_with)."""
    return predict_with(spec, problem, dtype, ((t.path, predictor_of(t, spec)) for t in tables), corners, limits)


def predict_with(
    spec: KernelSpec, problem: Any, dtype: torch.dtype, predictors: Iterable[tuple[Path | None, Predictor | None]],
    corners: Sequence[Any], limits: DeviceLimits,
) -> Predicted:
    """The first predictor (with the path of its table) that has neighbours for `problem` decides:
    its candidate with the lowest expected time ratio that is valid at every one of `corners`
    answers, if that ratio is lower than the default config's (the default answers otherwise)."""
    seen = None
    for path, predictor in predictors:
        seen = seen or predictor
        ranking = predictor.rank(spec, problem, dtype) if predictor is not None else None
        if ranking is None:
            continue
        bar = _default_ratio(spec, ranking, problem, dtype, corners, limits)
        if bar is None:
            return Predicted(None, "none of them measured this problem's default config or their own, so "
                                   "no config measured on them is known to beat it", ranking, math.nan)
        for ratio, config in ranking.candidates():
            if ratio >= bar:
                return Predicted(None, f"no config measured on them is expected to beat the default config "
                                       f"(expected {bar:.2f}× the best there)", ranking, bar)
            if _valid_at(spec, config, corners, dtype, limits):
                distance, nearest = ranking.neighbours[0]
                return Predicted(Lookup(config, Rung.PREDICTOR, path, nearest.key, distance, ranking.keys, ratio),
                                 "", ranking, bar)
        return Predicted(None, "no config measured on them is valid here", ranking, bar)
    if seen is None:
        return Predicted(None, "the tables hold no predictor block")
    same = f" and the same {', '.join(seen.match)}" if seen.match else ""
    return Predicted(None, f"the predictor holds no tuned problem of this dtype{same}")


def _default_ratio(
    spec: KernelSpec, ranking: Ranking, problem: Any, dtype: torch.dtype, corners: Sequence[Any], limits: DeviceLimits,
) -> float | None:
    """The default rung's answer's expected ratio (the kernel's untuned answer: its default config
    unless it names another) over the neighbours that measured it, else the ratio their own such
    answers ran at; inf where it is not valid throughout (any valid prediction beats it), None
    where neither is known."""
    try:
        default = spec.untuned_answer(problem, dtype)
    except Exception:  # noqa: BLE001 — no default to beat: safe_default picks a valid config then
        return math.inf
    if outside_space(spec, default) or not _valid_at(spec, default, corners, dtype, limits):
        return math.inf
    measured = ranking.measured_estimate(default)
    return measured if measured is not None else ranking.own_defaults_estimate(spec, dtype)


def _valid_at(spec: KernelSpec, config: Config, problems: Sequence[Any], dtype: torch.dtype, limits: DeviceLimits) -> bool:
    try:
        return all(not spec.violations(p, config, dtype, limits) for p in problems)
    except Exception:  # noqa: BLE001 — a constraint that cannot judge a corner cannot vouch for it
        return False


def _nearest(
    spec: KernelSpec, table: Table, entry: TableEntry, target: Any, problem: Any, corners: Sequence[Any],
    dtype: torch.dtype, limits: DeviceLimits, distance: float,
) -> Lookup | None:
    """The nearest rung's answer from one entry for `target` (a problem, or its bucket's bound):
    the entry's config adapted to target by the kernel's rule (KernelSpec.adapt) where the result
    is valid at every one of `corners`; else the config as tuned where that is valid for the
    caller's `problem` (checked first: a warning names it — a config tuned for one shape that
    breaks a constraint of its neighbour is worth knowing about) and at every corner; else None."""
    adapted = carried_over(spec, entry.problem, target, entry.config)
    if adapted is not None and _valid_at(spec, adapted, corners, dtype, limits):
        return Lookup(adapted, Rung.NEAREST, table.path, entry.key, distance, tuned_config=entry.config)
    others = [corner for corner in corners if corner is not problem]  # `problem` itself: judged by _fits
    if _fits(spec, table, entry, problem, dtype, limits) and _valid_at(spec, entry.config, others, dtype, limits):
        return Lookup(entry.config, Rung.NEAREST, table.path, entry.key, distance)
    return None


def _fits(
    spec: KernelSpec, table: Table, entry: TableEntry, problem: Any, dtype: torch.dtype, limits: DeviceLimits
) -> bool:
    """Whether an entry's config is valid for the *requested* problem: a config tuned for one
    shape can break a constraint (shared memory, rows per block) of a neighbouring one."""
    try:
        violations = spec.violations(problem, entry.config, dtype, limits)
    except Exception as exc:  # noqa: BLE001 — a constraint that raises cannot vouch for the config
        violations = [("a constraint", f"it raised {type(exc).__name__}")]
    if not violations:
        return True
    name, reason = violations[0]
    problem_key = spec.problem_key(problem)
    warn_entry_once(
        table,
        entry.key,
        f"skipping tuned config {entry.config.label()!r} for {entry.key!r} in {table.path}: "
        f"for {problem_key} it breaks {name} ({reason}); using the next candidate or the default "
        f"config. To tune this shape: {search_command(spec.name, problem_key, dtype_name(dtype))}, "
        "then omnitune export",
    )
    return False

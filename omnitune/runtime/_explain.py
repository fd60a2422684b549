"""Why the chain answered a lookup as it did, in words (for `omnitune lookup` and `omnitune plan
--coverage`): which rung, what the rungs above it lacked, and what the predictor expects of the
config. Off the hot path: computed on request, never cached."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from omnitune.runtime._buckets import Bucketing
from omnitune.runtime._chain import Lookup, Rung, dtypes_to_borrow, predict, ranked_entries
from omnitune.runtime._tables import Table
from omnitune.errors import OmnituneError
from omnitune.spec import DeviceLimits, KernelSpec, MatchPolicy, dtype_name, field_kind


@dataclass(frozen=True)
class Explanation:
    """A lookup's answer and why."""

    lookup: Lookup
    why: str
    """One sentence: why this rung answered (what the rungs above it lacked)."""
    expected_ratio: float | None = None
    """What the tables' predictor expects of the answer's config: its time ÷ the best on the
    tuned problems nearest to this one (1.0 for an exact entry); None without a predictor that
    has neighbours for it."""
    neighbours: tuple[str, ...] = ()
    """The tuned problems that expectation is based on, nearest first."""
    closest: str | None = None
    """For a lookup that found no tuned problem within the MatchPolicy: the entry key of the
    closest one (by summed |log2 ratio| of the dimensions, another flag or name counting 8);
    None otherwise."""
    tuned_on: str | None = None
    """The device key of the same-chip GPU whose table answered (omnitune.trial.same_chip_keys);
    None when this GPU's own table answered, or nothing tuned did."""


def explain(
    spec: KernelSpec, problem: Any, dtype: torch.dtype | None, device_name: str | None, tables: Sequence[Table],
    answer: Lookup, limits: DeviceLimits,
) -> Explanation:
    """Why the chain gave `answer` for `problem` from `tables` (as omnitune.runtime.explain reads
    them), re-deriving what each rung above it found."""
    twin, own = _twin(tables, answer, device_name), _has_own(tables, device_name)
    if answer.rung is Rung.EXACT:
        where = "on this GPU"
        if twin:
            lacking = "this GPU's own tables lack it" if own else "none tuned on this one"
            where = f"on {twin}, a GPU of the same chip ({lacking})"
        return Explanation(answer, f"this shape was tuned in this dtype {where}{_verify_fixed(spec, tables, answer)}",
                           1.0 if dtype else None, tuned_on=twin)
    found = _rungs(spec, problem, dtype, device_name, tables, answer, limits)
    if answer.rung is Rung.NEAREST:
        found = replace(found, why=found.why + _verify_fixed(spec, tables, answer))
    if twin:  # every other rung: the same reasons, read from tables the twin's answered from
        lacking = "this GPU's own tables have nothing nearer" if own else "none for this one"
        return replace(found, why=f"{found.why} (from {twin}'s tables: a GPU of the same chip; {lacking})",
                       tuned_on=twin if answer.source is not None else None)
    return found


def _rungs(
    spec: KernelSpec, problem: Any, dtype: torch.dtype | None, device_name: str | None, tables: Sequence[Table],
    answer: Lookup, limits: DeviceLimits,
) -> Explanation:
    """Why a rung below the exact one answered, and what the rungs above it lacked."""
    if dtype is None:
        return Explanation(answer, "no dtype given: tables are keyed by dtype")
    if device_name is None:
        return Explanation(answer, "no GPU named (and no CUDA GPU here): no table applies")
    if not tables:
        return Explanation(answer, f"no readable {spec.name} table for {device_name}")
    try:
        bucketing = Bucketing(spec)
        bound, corners = bucketing.bound(problem), bucketing.corners(problem)
    except Exception:  # noqa: BLE001 — as the chain: the problem answered on its own
        bound, corners = problem, [problem]
    source = _answering_dtype(answer, dtype)  # the sibling's, for a borrowed answer
    predicted = predict(spec, bound, source, tables, corners, limits)
    ranking = predicted.ranking
    expected = ranking.estimate(answer.config) if ranking is not None else None
    keys = ranking.keys if ranking is not None else ()
    borrowed = source is not dtype
    of = f" {dtype_name(source)}" if borrowed else ""
    lent = (f" ({dtype_name(source)} and {dtype_name(dtype)} take the same bytes and tensor-core rate: a config "
            "tuned in one serves the other)") if borrowed else ""
    if answer.rung is Rung.NEAREST:
        why = (f"not tuned {'in ' + dtype_name(dtype) if borrowed else 'itself'}: the nearest{of} tuned shape that "
               f"{_policy(spec)} allows and whose config is valid here answers{lent}")
        if answer.tuned_config is not None:
            why += f", adapted by {spec.name}'s rule from its tuned config {answer.tuned_config.label()}"
        return Explanation(answer, why, expected, keys)
    missed, closest = _missed(spec, problem, dtype, tables)
    if answer.rung is Rung.PREDICTOR:
        bar = "" if not math.isfinite(predicted.default_ratio) else f", the default config {predicted.default_ratio:.2f}×"
        why = (f"{missed}; predicted from the {len(answer.neighbours)} nearest{of} tuned shapes{lent}: expected "
               f"{answer.expected_ratio:.2f}× their best{bar}")
        return Explanation(answer, why, answer.expected_ratio, answer.neighbours, closest)
    why_not = predicted.why_not if ranking is None else f"the predictor's nearest tuned shapes: {predicted.why_not}"
    for sibling in dtypes_to_borrow(dtype)[1:]:  # what the borrowed rung found too
        borrowed_prediction = predict(spec, bound, sibling, tables, corners, limits)
        why_not += f"; from {dtype_name(sibling)}'s: " + (
            borrowed_prediction.why_not if borrowed_prediction.ranking is None
            else f"its nearest tuned shapes: {borrowed_prediction.why_not}")
    why = f"{missed}; {why_not}"
    if spec.untuned_config is not None:
        why += f"; {spec.name}'s answer for an untuned shape ({_untuned_rule(spec.untuned_config)})"
    return Explanation(answer, why, expected, keys, closest)


def _twin(tables: Sequence[Table], answer: Lookup, device_name: str | None) -> str | None:
    """The device key of the same-chip GPU (same_chip_keys) whose table answered, or — for the
    default — whose tables alone were read; None when this GPU's own table answered or none was read."""
    if not tables or device_name is None:
        return None
    from omnitune.trial import device_key

    here = device_key(device_name)
    if answer.source is not None:  # a table's file is named by its device key (Table.device_key)
        return answer.source.stem if answer.source.stem != here else None
    return None if _has_own(tables, device_name) else tables[0].device_key


def _has_own(tables: Sequence[Table], device_name: str | None) -> bool:
    """Whether any of the tables read is this GPU's own (the runtime puts those first)."""
    if not tables or device_name is None:
        return False
    from omnitune.trial import device_key

    return tables[0].device_key == device_key(device_name)


def _verify_fixed(spec: KernelSpec, tables: Sequence[Table], answer: Lookup) -> str:
    """For an answer from an entry that omnitune verify --fix replaced by its fallback: a clause
    saying so (the config it had, both re-timed medians); "" otherwise."""
    table = next((t for t in tables if t.path == answer.source), None)
    entry = table.entries.get(answer.matched_key) if table is not None and answer.matched_key else None
    fixed = entry.verify_fix if entry is not None else None
    if not fixed:
        return ""
    was, ms, kept = fixed.get("replaced_config"), fixed.get("replaced_time_ms"), fixed.get("fallback_time_ms")
    label = _config_label(spec, was)
    times = (f" ({ms:.4g} against {kept:.4g} ms)" if isinstance(ms, (int, float)) and isinstance(kept, (int, float))
             else "")
    return (f"; that entry holds its fallback config: omnitune verify --fix re-timed its tuned config ({label}) "
            f"slower{times}")


def _config_label(spec: KernelSpec, values: Any) -> str:
    """A stored config read as a table's entries are (KernelSpec.coerce_config), as Config.label()
    writes it; "?" for one that is no config of the kernel (a table's provenance never breaks an
    explanation)."""
    try:
        return spec.coerce_config(values, strict=True).label()
    except (OmnituneError, KeyError, TypeError, ValueError):
        return "?"


def _untuned_rule(rule) -> str:
    """The first sentence of the docstring of the kernel's untuned_config, else its name."""
    doc = (getattr(rule, "__doc__", None) or "").strip()
    sentence = " ".join(doc.split(":")[0].split())
    if not sentence:
        return getattr(rule, "__name__", "untuned_config")
    first = sentence.split(" ", 1)[0]
    # "Long prefill …" → "long prefill …", but a name keeps its case ("PyTorch's SDPA …", "SDPA …")
    return sentence[:1].lower() + sentence[1:] if first[1:] == first[1:].lower() else sentence


def _answering_dtype(answer: Lookup, dtype: torch.dtype) -> torch.dtype:
    """The dtype of the entry that answered (its key's prefix): `dtype` itself unless the chain
    borrowed its sibling's (SIBLING_DTYPES)."""
    prefix = (answer.matched_key or "").partition("|")[0]
    for candidate in dtypes_to_borrow(dtype):
        if dtype_name(candidate) == prefix:
            return candidate
    return dtype


def _policy(spec: KernelSpec) -> str:
    """e.g. "attention's MatchPolicy (d, causal, h, hkv equal; other dimensions within 4×)"."""
    match = spec.match
    exact = f"{', '.join(match.exact)} equal; " if match.exact else ""
    ratios = ", ".join(f"{name} {ratio:g}×" for name, ratio in sorted(match.ratio_overrides.items()))
    return f"{spec.name}'s MatchPolicy ({exact}other dimensions within {match.max_ratio:g}×{'; ' + ratios if ratios else ''})"


def _missed(spec: KernelSpec, problem: Any, dtype: torch.dtype, tables: Sequence[Table]) -> tuple[str, str | None]:
    """Why the exact and nearest rungs did not answer, and the closest tuned problem's key."""
    within = ranked_entries(spec, problem, dtype, tables, include_exact=False)
    if within:
        return (f"the {len(within)} tuned shapes within {_policy(spec)} have configs that break a constraint "
                "here (or elsewhere in this shape's cache bucket)"), None
    entries = [e for t in tables for e in t.entries.values() if e.dtype == dtype]
    if not entries:
        sibling = dtypes_to_borrow(dtype)[1:]
        nor = f" (nor any {dtype_name(sibling[0])} one near)" if sibling and any(
            e.dtype == sibling[0] for t in tables for e in t.entries.values()) else ""
        return f"the tables hold no {dtype_name(dtype)} entry{nor}", None
    closest = min(entries, key=lambda e: (_shape_distance(problem, e.problem), e.key))
    return (f"no tuned shape within {_policy(spec)}: the closest "
            f"{blocking(spec.match, spec, problem, closest.problem)}"), closest.key


def blocking(policy: MatchPolicy, spec: KernelSpec, a: Any, b: Any) -> str:
    """Why the MatchPolicy does not let `a` use `b`'s config, e.g. "differs in d (64 here, 128
    there; matched exactly)" or "has lq 16× apart (at most 4×)": a field matched exactly first."""
    ratios = []
    for f in spec.problem_fields():
        va, vb = getattr(a, f.name), getattr(b, f.name)
        if va == vb:
            continue
        if f.name in policy.exact or field_kind(f) not in ("int", "float") or not (va > 0 and vb > 0):
            return f"differs in {f.name} ({va} here, {vb} there; matched exactly)"
        limit = policy.ratio_overrides.get(f.name, policy.max_ratio)
        if not max(va, vb) / min(va, vb) <= limit:
            ratios.append(f"has {f.name} {max(va, vb) / min(va, vb):.3g}× apart ({va} here, {vb} there; at most {limit:g}×)")
    return ratios[0] if ratios else "is within it"


def _shape_distance(a: Any, b: Any) -> float:
    """Summed |log2 ratio| over the positive numeric fields, 8 for any other difference."""
    total = 0.0
    for name in a.__dataclass_fields__:
        va, vb = getattr(a, name), getattr(b, name)
        if va == vb:
            continue
        if isinstance(va, (int, float)) and isinstance(vb, (int, float)) and not isinstance(va, bool) and va > 0 and vb > 0:
            total += abs(math.log2(va / vb))
        else:
            total += 8.0
    return total


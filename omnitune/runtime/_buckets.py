"""Problems bucketed before the runtime's answer cache.

A serving engine asks for a config on every call, and a decode step's context is one token longer
than the last one's: keyed by the exact problem, every step would miss the cache and pay for a
whole lookup, and the cache would grow without bound. So answers are cached per bucket: the
fields the spec's MatchPolicy matches exactly stay as they are, and each integer field it matches
by ratio is rounded up to its bucket bound — the value rounded up to 3 significant bits (with the
default 4 buckets per octave: ..., 3584, 4096, 5120, 6144, 7168, 8192, ...), so a bucket is at most
25% wide and small values (1..8) are buckets of their own.

One answer serves a whole bucket only if its config is valid for every problem in it. The runtime
checks a candidate at the bucket's corners (each bucketed field at its bucket's lowest and highest
value). For constraints that are monotone in each field across a bucket — a tile too large for a
short context, splits left empty, registers for more rows: every shipped constraint is — valid
at the corners means valid throughout. A spec with a constraint that is not monotone in a field
caches that field exactly (MatchPolicy.bucket_overrides={field: 0}).
"""

from __future__ import annotations

import dataclasses
import itertools
import operator
from collections.abc import Callable
from typing import Any

from omnitune.coerce import MAX_DIMENSION
from omnitune.spec import KernelSpec

MISS = object()
"""What a bucket key function returns for a problem it cannot key (another type, a value that is
not a plain int): never a cache key, so the lookup takes the slow path, which validates."""


class Bucketing:
    """How one kernel's problems are bucketed: built once per spec from its MatchPolicy."""

    def __init__(self, spec: KernelSpec):
        fields = spec.problem_fields()
        self.names = tuple(f.name for f in fields)
        self.shifts = {f.name: _mantissa_bits(spec.match.buckets_of(f)) + 1
                       for f in fields if spec.match.buckets_of(f) > 0}
        """Per bucketed field, how many leading bits its bucket bound keeps."""
        self.key: Callable[[Any], Any] = _compile_key(spec.problem_type, self.names, self.shifts)
        getter = operator.attrgetter(*self.names)
        self.values: Callable[[Any], tuple] = getter if len(self.names) > 1 else (lambda p: (getter(p),))
        """The problem's field values as a tuple (an exact problem's key within a bucket)."""

    def bound(self, problem: Any) -> Any:
        """The problem with every bucketed field at its bucket bound: the bucket's representative,
        from which candidates are ranked. May raise what the problem type's checks raise."""
        return dataclasses.replace(problem, **{n: _bound(getattr(problem, n), k) for n, k in self.shifts.items()})

    def corners(self, problem: Any) -> list[Any]:
        """The problems at the corners of the problem's bucket (the bound among them). May raise
        what the problem type's checks raise, e.g. for a corner whose lq exceeds its ctx."""
        ranges = []
        for name, keep in self.shifts.items():
            value = getattr(problem, name)
            ranges.append(sorted({_floor(value, keep), _bound(value, keep)}))
        return [dataclasses.replace(problem, **dict(zip(self.shifts, values))) for values in itertools.product(*ranges)]


def _mantissa_bits(buckets_per_octave: int) -> int:
    bits = buckets_per_octave.bit_length() - 1
    if buckets_per_octave != 1 << bits:
        raise ValueError(f"buckets per octave must be a power of two (1, 2, 4, 8, ...), got {buckets_per_octave}")
    return bits


def _small(keep: int) -> int:
    # Values up to 2**keep are their own buckets (rounding them would change nothing, or round
    # 0 and negative values, which are never ratio-matched, into a positive bucket).
    return 1 << keep


def bucket_bound(value: int, buckets_per_octave: int = 4) -> int:
    """`value` rounded up to its bucket's bound (the public ops bucket the lengths they pass to
    the runtime with this, so that their memo and the runtime's cache agree on one rule)."""
    return _bound(value, _mantissa_bits(buckets_per_octave) + 1)


def _bound(value: int, keep: int) -> int:
    """`value` rounded up to `keep` significant bits (at most MAX_DIMENSION)."""
    if value <= _small(keep):
        return value
    shift = (value - 1).bit_length() - keep
    return min(-(-value >> shift) << shift, MAX_DIMENSION)


def _floor(value: int, keep: int) -> int:
    """The smallest value with the same bucket bound as `value`."""
    if value <= _small(keep):
        return value
    shift = (value - 1).bit_length() - keep
    return (-(-value >> shift) << shift) - (1 << shift) + 1


def _compile_key(problem_type: type, names: tuple[str, ...], shifts: dict[str, int]) -> Callable[[Any], Any]:
    """A function problem → bucket key, generated for this problem type (as dataclasses generates
    __init__): on the hot path, a loop over fields with a call per field would alone take more
    than the microsecond a cached lookup may cost. The key is a tuple of the field values, the
    bucketed ones rounded up as _bound does (without its cap, which only the rounding of
    MAX_DIMENSION itself reaches). MISS for another type or a value above MAX_DIMENSION; a value
    that is no int raises (a float has no bit_length, a str does not compare with 8). Either way
    the lookup takes the slow path, which rejects or converts the value. (A value equal to a valid
    one, 3.0 for 3, keys like it: the answer is the one for that equal problem.)"""
    checks, parts = [], []
    for i, name in enumerate(names):
        if name not in shifts:
            parts.append(f"p.{name}")
            continue
        keep = shifts[name]
        checks.append(f"    v{i} = p.{name}\n    if v{i} > MAX: return MISS")
        parts.append(f"(v{i} if v{i} <= {_small(keep)} else -(-v{i} >> (s := (v{i} - 1).bit_length() - {keep})) << s)")
    source = "\n".join([
        "def bucket_key(p):",
        "    if p.__class__ is not PROBLEM: return MISS",
        *checks,
        f"    return ({', '.join(parts)},)",
    ])
    namespace = {"PROBLEM": problem_type, "MISS": MISS, "MAX": MAX_DIMENSION}
    exec(source, namespace)  # noqa: S102 — the source is built from dataclass field names only
    return namespace["bucket_key"]

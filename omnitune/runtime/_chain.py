"""The lookup chain: exact key → nearest tuned problem → the kernel's default config."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from omnitune.runtime._format import entry_key, search_command
from omnitune.runtime._tables import Table, TableEntry, warn_entry_once
from omnitune.spec import Config, DeviceLimits, KernelSpec, dtype_name


class Rung(str, enum.Enum):
    """Which step of the chain answered."""

    EXACT = "exact"      # this very (problem, dtype) was tuned on this device
    NEAREST = "nearest"  # a tuned problem close enough under the kernel's MatchPolicy
    DEFAULT = "default"  # nothing applicable: the kernel's untuned default

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
    """The entry key ('<dtype>|<problem_key>') that answered; None for the default."""
    distance: float | None = None
    """MatchPolicy distance to the matched problem: 0.0 when exact, None for the default."""


def resolve(
    spec: KernelSpec,
    problem: Any,
    dtype: torch.dtype,
    tables: Sequence[Table],
    limits: DeviceLimits,
) -> Lookup:
    """Walk the chain over `tables` (earlier tables take precedence for the same key)."""
    key = entry_key(dtype_name(dtype), spec.problem_key(problem))
    for table in tables:
        entry = table.entries.get(key)
        if entry is not None and _fits(spec, table, entry, problem, dtype, limits):
            return Lookup(entry.config, Rung.EXACT, table.path, key, 0.0)

    for distance, table, entry in ranked_entries(spec, problem, dtype, tables, include_exact=False):
        if _fits(spec, table, entry, problem, dtype, limits):
            return Lookup(entry.config, Rung.NEAREST, table.path, entry.key, distance)

    return Lookup(spec.default_config(problem, dtype), Rung.DEFAULT)


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


def _fits(
    spec: KernelSpec, table: Table, entry: TableEntry, problem: Any, dtype: torch.dtype, limits: DeviceLimits
) -> bool:
    """Whether an entry's config is valid for the *requested* problem: a config tuned for one
    shape can break a constraint (shared memory, rows per block) of a neighbouring one."""
    violations = spec.violations(problem, entry.config, dtype, limits)
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

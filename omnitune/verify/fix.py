"""--fix: an entry that was slower than its fallback is replaced by the fallback, and a table
tuned on older kernel source is revalidated (omnitune.verify.revalidate), in the table file
itself, written as omnitune export writes (omnitune.export.write_json_atomic: sorted keys,
two-space indent, a temporary file renamed over the old one) — once for both.

The new entry holds the fallback config with the times verify measured for it, and says what it
replaced under `verify_fix` (the old config, both re-timed medians, when), so that a review of
the diff sees why the table changed. The file is read again just before writing, so entries
changed on disk since verify read it are kept.

A same-chip GPU's table served here (omnitune.trial.same_chip_keys: the H200's on an H100 SXM)
is never rewritten — its times are that GPU's. Its entries slower here than their fallback go,
replaced, into this GPU's own table beside it (apply_to_own_table): created holding them alone,
or merged into without touching an entry of its own. The runtime reads a GPU's own entries before
its twin's, so those shapes then run their fallback here and the twin's entries everywhere else.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from omnitune.provenance import ENTRY_SOURCE_HASH
from omnitune.verify.revalidate import FIELD as REVALIDATED
from omnitune.verify.revalidate import Plan, Restamp, restamp_document
from omnitune.verify.speed import Replacement
from omnitune.verify.tables import TableFile


@dataclass
class FixOutcome:
    replaced: list[str] = field(default_factory=list)
    """The keys replaced by their fallback (those still in the file)."""
    restamp: Restamp | None = None
    """What revalidation re-stamped (None when there was nothing to revalidate)."""


def apply_fixes(table: TableFile, replacements: Sequence[Replacement], *, revalidation: Plan | None = None,
                now: str | None = None) -> FixOutcome:
    """Write `replacements` and the `revalidation` plan into the table's file."""
    from omnitune.export import read_table_file, write_json_atomic

    outcome = FixOutcome()
    if not replacements and revalidation is None:
        return outcome
    now = now or datetime.now(timezone.utc).isoformat(timespec="seconds")
    document = read_table_file(table.path, table.kernel)
    if document is None:
        return outcome
    for fix in replacements:
        old = document["entries"].get(fix.key)
        if not isinstance(old, dict):
            continue
        document["entries"][fix.key] = replaced_entry(old, fix, now, has_fallback_fields="fallback_config" in old)
        outcome.replaced.append(fix.key)
    if revalidation is not None:
        outcome.restamp = restamp_document(document, revalidation, outcome.replaced, now)
    if outcome.replaced or (outcome.restamp is not None and outcome.restamp.revalidated):
        document["exported_at"] = now
        write_json_atomic(table.path, document)
    return outcome


def apply_to_own_table(table: TableFile, replacements: Sequence[Replacement], machine: Mapping[str, Any], *,
                       now: str | None = None) -> tuple[Path, list[str]]:
    """Write the `replacements` of a same-chip GPU's table (`table`, left as it is) into this
    machine's GPU's own table in the same folder; returns that file's path and the keys written
    (an entry the own table already holds is its own, and stays). A file there that cannot be
    merged into safely raises StoreError; one that cannot be written, OSError."""
    from omnitune.export import SCHEMA_VERSION, read_table_file, write_json_atomic

    path = table.path.with_name(f"{machine['key']}.json")
    written: list[str] = []
    twin = table.document  # not written: verify's reading of it serves
    if not replacements or twin is None:
        return path, written
    now = now or datetime.now(timezone.utc).isoformat(timespec="seconds")
    own = read_table_file(path, table.kernel) or {
        "schema_version": SCHEMA_VERSION, "kernel": table.kernel,
        "device": {field: machine.get(field) for field in ("key", "name", "compute_capability", "driver")},
        "software": {field: machine.get(field) for field in ("torch", "triton", "omnitune")},
        # The entries written are measured here, now, on today's source.
        "kernel_source_hash": table.spec.source_hash() if table.spec is not None else None,
        "representative": bool(twin.get("representative", True)),
        "entries": {},
    }
    for fix in replacements:
        old = twin["entries"].get(fix.key)
        if not isinstance(old, dict) or fix.key in own["entries"]:
            continue
        entry = replaced_entry(old, fix, now, has_fallback_fields="fallback_config" in old)
        entry["verify_fix"]["replaced_in"] = table.path.name
        entry.pop("trials", None)  # the twin's search's count: nothing was searched on this GPU
        own["entries"][fix.key] = entry
        written.append(fix.key)
    if written:
        own["exported_at"] = now
        write_json_atomic(path, own)
    return path, written


def replaced_entry(old: dict[str, Any], fix: Replacement, now: str, *, has_fallback_fields: bool) -> dict[str, Any]:
    timing = fix.fallback_timing
    config = fix.config.as_dict()
    is_default = old.get("default_config") == config
    entry = dict(old)
    # A revalidation record of an earlier run was about the config replaced here; and an older
    # source hash of the entry's own was its: the new config was measured here, on today's source.
    entry.pop(REVALIDATED, None)
    entry.pop(ENTRY_SOURCE_HASH, None)
    entry.update({
        "config": config,
        "time_ms": timing.median_ms, "p20_ms": timing.p20_ms, "p80_ms": timing.p80_ms,
        # The analytic counts do not change with the config: the rates scale with the time.
        "tflops": _rescaled(old.get("tflops"), old.get("time_ms"), timing.median_ms),
        "tbps": _rescaled(old.get("tbps"), old.get("time_ms"), timing.median_ms),
        "rel_error": fix.rel_error if fix.rel_error == fix.rel_error else old.get("rel_error"),
        "measured_at": now,
        "verify_fix": {
            "replaced_config": old.get("config"), "replaced_time_ms": fix.entry_ms,
            "fallback_time_ms": fix.fallback_ms, "at": now,
            "reason": fix.reason,
        },
    })
    if is_default:
        entry["default_time_ms"] = timing.median_ms
        entry["speedup_vs_default"] = 1.0
    elif fix.default_ms == fix.default_ms and fix.default_ms > 0:  # measured in the same re-timing
        entry["default_time_ms"] = fix.default_ms
        entry["speedup_vs_default"] = fix.default_ms / timing.median_ms
    if has_fallback_fields:
        entry.update({"fallback_config": config, "fallback_time_ms": timing.median_ms, "speedup_vs_fallback": 1.0})
    return entry


def _rescaled(rate: Any, old_ms: Any, new_ms: float) -> Any:
    if not isinstance(rate, (int, float)) or not isinstance(old_ms, (int, float)) or new_ms <= 0:
        return None
    return rate * old_ms / new_ms

"""--fix's answer to a changed kernel source: revalidate the table's entries rather than re-tune.

When a kernel's device code changes (a bounds check, a new parameter), every table tuned on the
old code fails compat hard, yet its configs still launch; whether they are still right and still
fast is exactly what numerics and speed measure. So, on the GPU a table is for (same name, same
compute capability: omnitune.verify.compat decides that, and versions may differ), an entry that
gives the right result and whose speed check passes (not slower than its fallback, nor than one of
the kernel's PyTorch backends) is re-stamped for today's source. It gains a `revalidated` record:
when, from which source hash to which, and the two medians measured.

The table's kernel_source_hash is one per file, so it moves only when every entry of the file
revalidated or was replaced by --fix (by its fallback, or a faster backend) in the same run: a
replaced entry was measured on today's code too. Otherwise the file keeps its old
hash (compat still fails it) and the entries that did revalidate carry their records, which the
compat check counts.

An entry that carries its own kernel_source_hash (export kept it from a table tuned on other
source) is revalidated on its own: its hash moves to today's when it revalidates (and goes, once
it is the table's), whatever the table's does; it neither needs the table's hash to be stale nor
keeps the table's from moving.

A measurement on the serving GPU is the whole point: where the speed part did not run (no GPU,
--interpret) nothing is revalidated, and the compat check says so.

This module decides and edits a document in memory; omnitune.verify.fix reads the file again and
writes it (one atomic write for the replacements and the re-stamp together).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from omnitune.provenance import ENTRY_SOURCE_HASH, REVALIDATED
from omnitune.verify.compat import Difference
from omnitune.verify.tables import TableFile
from omnitune.verify.verdict import Check, Status

FIELD = REVALIDATED
NO_SPEED = ("the speed part did not run (no GPU): revalidation needs each entry timed against its fallback "
            "on the GPU that serves the table")


@dataclass(frozen=True)
class EntryResult:
    """What this run found for one entry of the table."""

    key: str
    config: Any
    """The entry's `config` as the file held it when read (a config changed since is not re-stamped)."""
    numerics: Check | None
    speed: Check | None


@dataclass
class Plan:
    """Which entries of one stale table earned a re-stamp, and why the others did not."""

    from_hash: str | None
    """The table's hash, when it is stale; None when only entries with hashes of their own are."""
    to_hash: str
    measured: dict[str, dict[str, float]] = field(default_factory=dict)
    """Entry key → {entry_ms, fallback_ms}, for the entries that revalidated."""
    configs: dict[str, Any] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)
    """Entry key → why it was not revalidated (replaced ones excepted: they count apart)."""
    entry_hashes: dict[str, str] = field(default_factory=dict)
    """Entry key → the stale hash of its own that compat found revalidatable."""


@dataclass
class Restamp:
    """What was written: the entries re-stamped, whether the table's hash moved, and why not."""

    revalidated: list[str] = field(default_factory=list)
    records: dict[str, dict[str, Any]] = field(default_factory=dict)
    moved: bool = False
    kept_because: str | None = None


def plan(table: TableFile, revalidation: Mapping[str, Any] | None, results: Sequence[EntryResult],
         replacing: set[str], entries: Mapping[str, Mapping[str, Any]] | None = None) -> Plan:
    """The plan for a table whose compat check found it revalidatable (`revalidation`: its details;
    None when its hash is today's) and for its entries with stale hashes of their own that compat
    found revalidatable (`entries`: key → the entry check's revalidation details)."""
    entries = entries or {}
    to_hash = (revalidation or next(iter(entries.values())))["to_source_hash"]
    out = Plan(str(revalidation["from_source_hash"]) if revalidation is not None else None, str(to_hash),
               entry_hashes={key: str(r["from_source_hash"]) for key, r in entries.items()})
    for key, reason in table.bad_entries.items():
        out.refused[key] = f"the runtime ignores it ({reason})"
    for result in results:
        if result.key in replacing or (out.from_hash is None and result.key not in out.entry_hashes):
            continue
        reason = _refusal(result)
        if reason is None:
            out.measured[result.key] = {"entry_ms": float(result.speed.details["entry_ms"]),
                                        "fallback_ms": float(result.speed.details["fallback_ms"])}
            out.configs[result.key] = result.config
        else:
            out.refused[result.key] = reason
    return out


def _refusal(result: EntryResult) -> str | None:
    if result.numerics is None or result.numerics.status is not Status.PASS:
        return "numerics did not pass" + (f": {result.numerics.summary}" if result.numerics is not None else "")
    speed = result.speed
    if speed is None:
        return "not timed"
    details = speed.details
    if speed.status is Status.FAIL or details.get("slower_than_fallback") or details.get("slower_than_backend"):
        return f"speed: {speed.summary}"
    if not all(_finite(details.get(k)) for k in ("entry_ms", "fallback_ms")):
        return f"no time against its fallback: {speed.summary}"
    return None


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def restamp_document(document: dict[str, Any], plan: Plan, replaced: Sequence[str], now: str) -> Restamp:
    """Re-stamp `document` (the file as read just before writing, replacements already applied) in
    place. Entries and hashes are checked against what the file holds now, not what verify read:
    an entry added or changed since was not measured by this run."""
    out = Restamp()
    if plan.from_hash is not None and document.get("kernel_source_hash") != plan.from_hash:
        out.kept_because = (f"the file's kernel_source_hash is now {document.get('kernel_source_hash')!r}, "
                            "not the one verify read")
        return out
    entries = document["entries"]
    for key, measured in plan.measured.items():
        raw = entries.get(key)
        if not isinstance(raw, dict) or raw.get("config") != plan.configs[key]:
            continue
        from_hash = _stale_hash(key, raw, plan)
        if from_hash is None:
            continue
        record = {"at": now, "from_source_hash": from_hash, "to_source_hash": plan.to_hash,
                  "measured": dict(measured)}
        raw[FIELD] = record
        if ENTRY_SOURCE_HASH in raw:
            raw[ENTRY_SOURCE_HASH] = plan.to_hash
        out.revalidated.append(key)
        out.records[key] = record
    if plan.from_hash is not None:
        _move_table_hash(document, plan, set(out.revalidated) | set(replaced), out)
    # An entry's own hash that is now the table's says nothing the table does not.
    for raw in entries.values():
        if isinstance(raw, dict) and raw.get(ENTRY_SOURCE_HASH, object()) == document.get("kernel_source_hash"):
            del raw[ENTRY_SOURCE_HASH]
    return out


def _stale_hash(key: str, raw: Mapping[str, Any], plan: Plan) -> str | None:
    """The hash `raw` is revalidated from: its own, when compat found that stale (and the file
    still holds it), else the table's when that is stale; None when there is nothing to move
    (an entry good for today's source already, or whose own hash changed since verify read it)."""
    if ENTRY_SOURCE_HASH in raw:
        own = raw[ENTRY_SOURCE_HASH]
        return own if plan.entry_hashes.get(key) == own else None
    return plan.from_hash


def _move_table_hash(document: dict[str, Any], plan: Plan, done: set[str], out: Restamp) -> None:
    """Move the table's hash to today's when every entry that goes by it (one with a hash of its
    own does not) revalidated or was replaced; else say which entry stands in the way."""
    entries = document["entries"]
    left = sorted(k for k, raw in entries.items()
                  if k not in done and not (isinstance(raw, dict) and ENTRY_SOURCE_HASH in raw))
    if not entries:
        out.kept_because = "the table has no entries"
    elif left:
        why = plan.refused.get(left[0], "not measured by this run (added or changed since verify read the file)")
        more = f" (and {len(left) - 1} more)" if len(left) > 1 else ""
        out.kept_because = f"{left[0]}{more} not revalidated: {why}"
    else:
        document["kernel_source_hash"] = plan.to_hash
        out.moved = True


def compat_after(check: Check, restamp: Restamp | None, replaced: Sequence[str], why_not: str) -> Check:
    """The table's compat check once --fix ran: a warning when the hash moved (the table is
    today's again, and its file changed: to review and commit), else still the failure, saying
    how far revalidation got and what stands in the way (`why_not` when nothing was attempted)."""
    details = dict(check.details)
    hard = [Difference(**d) for d in details.get("hard", [])]
    soft = details.get("soft", [])
    base = "; ".join(d.text() for d in hard) + (f" (and {len(soft)} soft)" if soft else "")
    if restamp is None:
        details["revalidated"] = {"moved": False, "entries": [], "replaced": list(replaced), "why_not": why_not}
        return replace(check, summary=f"hard: {base}; not revalidated: {why_not}", details=details)
    details["revalidated"] = {"moved": restamp.moved, "entries": list(restamp.revalidated), "replaced": list(replaced),
                              "why_not": restamp.kept_because}
    if restamp.moved:
        done = [f"{len(restamp.revalidated)} revalidated (right and not slower than the fallback here)"]
        if replaced:
            done.append(f"{len(replaced)} replaced by a faster config (`verify_fix`)")
        stale = next(d for d in hard if d.field == "kernel_source_hash")
        summary = (f"revalidated (--fix): kernel_source_hash {stale.recorded} → {stale.here} re-stamped; entries: "
                   + ", ".join(done) + (f"; {len(soft)} soft differences remain" if soft else ""))
        return replace(check, status=Status.WARN, summary=summary, details=details)
    summary = (f"hard: {base}; --fix revalidated {_entries(len(restamp.revalidated))}"
               + (f" (a `{FIELD}` record each)" if restamp.revalidated else "")
               + (f", replaced {len(replaced)} by a faster config" if replaced else "")
               + f"; the table keeps its hash: {restamp.kept_because}")
    return replace(check, summary=summary, details=details)


def entry_compat_after(check: Check, restamp: Restamp | None, replaced: Sequence[str],
                       refused: Mapping[str, str], why_not: str) -> Check:
    """The compat check of an entry with a stale hash of its own once --fix ran: a warning when it
    was revalidated (its hash moved) or replaced (measured on today's source), else still the
    failure, saying why not (`refused`; `why_not` when nothing was attempted)."""
    key, details = check.subject, dict(check.details)
    record = restamp.records.get(key) if restamp is not None else None
    hard = [Difference(**d) for d in details.get("hard", [])]
    was = "hard: " + "; ".join(d.text() for d in hard) if hard else check.summary
    if record is not None:
        details["revalidated"] = {"record": record, "replaced": False, "why_not": None}
        return replace(check, status=Status.WARN, details=details,
                       summary=f"revalidated (--fix): the entry's kernel_source_hash {record['from_source_hash']} → "
                               f"{record['to_source_hash']} re-stamped (right and not slower than the fallback here)")
    if key in replaced:
        details["revalidated"] = {"record": None, "replaced": True, "why_not": None}
        return replace(check, status=Status.WARN, details=details,
                       summary="replaced by a faster config (--fix), measured on today's kernel source; "
                               f"was {was}")
    why = refused.get(key) or (why_not if restamp is None else "the file changed since verify read it")
    details["revalidated"] = {"record": None, "replaced": False, "why_not": why}
    return replace(check, details=details, summary=f"{was}; not revalidated: {why}")


def _entries(count: int) -> str:
    return f"{count} entr{'y' if count == 1 else 'ies'}"


def speed_after(check: Check, record: Mapping[str, Any]) -> Check:
    """An entry's speed check once it was re-stamped: its status as measured, the re-stamp noted."""
    return replace(check, summary=f"revalidated for the current kernel source (--fix): {check.summary}",
                   details={**check.details, FIELD: dict(record)})

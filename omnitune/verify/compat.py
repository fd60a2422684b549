"""Part 1, compatibility: what each table records about where and on what code it was measured,
against this machine.

Hard mismatches fail: another GPU (name or compute capability; the runtime here would not even
read the file, or would read configs measured on a different chip), and kernel source that has
changed since the measurement (the configs still launch, but were chosen for other code). Soft
ones warn: driver, torch, Triton or omnitune versions that differ (said how: major, minor, patch
or build), and facts the table did not record. The table's provenance covers its entries:
export writes it once per file, from the newest measurement — except for an entry measured on
other kernel source (kept by an export from a table tuned on older source), which carries its
own kernel_source_hash: each such entry is checked apart, in a check of its own (subject: its
key), so that it fails for its source while the table and its other entries pass.

A table of a GPU made of the same chip as this one (omnitune.trial.same_chip_keys: an H200's on an
H100 SXM) is what the runtime here serves below this GPU's own tables (served_twins):
its other name is a soft difference, its entries are checked and timed here, and --fix never
writes into it — configs timed here say nothing of the GPU it is for; its entries slower here go
into this GPU's own table instead (omnitune.verify.fix.apply_to_own_table).

Without a GPU (--interpret) a GPU's table cannot be compared with this machine's GPU: the device
fields are skipped, the source hash and the versions still checked — which is what CI can check.

A table whose only hard mismatch is the source hash, on the GPU it was tuned on (same name, same
compute capability), can be revalidated by `verify --fix` rather than re-tuned
(omnitune.verify.revalidate): its details say so under `revalidation`, and its summary tells the
user the way out. So can an entry whose own source hash is stale, on the same conditions.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from omnitune.profile.device import INTERPRETER_DEVICE, device_key, same_chip_keys
from omnitune.provenance import ENTRY_SOURCE_HASH
from omnitune.runtime._format import impossible_recorded_time
from omnitune.runtime._predictor import UnknownKind, parse_predictor, unusable_block
from omnitune.runtime._tables import name_few
from omnitune.source_hash import UNKNOWN
from omnitune.spec import SourceCheck
from omnitune.verify.tables import TableFile
from omnitune.verify.verdict import Check, Status

PART = "compat"


@dataclass(frozen=True)
class Difference:
    field: str
    recorded: Any
    here: Any
    note: str = ""

    def as_record(self) -> dict[str, Any]:
        return {"field": self.field, "recorded": self.recorded, "here": self.here, "note": self.note}

    def text(self) -> str:
        return f"{self.field} {self.recorded} → {self.here}" + (f" ({self.note})" if self.note else "")


def check_table(table: TableFile, machine: Mapping[str, Any], *, twin: bool = False) -> list[Check]:
    """The table's compatibility check, one failed check per entry the runtime would skip, a
    warning per entry that records an impossible time, and one per entry whose own kernel source
    hash is not today's source. twin: the table is one the
    runtime here serves as its same-chip twin's (served_twins)."""
    if table.problem is not None:
        return [Check(PART, table.label, Status.FAIL, f"unusable: it {table.problem}", table.kernel,
                      {"table": str(table.path)})]
    doc = table.document or {}
    hard: list[Difference] = []
    soft: list[Difference] = []
    skipped: list[str] = []
    notes: list[str] = []

    device = doc.get("device") or {}
    if _is_interpreter(machine) and device.get("name") != INTERPRETER_DEVICE:
        skipped += ["device", "compute_capability", "driver"]
    else:
        _compare_device(device, machine, hard, soft, twin)
    software = doc.get("software")
    if not isinstance(software, dict):  # the runtime ignores the record: so does this check, saying so
        software = {}
    for name in ("torch", "triton", "omnitune"):
        recorded, here = software.get(name), machine.get(name)
        if recorded is None:
            soft.append(Difference(name, None, here, "not recorded"))
        elif recorded != here:
            soft.append(Difference(name, recorded, here, version_change(recorded, here)))
    # today's source hashes, computed once for the table and its entries (tens of ms each)
    source = table.spec.source_check() if table.spec is not None else None
    _compare_source(table, source, doc.get("kernel_source_hash"), hard, soft, notes)
    entry_checks = _entry_source_checks(table, source, device, [d for d in hard if d.field != "kernel_source_hash"],
                                        skipped, twin)

    revalidation = _revalidation(table, device, hard, skipped, twin=twin)
    status = Status.FAIL if hard else Status.WARN if soft else Status.PASS
    if hard:
        summary = "hard: " + "; ".join(d.text() for d in hard)
        if soft:
            summary += f" (and {len(soft)} soft)"
        if revalidation is not None:
            summary += revalidation_hint(revalidation, device)
    elif soft:
        summary = "soft: " + "; ".join(d.text() for d in soft)
    else:
        apart = f"{len(table.entries) - len(entry_checks)} of its " if entry_checks else ""
        summary = f"{apart}{len(table.entries)} entries: device, versions and kernel source match"
    if skipped and not hard:
        summary += "; device skipped (no GPU)"
    if entry_checks:
        summary += f"; {len(entry_checks)} entries measured on other kernel source, each checked apart"
    details = {
        "table": str(table.path), "device_key": table.device_key, "entries": len(table.entries),
        "hard": [d.as_record() for d in hard], "soft": [d.as_record() for d in soft],
        "skipped": skipped, "notes": notes,
        **({"revalidation": revalidation} if revalidation is not None else {}),
        "recorded": {"device": device, "software": software, "kernel_source_hash": doc.get("kernel_source_hash"),
                     "exported_at": doc.get("exported_at")},
    }
    checks = [Check(PART, table.label, status, summary, table.kernel, details)]
    for key, reason in table.bad_entries.items():
        checks.append(Check(PART, key, Status.FAIL, f"the runtime ignores this entry: {reason}", table.kernel,
                            {"table": str(table.path), "key": key}))
    checks += _predictor_checks(table)
    for entry in table.entries:  # served, but its config was chosen or described by an impossible time
        reason = impossible_recorded_time(entry.raw)
        if reason is not None:
            checks.append(Check(PART, entry.key, Status.WARN, f"{reason}: no measurement gives it, and its config "
                                "may have won by it; tune the problem again and export", table.kernel,
                                {"table": str(table.path), "key": entry.key}))
    return checks + entry_checks


def _predictor_checks(table: TableFile) -> list[Check]:
    """The runtime's verdict on the table's predictor block, read by its own parse: ignored whole
    or in some of its points (a fail, as an ignored entry is: the problems it would answer get the
    default), or of a kind this omnitune does not read (a warning). None without a block."""
    block = table.document.get("predictor") if isinstance(table.document, dict) else None
    if block is None or table.spec is None:
        return []
    subject, details = f"{table.label} predictor", {"table": str(table.path)}
    try:
        _, bad, total = parse_predictor(block, table.spec)
    except UnknownKind as exc:
        return [Check(PART, subject, Status.WARN, f"the runtime does not read this predictor block: it {exc}",
                      table.kernel, details)]
    except Exception as exc:  # noqa: BLE001 — as the runtime takes it: untrusted input
        return [Check(PART, subject, Status.FAIL, f"the runtime ignores the predictor block: it "
                      f"{unusable_block(exc)}", table.kernel, details)]
    if not bad:
        return []
    return [Check(PART, subject, Status.FAIL, f"the runtime ignores {len(bad)} of the {total} points of the "
                  f"predictor block: {name_few(bad)}", table.kernel, {**details, "points": [k for k, _ in bad]})]


def _entry_source_checks(table: TableFile, source: SourceCheck | None, device: Mapping[str, Any],
                         device_hard: list[Difference], skipped: list[str], twin: bool = False) -> list[Check]:
    """A check for each entry that carries its own kernel source hash and is not good for today's
    source: failed as a stale table is (revalidatable on the same conditions), or warned about
    when the hash it carries says nothing (not recorded). Entries good for today's source, and
    those without a hash of their own (the table's check covers them), get none."""
    checks = []
    here = source.today if source is not None else None
    for entry in table.entries:
        if ENTRY_SOURCE_HASH not in entry.raw:
            continue
        recorded = entry.raw[ENTRY_SOURCE_HASH]
        details: dict[str, Any] = {"table": str(table.path), "key": entry.key,
                                   "table_kernel_source_hash": (table.document or {}).get("kernel_source_hash")}
        if not isinstance(recorded, str) or recorded in ("", UNKNOWN):
            stale = Difference("kernel_source_hash", recorded, here, "not recorded")
            checks.append(Check(PART, entry.key, Status.WARN, f"soft: {stale.text()} for this entry", table.kernel,
                                {**details, "hard": [], "soft": [stale.as_record()]}))
            continue
        if source is not None and source.matches(recorded, [entry.config]) is not None:
            continue
        stale = Difference("kernel_source_hash", recorded, here, "kernel source changed since this entry was measured")
        revalidation = _revalidation(table, device, [stale, *device_hard], skipped, entry_count=False, twin=twin)
        summary = (f"hard: {stale.text()}, the entry's own hash (the table's is "
                   f"{details['table_kernel_source_hash']}){revalidation_hint(revalidation, device)}")
        checks.append(Check(PART, entry.key, Status.FAIL, summary, table.kernel,
                            {**details, "hard": [stale.as_record()], "soft": [], "revalidation": revalidation}))
    return checks


def served_twins(tables: Sequence[TableFile], machine: Mapping[str, Any]) -> set[str]:
    """The paths of the tables the runtime here serves as this GPU's twin's, as it chooses them
    (omnitune.runtime): a same-chip GPU's, below this GPU's own (which answer first where they
    have the shape)."""
    if _is_interpreter(machine):
        return set()
    twins = same_chip_keys(device_key(str(machine.get("name", ""))))
    return {str(t.path) for t in tables if t.device_key in twins}


def other_gpu(table: TableFile, machine: Mapping[str, Any], *, twin: bool = False) -> str | None:
    """The GPU a readable table is for when that is not this machine's (None when it is, when
    the runtime here serves it as its twin's, or when there is no GPU here to compare): its
    entries are then not run here."""
    if table.document is None or twin or _is_interpreter(machine):
        return None
    name = (table.document.get("device") or {}).get("name")
    if name is None or device_key(str(name)) != device_key(str(machine.get("name", ""))):
        return str(name)
    return None


def _revalidation(table: TableFile, device: Mapping[str, Any], hard: list[Difference],
                  skipped: list[str], *, entry_count: bool = True, twin: bool = False) -> dict[str, Any] | None:
    """Whether `verify --fix` may revalidate the table (or one entry: `hard` is then the entry's)
    here, when its source hash is a hard mismatch (None otherwise): `possible`, and `why_not` when
    it is not. Configs measured on one chip say nothing about another, so the device must have
    been compared and be the same, compute capability included; version differences are soft and
    do not stand in the way. `entry_count`: count the entries a partial --fix already did (a
    table's, not an entry's, question)."""
    stale = next((d for d in hard if d.field == "kernel_source_hash"), None)
    if stale is None:
        return None
    others = [d for d in hard if d is not stale]
    if others:
        why_not = "; ".join(f"{d.field} differs ({d.note})" for d in others)
    elif twin:
        why_not = (f"it is {device.get('name')}'s table, served here as a same-chip GPU's: only `omnitune verify "
                   f"--fix` on an {device.get('name')} revalidates it")
    elif skipped:
        why_not = "no GPU here to compare the table's with"
    elif device.get("compute_capability") is None:
        why_not = "the table did not record its compute capability"
    elif not stale.here or stale.here == "unknown":
        why_not = "the current kernel source cannot be hashed"
    else:
        why_not = None
    # Entries an earlier partial revalidation re-stamped for today's source (the table kept its hash);
    # one with a hash of its own is not the table's to count.
    already = 0 if not entry_count else sum(
        1 for e in table.entries
        if ENTRY_SOURCE_HASH not in e.raw and isinstance(e.raw.get("revalidated"), dict)
        and e.raw["revalidated"].get("to_source_hash") == stale.here)
    return {"possible": why_not is None, "why_not": why_not, "from_source_hash": stale.recorded,
            "to_source_hash": stale.here, "entries_revalidated_before": already}


def revalidation_hint(revalidation: Mapping[str, Any], device: Mapping[str, Any]) -> str:
    """The way out of a stale source hash, for the compat summary of a run without --fix."""
    before = revalidation.get("entries_revalidated_before") or 0
    before_text = f"; {before} of its entries already revalidated by a partial --fix" if before else ""
    if revalidation["possible"]:
        return (f"; `omnitune verify --fix` on this GPU would revalidate it (entries whose numerics and speed "
                f"pass are re-stamped, no re-tuning){before_text}")
    if revalidation["why_not"] == "no GPU here to compare the table's with":
        return (f"; `omnitune verify --fix` on the {device.get('name') or 'GPU it was tuned on'} would revalidate "
                f"it when numerics and speed pass there (not here: no GPU){before_text}")
    return f"; cannot be revalidated: {revalidation['why_not']}"


def _is_interpreter(machine: Mapping[str, Any]) -> bool:
    return machine.get("name") == INTERPRETER_DEVICE


def _compare_device(device: Mapping[str, Any], machine: Mapping[str, Any], hard: list, soft: list,
                    twin: bool = False) -> None:
    name, here = device.get("name"), machine.get("name")
    if name != here and twin:
        soft.append(Difference("device", name, here, "a GPU of the same chip: served here, below this GPU's own tables"))
    elif name != here:
        hard.append(Difference("device", name, here, "another GPU"))
    cc, here_cc = device.get("compute_capability"), machine.get("compute_capability")
    if cc is None:
        soft.append(Difference("compute_capability", None, here_cc, "not recorded"))
    elif str(cc) != str(here_cc):
        hard.append(Difference("compute_capability", cc, here_cc, "another architecture"))
    driver, here_driver = device.get("driver"), machine.get("driver")
    if driver is None:
        soft.append(Difference("driver", None, here_driver, "not recorded"))
    elif driver != here_driver:
        soft.append(Difference("driver", driver, here_driver, version_change(driver, here_driver)))


def _compare_source(table: TableFile, source: SourceCheck | None, recorded: Any, hard: list, soft: list,
                    notes: list) -> None:
    here = source.today if source is not None else None
    if not recorded or recorded == "unknown":
        soft.append(Difference("kernel_source_hash", recorded, here, "not recorded"))
        return
    matched = source.matches(recorded, [entry.config for entry in table.entries]) if source is not None else None
    if matched is None:
        hard.append(Difference("kernel_source_hash", recorded, here, "kernel source changed since the measurement"))
    elif matched == "module":
        notes.append("kernel_source_hash is the whole-module hash of an older export; it matches today's "
                     "module, and omnitune export now records the jit-source hash")


_VERSION = re.compile(r"^v?(\d+(?:\.\d+)*)(.*)$")


def version_change(old: Any, new: Any) -> str:
    """How two version strings differ: "major", "minor", "patch" (any later number) or "build"
    (the same numbers, another suffix such as +cu130); "other" when either is not a version."""
    a, b = _VERSION.match(str(old)), _VERSION.match(str(new))
    if a is None or b is None:
        return "other"
    pa, pb = a.group(1).split("."), b.group(1).split(".")
    for level, (x, y) in zip(("major", "minor"), zip(pa, pb)):
        if int(x) != int(y):
            return level
    if [int(x) for x in pa[2:]] != [int(y) for y in pb[2:]] or len(pa) != len(pb):
        return "patch"
    return "build" if a.group(2) != b.group(2) else "same"

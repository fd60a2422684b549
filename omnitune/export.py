"""Write the best measured configs as the JSON tables production ships (tuned_configs/).

One file per kernel × device: `<out>/<kernel>/<device_key>.json` (format: tuned_configs/README.md,
reader: omnitune.runtime). Only what was measured goes in — each entry is the best *ok* trial of
one (problem, dtype); a row changed by hand or corrupt (a time that is zero, negative or infinite,
a config that is not JSON) makes none, with one warning per kernel. Files are written so that
they review well and survive crashes:
- keys and JSON sorted, two-space indent, final newline, so a diff shows only what changed;
- written to a temporary file beside the target, then os.replace'd over it, so a crash leaves
  the old file or the new one, never half of one; mode 0666 less the umask (omnitune/table_files.py);
- merged: entries of an existing file whose keys this database does not have are kept, so
  exports from several machines or sessions accumulate; the same key is replaced. The read,
  merge and write of one file hold its lock file, so concurrent exports keep both sides' entries;
- a kept entry is validated as the runtime would read it: one it would skip (a value outside the
  kernel's space, a non-finite number, a key that does not match its problem) is dropped, with
  one warning (logger "omnitune.export") per file, instead of being carried on forever;
- a file whose entries would not change is left untouched (its exported_at included).

The file's kernel_source_hash is the newest measurement's. An entry good for other kernel source
(kept from a file whose hash was another, or the best trial of a key measured on older source)
carries its own kernel_source_hash (omnitune.provenance), so that merging never passes an entry
off as measured on code it did not run on: `omnitune verify` fails those entries, not the others.

Each file also carries a predictor block (omnitune.predict: every config each tuned problem's
search measured, as its time ÷ that problem's best), from which the runtime predicts a config for
a problem no entry is close enough to; it merges point by point as entries do. With
predictor=False a file is written without one, the existing file's dropped too: where the
predictor loses to the kernel's untuned answer on shapes nobody tuned (attention and paged decode
on the H200, docs/results.md, round 22), the table is better without it.

For a kernel whose spec names a rollback_config (the fallback path of a kernel that chooses
between paths), each entry also says how the fallback did in the same search: its config, its
best ok time, and the winner's speedup over it (None where the fallback was not measured).
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd

from omnitune import store, table_files
from omnitune.coerce import describe
from omnitune.errors import OmnituneError, StoreError, one_line
from omnitune.predict import fit_block, merge_blocks
from omnitune.provenance import ENTRY_SOURCE_HASH, entry_source_hash, provenance_hash, with_entry_source
from omnitune.report import (
    KEY_COLUMNS,
    best_per_key,
    impossible_times,
    in_any_column,
    in_whole_sessions,
    with_retiming,
)
from omnitune.runtime._format import SCHEMA_VERSION, entry_key, impossible_recorded_time, table_path
from omnitune.runtime._reading import HugeNumber, UnreadableTable, parse_table_json, read_table_text
from omnitune.runtime._tables import json_kind, name_few, parse_entry
from omnitune.spec import KernelSpec

logger = logging.getLogger("omnitune.export")


@dataclass(frozen=True)
class TableDocument:
    """The content of one table file, before merging with what is on disk."""

    kernel: str
    device_key: str
    content: dict[str, Any]


@dataclass(frozen=True)
class ExportedFile:
    """What export did to one file."""

    path: Path
    kernel: str
    device_key: str
    entries: int
    """Entries in the file now."""
    from_db: int
    """Entries written from this database (new or replacing the file's own)."""
    kept: int
    """Entries kept from the existing file because the database has nothing for their keys."""
    changed: bool
    """False when the file already held exactly these entries and was left untouched."""
    representative: bool
    dropped: int = 0
    """Entries (and predictor points) of the existing file dropped as invalid (warned about) instead of kept."""
    predictor_points: int = 0
    """Tuned problems in the file's predictor block now."""
    source_hash: Any = None
    """The file's kernel_source_hash now."""
    kept_on_other_source: int = 0
    """Of the kept entries, those good for other kernel source than the file's (each carries its own hash)."""
    from_db_on_other_source: int = 0
    """Of the entries from the database, those whose best trial ran on older source than the newest."""
    other_source_hashes: tuple[Any, ...] = ()
    """The hashes those entries carry, sorted."""


def export_tables(
    db_path: Path, out_dir: Path, kernel: str | None = None, *, exported_at: str | None = None,
    predictor: bool = True,
) -> list[ExportedFile]:
    """Export every kernel × device of the database (or one kernel's) under out_dir; without
    `predictor`, the files carry no predictor block (an existing file's is removed)."""
    trials = store.read_trials(db_path, kernel)
    devices = store.read_devices(db_path)
    exported_at = exported_at or datetime.now(timezone.utc).isoformat(timespec="seconds")
    results = []
    for document in build_documents(trials, devices, exported_at, predictor=predictor):
        path = table_path(out_dir, document.kernel, document.device_key)
        with table_files.locked(path):  # read, merge and write as one step against other exports
            table_files.remove_stale_temporaries(path)
            existing = read_table_file(path, document.kernel)
            dropped = drop_invalid_entries(existing, document.content["entries"], path) if existing else []
            merged = merge_document(document.content, existing)
            if predictor:
                dropped += _merge_predictor(merged, document.content, existing, path)
            else:
                merged.pop("predictor", None)
            changed = existing is None or bool(dropped) or _without_timestamp(merged) != _without_timestamp(existing)
            if changed:
                write_json_atomic(path, merged)
        from_db = len(document.content["entries"])
        on_other_source = {k: e[ENTRY_SOURCE_HASH] for k, e in merged["entries"].items()
                           if isinstance(e, dict) and ENTRY_SOURCE_HASH in e}
        from_db_on_other_source = sum(1 for k in on_other_source if k in document.content["entries"])
        results.append(ExportedFile(
            path=path,
            kernel=document.kernel,
            device_key=document.device_key,
            entries=len(merged["entries"]),
            from_db=from_db,
            kept=len(merged["entries"]) - from_db,
            changed=changed,
            representative=bool(merged["representative"]),
            dropped=len(dropped),
            predictor_points=len(merged.get("predictor", {}).get("points", {})),
            source_hash=merged["kernel_source_hash"],
            kept_on_other_source=len(on_other_source) - from_db_on_other_source,
            from_db_on_other_source=from_db_on_other_source,
            other_source_hashes=tuple(sorted(set(on_other_source.values()), key=str)),
        ))
    return results


def build_documents(
    trials: pd.DataFrame, devices: pd.DataFrame, exported_at: str, *, predictor: bool = True
) -> list[TableDocument]:
    """One document per kernel × device holding the best ok trial of each (problem, dtype), and
    with `predictor` the predictor block fit over every trial of it."""
    trials = _without_impossible_times(trials)
    best = best_per_key(trials)
    best = best[best["status"] == "ok"]
    documents = []
    for (kernel, device_key), rows in best.groupby(["kernel", "device_key"], sort=True):
        _refuse_unsafe_names(kernel, device_key)
        newest = rows.sort_values("measured_at", kind="stable").iloc[-1]
        rollback = _rollback_config(kernel)
        fallbacks = _fallback_trials(trials[trials["kernel"] == kernel], rollback) if rollback else None
        source_hash = provenance_hash(kernel, _plain(newest["source_hash"]))
        measured_on = _provenance_hashes(kernel, rows["source_hash"])
        spec = _spec_or_none(kernel)
        entries, unusable = {}, []
        for _, r in rows.iterrows():
            key = entry_key(r["dtype"], r["problem_key"])
            try:
                entry = with_entry_source(_entry(r), measured_on[_plain(r["source_hash"])], source_hash)
            except (TypeError, ValueError) as exc:  # a cell that is not the JSON the search wrote
                unusable.append((key, f"trial {_plain(r['trial_number'])}: {one_line(exc, 120)}"))
                continue
            if fallbacks is not None:
                entry.update(_fallback_fields(r, fallbacks))
            # What the runtime would skip is not written: a row changed by hand, or corrupt.
            reason = _entry_problem(key, entry, spec)
            if reason is not None:
                unusable.append((key, f"trial {_plain(r['trial_number'])}: {reason}"))
                continue
            entries[key] = entry
        if unusable:
            _warn_unusable_rows(kernel, unusable)
        if not entries:
            continue
        fit = spec is not None and predictor
        block = fit_block(spec, trials[(trials["kernel"] == kernel) & (trials["device_key"] == device_key)]) if fit else None
        content = {
            "schema_version": SCHEMA_VERSION,
            "kernel": kernel,
            "device": _device(devices, device_key, newest["device_name"]),
            # Provenance of the newest measurement in the file; every entry carries its own date.
            "software": {
                "torch": _plain(newest["torch_version"]),
                "triton": _plain(newest["triton_version"]),
                "omnitune": _plain(newest["omnitune_version"]),
            },
            "kernel_source_hash": source_hash,
            "exported_at": exported_at,
            "representative": bool(rows["representative"].all()),
            "entries": entries,
        }
        if block is not None:
            content["predictor"] = block
        documents.append(TableDocument(kernel, device_key, content))
    return documents


def _warn_unusable_rows(kernel: Any, unusable: list[tuple[str, str]]) -> None:
    logger.warning("leaving out %d %s rows of the database that cannot make a table entry (changed by hand, "
                   "or corrupt): %s", len(unusable), kernel, name_few(unusable))


def _without_impossible_times(trials: pd.DataFrame) -> pd.DataFrame:
    """The trials less the ok rows with a time no measurement gives (report.impossible_times),
    warned about as rows that cannot make an entry; best_per_key counts them as failures, and the
    predictor must not fit them either."""
    bad_in = impossible_times(trials)
    impossible = in_any_column(bad_in)
    for kernel, rows in trials[impossible].groupby("kernel", sort=True):
        unusable = []
        for index, r in rows.iterrows():
            column = next(c for c, bad in bad_in.items() if bad[index])
            value = r[column].item() if hasattr(r[column], "item") else r[column]
            unusable.append((entry_key(r["dtype"], r["problem_key"]), f"trial {_plain(r['trial_number'])}: "
                             f"{column} {describe(value)} is not a positive number of milliseconds"))
        _warn_unusable_rows(kernel, unusable)
    return trials[~impossible]


def _refuse_unsafe_names(kernel: Any, device_key: Any) -> None:
    """The kernel and device key name the table's folder and file: a database that holds one no
    search writes (a path, an empty name: a tampered or corrupt file) exports nothing, rather than
    a file outside --out."""
    from omnitune.trial import device_key as key_of

    if not isinstance(device_key, str) or key_of(device_key) != device_key:
        raise StoreError(f"the database holds trials under device key {describe(device_key)}, which is not a "
                         "device key (letters, digits and '_'): a tampered or corrupt database; nothing exported")
    if not isinstance(kernel, str) or not kernel or kernel.startswith(".") or any(c in kernel for c in "/\\\0"):
        raise StoreError(f"the database holds trials of kernel {describe(kernel)}, which cannot name a table's "
                         "folder: a tampered or corrupt database; nothing exported")


def _provenance_hashes(kernel: str, recorded: pd.Series) -> dict[Any, Any]:
    """Each source hash the trials recorded → the one a table records for it (provenance_hash),
    worked out once per distinct hash: it hashes the kernel's module."""
    return {h: provenance_hash(kernel, h) for h in {_plain(v) for v in recorded}}


def merge_document(new: dict[str, Any], existing: dict[str, Any] | None) -> dict[str, Any]:
    """`new` with the entries of `existing` whose keys it lacks; the rest of `new` wins. A kept
    entry good for other kernel source than new's kernel_source_hash carries its own (the file's
    hash, or the entry's own, that it was kept with), rather than taking new's."""
    if existing is None:
        return new
    # An older export wrote the whole-module hash: translated as new's was, so that an unchanged
    # module does not make every kept entry look measured on other source.
    file_hash = provenance_hash(new["kernel"], existing.get("kernel_source_hash"))
    kept = {k: _kept_entry(v, file_hash, new["kernel_source_hash"])
            for k, v in existing["entries"].items() if k not in new["entries"]}
    merged = dict(new)
    merged["entries"] = {**kept, **new["entries"]}
    if kept:
        merged["representative"] = bool(new["representative"]) and bool(existing.get("representative", True))
    return merged


def _kept_entry(entry: Any, file_hash: Any, new_hash: Any) -> Any:
    """An entry of a file whose header says `file_hash`, as a file whose header says `new_hash` keeps it."""
    if not isinstance(entry, dict):
        return entry  # drop_invalid_entries leaves none; the format is not this function's to judge
    return with_entry_source(entry, entry_source_hash(entry, file_hash), new_hash)


def _merge_predictor(merged: dict[str, Any], new: dict[str, Any], existing: dict[str, Any] | None,
                     path: Path) -> list[tuple[str, str]]:
    """Set merged's predictor block: new's, with the existing file's points for problems this
    database lacks (omnitune.predict.merge_blocks); the points dropped as invalid are warned
    about once and returned as (key, why)."""
    block, dropped = merge_blocks(new.get("predictor"), (existing or {}).get("predictor"), _spec_or_none(new["kernel"]))
    merged.pop("predictor", None)
    if block is not None:
        merged["predictor"] = block
    if dropped:
        logger.warning("dropping %d invalid points of the predictor block of %s instead of keeping them: %s",
                       len(dropped), path, name_few(dropped))
    return [(f"predictor point {key}", why) for key, why in dropped]


def read_table_file(path: Path, kernel: str) -> dict[str, Any] | None:
    """An existing table to merge into; None if there is none. A file that cannot be merged
    safely is an error rather than something to overwrite (read as the runtime reads one: a FIFO
    or a device at the path is refused, not waited on or read without end)."""
    advice = "move it aside and export again"
    try:
        document = parse_table_json(read_table_text(path))
    except FileNotFoundError:
        return None
    except UnreadableTable as exc:
        raise StoreError(f"cannot merge into {path}: it {exc}; {advice}") from None
    if not isinstance(document, dict):
        raise StoreError(f"cannot merge into {path}: it holds {json_kind(document)}, not a table object; {advice}")
    if document.get("schema_version") != SCHEMA_VERSION:
        raise StoreError(f"cannot merge into {path}: schema_version {describe(document.get('schema_version'))}, "
                         f"expected {SCHEMA_VERSION}; {advice}")
    if document.get("kernel") != kernel or not isinstance(document.get("entries"), dict):
        raise StoreError(f"cannot merge into {path}: it is not a {kernel} table with entries; {advice}")
    # The file's name is the device its entries serve (the runtime reads no other file for it, nor
    # a file whose device differs): another GPU's entries kept here would be served as this one's.
    # (A file that records no device is merged into: the export writes this device's.)
    device = document.get("device")
    recorded = device.get("key") if isinstance(device, dict) else None
    if recorded is not None and recorded != path.stem:
        raise StoreError(f"cannot merge into {path}: it is the table of device {describe(recorded)}, not of "
                         f"{path.stem}; {advice}")
    return document


def drop_invalid_entries(existing: dict[str, Any], replacing: dict[str, Any], path: Path) -> list[tuple[str, str]]:
    """Remove from `existing` (in place) the entries that would be kept but are invalid, and
    warn once about them; returns (key, reason) of each. Entries this export replaces are left
    alone: they go anyway."""
    spec = _spec_or_none(existing.get("kernel"))
    dropped = []
    for key in sorted(k for k in existing["entries"] if k not in replacing):
        reason = _entry_problem(key, existing["entries"][key], spec)
        if reason is not None:
            dropped.append((key, reason))
    for key, _ in dropped:
        del existing["entries"][key]
    if dropped:
        logger.warning("dropping %d invalid entries of %s instead of keeping them: %s",
                       len(dropped), path, name_few(dropped))
    return dropped


def _entry_problem(key: str, raw: Any, spec: KernelSpec | None) -> str | None:
    """Why an entry of an existing file must not be kept (None if it may)."""
    bad_number = _non_finite_path(raw)
    if bad_number is not None:
        return f"{bad_number} is not a finite number"  # could not even be written back (strict JSON)
    bad_time = impossible_recorded_time(raw)
    if bad_time is not None:
        return bad_time
    if spec is None:  # a user's kernel not importable here: the format only
        if not isinstance(raw, dict) or not {"problem", "dtype", "config"} <= set(raw):
            return "it is not an object with problem, dtype and config"
        return None
    try:
        parse_entry(key, raw, spec)
    except KeyError as exc:
        return f"it lacks {describe(exc.args[0])}"
    except Exception as exc:  # noqa: BLE001 — whatever the runtime would skip it for
        return str(exc) or type(exc).__name__
    return None


def _non_finite_path(value: Any, where: str = "") -> str | None:
    """The JSON path of the first NaN, infinity or oversized integer in `value`, else None."""
    if isinstance(value, HugeNumber) or (isinstance(value, float) and not math.isfinite(value)):
        return where or "the entry"
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for k, v in items:
        found = _non_finite_path(v, f"{where}.{k}" if where else str(k))
        if found is not None:
            return found
    return None


def _spec_or_none(kernel: Any) -> KernelSpec | None:
    from omnitune.registry import get_spec

    if not isinstance(kernel, str):
        return None
    try:
        return get_spec(kernel)
    except (OmnituneError, ImportError):
        return None


def document_text(document: dict[str, Any]) -> str:
    """The canonical text of a table: sorted keys, two-space indent, final newline."""
    return json.dumps(document, sort_keys=True, indent=2, allow_nan=False, ensure_ascii=False) + "\n"


def write_json_atomic(path: Path, document: dict[str, Any]) -> None:
    """Write through a temporary file in the same folder and os.replace it over `path`: readers
    (and a crash) see the old file or the new one, never a truncated one. A table reached
    through a symlink (a shared table linked into a folder) is written where the link points:
    replacing the link itself with a plain file left the shared table stale, unsaid."""
    if path.is_symlink():
        try:
            path = path.resolve(strict=False)
        except (OSError, RuntimeError):  # a loop: reading the table refused it before this
            pass
    table_files.write_atomic(path, document_text(document))


def _entry(row: pd.Series) -> dict[str, Any]:
    default_config = row["default_config_json"]
    return {
        "problem": json.loads(row["problem_json"]),
        "dtype": row["dtype"],
        "config": json.loads(row["config_json"]),
        "time_ms": _plain(row["time_ms"]),
        "p20_ms": _plain(row["p20_ms"]),
        "p80_ms": _plain(row["p80_ms"]),
        "tflops": _plain(row["tflops"]),
        "tbps": _plain(row["tbps"]),
        "default_config": json.loads(default_config) if isinstance(default_config, str) else None,
        "default_time_ms": _plain(row["default_time_ms"]),
        "speedup_vs_default": _plain(row["speedup_vs_default"]),
        "trials": _plain(row["trials"]),
        "rel_error": _plain(row["rel_error"]),
        "measured_at": _plain(row["measured_at"]),
    }


def _rollback_config(kernel: str) -> dict[str, Any] | None:
    """The kernel spec's rollback_config; None for a kernel without one, or whose module cannot
    be imported here (a user's kernel exported on another machine)."""
    from omnitune.registry import get_spec

    try:
        rollback = get_spec(kernel).rollback_config
    except (OmnituneError, ImportError):
        return None
    return dict(rollback) if rollback else None


def _fallback_trials(trials: pd.DataFrame, rollback: dict[str, Any]) -> pd.DataFrame:
    """Per key, the fallback path's best ok trial: from the latest re-timing of the key's
    finalists when the fallback was among them (measured side by side with the winner), else
    from the search. A re-timing cut short while stored is passed over, as best_per_key does."""
    ok = with_retiming(trials)
    ok = ok[(ok["retime_session"].isna() | in_whole_sessions(ok)) & (ok["status"] == "ok") & ok["time_ms"].notna()]
    is_fallback = [all(json.loads(text).get(k) == v for k, v in rollback.items()) for text in ok["config_json"]]
    ok = ok[pd.Series(is_fallback, index=ok.index, dtype=bool)]
    if ok.empty:
        return ok.set_index(KEY_COLUMNS)
    latest = ok.groupby(KEY_COLUMNS)["retime_session"].transform("max")  # NaN: never re-timed
    chosen = ok[latest.isna() | (ok["retime_session"] == latest)]
    return chosen.sort_values(["time_ms", "trial_number"], kind="stable").drop_duplicates(KEY_COLUMNS).set_index(KEY_COLUMNS)


def _fallback_fields(row: pd.Series, fallbacks: pd.DataFrame) -> dict[str, Any]:
    key = tuple(row[c] for c in KEY_COLUMNS)
    if key not in fallbacks.index:
        return {"fallback_config": None, "fallback_time_ms": None, "speedup_vs_fallback": None}
    fallback = fallbacks.loc[key]
    return {
        "fallback_config": json.loads(fallback["config_json"]),
        "fallback_time_ms": _plain(fallback["time_ms"]),
        "speedup_vs_fallback": _plain(fallback["time_ms"] / row["time_ms"]),
    }


def _device(devices: pd.DataFrame, device_key: str, device_name: Any) -> dict[str, Any]:
    match = devices[devices["key"] == device_key]
    if match.empty:
        return {"key": device_key, "name": _plain(device_name), "compute_capability": None, "driver": None}
    row = match.iloc[0]
    return {
        "key": device_key,
        "name": _plain(row["name"]) or _plain(device_name),
        "compute_capability": _plain(row["compute_capability"]),
        "driver": _plain(row["driver"]),
    }


def _plain(value: Any) -> Any:
    """A JSON-safe Python value: numpy scalars unwrapped, NaN/inf/NA as None."""
    if value is None or value is pd.NA:
        return None
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _without_timestamp(document: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in document.items() if k != "exported_at"}

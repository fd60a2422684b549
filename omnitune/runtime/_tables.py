"""Reading tuned-config files: parse, validate against the kernel's spec, cache, and warn once.

A table is untrusted input: hand-edited, truncated by a full disk, or not a file at all. Whatever
is wrong with it, inference goes on with the next table or the default config, and the problem
is logged once (logger "omnitune.runtime", WARNING) with the command that would fill the gap:
- no table for a kernel on this GPU in any config directory: one warning per kernel and device;
- a file that cannot be used whole (not a regular file, larger than MAX_TABLE_BYTES, not UTF-8,
  empty, not JSON, another schema, kernel or device): one warning per file version;
- entries that cannot be used (a value outside the kernel's space, a non-finite or huge number,
  a wrong type, a key that does not match its problem): skipped, the rest of the file is used,
  and ONE warning per file version names how many and the first few;
- a predictor block (_predictor.py) is parsed only when the chain first needs it: one that cannot
  be used whole is ignored, its bad points skipped, each with one warning per file version (a
  block of a kind this omnitune does not read: one INFO line).
Parsed files are cached by (path, mtime, size), so a rewritten file is read again and warned
about again, an unchanged one never. Files are read and parsed outside the lock, so a slow
filesystem delays only the lookup that reads it, not other threads' lookups.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from omnitune.coerce import describe
from omnitune.plain_json import encodes_as_utf8
from omnitune.runtime._format import SCHEMA_VERSION, search_command, split_entry_key
from omnitune.runtime._keyed import keyed_problem
from omnitune.runtime._predictor import Predictor, UnknownKind, parse_predictor, unusable_block
from omnitune.runtime._reading import UnreadableTable, parse_table_json, read_table_text
from omnitune.spec import Config, KernelSpec

logger = logging.getLogger("omnitune.runtime")

FileStamp = tuple[int, int]  # (mtime_ns, size)

_ENTRIES_NAMED = 3  # how many bad entries a summary warning names
_UNPARSED = object()


@dataclass(frozen=True)
class TableEntry:
    """One validated entry: the tuned config of one (problem, dtype)."""

    key: str
    dtype: torch.dtype
    problem: Any
    config: Config
    verify_fix: Mapping[str, Any] | None = None
    """The record omnitune verify --fix left where it replaced the tuned config by its fallback
    (the config replaced, both re-timed medians); None for a config as tuned. Read for the
    explanations alone: the lookup serves the entry's config either way."""


@dataclass(frozen=True)
class Table:
    """The valid entries of one file, as it was when read."""

    path: Path
    stamp: FileStamp
    entries: Mapping[str, TableEntry]
    predictor_block: Any = None
    """The file's "predictor" value as parsed JSON (None without one): validated on first use
    by predictor_of, so that a lookup answered by an entry never pays for it."""

    @property
    def device_key(self) -> str:
        """The GPU the table was tuned on (omnitune.trial.device_key): the file's name, which a
        table is read only if its document's device key matches."""
        return self.path.stem


_parsed: dict[str, tuple[FileStamp, Table | None]] = {}
_predictors: dict[tuple[str, FileStamp], Predictor | None] = {}
_warned: set[tuple] = set()
_lock = threading.Lock()  # guards _parsed, _predictors and _warned; never held while reading a file


def clear() -> None:
    """Forget every parsed file and predictor block, and every warning already given."""
    with _lock:
        _parsed.clear()
        _predictors.clear()
        _warned.clear()


def predictor_of(table: Table, spec: KernelSpec) -> Predictor | None:
    """The table's predictor block, validated (once per file version), or None if it has none or
    it cannot be used; a bad block, or bad points in one, warned about once."""
    if table.predictor_block is None:
        return None
    identity = (str(table.path), table.stamp)
    found = _predictors.get(identity, _UNPARSED)
    if found is not _UNPARSED:
        return found
    predictor = None
    advice = ("problems without a tuned entry within the MatchPolicy get the default config. To refresh it: "
              "omnitune export from the results database of this GPU")
    try:
        predictor, bad, total = parse_predictor(table.predictor_block, spec)
    except UnknownKind as exc:
        logger.info("not using the predictor block of %s: it %s", table.path, exc)
    except Exception as exc:  # noqa: BLE001 — BlockError says what; anything else still must not break a lookup
        warn_once((*identity, "predictor"),
                  f"ignoring the predictor block of {table.path}: it {unusable_block(exc)}; {advice}")
    else:
        if bad:
            warn_once((*identity, "predictor"), f"ignoring {len(bad)} of the {total} points of the predictor "
                      f"block of {table.path}: {name_few(bad)}; predicting from the others")
    with _lock:
        _predictors[identity] = predictor
    return predictor


def load_table(path: Path, spec: KernelSpec, gap_command: str) -> Table | None:
    """The valid entries of the table at `path`, or None if there is none or it is unusable.

    `gap_command` is the search command that would fill the gap the caller is looking up; it goes
    into the warning when the whole file has to be ignored."""
    stamp = file_stamp(path)
    if stamp is None:
        return None
    return load_stamped(path, stamp, spec, gap_command)


def file_stamp(path: Path) -> FileStamp | None:
    """(mtime_ns, size) of whatever is at `path` (stat never blocks, even on a FIFO); None if
    nothing is, or it cannot be stat'ed (that is warned about when it is read)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):  # ValueError: a path with a NUL byte
        return (-1, -1)
    return (st.st_mtime_ns, st.st_size)


def load_stamped(path: Path, stamp: FileStamp, spec: KernelSpec, gap_command: str) -> Table | None:
    cached = _parsed.get(str(path))
    if cached is not None and cached[0] == stamp:
        return cached[1]
    table = _parse(path, stamp, spec, gap_command)  # outside the lock: reading may be slow
    with _lock:
        _parsed[str(path)] = (stamp, table)
    return table


def warn_entry_once(table: Table, key: str, message: str) -> None:
    """Warn about one entry of one file version, once."""
    warn_once((str(table.path), table.stamp, key), message)


def warn_once(identity: tuple, message: str, level: int = logging.WARNING) -> None:
    with _lock:
        if identity in _warned:
            return
        _warned.add(identity)
    logger.log(level, message)


def warn_missing(spec: KernelSpec, device_name: str, paths: Iterable[Path], gap_command: str) -> None:
    """No config directory holds a table for this kernel and device: once per kernel and device."""
    paths = list(paths)
    warn_once(
        ("missing", spec.name, device_name, tuple(map(str, paths))),
        f"no tuned configs for {spec.name} on {device_name}: none of {', '.join(map(str, paths))} exists; "
        f"using the default config for every {spec.name} call. To tune a shape: {gap_command}, then omnitune export",
    )


def note_twin(spec: KernelSpec, device_name: str, path: Path, gap_command: str, *, below_own: bool = False) -> None:
    """path's table, tuned on a GPU of the same chip, is read for this kernel and device — alone
    (no table of this GPU's) or below_own (for the shapes this GPU's own tables lack): said once
    per kernel, device and file (INFO: configs are served, tuned or not here)."""
    if below_own:
        said = (f"{spec.name} on {device_name}: shapes its own tables lack are served from {path}, tuned on a GPU "
                f"of the same chip. To tune one for this GPU: {gap_command}, then omnitune export")
    else:
        said = (f"no tuned configs for {spec.name} on {device_name}: using {path}, tuned on a GPU of the same "
                f"chip. To tune for this GPU: {gap_command}, then omnitune export")
    warn_once(("twin", spec.name, device_name, str(path)), said, level=logging.INFO)


def fallback_advice(command: str) -> str:
    return f"using the next table or the default config. To tune this shape: {command}, then omnitune export"


def _parse(path: Path, stamp: FileStamp, spec: KernelSpec, gap_command: str) -> Table | None:
    try:
        doc = parse_table_json(read_table_text(path))
        problem = schema_problem(doc, spec.name, path)
    except FileNotFoundError:  # removed since it was stat'ed
        return None
    except UnreadableTable as exc:
        problem = str(exc)
    if problem is not None:
        warn_once((str(path), stamp), f"ignoring tuned configs {path}: it {problem}; {fallback_advice(gap_command)}")
        return None

    _note_source_hash(doc, spec, path)
    entries: dict[str, TableEntry] = {}
    bad: list[tuple[str, str]] = []
    for key in sorted(doc["entries"]):
        try:
            entries[key] = parse_entry(key, doc["entries"][key], spec)
        except KeyError as exc:
            bad.append((key, f"it lacks {describe(exc.args[0])}"))
        except Exception as exc:  # noqa: BLE001 — a table is untrusted, and an entry's problem is
            # built by the spec author's dataclass: whatever one entry raises, the others stay usable
            bad.append((key, str(exc) or type(exc).__name__))
    if bad:
        _warn_bad_entries(path, stamp, spec, bad, len(doc["entries"]))
    return Table(path, stamp, entries, doc.get("predictor"))


def _warn_bad_entries(path: Path, stamp: FileStamp, spec: KernelSpec, bad: list[tuple[str, str]], total: int) -> None:
    # One warning per file version, however many entries are bad: a corrupt table must not
    # flood an inference server's log. The first bad entry's key names the search that replaces it.
    dtype_name, problem_key = (part if _printable(part) else None for part in split_entry_key(bad[0][0]))
    command = search_command(spec.name, problem_key or "...", dtype_name or "...")
    warn_once(
        (str(path), stamp, "entries"),
        f"ignoring {len(bad)} of the {total} entries of {path}: {name_few(bad)}; for their problems "
        + fallback_advice(command),
    )


def _printable(text: str | None) -> bool:
    """Whether a key's part can go into a log line as it is: a key with a newline in it would
    write lines of its own into the log, one with a lone surrogate fail the log's UTF-8 handler."""
    return bool(text) and text.isprintable() and encodes_as_utf8(text)


def name_few(bad: list[tuple[str, str]]) -> str:
    """The first few bad keys with their reasons, and how many more."""
    named = "; ".join(f"{describe(key, 200)} ({reason})" for key, reason in bad[:_ENTRIES_NAMED])
    return named + (f"; and {len(bad) - _ENTRIES_NAMED} more" if len(bad) > _ENTRIES_NAMED else "")


def schema_problem(doc: Any, kernel: str, path: Path) -> str | None:
    """Why a parsed document is not a table this runtime can read for this kernel and device
    (omnitune verify reports it with the same words)."""
    if not isinstance(doc, dict):
        return f"holds {json_kind(doc)}, not an object"
    version = doc.get("schema_version")
    if type(version) is not int or version != SCHEMA_VERSION:  # not True, not 1.0
        return f"has schema_version {describe(version)}; this omnitune reads schema_version {SCHEMA_VERSION}"
    if doc.get("kernel") != kernel:
        return f"is for kernel {describe(doc.get('kernel'))}, not {kernel!r}"
    device = doc.get("device")
    if not isinstance(device, dict) or device.get("key") != path.stem:
        found = device.get("key") if isinstance(device, dict) else None
        return f"is for device {describe(found)}, but its name says {path.stem!r}"
    if not isinstance(doc.get("entries"), dict):
        return "has no 'entries' object"
    return None


def json_kind(value: Any) -> str:
    """What a parsed JSON value is, in JSON's words ("an array", "null")."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"JSON {str(value).lower()}"
    kinds = ((list, "an array"), (str, "a string"), ((int, float), "a number"))
    return next((kind for types, kind in kinds if isinstance(value, types)), f"a {type(value).__name__}")


def parse_entry(key: str, raw: Any, spec: KernelSpec) -> TableEntry:
    """One entry of a table, validated against the spec (export re-validates the entries it keeps
    with it too); raises KeyError, TypeError, ValueError or an OmnituneError naming what is wrong."""
    # Only the fields that make the lookup are read, and `verify_fix` (where it is an object) for
    # the explanations; every other one (times, the `revalidated` record of omnitune verify --fix,
    # an entry's own `kernel_source_hash`, fields a later omnitune adds) is ignored, so that
    # provenance can never make the runtime skip an entry.
    dtype, problem = keyed_problem(key, raw, spec)
    config = spec.coerce_config(raw["config"], strict=True)  # true/false for a flag, not 1 or 1.0
    fixed = raw.get("verify_fix")
    return TableEntry(key=key, dtype=dtype, problem=problem, config=config,
                      verify_fix=fixed if isinstance(fixed, dict) else None)


def _note_source_hash(doc: dict, spec: KernelSpec, path: Path) -> None:
    # A soft mismatch, as FlashInfer classes it: the configs are still valid launch parameters,
    # only perhaps no longer the fastest, so they are used and the difference is logged. Entries
    # that a partial `omnitune verify --fix` revalidated are served the same way as the others.
    recorded = doc.get("kernel_source_hash")
    check = spec.source_check()
    current = check.today
    raws = [raw for raw in doc["entries"].values() if isinstance(raw, dict)]
    if (isinstance(recorded, str) and recorded and current != "unknown"
            and not check.is_current(recorded, _configs(raws))):
        logger.info(
            "%s was tuned on %s source %s; the source is now %s (configs used; `omnitune verify --fix` on "
            "this GPU revalidates them, or re-tune to refresh them)",
            path, spec.name, describe(recorded), current,
        )
        return
    # A current file can still keep entries from older source (export merging into it): each
    # carries its own hash, and the same soft mismatch is logged once for them.
    older = sum(1 for raw in raws if isinstance(h := raw.get("kernel_source_hash"), str) and h
                and not check.is_current(h, _configs([raw])))
    if older and current != "unknown":
        logger.info(
            "%d of the %d entries of %s were tuned on older %s source (configs used; `omnitune verify --fix` "
            "on this GPU revalidates them, or re-tune to refresh them)",
            older, len(doc["entries"]), path, spec.name,
        )


def _configs(raws: list) -> list:
    """The entries' configs as the table holds them, for SourceCheck.is_current (which configs run
    a spec's extra source modules)."""
    return [raw["config"] for raw in raws if isinstance(raw.get("config"), dict)]

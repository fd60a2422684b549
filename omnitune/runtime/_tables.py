"""Reading tuned-config files: parse, validate against the kernel's spec, cache, and warn once.

A missing file is normal (nothing was tuned for that GPU) and silent. Anything else wrong — an
empty, corrupt or truncated file, another schema, an entry whose values are outside the kernel's
space — is logged once (per file version, per entry) and skipped: inference must never break
because a table is bad. Parsed files are cached by (path, mtime, size), so a rewritten file is
read again and warned about again, an unchanged one never.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from omnitune.errors import OmnituneError
from omnitune.runtime._format import SCHEMA_VERSION, entry_key, search_command, split_entry_key
from omnitune.spec import DTYPES, Config, KernelSpec

logger = logging.getLogger("omnitune.runtime")

FileStamp = tuple[int, int]  # (mtime_ns, size)


@dataclass(frozen=True)
class TableEntry:
    """One validated entry: the tuned config of one (problem, dtype)."""

    key: str
    dtype: torch.dtype
    problem: Any
    config: Config


@dataclass(frozen=True)
class Table:
    """The valid entries of one file, as it was when read."""

    path: Path
    stamp: FileStamp
    entries: Mapping[str, TableEntry]


_parsed: dict[str, tuple[FileStamp, Table | None]] = {}
_warned: set[tuple] = set()
_lock = threading.Lock()


def clear() -> None:
    """Forget every parsed file and every warning already given."""
    with _lock:
        _parsed.clear()
        _warned.clear()


def load_table(path: Path, spec: KernelSpec, gap_command: str) -> Table | None:
    """The valid entries of the table at `path`, or None if there is none or it is unusable.

    `gap_command` is the search command that would fill the gap the caller is looking up; it goes
    into the warning when the whole file has to be ignored."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        _warn_once((str(path), "stat"), f"cannot read tuned configs {path} ({exc}); {_fallback(gap_command)}")
        return None
    stamp = (st.st_mtime_ns, st.st_size)
    cached = _parsed.get(str(path))
    if cached is not None and cached[0] == stamp:
        return cached[1]
    with _lock:
        cached = _parsed.get(str(path))
        if cached is not None and cached[0] == stamp:
            return cached[1]
        table = _parse(path, stamp, spec, gap_command)
        _parsed[str(path)] = (stamp, table)
        return table


def warn_entry_once(table: Table, key: str, message: str) -> None:
    """Warn about one entry of one file version, once."""
    _warn_once((str(table.path), table.stamp, key), message)


def _warn_once(identity: tuple, message: str) -> None:
    if identity in _warned:
        return
    _warned.add(identity)
    logger.warning(message)


def _fallback(command: str) -> str:
    return f"using the next table or the default config. To tune this shape: {command}, then omnitune export"


def _parse(path: Path, stamp: FileStamp, spec: KernelSpec, gap_command: str) -> Table | None:
    problem = None
    doc: Any = None
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        problem = f"cannot be read ({exc})"
    else:
        if not text.strip():
            problem = "is empty"
        else:
            try:
                doc = json.loads(text)
            except json.JSONDecodeError as exc:
                problem = f"is not valid JSON, truncated or corrupt ({exc.msg}: line {exc.lineno} column {exc.colno})"
            except (ValueError, RecursionError) as exc:  # e.g. absurdly deep nesting
                problem = f"is not valid JSON ({type(exc).__name__})"
    if problem is None:
        problem = _schema_problem(doc, spec, path)
    if problem is not None:
        _warn_once((str(path), stamp), f"ignoring tuned configs {path}: it {problem}; {_fallback(gap_command)}")
        return None

    _note_source_hash(doc, spec, path)
    entries: dict[str, TableEntry] = {}
    for key in sorted(doc["entries"]):
        try:
            entries[key] = _parse_entry(key, doc["entries"][key], spec)
        except KeyError as exc:
            _warn_entry(path, stamp, key, spec, f"it lacks {exc.args[0]!r}")
        except (OmnituneError, TypeError, ValueError) as exc:
            _warn_entry(path, stamp, key, spec, str(exc))
    return Table(path, stamp, entries)


def _warn_entry(path: Path, stamp: FileStamp, key: str, spec: KernelSpec, reason: str) -> None:
    # The entry's own key names the gap: re-tuning that (problem, dtype) replaces it.
    dtype_name, problem_key = split_entry_key(key)
    _warn_once(
        (str(path), stamp, key),
        f"ignoring entry {key!r} of {path}: {reason}; "
        + _fallback(search_command(spec.name, problem_key or "...", dtype_name or "...")),
    )


def _schema_problem(doc: Any, spec: KernelSpec, path: Path) -> str | None:
    """Why a parsed document is not a table this runtime can read for this kernel and device."""
    if not isinstance(doc, dict):
        return f"holds a JSON {type(doc).__name__}, not an object"
    version = doc.get("schema_version")
    if version != SCHEMA_VERSION:
        return f"has schema_version {version!r}; this omnitune reads schema_version {SCHEMA_VERSION}"
    if doc.get("kernel") != spec.name:
        return f"is for kernel {doc.get('kernel')!r}, not {spec.name!r}"
    device = doc.get("device")
    if not isinstance(device, dict) or device.get("key") != path.stem:
        found = device.get("key") if isinstance(device, dict) else None
        return f"is for device {found!r}, but its name says {path.stem!r}"
    if not isinstance(doc.get("entries"), dict):
        return "has no 'entries' object"
    return None


def _parse_entry(key: str, raw: Any, spec: KernelSpec) -> TableEntry:
    # Only the fields that make the lookup are read; every other one (times, `verify_fix`, the
    # `revalidated` record of omnitune verify --fix, fields a later omnitune adds) is ignored, so
    # that provenance can never make the runtime skip an entry.
    if not isinstance(raw, dict):
        raise TypeError(f"it is a JSON {type(raw).__name__}, not an object")
    dtype_name = raw["dtype"]
    dtype = DTYPES.get(dtype_name) if isinstance(dtype_name, str) else None
    if dtype is None or dtype not in spec.dtypes:
        raise ValueError(f"dtype {dtype_name!r} is not one of {spec.name}'s dtypes")
    if not isinstance(raw["problem"], Mapping):
        raise TypeError("its 'problem' is not an object")
    problem = spec.problem_from_mapping(raw["problem"])
    config = spec.coerce_config(raw["config"])
    expected = entry_key(dtype_name, spec.problem_key(problem))
    if key != expected:
        raise ValueError(f"its problem and dtype give the key {expected!r}")
    return TableEntry(key=key, dtype=dtype, problem=problem, config=config)


def _note_source_hash(doc: dict, spec: KernelSpec, path: Path) -> None:
    # A soft mismatch, as FlashInfer classes it: the configs are still valid launch parameters,
    # only perhaps no longer the fastest, so they are used and the difference is logged. Entries
    # that a partial `omnitune verify --fix` revalidated are served the same way as the others.
    recorded = doc.get("kernel_source_hash")
    current = spec.source_hash()
    if recorded and current != "unknown" and recorded != current:
        logger.info(
            "%s was tuned on %s source %s; the source is now %s (configs used; `omnitune verify --fix` on "
            "this GPU revalidates them, or re-tune to refresh them)",
            path, spec.name, recorded, current,
        )

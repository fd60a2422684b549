"""The source hash an exported table records, translated from what a search recorded
(omnitune.source_hash holds the hashes; this module looks the kernel up, which the hashes, read
by omnitune.spec, must not); and the source each entry of a table is good for.

A table's `kernel_source_hash` speaks for every entry that does not carry its own. An entry
measured on other source than that (kept by an export from a file tuned on older source, or an
older trial of the database) carries its own `kernel_source_hash`, so that no export makes an
entry look measured on code it never ran on; `omnitune verify` checks each such entry apart, and
the runtime ignores the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from omnitune.source_hash import UNKNOWN


def provenance_hash(kernel: str, recorded: Any) -> Any:
    """The source hash an exported table records for the search's `recorded` one.

    Searches made before this hash existed recorded the whole-module hash. Where that still
    equals the module's current source, the device code measured is today's, so its jit hash is
    written instead; any other value (a jit hash already, or a hash of code that has changed
    since) is written as recorded, which is the truth about what was measured."""
    if not isinstance(recorded, str) or recorded in ("", UNKNOWN):
        return recorded
    from omnitune.errors import OmnituneError
    from omnitune.registry import get_spec

    try:
        spec = get_spec(kernel)
    except (OmnituneError, ImportError):
        return recorded
    if spec.source_matches(recorded) == "module":
        return spec.source_hash()
    return recorded


ENTRY_SOURCE_HASH = "kernel_source_hash"
"""An entry's own kernel source hash: present only where it is not its file's."""
REVALIDATED = "revalidated"
"""The record `omnitune verify --fix` writes in an entry it revalidated for newer source."""


def entry_source_hash(entry: Mapping[str, Any], file_hash: Any) -> Any:
    """The kernel source an entry of a file whose header says `file_hash` is good for: its own
    hash where it carries one; else the source a partial `verify --fix` revalidated it for (the
    file then keeps its older hash until every entry is revalidated); else the file's."""
    if ENTRY_SOURCE_HASH in entry:
        return entry[ENTRY_SOURCE_HASH]
    record = entry.get(REVALIDATED)
    if isinstance(record, Mapping) and isinstance(record.get("to_source_hash"), str):
        return record["to_source_hash"]
    return file_hash


def with_entry_source(entry: Mapping[str, Any], source_hash: Any, file_hash: Any) -> dict[str, Any]:
    """A copy of `entry`, good for `source_hash`, for a file whose header says `file_hash`: it
    carries its own hash only when that differs from the file's."""
    out = {k: v for k, v in entry.items() if k != ENTRY_SOURCE_HASH}
    if source_hash != file_hash:
        out[ENTRY_SOURCE_HASH] = source_hash
    return out

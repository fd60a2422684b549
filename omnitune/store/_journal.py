"""The Optuna journal file as bytes: what a process killed while appending to it leaves at its end,
and where a journal that cannot be read goes wrong.

Optuna appends each record as one JSON line and skips a last line it cannot parse, but a record
appended after such a line glues onto it, and from then on no process can read the file. So the
end is looked at under the journal's lock, before every write and when the journal is opened: an
incomplete last record is dropped (the file as it was is kept beside it) before anything is
appended. Optuna never counted such a line as read, so the processes that have the journal open
carry on from where it starts, which is where the next record now goes.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from datetime import datetime, timezone
from pathlib import Path

from omnitune.errors import StoreError

log = logging.getLogger(__name__)

# How much of the file's end is read at a time while looking for its last line.
_TAIL_CHUNK = 1 << 13
# The first bytes of every SQLite database file.
SQLITE_HEADER = b"SQLite format 3\x00"


def is_sqlite_file(path: Path) -> bool:
    """Whether `path` is an SQLite database (by its header): no journal, whatever its URL says."""
    try:
        with open(path, "rb") as f:
            return f.read(len(SQLITE_HEADER)) == SQLITE_HEADER
    except OSError:
        return False


def _last_line_start(f, size: int) -> int:
    """Where the file's last line starts: after the last newline before its final byte (that
    byte is the last line's own newline when it has one); 0 for a file of one line."""
    end = size - 1
    while end > 0:
        start = max(0, end - _TAIL_CHUNK)
        f.seek(start)
        newline = f.read(end - start).rfind(b"\n")
        if newline >= 0:
            return start + newline + 1
        end = start
    return 0


def _is_record(line: bytes) -> bool:
    """Whether `line` is a whole journal record: a JSON object and the newline written with it."""
    if not line.endswith(b"\n"):
        return False
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:  # not JSON, or not UTF-8
        return False


def _looks_interrupted(line: bytes, start: int) -> bool:
    """Whether a last line that is not a record is what an interrupted append leaves: the start
    of a record, or the zeros a crash leaves in a file's last block; after whole records, any bad
    line. Anything else (one line that is not a record at all) is no journal of Optuna's, and is
    not cut."""
    return start > 0 or not line.strip(b"\0\n") or line.lstrip(b"\0").startswith(b"{")


def _backup_path(path: Path) -> Path:
    """A new file beside `path` for a copy of it: `<name>.bak-<UTC time>` (-2, -3… if taken)."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    backup, n = path.with_name(f"{path.name}.bak-{stamp}"), 1
    while backup.exists():
        n += 1
        backup = path.with_name(f"{path.name}.bak-{stamp}-{n}")
    return backup


def drop_interrupted_record(path: Path) -> Path | None:
    """With the journal's lock held: cut an incomplete or garbled last record off the journal at
    `path`, after copying the whole file beside it; returns the copy (None when the end was whole).
    A StoreError when the file's only line is no record at all (not a journal: left as it is)."""
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        return None
    with f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return None
        start = _last_line_start(f, size)
        f.seek(start)
        line = f.read(size - start)
    if _is_record(line):
        return None
    if _is_record(line + b"\n"):
        # Cut right before its newline: the record is whole (no prefix of a JSON object is one),
        # and dropping it lost a trial's last word (its tell), so it is ended instead.
        try:
            with open(path, "ab") as f:
                f.write(b"\n")
        except OSError as exc:
            raise StoreError(f"the Optuna journal {path} ends without its last newline, which could not be "
                             f"written: {exc.strerror or exc}") from None
        log.warning("the Optuna journal %s ended without the newline of its last record (a process stopped "
                    "while writing it): added it", path)
        return None
    if not _looks_interrupted(line, start):
        raise StoreError(f"{path} is not an Optuna journal (its one line is no journal record); give the "
                         f"journal a file of its own")
    backup = _backup_path(path)
    try:
        shutil.copyfile(path, backup)
        os.truncate(path, start)
    except OSError as exc:
        raise StoreError(f"the Optuna journal {path} ends in an incomplete record (a process stopped while "
                         f"writing it), which could not be dropped: {exc.strerror or exc}") from None
    log.warning("the Optuna journal %s ended in an incomplete record (a process stopped while writing it): "
                "dropped it, and kept the journal as it was in %s", path, backup)
    return backup


def unreadable_line(path: Path) -> tuple[int, str] | None:
    """The first line of the journal at `path` that is no record, other than its last (which
    drop_interrupted_record handles), and why; None if every such line is one."""
    with open(path, "rb") as f:
        previous: tuple[int, bytes] | None = None
        for number, line in enumerate(f, start=1):
            if previous is not None and not _is_record(previous[1]):
                return previous[0], _why_not_a_record(previous[1])
            previous = number, line
    return None


def _why_not_a_record(line: bytes) -> str:
    """What is wrong with a whole line that is no record: its JSON, or what the JSON is."""
    try:
        json.loads(line)
    except ValueError as exc:
        return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return "not a JSON object"

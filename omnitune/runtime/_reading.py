"""Reading a table file without trusting what is at its path: the runtime (on an inference hot
path) and export (before merging into a file) both read through here.

Anything can sit at a table path: a FIFO would block a plain open() until some writer appeared,
a symlink to /dev/zero would be read until memory ran out, a corrupt file can hold numbers no
parser should expand. So the file is opened non-blocking, must be a regular file of at most
MAX_TABLE_BYTES, and its JSON is parsed with integers of absurd length kept as a marker that
no later check accepts.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

MAX_TABLE_BYTES = 16 * 1024 * 1024
"""A shipped table is ~15 KB for a dozen entries; 16 MiB is tens of thousands of entries."""

# Longer integer literals are not converted: Python refuses past 4,300 digits anyway (ValueError
# for the whole document), and nothing valid in a table needs more than a few.
_MAX_INT_DIGITS = 100

_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)


class UnreadableTable(Exception):
    """A table file that cannot be used; the message completes 'the file ...'."""


class HugeNumber:
    """An integer literal of more than _MAX_INT_DIGITS digits, left unconverted."""

    def __init__(self, digits: int):
        self.digits = digits

    def __repr__(self) -> str:
        return f"<a {self.digits}-digit number>"


def read_table_text(path: Path) -> str:
    """The text of the table at `path`. FileNotFoundError when there is none; UnreadableTable
    for anything else that is not a readable UTF-8 regular file of at most MAX_TABLE_BYTES."""
    try:
        fd = os.open(path, _OPEN_FLAGS)  # non-blocking: a FIFO opens at once instead of waiting
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise UnreadableTable(f"cannot be opened ({exc.strerror or exc})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UnreadableTable(f"is not a regular file (it is a {_file_kind(info.st_mode)})")
        if info.st_size > MAX_TABLE_BYTES:
            raise UnreadableTable(f"is {info.st_size:,} bytes, more than a table may hold ({MAX_TABLE_BYTES:,})")
        data = _read_at_most(fd, MAX_TABLE_BYTES + 1)  # the file may have grown since fstat
    except OSError as exc:
        raise UnreadableTable(f"cannot be read ({exc.strerror or exc})") from None
    finally:
        os.close(fd)
    if len(data) > MAX_TABLE_BYTES:
        raise UnreadableTable(f"is more than a table may hold ({MAX_TABLE_BYTES:,} bytes)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UnreadableTable(f"is not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def parse_table_json(text: str) -> Any:
    """The JSON document in `text`; UnreadableTable if it is not one. Infinity, NaN and 1e999
    parse (as floats) and are rejected later by the checks of the values they stand for."""
    if not text.strip():
        raise UnreadableTable("is empty")
    try:
        return json.loads(text, parse_int=_parse_int)
    except json.JSONDecodeError as exc:
        raise UnreadableTable(
            f"is not valid JSON, truncated or corrupt ({exc.msg}: line {exc.lineno} column {exc.colno})"
        ) from None
    except (ValueError, RecursionError) as exc:  # e.g. absurdly deep nesting
        raise UnreadableTable(f"is not valid JSON ({type(exc).__name__})") from None


def _parse_int(literal: str) -> int | HugeNumber:
    if len(literal) > _MAX_INT_DIGITS:
        return HugeNumber(len(literal.lstrip("-")))
    return int(literal)


def _read_at_most(fd: int, limit: int) -> bytes:
    chunks, total = [], 0
    while total < limit:
        chunk = os.read(fd, min(1 << 20, limit - total))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    return b"".join(chunks)


def _file_kind(mode: int) -> str:
    for test, kind in ((stat.S_ISDIR, "directory"), (stat.S_ISFIFO, "FIFO"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device"), (stat.S_ISSOCK, "socket")):
        if test(mode):
            return kind
    return "special file"

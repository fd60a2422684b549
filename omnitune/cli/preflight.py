"""Checks a command makes before it spends time or writes anything: that the files it will write
can be written, that two storages are not one file, that a problem can be held in memory.

Each raises an OmnituneError (one line, exit 2) naming the option at fault. The writability
checks ask os.access rather than reading mode bits: as root, mode bits allow everything, while a
read-only mount or an immutable file still refuses — and os.access says so. Where os.access says
yes, a folder is also tried for real (a temporary file made and removed): /proc says yes to root."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omnitune.errors import OmnituneError, ShapeError, StoreError, first_line_or_type

if TYPE_CHECKING:
    import torch


def _nearest_existing(path: Path) -> Path:
    """`path` itself if it exists, else its nearest existing ancestor (what mkdir would start from)."""
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _writable_folder_below(folder: Path, option: str, target: Path) -> None:
    """That `folder` (which need not exist yet) could be made and written into."""
    base = _nearest_existing(folder)
    if not base.is_dir():
        raise OmnituneError(f"cannot write {option} {target}: {base} is a file, not a folder")
    if not os.access(base, os.W_OK | os.X_OK):
        raise OmnituneError(f"cannot write {option} {target}: {base} is read-only")
    # os.access can say yes where no file can be made: /proc, /sys (root may "write" them) and
    # other special filesystems. Making (and removing) a temporary file there is the real test —
    # what the writes do (write_atomic makes its temporary file in the same folder).
    try:
        fd, probe = tempfile.mkstemp(prefix=".omnitune-write-check-", suffix=".tmp", dir=base)
    except OSError as exc:
        raise OmnituneError(f"cannot write {option} {target}: cannot create a file in {base} "
                            f"({exc.strerror or exc})") from None
    os.close(fd)
    with suppress(OSError):
        os.unlink(probe)


def require_writable_file(path: Path, option: str) -> None:
    """That the file `path` can be written (created, with its folders, or replaced)."""
    if path.is_dir():
        raise OmnituneError(f"{option} {path} is a folder; give the path of a file to write")
    if path.exists() and not os.access(path, os.W_OK):
        raise OmnituneError(f"cannot write {option} {path}: the file is read-only")
    _writable_folder_below(path.parent, option, path)


# A JSON report is small; a file past this at the report's path is something else.
_REPORT_BYTES = 64 * 1024 * 1024


def require_report_file(path: Path, option: str, *, report_keys: frozenset[str], what: str,
                        not_under: Sequence[Path] = ()) -> None:
    """That `path` can take a JSON report (require_writable_file), and that what is there now, if
    anything, is one of this command's — an earlier report, replaced — and not a results database,
    a journal, a table, a config or any other JSON file, which --json FILE replaced before.
    `report_keys` are the top-level keys every such report has; `what` names it in the message
    ("bench report"). A device or a FIFO (/dev/null, /dev/stdout, a pipe) is written into, not
    replaced (write_output_file), so it passes."""
    require_writable_file(path, option)
    for folder in not_under:
        if Path(os.path.abspath(path)).is_relative_to(os.path.abspath(folder)):
            raise OmnituneError(f"{option} {path} is inside the tables folder {folder}; write the report elsewhere")
    if not path.is_file() or path.stat().st_size == 0:
        return
    from omnitune.store._journal import is_sqlite_file

    if is_sqlite_file(path):
        raise OmnituneError(f"{option} {path} is an SQLite database (a results database?), not a report; give "
                            f"another file")
    found = "larger than a report"
    if path.stat().st_size <= _REPORT_BYTES:
        found = "not a JSON report (an Optuna journal, or another file?)"
        with suppress(OSError, UnicodeDecodeError, ValueError, RecursionError):
            document = json.loads(path.read_text(encoding="utf-8"))
            if isinstance(document, dict) and report_keys <= document.keys():
                return
            table = isinstance(document, dict) and {"kernel", "entries"} <= document.keys()
            found = f"not a {what} but a tuned table" if table else f"JSON but not a {what} (a config, or other data?)"
    raise OmnituneError(f"{option} {path} exists and is {found}, so it is not replaced; give another file, or "
                        f"move it aside")


def require_writable_folder(path: Path, option: str) -> None:
    """That files can be written under the folder `path` (made if it does not exist)."""
    if path.exists() and not path.is_dir():
        raise OmnituneError(f"{option} {path} is a file; give a folder to write into")
    _writable_folder_below(path, option, path)


def _storage_file(url: str) -> Path | None:
    """The file a storage URL names: an SQLAlchemy SQLite URL's (sqlite:///relative,
    sqlite:////absolute) or a journal's (journal:///path); None for another database or an
    in-memory one."""
    from omnitune.store import journal_path, sqlite_file_name

    if (journal := journal_path(url)) is not None:
        return journal
    name = sqlite_file_name(url)
    return None if name in (None, "", ":memory:") else Path(name)


def _same_file(a: Path, b: Path) -> bool:
    if a.exists() and b.exists():
        return os.path.samefile(a, b)
    return a.resolve() == b.resolve()


def require_storage_apart(storage: str | None, db: Path) -> None:
    """That --storage does not name the results database: Optuna would create its own tables
    inside the catalogue (or append its journal to it), which is derived from them and rebuilt
    from them."""
    target = _storage_file(storage) if storage else None
    if target is not None and _same_file(target, db):
        from omnitune.store import default_storage_url

        raise StoreError(
            f"--storage {storage} names the results database {db} itself; the Optuna storage holds the "
            f"studies the database is derived from, so it must be another file, e.g. {default_storage_url(db)}"
        )


def require_storage_to_read(storage: str) -> None:
    """That the file a --storage to read from names exists: opening a missing one, Optuna makes it
    (a journal with its folders, an SQLite database), and report and export read "0 trials" from
    a file a typo made."""
    target = _storage_file(storage)
    if target is not None and not target.exists():
        raise StoreError(f"--storage {storage}: there is no Optuna storage at {target}; give the storage a "
                         "search wrote into, or leave out --storage to use the results database as it is"
                         + _absolute_path_hint(storage, target))
    from omnitune.store import sqlite_file_name

    if sqlite_file_name(storage) and target is not None and target.is_file() and target.stat().st_size == 0:
        # Optuna would make its tables in it: a command that reads would have written its source.
        raise StoreError(f"--storage {storage}: {target} is an empty file, not an Optuna storage; give the storage "
                         "a search wrote into")


def require_storage_folder_meant(storage: str | None) -> None:
    """That a --storage to write into does not make a folder tree the user most likely did not mean:
    journal:///tmp/x.log names ./tmp/x.log, and Optuna makes ./tmp for it, where /tmp exists."""
    target = _storage_file(storage) if storage else None
    if target is None or target.parent.exists():
        return
    hint = _absolute_path_hint(storage, target, of_folder=True)
    if hint:
        raise StoreError(f"--storage {storage} names {target}, whose folder {target.parent} does not exist here"
                         + hint)


def _absolute_path_hint(storage: str, target: Path, *, of_folder: bool = False) -> str:
    """A hint where a three-slash URL missed a file (of_folder: a folder to write a file into) that
    its absolute reading names: journal:/// and sqlite:/// take a path relative to the current
    folder, so journal:///tmp/x.log is ./tmp/x.log while the user most likely meant /tmp/x.log."""
    absolute = Path("/") / target
    if target.is_absolute() or not (absolute.parent if of_folder else absolute).exists():
        return ""
    scheme = storage.split(":///", 1)[0] + ":///"
    return (f" (three slashes name a path relative to the current folder; for /{target} write "
            f"{scheme}/{target})")


def _memory_bytes(interpret: bool) -> tuple[int, str] | None:
    """How much memory the problem's tensors are made in, and what it is; None if unknown. On the
    host, what is available now (MemAvailable): Linux lends more than it has and the OOM killer
    collects later, from whichever process — a refusal at the start is the kinder answer."""
    import torch

    if not interpret and torch.cuda.is_available():
        return torch.cuda.mem_get_info()[1], "this GPU's memory"
    with suppress(OSError, ValueError, IndexError):
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024, "this machine's available memory"
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "this machine's memory"
    except (AttributeError, OSError, ValueError):
        return None


# Under the interpreter the tensors are made on the host, the reference computes in fp32 or fp64
# beside them, and the interpreter copies what each program touches: several times the byte
# model (a paged-decode problem of 5 GiB took 24 GiB before the OOM killer ended it).
INTERPRETER_MEMORY_FACTOR = 8


def _size(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def require_fits_in_memory(spec: Any, problem: Any, dtype: torch.dtype, interpret: bool) -> None:
    """That the problem's inputs and outputs can be allocated where the kernel runs. The spec's
    byte model counts each tensor the kernel reads or writes once: a lower bound of what the
    inputs, the output and the reference allocate, so a problem over it can never run — found
    before the search opens a database, rather than as an allocator's traceback after."""
    available = _memory_bytes(interpret)
    if available is None:
        return
    try:
        needed = float(spec.bytes_moved(problem, dtype))
    except OverflowError:  # dimensions too large for a float
        needed = float("inf")
    limit, where = available
    if needed > limit:
        shown = "more than can be counted" if needed == float("inf") else _size(needed)
        raise ShapeError(
            f"{spec.name} {spec.problem_key(problem)} is too large: its tensors alone need {shown}, "
            f"more than {where} ({_size(limit)})"
        )
    if interpret and needed * INTERPRETER_MEMORY_FACTOR > limit:
        raise ShapeError(
            f"{spec.name} {spec.problem_key(problem)} is too large for --interpret: its tensors need {_size(needed)}, "
            f"and the interpreter with the reference about {INTERPRETER_MEMORY_FACTOR} times that, more than {where} "
            f"({_size(limit)}); interpret a smaller shape (correctness only), or run it on a GPU"
        )


@contextmanager
def allocation_errors(spec: Any, problem: Any) -> Iterator[None]:
    """An allocator's refusal while a problem's tensors are made, as a ShapeError: a problem under
    the lower bound of require_fits_in_memory can still be too large for what is free."""
    import torch

    try:
        yield
    except (RuntimeError, MemoryError) as exc:
        out_of_memory = isinstance(exc, (torch.cuda.OutOfMemoryError, MemoryError)) or "allocate" in str(exc)
        if not out_of_memory:
            raise
        why = first_line_or_type(exc)
        raise ShapeError(f"{spec.name} {spec.problem_key(problem)} does not fit in memory here: {why}") from None

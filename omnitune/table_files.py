"""Writing table files: one writer at a time per table, whole files only, readable by everyone the
umask allows, and no debris left by a writer that was killed.

- `locked(path)` holds an exclusive flock on `.<name>.lock` beside the table for the whole
  read-merge-write of an export, so that two exports into one directory (two machines sharing a
  checkout, two sessions) both keep their entries instead of the later rename dropping the
  other's. The lock file stays (an empty hidden file, ignored by git): deleting it while another
  writer waits on it would let a third one lock a new file beside them.
- `write_atomic(path, text)` writes `.<name>.<random>.tmp` beside the target and renames it over
  the target, so a reader (or a crash) sees the old file or the new one, never half of one. The
  file is created with mode 0666 less the umask (0644 usually), not mkstemp's 0600, which an
  inference process running as another user could not read.
- `remove_stale_temporaries(path)`, called under the lock, deletes the `.tmp` files a killed
  writer left: a writer creates one only while it holds the lock, so one found by the holder of
  the lock is no live writer's.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import os
import secrets
import time
from collections.abc import Iterator
from pathlib import Path

from omnitune.errors import StoreError

LOCK_TIMEOUT_S = 120.0
"""How long an export waits for another one writing the same table (an export takes seconds)."""


def lock_path(path: Path) -> Path:
    return path.parent / f".{path.name}.lock"


def temporary_pattern(path: Path) -> str:
    """The glob of the temporary files written for `path` (also what .gitignore lists)."""
    return str(path.parent / f".{glob.escape(path.name)}.*.tmp")


@contextlib.contextmanager
def locked(path: Path, timeout_s: float | None = None) -> Iterator[None]:
    """Hold the exclusive lock of the table at `path` (creating its folder if need be), waiting
    at most timeout_s (default LOCK_TIMEOUT_S) for another holder: then StoreError."""
    timeout_s = LOCK_TIMEOUT_S if timeout_s is None else timeout_s
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_path(path), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise StoreError(
                        f"another export has been writing {path} for over {timeout_s:.0f} s "
                        f"(it holds {lock_path(path)}); wait for it, or stop it, and export again"
                    ) from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)  # releases the lock, as the kernel does for a killed holder


def remove_stale_temporaries(path: Path) -> list[Path]:
    """Delete the temporary files of `path` left by killed writers; call it holding the lock."""
    removed = []
    for name in glob.glob(temporary_pattern(path)):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name)
            removed.append(Path(name))
    return removed


def write_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` whole: through a temporary file in the same folder, fsync'ed, then
    os.replace'd over `path`."""
    write_bytes_atomic(path, text.encode("utf-8"))


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """write_atomic for bytes (a figure)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _create_temporary(path)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _create_temporary(path: Path) -> tuple[int, str]:
    # O_EXCL as mkstemp does, but mode 0666: the kernel applies the umask, so the table gets the
    # mode any file this user creates would (the mode survives the rename).
    for _ in range(100):
        name = str(path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp")
        try:
            return os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666), name
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary file name beside {path}")


"""One GPU shared by several measuring processes: a lock that lets one of them at a time work on it.

A search of many problems keeps the GPU busy only while some process is measuring; the host work
between two measurements (the sampler choosing the next config, the study storing the last one,
the next problem's inputs drawn on the CPU) left it idle for most of a whole-model search (round
13: 28% busy). Several search processes — lanes, each searching its own problems — keep it busy
instead: while one lane chooses or stores, another measures. Timings stay honest only if no two
lanes run kernels at once, so every piece of GPU work a lane does (checking a config against the
reference, timing it, re-timing the finalists, computing a reference) happens while it holds this
lock, and host work happens outside it.

The lock is an advisory `flock` on a file, so that processes that share nothing but a path can
use it, and the kernel releases it when a holder dies (a crashed lane never blocks the others).
A process that is alone on its GPU uses `NO_GPU_LOCK`, which costs nothing.
"""

from __future__ import annotations

import collections
import fcntl
import logging
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# The variable that hands a lane process the lock's path (set by the process that starts lanes).
GPU_LOCK_ENV = "OMNITUNE_GPU_LOCK"

log = logging.getLogger(__name__)


# Each holding's (start, end) in time.monotonic() seconds, which all processes of a host share:
# enough to lay a session's holdings beside the GPU's utilization (benchmarks/search_wall.py).
# A whole-model search takes the lock a few thousand times; past this many the earliest are kept.
KEPT_HOLDINGS = 100_000
# The first few holdings are kept with what each was spent on (phases): a lane's start, where the
# GPU may sit idle while a holder does first-time host work under the lock.
DETAILED_HOLDINGS = 8


class _Held:
    """Taking and giving back, re-entrant within a thread (a holder may take it again, e.g. a
    reference computed inside a measurement), with its accounting: `held_s`, how long it was held
    (the GPU time of this process's searches, which `omnitune plan` reads), `acquisitions`,
    `holdings` (when each began and ended) and `phase_s` (what the holder says it spent the time
    on: `spent`). Subclasses say what taking it waits for (`_take`, `_give`)."""

    waited_s = 0.0
    keeps_holdings = True

    def __init__(self) -> None:
        self._depth = 0
        self._owner: int | None = None
        self._taken_at = 0.0
        self._taken_mono = 0.0
        self.held_s = 0.0
        self.acquisitions = 0
        self.holdings: list[tuple[float, float]] = []
        self.phase_s: collections.Counter[str] = collections.Counter()
        # What each of the first DETAILED_HOLDINGS holdings was spent on ({phase: seconds}); the
        # holding itself is the entry of `holdings` at the same place.
        self.first_phases: list[dict[str, float]] = []
        self._phases_at_take: collections.Counter[str] | None = None

    def spent(self, phase: str, seconds: float) -> None:
        """Count `seconds` of holding it as spent on `phase` (checking, timing, ...): where a
        lane's GPU time goes, beside how long it held the lock."""
        self.phase_s[phase] += seconds

    def __enter__(self):
        me = threading.get_ident()
        if self._owner == me:
            self._depth += 1
            return self
        self._take()
        self._owner, self._depth = me, 1
        self._taken_at = time.perf_counter()
        self._taken_mono = time.monotonic()
        self.acquisitions += 1
        detailed = self.keeps_holdings and self.acquisitions <= DETAILED_HOLDINGS
        self._phases_at_take = collections.Counter(self.phase_s) if detailed else None
        return self

    def __exit__(self, *exc: object) -> None:
        self._depth -= 1
        if self._depth:
            return
        self.held_s += time.perf_counter() - self._taken_at
        if self.keeps_holdings and len(self.holdings) < KEPT_HOLDINGS:
            self.holdings.append((self._taken_mono, time.monotonic()))
        if self._phases_at_take is not None:
            self.first_phases.append({phase: round(seconds - self._phases_at_take[phase], 6)
                                      for phase, seconds in self.phase_s.items()
                                      if seconds > self._phases_at_take[phase]})
            self._phases_at_take = None
        self._owner = None
        self._give()

    def _take(self) -> None:
        return None

    def _give(self) -> None:
        return None

    def close(self) -> None:
        return None


class GpuLock(_Held):
    """Exclusive use of the GPU among the processes that open the same `path`, and among the
    threads of one process. `waited_s` says how long this process waited for it: a lane's idle
    time; `held_s` its GPU time."""

    def __init__(self, path: str | Path):
        super().__init__()
        self.path = str(path)
        self._fd: int | None = None
        self._threads = threading.Lock()  # one thread of this process at a time holds the file lock
        self.waited_s = 0.0

    def _take(self) -> None:
        began = time.perf_counter()
        self._threads.acquire()
        try:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            fcntl.flock(self._fd, fcntl.LOCK_EX)
        except BaseException:
            self._threads.release()
            raise
        self.waited_s += time.perf_counter() - began

    def _give(self) -> None:
        try:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            self._threads.release()

    def close(self) -> None:
        if self._fd is not None and self._owner is None:
            os.close(self._fd)
            self._fd = None

    def __getstate__(self) -> dict:
        # Crossing into another process (an isolated worker): it opens the file itself.
        return {"path": self.path}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["path"])


class _NoGpuLock(_Held):
    """The lock of a process alone on its GPU: nothing to wait for, but the time it is held is
    counted all the same (but not each holding: nothing lays it beside other processes')."""

    path = None
    keeps_holdings = False


NO_GPU_LOCK = _NoGpuLock()


_process_locks: dict[str, GpuLock] = {}
_ignored_paths: set[str] = set()  # values of GPU_LOCK_ENV warned about


def _usable_lock_path(path: str | None) -> bool:
    """Whether GPU_LOCK_ENV names a lock file as the processes that set it do (an absolute path in
    an existing folder, no folder itself). A value left over in a shell (a folder, a missing
    folder, a blank) is ignored with one warning: taking it failed every measurement, and verify
    blamed the tables for it."""
    if not path:
        return False
    usable = os.path.isabs(path) and os.path.isdir(os.path.dirname(path)) and not os.path.isdir(path)
    if not usable and path not in _ignored_paths:
        _ignored_paths.add(path)
        log.warning("ignoring %s=%r: not the path of a lock file in an existing folder", GPU_LOCK_ENV, path)
    return usable


def gpu_lock_from_env() -> GpuLock | _NoGpuLock:
    """The lock a lane was started with (GPU_LOCK_ENV), one object per process (its accounting
    covers every runner of the lane), else NO_GPU_LOCK."""
    path = os.environ.get(GPU_LOCK_ENV)
    if path in _process_locks:  # judged usable when first met: runners and compile tasks ask often
        return _process_locks[path]
    if not _usable_lock_path(path):
        return NO_GPU_LOCK
    _process_locks[path] = GpuLock(path)
    return _process_locks[path]


@contextmanager
def shared_with_compile_workers() -> Iterator[None]:
    """A lock for a process alone on its GPU that starts compile workers (omnitune.measure.precompile):
    a search, `omnitune verify`. Shared with them through GPU_LOCK_ENV as lanes share theirs, for as
    long as it lasts; its runners (omnitune.measure.runner) take it for their GPU work.

    A worker launches a config for real where its launch cannot be captured (kv_compress reads
    lengths back to the host) and draws each problem's inputs on the GPU, under this lock. Without
    one, a search alone had workers running kernels beside its own timings: in round 32 (H100,
    kv_compress, one lane) its 14 workers spent 1,815–1,821 s of CPU on 16 configs in 127–137 s,
    and the search waited 58–71 s of it for them. Nothing changes where a lock is set already (a
    lane's)."""
    if _usable_lock_path(os.environ.get(GPU_LOCK_ENV)):
        yield
        return
    with tempfile.TemporaryDirectory(prefix="omnitune-gpu-") as folder:
        path = os.path.join(folder, "gpu.lock")
        os.environ[GPU_LOCK_ENV] = path
        try:
            yield
        finally:
            del os.environ[GPU_LOCK_ENV]
            lock = _process_locks.pop(path, None)
            if lock is not None:
                lock.close()

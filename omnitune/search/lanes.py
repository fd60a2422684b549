"""Lanes: several search processes sharing one GPU, each searching whole problems of one session.

A search of many problems (`omnitune search --model`, a repeated --shape) used to leave the GPU
idle whenever its one process did host work: the sampler choosing the next config (~40 ms a trial
on the H200's host, mostly Optuna reading the study back from SQLite), storing the last one, the
next problem's inputs drawn on the CPU. In round 13 the GPU was busy 28% of a whole-model search.
Lanes overlap that host work with measuring: N processes (`--lanes`), started by the `omnitune
search` the user ran before it has checked its arguments (they wait for its go, GO_FILE), each
take the session's problems in their own order (omnitune.cli.search_lanes), the first lane to
claim a problem searches it (a claim is a file created exclusively in the session's folder), and
every piece of GPU work a lane does happens under one GPU lock (omnitune.measure.gpu_lock), so no
lane ever times its kernels beside another's. The host work of one lane runs while another holds
the lock.

Everything else about a problem's search is unchanged: its study, its budget, its finalists, its
resume. A lane that dies frees the lock (the kernel drops a dead process's flock) and leaves its
problem's finished trials stored; rerunning the command resumes it like any interrupted search.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

# What a lane leaves in the session folder when it ends: its GPU lock's accounting.
LANE_STATS = "lane-{index}.json"
# Left in the session folder on Ctrl-C: a lane still starting stops as soon as it can take the
# interrupt (it ignores SIGINT until then, so that none dies mid-import with a traceback). Left
# before GO_FILE, it calls the session off: the lanes exit without a word.
STOP_FILE = "stop"
# Left in the session folder once the session has checked its arguments and made the database:
# JSON settings every lane takes (how many lanes search, the compile processes each gets, the
# timeout's deadline). Lanes start before that, so that their start (importing torch and Triton,
# loading the kernels: ~10 s on the H200's host) overlaps the session's own, and wait for it before
# they touch the database.
GO_FILE = "go"
# How often a lane waiting for GO_FILE looks.
GO_POLL_S = 0.02
# The session's process id, in each lane's environment: a lane that reads its parent only once it
# has started (importing torch takes seconds) could find its session already gone and take the
# init process (pid 1) for it, then wait for a go that never comes.
SESSION_PID_ENV = "OMNITUNE_LANE_SESSION_PID"
# How long a lane may take to stop after the parent passed on Ctrl-C before it is killed.
STOP_GRACE_S = 60.0


def _session_pid() -> int:
    """The session's process id as it gave it (SESSION_PID_ENV), else this process's parent."""
    given = os.environ.get(SESSION_PID_ENV, "")
    return int(given) if given.isdigit() else os.getppid()


def _interrupt_when_the_session_dies() -> None:
    """On Linux, have the kernel send this lane SIGINT when its session's process dies (killed, or
    ended by SIGTERM, which it does not pass on): the lane stops as on Ctrl-C (its finished trials
    stored) instead of searching on with no session. Elsewhere, or where prctl is unavailable,
    nothing: the lane still stops waiting for the go when its parent changes."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGINT), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class LaneSession:
    """One lane's view of the session folder: which problems it may search."""

    def __init__(self, folder: str | Path, index: int):
        self.folder = Path(folder)
        self.index = index
        self.claims = self.folder / "claims"
        self.claims.mkdir(parents=True, exist_ok=True)
        self._session_pid = _session_pid()
        self.ready_at: float | None = None  # time.monotonic() when wait_for_go began
        self.go_at: float | None = None  # ... and when it saw the go

    def wait_for_go(self) -> dict | None:
        """The settings the session gives its lanes (GO_FILE), once it has checked its arguments;
        None when it called the lanes off (STOP_FILE first, or the session process is gone)."""
        go, stop = self.folder / GO_FILE, self.folder / STOP_FILE
        _interrupt_when_the_session_dies()
        self.ready_at = time.monotonic()  # when this lane could have started (CLOCK_MONOTONIC: host-wide)
        while True:
            if go.exists():
                self.go_at = time.monotonic()
                return json.loads(go.read_text())
            if stop.exists() or os.getppid() != self._session_pid:
                return None
            time.sleep(GO_POLL_S)

    @property
    def gpu_lock_path(self) -> Path:
        return self.folder / "gpu.lock"

    def take_interrupts(self) -> None:
        """From now on Ctrl-C (passed on by the parent) interrupts this lane as it does any search;
        raises KeyboardInterrupt at once when the session was interrupted while the lane started."""
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if (self.folder / STOP_FILE).exists():
            raise KeyboardInterrupt

    def _claim_file(self, key: Sequence[str]) -> Path:
        digest = hashlib.sha1("|".join(key).encode()).hexdigest()[:20]
        return self.claims / digest

    def claim(self, key: Sequence[str]) -> bool:
        """True if this lane now owns the problem `key` (kernel, problem key, dtype): no other lane
        claimed it first. A lane that claimed it already is told True again."""
        path = self._claim_file(key)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return path.read_text().strip() == str(self.index)
        with os.fdopen(fd, "w") as f:
            f.write(str(self.index))
        return True

    def write_stats(self, stats: dict) -> None:
        (self.folder / LANE_STATS.format(index=self.index)).write_text(json.dumps(stats))


def read_lane_stats(folder: str | Path, lanes: int) -> list[dict]:
    """What each lane left (LaneSession.write_stats); lanes that left nothing are skipped."""
    found = []
    for index in range(lanes):
        path = Path(folder) / LANE_STATS.format(index=index)
        try:
            found.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return found


@dataclass(frozen=True)
class LanesResult:
    returncodes: list[int]
    wall_s: float
    stats: list[dict]

    @property
    def returncode(self) -> int:
        """The session's exit code: 0 when every lane succeeded; else an interrupted lane's 130,
        else the first failure's."""
        failed = [code for code in self.returncodes if code != 0]
        if not failed:
            return 0
        return 130 if 130 in failed else failed[0]

    @property
    def gpu_held_s(self) -> float:
        """How long some lane held the GPU lock, summed over lanes (they never hold it together)."""
        return sum(s.get("gpu_lock_held_s", 0.0) for s in self.stats)

    @property
    def held_by_phase(self) -> dict[str, float]:
        """What the lanes said they held the GPU for (GpuLock.spent), summed over lanes, largest
        first."""
        phases: dict[str, float] = {}
        for stats in self.stats:
            for phase, seconds in (stats.get("gpu_lock_phase_s") or {}).items():
                phases[phase] = phases.get(phase, 0.0) + seconds
        return dict(sorted(phases.items(), key=lambda item: -item[1]))


class LaneProcesses:
    """The lane processes of one session, started before the session has checked its arguments.

    Each runs in a session of its own, so that a Ctrl-C at the terminal reaches the session's
    process alone and is passed on once to each lane. Every line a lane prints is relayed through
    `echo(lane, line)` — held back until go(): a session whose arguments turn out wrong says so
    once, and its lanes, called off (cancel), say nothing."""

    def __init__(self, commands: Sequence[Sequence[str]], folder: str | Path, *, env: dict[str, str] | None = None,
                 echo: Callable[[int, str], None]):
        self.folder = Path(folder)
        self.echo = echo
        self.began = time.monotonic()
        self._held: list[tuple[int, str]] | None = []  # lines printed before go()
        self._lines = threading.Lock()
        environment = dict(os.environ if env is None else env)
        environment.setdefault("PYTHONUNBUFFERED", "1")
        self.processes: list[subprocess.Popen] = []
        self.relays: list[threading.Thread] = []
        try:
            for index, command in enumerate(commands):
                process = subprocess.Popen(list(command), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                           bufsize=1, env=environment, start_new_session=True)
                self.processes.append(process)
                relay = threading.Thread(target=self._relay, args=(process, index), daemon=True,
                                         name=f"omnitune-lane-{index}")
                relay.start()
                self.relays.append(relay)
        except BaseException:
            self.cancel()
            raise

    def _relay(self, process: subprocess.Popen, index: int) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            line = line.rstrip("\n")
            with self._lines:
                if self._held is not None:
                    self._held.append((index, line))
                    continue
            self.echo(index, line)

    def go(self, settings: dict) -> None:
        """Let the lanes search with `settings` (LaneSession.wait_for_go), and relay what they
        printed so far."""
        staging = self.folder / f".{GO_FILE}.{os.getpid()}"
        staging.write_text(json.dumps(settings))
        os.replace(staging, self.folder / GO_FILE)  # whole or not at all, for a lane that looks now
        with self._lines:
            held, self._held = self._held or [], None
        for index, line in held:
            self.echo(index, line)

    def cancel(self) -> None:
        """Call the lanes off before go(): they are ended at once, and what they printed is dropped."""
        (self.folder / STOP_FILE).touch()
        for process in self.processes:
            if process.poll() is None:
                process.kill()
        for process in self.processes:
            process.wait()
        for relay in self.relays:
            relay.join(timeout=5)

    def wait(self) -> LanesResult:
        """Wait for every lane (after go()); Ctrl-C is passed on to each."""
        try:
            codes = [process.wait() for process in self.processes]
        except KeyboardInterrupt:
            (self.folder / STOP_FILE).touch()
            _interrupt(self.processes)
            codes = [130 if p.returncode == -signal.SIGINT else p.returncode for p in self.processes]
        for relay in self.relays:
            relay.join(timeout=5)
        return LanesResult(codes, time.monotonic() - self.began, read_lane_stats(self.folder, len(self.processes)))


def run_lanes(commands: Sequence[Sequence[str]], folder: str | Path, *, env: dict[str, str] | None = None,
              echo: Callable[[int, str], None], settings: dict | None = None) -> LanesResult:
    """Start one process per command (a lane), let them go at once with `settings`, relay every
    line they print through `echo(lane, line)`, and wait for all of them."""
    lanes = LaneProcesses(commands, folder, env=env, echo=echo)
    lanes.go(settings or {})
    return lanes.wait()


def _interrupt(processes: Sequence[subprocess.Popen]) -> None:
    """Pass Ctrl-C on to each lane still running (each stores what it finished and exits 130), and
    kill any that has not stopped after STOP_GRACE_S."""
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
    deadline = time.monotonic() + STOP_GRACE_S
    for process in processes:
        try:
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# A lane ignores Ctrl-C until its search can take it (LaneSession.take_interrupts).
_LANE_MAIN = "import signal; signal.signal(signal.SIGINT, signal.SIG_IGN); from omnitune.cli import main; main()"


def lane_command(executable: str = sys.executable) -> list[str]:
    """How a lane process is started: this Python, running the omnitune CLI."""
    return [executable, "-c", _LANE_MAIN]

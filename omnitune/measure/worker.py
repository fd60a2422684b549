"""Measure candidates in an isolated, persistent worker process, so that a candidate that kills
its process (an illegal memory access poisons the whole CUDA context; a segfault or abort in the
compiler; a kernel that never returns) costs one trial, not the search.

IsolatedRunner is a drop-in for Runner as the search driver uses it (measure, check, time_interleaved,
context_lost). It starts one worker with multiprocessing's "spawn" context — a fresh interpreter,
so no CUDA or Triton state is shared with the parent — that imports the kernel by the name the
user gave (omnitune.registry.get_spec), builds one Runner (inputs and reference once) and then
serves requests over a pipe, trial after trial. Only after a failure is a worker replaced:

    worker died mid-trial (signal, exit, context lost) → TrialStatus.CRASHED, restarted lazily
    no reply within timeout_s (compile + check + timing) → worker killed, TrialStatus.TIMEOUT

A Python exception inside the worker (a user mistake, a broken reference) is raised in the
parent as it would be in-process; the worker survives it.
"""

from __future__ import annotations

import enum
import math
import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from omnitune.errors import OmnituneError, one_line
from omnitune.measure.runner import MeasureSettings, Observer
from omnitune.trial import TrialResult, TrialStatus
from omnitune.spec import Config, DeviceLimits

# Set to "1" in every worker's environment. Kernels never need it; the fault-injection kernel of
# the tests checks it so that its lethal faults can only fire inside a worker.
WORKER_ENV = "OMNITUNE_ISOLATED_WORKER"
DEFAULT_TIMEOUT_S = 120.0
# Starting a worker imports torch and Triton and builds the inputs and reference: a few seconds
# on a CPU, more for large problems; it is not charged to any trial.
DEFAULT_STARTUP_TIMEOUT_S = 600.0
# How long a worker asked to stop may take before it is killed.
STOP_GRACE_S = 5.0
# How often a worker checks that the process that started it is still alive.
PARENT_POLL_S = 0.5


class WorkerStartError(OmnituneError):
    """The worker could not be started: it died or hung while building the inputs and reference."""


class WorkerLost(RuntimeError):
    """The worker died or overran its time while serving a request that has no trial status
    (re-timing the finalists); the driver keeps the search's own times."""


class _Method(str, enum.Enum):
    MEASURE = "measure"
    CHECK = "check"
    TIME_INTERLEAVED = "time_interleaved"


# --- messages over the pipe ------------------------------------------------------------------------


@dataclass(frozen=True)
class _Setup:
    """What a worker needs to build its Runner besides the kernel's name. Pickled by the parent;
    unpickled by the worker only after it has set TRITON_INTERPRET and imported the kernel, since
    the problem's class lives in the kernel's module (a file kernel's module exists only then)."""

    problem: Any
    dtype: torch.dtype
    settings: MeasureSettings
    limits: DeviceLimits | None
    observer_factories: tuple[Callable[[], Observer], ...]


@dataclass(frozen=True)
class _Call:
    method: _Method
    args: tuple


@dataclass(frozen=True)
class _Stop:
    pass


@dataclass(frozen=True)
class _Ready:
    pid: int


@dataclass(frozen=True)
class _Reply:
    value: Any
    context_lost: bool  # the worker exits right after sending this


@dataclass(frozen=True)
class _Raised:
    """An exception raised inside the worker; `pickled` is None when it cannot cross the pipe."""

    pickled: bytes | None
    summary: str
    traceback_text: str

    @classmethod
    def of(cls, exc: BaseException) -> _Raised:
        try:
            pickled = pickle.dumps(exc)
            pickle.loads(pickled)  # some exceptions pickle but cannot be rebuilt
        except Exception:  # noqa: BLE001 — then the parent gets a summary instead
            pickled = None
        return cls(pickled, one_line(exc), "".join(traceback.format_exception(exc)))

    def exception(self) -> BaseException:
        exc = pickle.loads(self.pickled) if self.pickled is not None else WorkerLost(self.summary)
        exc.add_note("raised in the isolated worker:\n" + self.traceback_text.rstrip())
        return exc


@dataclass(frozen=True)
class _Died:
    detail: str


@dataclass(frozen=True)
class _TimedOut:
    pass


# --- the worker process ------------------------------------------------------------------------------


def _exit_when_orphaned(parent_pid: int) -> None:
    """Kill this worker as soon as its parent is gone (kill -9 of the search): an orphan would
    hold its GPU forever. Polled from a thread rather than prctl(PR_SET_PDEATHSIG), which fires
    when the parent *thread* that started the worker ends — with --gpus that is a slot's thread,
    and the worker outlives it to re-time the finalists."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(PARENT_POLL_S)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="omnitune-parent-watch", daemon=True).start()


def _serve(conn: multiprocessing.connection.Connection, kernel: str, interpret: bool, setup_bytes: bytes,
           parent_pid: int | None = None, visible_device: str | None = None) -> None:
    """The worker's main: build the Runner once, then answer calls until told to stop."""
    # Ctrl-C reaches the whole process group; the parent decides what becomes of the trial.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if parent_pid is not None:
        _exit_when_orphaned(parent_pid)
    if visible_device is not None:
        # Before CUDA is initialised (torch and Triton do it lazily): this worker's GPU 0.
        os.environ["CUDA_VISIBLE_DEVICES"] = visible_device
    os.environ[WORKER_ENV] = "1"
    if interpret:
        os.environ["TRITON_INTERPRET"] = "1"  # before any kernel module is imported
    try:
        from omnitune.registry import get_spec
        from omnitune.measure.runner import Runner

        spec = get_spec(kernel)
        setup: _Setup = pickle.loads(setup_bytes)
        runner = Runner(spec, setup.problem, setup.dtype, interpret=interpret, settings=setup.settings,
                        observers=[make() for make in setup.observer_factories], limits=setup.limits)
    except BaseException as exc:  # noqa: BLE001 — the parent raises it
        conn.send(_Raised.of(exc))
        return
    conn.send(_Ready(os.getpid()))
    while True:
        try:
            request = conn.recv()
        except EOFError:
            return  # the parent is gone
        if isinstance(request, _Stop):
            return
        try:
            value = getattr(runner, request.method.value)(*request.args)
            conn.send(_Reply(value, runner.context_lost))  # may fail to pickle: then say why
        except BaseException as exc:  # noqa: BLE001
            conn.send(_Raised.of(exc))
            continue
        if runner.context_lost:
            return  # this process can no longer use the GPU; the parent starts a fresh one


# --- the parent's side ---------------------------------------------------------------------------------


class _Worker:
    """One started worker process and the parent's end of its pipe."""

    def __init__(self, context: multiprocessing.context.SpawnContext, kernel: str, interpret: bool,
                 setup_bytes: bytes, visible_device: str | None = None):
        self.conn, child_conn = context.Pipe()
        # daemon: a parent that exits without close() still takes its worker down; one killed
        # outright is noticed by the worker itself (_exit_when_orphaned).
        self.process = context.Process(
            target=_serve, args=(child_conn, kernel, interpret, setup_bytes, os.getpid(), visible_device),
            name="omnitune-worker", daemon=True,
        )
        self.process.start()
        child_conn.close()  # the parent must not hold the worker's end, or EOF never comes

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def receive(self, timeout_s: float) -> _Ready | _Reply | _Raised | _Died | _TimedOut:
        """The worker's next message; _Died if it exits first, _TimedOut after timeout_s."""
        ready = multiprocessing.connection.wait([self.conn, self.process.sentinel], timeout=timeout_s)
        # A worker that replied and then exited leaves both ready: the reply comes first.
        if self.conn in ready or (ready and self.conn.poll()):
            try:
                return self.conn.recv()
            except (EOFError, OSError):
                pass
        if not ready:
            return _TimedOut()
        return self.died()

    def died(self) -> _Died:
        """The worker has exited (or is exiting): wait for it and say how it ended."""
        self.process.join(STOP_GRACE_S)
        return _Died(_exit_detail(self.process.exitcode))

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self._reap()

    def stop(self) -> None:
        """Ask the worker to finish, then reap it; kill it if it does not finish in time."""
        if self.process.is_alive():
            try:
                self.conn.send(_Stop())
            except (BrokenPipeError, OSError):
                pass
            self.process.join(STOP_GRACE_S)
        self.kill()

    def _reap(self) -> None:
        self.process.join(STOP_GRACE_S)
        self.conn.close()
        if self.process.exitcode is not None:
            self.process.close()


class IsolatedRunner:
    """Measures configs like omnitune.measure.runner.Runner, in a worker process of its own.

    `kernel` is the kernel as the user named it (built-in name, module path or .py file): the
    worker imports it itself. `problem`, `dtype`, `settings` and `limits` go to the worker's
    Runner (they must pickle); observers are built in the worker by `observer_factories`
    (e.g. the NvmlSampler class). `timeout_s` bounds one trial: compile + check + timing.
    `gpu`: the worker sees only this GPU (an index into the GPUs this process sees); under the
    interpreter it is only a label, so that the multi-GPU path runs on a CPU too.
    Use as a context manager, or call close(): it stops the worker.
    """

    # A dead worker is replaced, so the parent never loses the GPU (the driver reads this).
    context_lost = False

    def __init__(
        self,
        kernel: str,
        problem: Any,
        dtype: torch.dtype,
        *,
        interpret: bool = False,
        settings: MeasureSettings = MeasureSettings(),
        limits: DeviceLimits | None = None,
        observer_factories: Sequence[Callable[[], Observer]] = (),
        timeout_s: float = DEFAULT_TIMEOUT_S,
        startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S,
        gpu: int | None = None,
    ):
        if not timeout_s > 0 or not startup_timeout_s > 0:
            raise OmnituneError(f"worker timeouts must be positive, got {timeout_s} s and {startup_timeout_s} s")
        self.kernel = kernel
        self.problem = problem
        self.dtype = dtype
        self.interpret = interpret
        self.settings = settings
        self.timeout_s = timeout_s
        self.startup_timeout_s = startup_timeout_s
        self.gpu = gpu
        self._visible_device = None if gpu is None or interpret else visible_device(gpu)
        self._setup_bytes = pickle.dumps(
            _Setup(problem, dtype, settings, limits, tuple(observer_factories))
        )
        self._context = multiprocessing.get_context("spawn")
        self._worker: _Worker | None = None
        self.workers_started = 0

    # --- what the driver calls -----------------------------------------------------------------

    def measure(self, config: Config) -> TrialResult:
        """Measure one config in the worker; a worker that dies or overruns timeout_s makes it
        CRASHED or TIMEOUT (the worker is replaced before the next call)."""
        outcome = self._call(_Method.MEASURE, (config,), self.timeout_s)
        if isinstance(outcome, _Reply):
            return outcome.value
        status, detail = self._failure(outcome)
        return TrialResult(config, status, detail=detail, representative=not self.interpret)

    def check(self, config: Config) -> tuple[TrialStatus, float, str]:
        """Runner.check in the worker: (status, relative error, detail)."""
        outcome = self._call(_Method.CHECK, (config,), self.timeout_s)
        if isinstance(outcome, _Reply):
            return outcome.value
        status, detail = self._failure(outcome)
        return status, math.nan, detail

    def time_interleaved(self, configs: Sequence[Config], rounds: int) -> list[list[float]]:
        """Runner.time_interleaved in the worker, allowed timeout_s per config. A worker that
        dies or overruns raises WorkerLost."""
        configs = list(configs)
        outcome = self._call(_Method.TIME_INTERLEAVED, (configs, rounds), self.timeout_s * max(1, len(configs)))
        if isinstance(outcome, _Reply):
            return outcome.value
        _, detail = self._failure(outcome)
        raise WorkerLost(f"re-timing the finalists: {detail}")

    # --- the worker's life ----------------------------------------------------------------------

    @property
    def worker_pid(self) -> int | None:
        """The pid of the running worker; None before the first call and after a failure (the
        next call starts a new one)."""
        return self._worker.pid if self._worker is not None else None

    def close(self) -> None:
        """Stop the worker and reap it. The runner can still be used: a later call starts a new one."""
        worker, self._worker = self._worker, None
        if worker is not None:
            worker.stop()

    def __enter__(self) -> IsolatedRunner:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _call(self, method: _Method, args: tuple, timeout_s: float) -> _Reply | _Died | _TimedOut:
        worker = self._running_worker()
        try:
            try:
                worker.conn.send(_Call(method, args))
            except (BrokenPipeError, ConnectionResetError):
                outcome = worker.died()  # it died just before this request: the same as during it
            else:
                outcome = worker.receive(timeout_s)
        except BaseException:
            # Ctrl-C (or a broken pipe) mid-request: the worker's state is unknown; replace it.
            self._discard(kill=True)
            raise
        if isinstance(outcome, _Raised):
            raise outcome.exception()
        if isinstance(outcome, _Reply):
            if outcome.context_lost:
                self._discard(kill=False)  # it exits by itself
            return outcome
        if isinstance(outcome, _TimedOut):
            self._discard(kill=True)
            return outcome
        if isinstance(outcome, _Died):
            self._discard(kill=False)
            return outcome
        self._discard(kill=True)
        raise WorkerLost(f"unexpected message from the worker: {type(outcome).__name__}")

    def _running_worker(self) -> _Worker:
        """The worker, started (and waited for) if there is none."""
        if self._worker is not None:
            if self._worker.process.is_alive():
                return self._worker
            self._discard(kill=False)  # died while idle (killed from outside): start afresh
        worker = _Worker(self._context, self.kernel, self.interpret, self._setup_bytes, self._visible_device)
        self.workers_started += 1
        try:
            ready = worker.receive(self.startup_timeout_s)
        except BaseException:
            worker.kill()
            raise
        if isinstance(ready, _Ready):
            self._worker = worker
            return worker
        worker.kill()
        if isinstance(ready, _Raised):
            raise ready.exception()
        if isinstance(ready, _TimedOut):
            raise WorkerStartError(
                f"the worker measuring {self.kernel} was not ready after {self.startup_timeout_s:g} s "
                "(importing the kernel and building its inputs and reference)"
            )
        why = ready.detail if isinstance(ready, _Died) else f"it sent {type(ready).__name__}"
        raise WorkerStartError(f"the worker measuring {self.kernel} died while starting ({why})")

    def _discard(self, *, kill: bool) -> None:
        worker, self._worker = self._worker, None
        if worker is None:
            return
        if kill:
            worker.kill()
        else:
            worker.stop()

    def _failure(self, outcome: _Died | _TimedOut) -> tuple[TrialStatus, str]:
        if isinstance(outcome, _TimedOut):
            return TrialStatus.TIMEOUT, (
                f"no result within {self.timeout_s:g} s (compile + check + timing); worker killed"
            )
        return TrialStatus.CRASHED, outcome.detail


def visible_device(index: int) -> str:
    """CUDA_VISIBLE_DEVICES for a worker that must see GPU `index` of the GPUs this process sees
    (an index into this process's own CUDA_VISIBLE_DEVICES when it has one)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None or not visible.strip():
        return str(index)
    entries = [e.strip() for e in visible.split(",") if e.strip()]
    if not 0 <= index < len(entries):
        raise OmnituneError(f"GPU {index} is not visible here: CUDA_VISIBLE_DEVICES={visible}")
    return entries[index]


def _exit_detail(exitcode: int | None) -> str:
    """'worker killed by SIGSEGV', 'worker exited with code 3': one line for the trial's detail."""
    if exitcode is None:
        return "worker stopped answering"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"worker killed by {name}"
    return f"worker exited with code {exitcode}"

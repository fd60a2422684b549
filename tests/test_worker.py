"""IsolatedRunner: candidates measured in a persistent worker process that a lethal config can
kill without killing the search.

The fault kernel (tests/fault_kernel.py) is named by its file, as a user names their own kernel,
so the worker imports it through omnitune.registry the same way. Every worker started costs a
fresh interpreter importing torch and Triton (1-2 s on a CPU): the tests start as few as they can.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import signal
import time
from pathlib import Path

import optuna
import pytest
import torch

from omnitune.errors import OmnituneError, UnknownKernelError
from omnitune.profile.device import current_device_facts
from omnitune.registry import get_spec
from omnitune.search.driver import StopReason, run_search
from omnitune.measure.runner import Runner
from omnitune.trial import TrialStatus
from omnitune.measure.worker import IsolatedRunner
from omnitune.spec import Config
from omnitune.store import open_db

optuna.logging.set_verbosity(optuna.logging.WARNING)

FAULT_KERNEL = str(Path(__file__).with_name("fault_kernel.py"))
FAULT_SPEC = get_spec(FAULT_KERNEL)
FAULT_PROBLEM = FAULT_SPEC.problem_type(n=100)
HANG_TIMEOUT_S = 3.0

# What each faulty config must come back as, and a word its detail must contain.
EXPECTED = {
    "raise_resources": (TrialStatus.OUT_OF_RESOURCES, "OutOfResources"),
    "compile_error": (TrialStatus.COMPILE_ERROR, "CompilationError"),
    "hang": (TrialStatus.TIMEOUT, f"no result within {HANG_TIMEOUT_S:g} s"),
    "abort": (TrialStatus.CRASHED, "SIGABRT"),
    "segfault": (TrialStatus.CRASHED, "SIGSEGV"),
    # On the CPU the interpreter's stand-in for an illegal memory access is a segfault.
    "illegal_access": (TrialStatus.CRASHED, "SIGSEGV"),
    "exit": (TrialStatus.CRASHED, "exited with code 3"),
}


def fault_config(fault: str, block: int = 16) -> Config:
    return Config(FAULT=fault, BLOCK=block)


def fault_runner(**kwargs) -> IsolatedRunner:
    return IsolatedRunner(FAULT_KERNEL, FAULT_PROBLEM, torch.float32, interpret=True, **kwargs)


def wait_until_exited(pid: int, timeout_s: float = 10.0) -> None:
    """Until our child `pid` can be waited for (without waiting for it): a signal is not instant."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
            return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} still running {timeout_s} s after SIGKILL")


def assert_reaped(pid: int) -> None:
    """The process is gone and was waited for: neither running nor a zombie."""
    assert pid not in {p.pid for p in multiprocessing.active_children()}
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def test_every_fault_gets_its_status_through_the_driver_and_the_search_completes(tmp_path):
    assert set(EXPECTED) | {"none"} == set(FAULT_SPEC.param("FAULT").choices)
    db = open_db(tmp_path / "results.db")
    runner = fault_runner(timeout_s=HANG_TIMEOUT_S)
    with runner:
        outcome = run_search(
            FAULT_SPEC, FAULT_PROBLEM, torch.float32, runner_factory=lambda: runner,
            device=current_device_facts(interpret=True), trials=100, sampler="grid",
            storage_url=f"sqlite:///{tmp_path / 'studies.optuna.db'}", db=db, finalists=0,
        )
        last_pid = runner.worker_pid
    assert outcome.stop_reason is StopReason.EXHAUSTED
    rows = {r["config_label"]: r for r in db.query("SELECT * FROM trials")}
    healthy = [fault_config("none", 16), fault_config("none", 32)]
    assert len(rows) == len(healthy) + len(EXPECTED)
    for config in healthy:
        row = rows[config.label()]
        assert row["status"] == "ok" and row["rel_error"] <= FAULT_SPEC.tolerance[torch.float32]
    for fault, (status, words) in EXPECTED.items():
        row = rows[fault_config(fault).label()]
        assert (row["status"], row["time_ms"]) == (status.value, None), fault
        assert words in row["detail"] and "\n" not in row["detail"], (fault, row["detail"])
    assert outcome.failures == {TrialStatus.OUT_OF_RESOURCES: 1, TrialStatus.COMPILE_ERROR: 1,
                                TrialStatus.TIMEOUT: 1, TrialStatus.CRASHED: 4}
    assert outcome.best is not None and outcome.best.config in healthy
    # The lethal faults come last in the grid: a worker was started for the first trial and
    # again after each of hang, abort, segfault and illegal_access; exit, the last trial, left
    # none behind.
    assert runner.workers_started == 5
    assert last_pid is None


def test_the_worker_serves_trial_after_trial_and_is_replaced_only_after_a_crash():
    with fault_runner() as runner:
        assert runner.worker_pid is None  # nothing started before something needs measuring
        first = runner.measure(fault_config("none", 16))
        pid = runner.worker_pid
        second = runner.measure(fault_config("none", 32))
        resources = runner.measure(fault_config("raise_resources"))
        assert (first.status, second.status) == (TrialStatus.OK, TrialStatus.OK)
        assert not first.representative  # the interpreter's times mean nothing
        assert resources.status is TrialStatus.OUT_OF_RESOURCES
        assert runner.worker_pid == pid and runner.workers_started == 1

        crashed = runner.measure(fault_config("exit"))
        assert crashed.status is TrialStatus.CRASHED and crashed.detail == "worker exited with code 3"
        assert not runner.context_lost  # the parent never held the dead worker's GPU context
        assert runner.worker_pid is None  # replaced lazily: only when the next trial comes
        assert_reaped(pid)

        again = runner.measure(fault_config("none", 16))
        new_pid = runner.worker_pid
        assert again.status is TrialStatus.OK and again.rel_error == first.rel_error
        assert new_pid not in (None, pid) and runner.workers_started == 2

        # A worker killed from outside while idle (the OOM killer, say) is replaced, not blamed.
        os.kill(new_pid, signal.SIGKILL)
        wait_until_exited(new_pid)
        assert runner.measure(fault_config("none", 32)).status is TrialStatus.OK
        last_pid = runner.worker_pid
        assert last_pid not in (None, pid, new_pid) and runner.workers_started == 3
        assert_reaped(new_pid)
    assert runner.worker_pid is None
    assert_reaped(last_pid)


def test_check_and_time_interleaved_are_forwarded_and_a_worker_exception_reaches_the_caller():
    with fault_runner() as runner:
        status, rel_error, detail = runner.check(fault_config("none", 32))
        assert (status, detail) == (TrialStatus.OK, "") and rel_error <= FAULT_SPEC.tolerance[torch.float32]
        assert runner.check(fault_config("compile_error"))[0] is TrialStatus.COMPILE_ERROR
        pid = runner.worker_pid
        # Runner.time_interleaved refuses the interpreter with an OmnituneError: it arrives as
        # itself (the CLI prints it on one line), and the worker lives on.
        with pytest.raises(OmnituneError, match="interleaved timing needs a GPU") as caught:
            runner.time_interleaved([fault_config("none", 16)], rounds=3)
        assert any("raised in the isolated worker" in note for note in caught.value.__notes__)
        assert runner.worker_pid == pid
        # A config missing a parameter breaks the constraint check: not a trial status, a bug.
        with pytest.raises(KeyError):
            runner.measure(Config(BLOCK=16))
        assert runner.measure(fault_config("none", 16)).status is TrialStatus.OK
        assert runner.worker_pid == pid
    assert_reaped(pid)


def test_a_kernel_the_worker_cannot_import_is_the_users_error(tmp_path):
    runner = fault_runner()
    runner.kernel = str(tmp_path / "no_such_kernel.py")  # as if the user had named this file
    with pytest.raises(UnknownKernelError, match="does not exist"):
        runner.measure(fault_config("none"))
    assert runner.worker_pid is None and runner.workers_started == 1
    runner.close()  # nothing to stop: harmless


@pytest.mark.parametrize(("timeout_s", "startup_timeout_s"), [(0.0, 10.0), (5.0, -1.0)])
def test_timeouts_must_be_positive(timeout_s, startup_timeout_s):
    with pytest.raises(OmnituneError, match="must be positive"):
        fault_runner(timeout_s=timeout_s, startup_timeout_s=startup_timeout_s)


def test_attention_in_a_worker_matches_the_in_process_runner(monkeypatch):
    from omnitune.kernels.attention import AttentionProblem

    spec = get_spec("attention")
    problem = AttentionProblem(b=1, h=2, hkv=1, lq=9, lk=21, d=64, causal=True)
    configs = [
        spec.default_config(problem, torch.float32),
        Config(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1, PACK_GQA=True, USE_TMA=False),
    ]
    in_process = Runner(spec, problem, torch.float32, interpret=True)
    expected = [in_process.measure(c) for c in configs]
    with IsolatedRunner("attention", problem, torch.float32, interpret=True) as runner:
        # The worker must switch the interpreter on itself, whatever the parent's environment says.
        with monkeypatch.context() as env:
            env.delenv("TRITON_INTERPRET", raising=False)
            isolated = [runner.measure(configs[0])]
        isolated.append(runner.measure(configs[1]))
    for want, got in zip(expected, isolated):
        assert want.status is TrialStatus.OK, want.detail
        assert (got.status, got.detail, got.representative) == (want.status, want.detail, want.representative)
        assert math.isfinite(got.rel_error) and got.rel_error == want.rel_error


def test_lethal_faults_measured_in_process_by_accident_only_fail_the_trial():
    runner = Runner(FAULT_SPEC, FAULT_PROBLEM, torch.float32, interpret=True)
    for fault in ("hang", "abort", "segfault", "illegal_access", "exit"):
        result = runner.measure(fault_config(fault))
        assert result.status is TrialStatus.LAUNCH_ERROR and "only inside an isolated worker" in result.detail


def test_cli_search_isolated_matches_in_process(tmp_path):
    """`omnitune search --isolate` measures through a worker and stores the same statuses."""
    import sqlite3

    from typer.testing import CliRunner

    from omnitune.cli import app

    shape = "b=1,h=2,hkv=1,lq=9,lk=13,d=64,causal=1"
    results = {}
    for mode in ("in-process", "isolated"):
        db = tmp_path / f"{mode}.db"
        args = ["search", "attention", "--shape", shape, "--dtype", "fp32", "--trials", "2", "--interpret",
                "--db", str(db)]
        if mode == "isolated":
            args += ["--isolate", "--trial-timeout", "60"]
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output
        results[mode] = sqlite3.connect(db).execute(
            "select config_json, status from trials order by trial_number").fetchall()
    assert results["isolated"] == results["in-process"]
    assert [s for _, s in results["isolated"]].count("ok") == 2


@pytest.mark.gpu
def test_a_real_illegal_memory_access_crashes_only_its_trial_and_the_healthy_configs_are_measured_after(tmp_path):
    """On a GPU: a store 4 TiB past the output poisons the worker's CUDA context; the trial is
    crashed, the worker replaced, and every healthy config after it measured on the GPU."""
    illegal = fault_config("illegal_access")
    healthy = [fault_config("none", 16), fault_config("none", 32)]
    with IsolatedRunner(FAULT_KERNEL, FAULT_PROBLEM, torch.float32, timeout_s=60) as runner:
        crashed = runner.measure(illegal)
        after = [runner.measure(c) for c in healthy]
        assert runner.workers_started == 2  # the poisoned worker was replaced once
    assert crashed.status is TrialStatus.CRASHED, crashed.detail
    assert "illegal memory access" in crashed.detail or "worker" in crashed.detail, crashed.detail
    for result in after:
        assert result.status is TrialStatus.OK and result.representative, result.detail
        assert result.rel_error <= FAULT_SPEC.tolerance[torch.float32] and result.time_ms > 0

    # The same through a whole isolated grid sweep: every fault its status, the search completes.
    db = open_db(tmp_path / "results.db")
    with fault_runner_on_gpu() as runner:
        outcome = run_search(
            FAULT_SPEC, FAULT_PROBLEM, torch.float32, runner_factory=lambda: runner,
            device=current_device_facts(interpret=False), trials=100, sampler="grid",
            storage_url=f"sqlite:///{tmp_path / 'studies.optuna.db'}", db=db, finalists=0,
        )
    assert outcome.stop_reason is StopReason.EXHAUSTED
    rows = {r["config_label"]: r for r in db.query("SELECT * FROM trials")}
    assert rows[illegal.label()]["status"] == "crashed"
    assert all(rows[c.label()]["status"] == "ok" for c in healthy)


def fault_runner_on_gpu() -> IsolatedRunner:
    # Long enough for a first compile on the GPU; the hang config costs this much.
    return IsolatedRunner(FAULT_KERNEL, FAULT_PROBLEM, torch.float32, timeout_s=10.0)

"""Several measuring processes on one study: `omnitune search --gpus` (one isolated worker per
GPU; under the interpreter the GPUs are CPU workers), `omnitune worker` processes sharing an
Optuna RDB storage (a SQLite file always; PostgreSQL when OMNITUNE_TEST_POSTGRES_URL names a
server, as .ci/run does), kill -9 of a search in the middle of its sweep, and heartbeats.

Every claim is checked against Optuna's storage itself, never against what a process says of
itself: one finished trial per config, the budget, the trials lost.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path

import optuna
import pytest
import torch
from optuna.trial import TrialState
from typer.testing import CliRunner

from omnitune.cli import app
from omnitune.profile.device import current_device_facts
from omnitune.registry import get_spec
from omnitune.search.driver import StopReason, run_search
from omnitune.measure.runner import Runner
from omnitune.trial import TrialStatus
from omnitune.spec import Config
from omnitune.store import config_from_attrs, open_optuna_storage, result_from_attrs

optuna.logging.set_verbosity(optuna.logging.WARNING)

REPO = Path(__file__).resolve().parents[1]
FAULT_KERNEL = str(Path(__file__).with_name("fault_kernel.py"))
FAULT_SPEC = get_spec(FAULT_KERNEL)
HANG_TIMEOUT_S = 1.5
# What each config of the fault kernel's grid must end as under the interpreter.
FAULT_STATUS = {
    "none": TrialStatus.OK,
    "raise_resources": TrialStatus.OUT_OF_RESOURCES,
    "compile_error": TrialStatus.COMPILE_ERROR,
    "hang": TrialStatus.TIMEOUT,
    "abort": TrialStatus.CRASHED,
    "segfault": TrialStatus.CRASHED,
    "illegal_access": TrialStatus.CRASHED,
    "exit": TrialStatus.CRASHED,
}
FAULT_CONFIGS = [Config(FAULT="none", BLOCK=32)] + [Config(FAULT=f, BLOCK=16) for f in FAULT_STATUS]
# The grid measures the default, then the spec's order: the healthy configs, then one of each
# fault up to the first segfault (each lethal fault costs a worker restart, ~2 s on a CPU; the
# full sweep is tests/test_worker.py's).
GRID_PREFIX = FAULT_CONFIGS[:7]
KV_SHAPE = "t=9,hkv=2,d=16,block_size=4"
POSTGRES_URL = os.environ.get("OMNITUNE_TEST_POSTGRES_URL")
# The CPU path of the machinery, as CI runs it: these tests run kernels through the interpreter,
# also in this process, where conftest compiles them for real when a GPU is present. The GPU
# path: tests/test_worker.py's gpu test and benchmarks/multi_gpu_throughput.py.
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-path tests (Triton's interpreter)")


def cli_env() -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(REPO), TRITON_INTERPRET="1", PYTHONUNBUFFERED="1")
    env.pop("OMNITUNE_DB", None)
    return env


def only_study(url: str) -> optuna.Study:
    storage = open_optuna_storage(url)
    summaries = optuna.study.get_all_study_summaries(storage, include_best_trial=False)
    assert len(summaries) == 1, [s.study_name for s in summaries]
    return optuna.load_study(study_name=summaries[0].study_name, storage=storage)


def measurements(study: optuna.Study) -> dict[Config, list[int]]:
    """Config -> the numbers of the finished trials that measured it (re-timings excluded)."""
    measured: dict[Config, list[int]] = {}
    for trial in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        result = result_from_attrs(trial.user_attrs)
        if result is not None and trial.user_attrs.get("chosen_by") != "finalist":
            measured.setdefault(result.config, []).append(trial.number)
    return measured


def assert_fault_sweep_complete(study: optuna.Study, configs: list[Config]) -> None:
    """Every config of `configs` measured exactly once, with its own status, and no other."""
    measured = measurements(study)
    assert set(measured) == set(configs)
    assert all(len(numbers) == 1 for numbers in measured.values()), measured
    for trial in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        result = result_from_attrs(trial.user_attrs)
        if result is not None:
            assert result.status is FAULT_STATUS[result.config["FAULT"]], (result.config, result.detail)


def test_gpus_two_interpreter_workers_share_the_fault_sweep(tmp_path):
    db = tmp_path / "results.db"
    result = CliRunner().invoke(app, [
        "search", FAULT_KERNEL, "--shape", "n=100", "--dtype", "fp32", "--interpret", "--sampler", "grid",
        "--trials", str(len(GRID_PREFIX)), "--gpus", "0,1", "--trial-timeout", str(HANG_TIMEOUT_S),
        "--db", str(db),
    ])
    assert result.exit_code == 0, result.output
    study = only_study(f"journal:///{tmp_path / 'results.optuna.log'}")  # the default storage
    assert [c["FAULT"] for c in GRID_PREFIX][-3:] == ["hang", "abort", "segfault"]
    assert_fault_sweep_complete(study, GRID_PREFIX)
    slots = [t.user_attrs.get("slot") for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
             if result_from_attrs(t.user_attrs) is not None]
    assert set(slots) == {0, 1}  # both workers measured
    # Every trial reached the catalogue too, from both threads.
    statuses = dict(sqlite3.connect(db).execute("SELECT config_json, status FROM trials").fetchall())
    assert {Config(**json.loads(c)): s for c, s in statuses.items()} == {
        c: FAULT_STATUS[c["FAULT"]].value for c in GRID_PREFIX
    }


@pytest.mark.parametrize(("gpus", "message"), [
    ("a,b", "GPU indices separated by commas"),
    ("0,0", "names a GPU twice"),
    (",", "GPU indices separated by commas"),
])
def test_gpus_must_be_distinct_indices(tmp_path, gpus, message):
    result = CliRunner().invoke(app, [
        "search", FAULT_KERNEL, "--shape", "n=100", "--dtype", "fp32", "--interpret", "--gpus", gpus,
        "--db", str(tmp_path / "r.db"),
    ])
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output


def children_of(pid: int) -> list[int]:
    children = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                children.append(int(entry.name))
    return children


def is_running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's zombie waits for a reaper that may never come here)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def finished_trials(journal: Path) -> int:
    """COMPLETE trials in the search's journal (read without a lock: a reader never takes one)."""
    if not journal.exists():
        return 0
    storage = open_optuna_storage(f"journal:///{journal}")
    return sum(len(storage.get_all_trials(study._study_id, deepcopy=False, states=(TrialState.COMPLETE,)))
               for study in storage.get_all_studies())


def test_kill_9_mid_sweep_loses_at_most_one_trial_per_worker_and_the_rerun_completes(tmp_path):
    db = tmp_path / "results.db"
    journal = tmp_path / "results.optuna.log"  # the default storage
    trials = 14
    args = [sys.executable, "-m", "omnitune", "search", "kv_cache_write", "--shape", KV_SHAPE, "--dtype", "fp32",
            "--interpret", "--sampler", "random", "--trials", str(trials), "--gpus", "0,1", "--db", str(db)]
    search = subprocess.Popen(args, env=cli_env(), cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while finished_trials(journal) < 3:
            assert search.poll() is None, search.stderr.read().decode()
            assert time.monotonic() < deadline, "the search finished no 3 trials in 60 s"
            time.sleep(0.02)
        children = children_of(search.pid)  # the two workers and multiprocessing's resource tracker
        workers = [pid for pid in children if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()]
        search.send_signal(signal.SIGKILL)
        search.wait(10)
    finally:
        if search.poll() is None:
            search.kill()
    # The workers notice that their parent is gone and exit: no orphan keeps its GPU.
    deadline = time.monotonic() + 10
    while any(is_running(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(workers) == 2 and not any(is_running(pid) for pid in children)

    url = f"journal:///{journal}"
    study = only_study(url)
    before = measurements(study)
    assert 0 < sum(len(n) for n in before.values()) < trials + 20  # killed mid-sweep
    lost = [t for t in study.get_trials(deepcopy=False) if t.state is TrialState.RUNNING]
    assert len(lost) <= 2  # at most the trial in flight on each of the two workers

    # Resumed in this process (quicker than two fresh workers): the storage is what resumes.
    rerun = CliRunner().invoke(app, args[3:args.index("--gpus")] + ["--db", str(db)])
    assert rerun.exit_code == 0, rerun.output
    study = only_study(url)
    after = measurements(study)
    assert all(len(numbers) == 1 for numbers in after.values()), after  # nothing measured twice
    assert {c: n for c, n in after.items() if c in before} == before  # the rerun kept every finished trial
    statuses = [result_from_attrs(study.trials[n[0]].user_attrs).status for n in after.values()]
    assert sum(s is not TrialStatus.PRUNED for s in statuses) == trials
    failed = {t.number for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,))}
    assert {t.number for t in lost} <= failed  # the abandoned trials were failed: their configs are free again


def worker_args(url: str, db: Path, trials: int) -> list[str]:
    # --no-isolate: kv_cache_write's configs are all safe, and a worker subprocess per worker
    # would double the interpreters started (torch and Triton imported: seconds of CPU each).
    return [sys.executable, "-m", "omnitune", "worker", "kv_cache_write", "--storage", url, "--shape", KV_SHAPE,
            "--dtype", "fp32", "--trials", str(trials), "--interpret", "--db", str(db), "--heartbeat", "2",
            "--no-isolate"]


def fresh_postgres_database() -> str:
    """A database of its own on the test server, so that runs never see each other's studies."""
    import psycopg

    from omnitune.store import storage_url_for_driver

    name = "omnitune_" + uuid.uuid4().hex[:12]
    plain = storage_url_for_driver(POSTGRES_URL).replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(plain, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    base, _, _ = POSTGRES_URL.rpartition("/")
    return f"{base}/{name}"


@pytest.mark.parametrize("backend", [
    "sqlite",
    pytest.param("postgresql", marks=pytest.mark.skipif(
        POSTGRES_URL is None, reason="OMNITUNE_TEST_POSTGRES_URL is not set (.ci/run starts a PostgreSQL server)")),
])
def test_several_workers_share_one_study_within_the_budget_measuring_no_config_twice(tmp_path, backend):
    url = f"sqlite:///{tmp_path / 'shared.db'}" if backend == "sqlite" else fresh_postgres_database()
    trials = 7
    workers = [subprocess.Popen(worker_args(url, tmp_path / f"worker{i}.db", trials), env=cli_env(), cwd=tmp_path,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    for worker in workers:
        out, err = worker.communicate(timeout=120)
        assert worker.returncode == 0, err + out
    study = only_study(url)
    assert study.study_name.startswith("kv_cache_write|")
    measured = measurements(study)
    assert all(len(numbers) == 1 for numbers in measured.values()), measured
    ok_or_failed = [c for c, _ in measured.items()
                    if result_from_attrs(study.trials[measured[c][0]].user_attrs).status is not TrialStatus.PRUNED]
    assert len(ok_or_failed) == trials  # the budget, exactly, across the workers
    owners = {t.user_attrs["owner"] for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
              if "owner" in t.user_attrs}
    # Measured by these workers (how the trials split between them depends on which started first).
    assert owners and {owner.rpartition(":")[2] for owner in owners} <= {str(w.pid) for w in workers}
    assert not [t for t in study.get_trials(deepcopy=False) if t.state is TrialState.RUNNING]

    # The local catalogue and report read the shared storage.
    db = tmp_path / "local.db"
    report = CliRunner().invoke(app, ["report", "--db", str(db), "--storage", url, "--format", "json"])
    assert report.exit_code == 0, report.output
    rows = sqlite3.connect(db).execute("SELECT config_json FROM trials WHERE status != 'pruned'").fetchall()
    assert {Config(**json.loads(c)) for (c,) in rows} == set(ok_or_failed)


@pytest.mark.filterwarnings("ignore:Heartbeat of storage")  # this test asks a trial itself
def test_a_trial_whose_heartbeat_stopped_is_failed_and_retried(tmp_path):
    """A worker on another host died mid-trial: its heartbeat stops, the next worker fails the
    trial and measures its config again (once)."""
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    problem = FAULT_SPEC.problem_type(n=100)
    device = current_device_facts(interpret=True)
    dead_config = Config(FAULT="none", BLOCK=32)
    runner = Runner(FAULT_SPEC, problem, torch.float32, interpret=True)

    def search(trials: int):
        return run_search(FAULT_SPEC, problem, torch.float32, runner_factory=lambda: runner, device=device,
                          trials=trials, storage_url=url, sampler="grid", finalists=0, heartbeat_interval_s=1)

    assert search(trials=1).stop_reason is StopReason.BUDGET  # creates the study: the default only
    storage = open_optuna_storage(url, heartbeat_interval_s=1)
    study = optuna.load_study(study_name=only_study(url).study_name, storage=storage)
    from omnitune.search.space import ConfigSpace
    from omnitune.store import config_json

    space = ConfigSpace(FAULT_SPEC)
    study.enqueue_trial(space.encode(dead_config))
    trial = study.ask(space.distributions)
    trial.set_user_attr("owner", "another-host:1")  # not on this host: only its heartbeat can tell
    trial.set_user_attr("config_json", config_json(dead_config))
    storage.record_heartbeat(trial._trial_id)
    with sqlite3.connect(tmp_path / "shared.db") as conn:  # its last heartbeat, an hour ago
        conn.execute("UPDATE trial_heartbeats SET heartbeat = datetime('now', '-1 hour')")

    outcome = search(trials=3)
    study = only_study(url)
    assert study.trials[trial.number].state is TrialState.FAIL
    assert outcome.measured_total == 3
    measured = measurements(study)
    assert all(len(numbers) == 1 for numbers in measured.values())
    retried = study.trials[measured[dead_config][0]]
    assert retried.system_attrs.get("failed_trial") == trial.number  # the storage's retry, not a new pick
    assert config_from_attrs(retried.user_attrs) == dead_config


def test_a_plain_postgresql_url_uses_psycopg_3():
    from omnitune.store import storage_url_for_driver

    assert storage_url_for_driver("postgresql://u:p@h:5/db") == "postgresql+psycopg://u:p@h:5/db"
    assert storage_url_for_driver("postgres://h/db") == "postgresql+psycopg://h/db"
    assert storage_url_for_driver("postgresql+psycopg://h/db") == "postgresql+psycopg://h/db"
    assert storage_url_for_driver("sqlite:///x.db") == "sqlite:///x.db"


def test_an_unreachable_postgresql_storage_is_one_error_without_the_password(tmp_path):
    result = CliRunner().invoke(app, [
        "worker", "kv_cache_write", "--storage", "postgresql://me:secret@127.0.0.1:1/none", "--shape", KV_SHAPE,
        "--dtype", "fp32", "--interpret", "--db", str(tmp_path / "r.db"),
    ])
    assert result.exit_code == 2, result.output
    assert "cannot open the Optuna storage" in result.output and "secret" not in result.output
    assert "Traceback" not in result.output


def test_a_worker_measures_its_try_configs_right_after_the_default(tmp_path):
    """worker --try, as search --try: the given config is the study's second trial, chosen_by "given"."""
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    spec = get_spec("kv_cache_write")
    problem = spec.parse_shape(KV_SHAPE)
    tried = spec.complete_config({"BLOCK_T": 2}, problem, torch.float32)
    assert tried != spec.default_config(problem, torch.float32)
    result = subprocess.run([*worker_args(url, tmp_path / "worker.db", 3), "--try", '{"BLOCK_T": 2}'],
                            env=cli_env(), cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr + result.stdout
    trials = sorted(only_study(url).get_trials(deepcopy=False, states=(TrialState.COMPLETE,)), key=lambda t: t.number)
    assert result_from_attrs(trials[0].user_attrs).config == spec.default_config(problem, torch.float32)
    assert result_from_attrs(trials[1].user_attrs).config == tried
    assert trials[1].user_attrs["measurement"]["chosen_by"] == "given"


def test_a_worker_refuses_a_bad_try_config_in_one_line(tmp_path):
    result = subprocess.run([*worker_args(f"sqlite:///{tmp_path / 'shared.db'}", tmp_path / "worker.db", 3),
                             "--try", '{"BLOCK_Q": 2}'], env=cli_env(), cwd=tmp_path, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "kv_cache_write has no parameter 'BLOCK_Q'" in lines[0], result.stderr
    assert not (tmp_path / "shared.db").exists()

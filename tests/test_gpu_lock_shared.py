"""A search alone on its GPU shares a GPU lock with its compile workers (gpu_lock.shared_with_compile_workers)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from omnitune.cli.search_cmd import workers_share_the_gpu_lock
from omnitune.measure import gpu_lock
from omnitune.measure.precompile import compile_processes, end_workers


def _lock_path_seen_by_worker() -> str | None:
    return os.environ.get(gpu_lock.GPU_LOCK_ENV)


def test_a_search_alone_gets_a_lock_for_as_long_as_it_lasts(monkeypatch):
    monkeypatch.delenv(gpu_lock.GPU_LOCK_ENV, raising=False)
    assert gpu_lock.gpu_lock_from_env() is gpu_lock.NO_GPU_LOCK
    with gpu_lock.shared_with_compile_workers():
        path = os.environ[gpu_lock.GPU_LOCK_ENV]
        lock = gpu_lock.gpu_lock_from_env()
        assert isinstance(lock, gpu_lock.GpuLock) and lock.path == path
        with lock:
            assert Path(path).exists()
    assert gpu_lock.GPU_LOCK_ENV not in os.environ
    assert not Path(path).parent.exists()  # its folder goes with it
    assert gpu_lock.gpu_lock_from_env() is gpu_lock.NO_GPU_LOCK


def test_a_lane_keeps_the_lock_its_session_gave_it(monkeypatch, tmp_path):
    lanes = str(tmp_path / "gpu.lock")
    monkeypatch.setenv(gpu_lock.GPU_LOCK_ENV, lanes)
    with gpu_lock.shared_with_compile_workers():
        assert os.environ[gpu_lock.GPU_LOCK_ENV] == lanes
    assert os.environ[gpu_lock.GPU_LOCK_ENV] == lanes


def test_compile_workers_started_inside_hold_the_same_lock(monkeypatch):
    """The workers take the environment they are started with (precompile._start_worker), so a
    launch they cannot capture waits for the search's timings (tests/test_precompile.py shows the
    wait itself on a GPU)."""
    monkeypatch.delenv(gpu_lock.GPU_LOCK_ENV, raising=False)
    with gpu_lock.shared_with_compile_workers():
        pool = compile_processes(2)
        try:
            seen = {pool.submit(_lock_path_seen_by_worker).result(timeout=120) for _ in range(4)}
        finally:
            end_workers(pool)
        assert seen == {os.environ[gpu_lock.GPU_LOCK_ENV]}


def test_the_lock_is_undone_when_the_search_fails(monkeypatch):
    monkeypatch.delenv(gpu_lock.GPU_LOCK_ENV, raising=False)
    with pytest.raises(RuntimeError), gpu_lock.shared_with_compile_workers():
        raise RuntimeError("a search that failed")
    assert gpu_lock.GPU_LOCK_ENV not in os.environ


@pytest.mark.parametrize(("workers", "interpret", "gpus", "shared"), [
    (8, False, None, True),      # a search alone on a GPU with compile workers
    (0, False, None, False),     # no workers: nothing to share with
    (8, True, None, False),      # the interpreter: no GPU
    (8, False, [0, 1], False),   # --gpus: one lock would serialize the GPUs' measurements
])
def test_which_searches_share_it(workers, interpret, gpus, shared):
    assert workers_share_the_gpu_lock(workers, interpret=interpret, gpus=gpus) is shared


@pytest.mark.gpu
def test_a_search_alone_on_the_gpu_shares_its_lock_with_its_workers_and_finishes(tmp_path, monkeypatch):
    """kv_compress's launch cannot be captured (it reads lengths back to the host), so its compile
    workers launch it for real, under the lock the search shares with them: the search must still
    measure every trial, and leave no lock behind."""
    import sqlite3

    from typer.testing import CliRunner

    from omnitune.cli import app

    monkeypatch.delenv(gpu_lock.GPU_LOCK_ENV, raising=False)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))  # the workers compile, not load
    entered = []
    real = gpu_lock.shared_with_compile_workers

    def recording():
        entered.append(True)
        return real()

    monkeypatch.setattr(gpu_lock, "shared_with_compile_workers", recording)
    db = tmp_path / "omnitune.db"
    shapes = ["--shape", "b=1,h=4,hkv=2,n=256,d=64,window=8,recent=4,keep_pct=25",
              "--shape", "b=2,h=4,hkv=2,n=320,d=64,window=8,recent=4,keep_pct=25"]
    result = CliRunner().invoke(app, ["search", "kv_compress", *shapes, "--dtype", "bf16", "-n", "6",
                                      "--lanes", "1", "--precompile", "4", "--db", str(db)])
    assert result.exit_code == 0, result.output
    assert entered == [True]
    assert gpu_lock.GPU_LOCK_ENV not in os.environ
    with sqlite3.connect(db) as rows:
        counted = rows.execute("select problem_key, count(*), sum(status = 'ok') from trials "
                               "where extra_json not like '%\"finalist\"%' group by problem_key").fetchall()
    assert len(counted) == 2 and all(trials == 6 and ok >= 1 for _, trials, ok in counted), counted


@pytest.mark.parametrize("junk", ["/nonexistent/folder/x", "relative.lock", " ", "{folder}"])
def test_a_lock_variable_left_over_in_the_shell_is_ignored_with_a_warning(junk, monkeypatch, tmp_path, caplog):
    """A leftover that names no usable lock file (a missing folder, a folder, a blank) failed every
    measurement of verify, which blamed the tables; it is ignored, and a search alone makes its own."""
    value = junk.format(folder=tmp_path)
    monkeypatch.setenv(gpu_lock.GPU_LOCK_ENV, value)
    monkeypatch.chdir(tmp_path)
    with caplog.at_level("WARNING", logger="omnitune.measure.gpu_lock"):
        assert gpu_lock.gpu_lock_from_env() is gpu_lock.NO_GPU_LOCK
    assert f"ignoring {gpu_lock.GPU_LOCK_ENV}={value!r}" in caplog.text or value in gpu_lock._ignored_paths
    with gpu_lock.shared_with_compile_workers():
        lock = gpu_lock.gpu_lock_from_env()
        assert isinstance(lock, gpu_lock.GpuLock) and lock.path != value
        with lock:
            assert Path(lock.path).is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing made where the junk pointed

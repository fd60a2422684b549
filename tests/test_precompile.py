"""Parallel precompilation: worker processes launch each config once (filling Triton's cache);
failures are reported, never raised, and the measuring process is untouched."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import multiprocessing
import os
import time
from pathlib import Path

import pytest
import torch

from omnitune import registry
from omnitune.registry import get_spec
from omnitune.measure.precompile import PrecompileReport, _importable_name, precompile
from omnitune.spec import Config

FAULT_KERNEL = str(Path(__file__).with_name("fault_kernel.py"))


def test_healthy_configs_all_compile_and_progress_is_reported():
    spec = get_spec("kv_cache_write")
    problem = spec.parse_shape("t=9,hkv=2,d=16,block_size=4")
    configs = spec.valid_configs(problem, torch.float16)[:3]
    seen = []
    report = precompile(spec, problem, torch.float16, configs + configs[:1], device="cpu", workers=2,
                        on_done=lambda done, total: seen.append((done, total)))
    assert report.compiled == 3 and not report.failed  # the duplicate is launched once
    assert seen[-1] == (3, 3)
    assert report.cpu_s > 0  # the workers' own CPU time, reported back with each config
    assert "precompiled 3 configs" in report.summary() and "s of their CPU" in report.summary()


def test_failing_configs_are_reported_not_raised():
    spec = get_spec(FAULT_KERNEL)
    problem = spec.parse_shape("n=40")
    healthy = Config(FAULT="none", BLOCK=32)
    faulty = [Config(FAULT="raise_resources", BLOCK=16), Config(FAULT="compile_error", BLOCK=16)]
    report = precompile(spec, problem, torch.float32, [healthy, *faulty], device="cpu", workers=2)
    assert report.compiled == 1
    assert set(report.failed) == set(faulty)
    assert "OutOfResources" in report.failed[faulty[0]]
    assert "CompilationError" in report.failed[faulty[1]]
    # The summary says why, with the commonest reason: a pool whose every config fails says so.
    assert "2 did not compile or launch" in report.summary() and "1 with " in report.summary()
    same = PrecompileReport(0, {c: "RuntimeError: CUDA driver initialization failed" for c in faulty}, 1.0, 2)
    assert same.summary().endswith("all with RuntimeError: CUDA driver initialization failed")


def test_a_file_kernel_is_found_again_by_its_path():
    assert _importable_name(get_spec(FAULT_KERNEL)) == FAULT_KERNEL
    assert _importable_name(get_spec("attention")) == "attention"


def test_nothing_to_compile():
    spec = get_spec("kv_cache_write")
    report = precompile(spec, spec.example_problem, torch.float16, [], device="cpu")
    assert report.compiled == 0 and report.workers == 0


def test_the_pool_compiles_configs_as_they_are_submitted_and_ready_waits_for_them():
    from omnitune.measure.ahead import PrecompilePool

    spec = get_spec("kv_cache_write")
    problem = spec.parse_shape("t=9,hkv=2,d=16,block_size=4")
    configs = spec.valid_configs(problem, torch.float16)[:3]
    with PrecompilePool(spec, problem, torch.float16, workers=2, device="cpu") as pool:
        pool.submit(configs[:2])
        pool.submit(configs[1:])  # a config submitted twice is compiled once
        for config in configs:
            pool.ready(config)
        pool.ready(Config(BLOCK=1))  # never submitted: returns at once
        report = pool.report()
    # ready() may cancel a config no worker had started (the measuring process compiles it then).
    assert report.compiled + len(report.failed) <= 3 and not report.failed
    assert len(pool.futures) == 3


def test_a_worker_makes_its_inputs_without_the_seeded_cpu_draws(monkeypatch):
    """A precompile worker's launch only compiles, so its inputs are drawn on the target device
    (not from the seed on the CPU, which took seconds per worker at decode's largest shapes): the
    same shapes, strides and dtypes as the measuring process's inputs, other values."""
    from omnitune.kernels import _host
    from omnitune.measure import precompile as pre

    monkeypatch.setattr(_host, "_draw_on_target", False)
    monkeypatch.setattr(pre, "_problem_state", {})
    spec = get_spec("paged_decode_attention")
    key = "b=2,h=4,hkv=2,lq=1,ctx=40,d=32,block_size=16"
    seeded = spec.make_inputs(spec.parse_shape(key), torch.float32, "cpu", 0)
    pre._set_problem("paged_decode_attention", key, torch.float32, "cpu")
    _, inputs = pre._inputs_and_spec()
    assert _host._draw_on_target  # the worker switched its own process
    for name in ("q", "key_cache", "value_cache", "block_tables"):
        mine, theirs = getattr(inputs, name), getattr(seeded, name)
        assert (mine.shape, mine.stride(), mine.dtype) == (theirs.shape, theirs.stride(), theirs.dtype)
    assert not torch.equal(inputs.q, seeded.q)  # drawn elsewhere: the seed's numbers are not spent
    assert pre._launch_once(spec.default_config(spec.parse_shape(key), torch.float32).as_dict()) is None


def test_the_problems_of_a_search_share_the_worker_processes():
    """Starting 14 interpreters that import torch and Triton for every problem was a fixed cost
    per problem: the pools of consecutive problems hand their configs to the same processes, and a
    worker switches to the next problem's inputs on its first config of it."""
    from omnitune.measure import ahead

    ahead.close_shared_workers()
    spec = get_spec("kv_cache_write")
    first, second = (spec.parse_shape(key) for key in ("t=9,hkv=2,d=16,block_size=4", "t=5,hkv=1,d=32,block_size=8"))
    try:
        with ahead.PrecompilePool(spec, first, torch.float16, workers=2, device="cpu") as pool:
            configs = spec.valid_configs(first, torch.float16)[:2]
            pool.submit(configs)
            for future in pool.futures.values():
                assert future.result(timeout=120).error is None
            processes = set(pool.pool._processes)
        with ahead.PrecompilePool(spec, second, torch.float16, workers=2, device="cpu") as again:
            assert again.pool is pool.pool  # the same executor, still running
            again.submit(spec.valid_configs(second, torch.float16)[:2])
            for future in again.futures.values():
                assert future.result(timeout=120).error is None
            assert set(again.pool._processes) == processes
    finally:
        ahead.close_shared_workers()


def test_a_worker_switches_problems_and_drops_the_previous_inputs(monkeypatch):
    from omnitune.kernels import _host
    from omnitune.measure import precompile as pre

    monkeypatch.setattr(_host, "_draw_on_target", False)  # a worker's switch, undone for this process
    monkeypatch.setattr(pre, "_problem_state", {})
    spec = get_spec("kv_cache_write")
    for key in ("t=9,hkv=2,d=16,block_size=4", "t=5,hkv=1,d=32,block_size=8"):
        identity = ("kv_cache_write", key, torch.float16, "cpu")
        config = spec.default_config(spec.parse_shape(key), torch.float16).as_dict()
        assert pre._launch_for(identity, config).error is None
        assert pre._problem_state["identity"] == identity
        assert pre._problem_state["inputs"].key.shape[0] == spec.parse_shape(key).t


def test_a_worker_still_busy_when_its_problem_ends_is_not_handed_the_next(monkeypatch):
    """A config that hangs its worker past the problem's search would hold a process of the next
    problem's pool: then the processes are ended and the next problem starts fresh ones; a pool a
    dead worker broke is started again on the next submit."""
    from omnitune.measure import ahead
    from omnitune.measure.worker import WORKER_ENV

    ahead.close_shared_workers()
    monkeypatch.setenv(WORKER_ENV, "1")  # the fault kernel's lethal faults fire only in workers
    spec = get_spec(FAULT_KERNEL)
    problem = spec.parse_shape("n=40")
    try:
        with ahead.PrecompilePool(spec, problem, torch.float32, workers=1, device="cpu") as pool:
            pool.submit([Config(FAULT="hang", BLOCK=32)])
            hung = pool.pool
            deadline = time.monotonic() + 60
            while not pool.futures[Config(FAULT="hang", BLOCK=32)].running() and time.monotonic() < deadline:
                time.sleep(0.05)
        assert ahead._SHARED.executor is None  # ended, not handed on
        with ahead.PrecompilePool(spec, problem, torch.float32, workers=1, device="cpu") as pool:
            assert pool.pool is not hung
            pool.submit([Config(FAULT="exit", BLOCK=32)])
            with pytest.raises(Exception):
                pool.futures[Config(FAULT="exit", BLOCK=32)].result(timeout=120)  # the worker died
            pool.submit([Config(FAULT="none", BLOCK=32)])  # a broken pool is started again
            assert pool.futures[Config(FAULT="none", BLOCK=32)].result(timeout=120).error is None
    finally:
        ahead.close_shared_workers()


def test_a_pool_prepared_ahead_submits_again_what_the_previous_problems_end_killed():
    """The next problem's pool is opened while the one before it still runs; when that one's end
    kills the shared processes (a hung worker), the prepared configs go to fresh ones."""
    from omnitune.measure import ahead

    ahead.close_shared_workers()
    spec = get_spec("kv_cache_write")
    problem = spec.parse_shape("t=5,hkv=1,d=32,block_size=8")
    config = spec.default_config(problem, torch.float16)
    try:
        prepared = ahead.PrecompilePool(spec, problem, torch.float16, workers=1, device="cpu")
        prepared.submit([config])
        killed = prepared.pool
        ahead.close_shared_workers()  # as the previous problem's close does with a hung worker
        prepared.revive()
        assert prepared.pool is not killed
        assert prepared.futures[config].result(timeout=120).error is None
    finally:
        ahead.close_shared_workers()


@pytest.mark.gpu
def test_a_worker_on_the_gpu_compiles_by_capture_and_puts_nothing_on_the_gpu(monkeypatch):
    """Another process may be timing its kernels: a worker's launch is captured into a graph that is
    thrown away. The KV write writes into its output's caches, so a launch that ran would show."""
    from omnitune.measure import precompile as pre
    from omnitune.measure.capture_load import CaptureLoader

    spec = get_spec("kv_cache_write")
    problem = spec.parse_shape("t=37,hkv=2,d=64,block_size=16")
    inputs = spec.make_inputs(problem, torch.bfloat16, "cuda", 0)
    worker_out = spec.new_output(inputs)  # as _inputs_and_spec makes it: once a problem, poisoned
    monkeypatch.setattr(pre, "_problem_state", {"spec": spec, "inputs": inputs, "out": worker_out})
    monkeypatch.setattr(pre, "_capture", CaptureLoader())
    def same(a, b):  # the poisoned slots are NaN, which torch.equal never finds equal
        return torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0))

    configs = spec.valid_configs(problem, torch.bfloat16)
    for config in (configs[0], configs[-1]):
        assert pre._launch_once(config.as_dict()) is None
        torch.cuda.synchronize()
        assert same(worker_out, spec.new_output(inputs))  # untouched, the poison still there: nothing ran
        assert pre._capture.usable and not torch.cuda.is_current_stream_capturing()
        ran = spec.new_output(inputs)
        spec.launch(inputs, ran, config)  # the same launch for real writes the caches, rightly
        assert not same(ran, worker_out)
        assert spec.compare(ran, spec.reference(inputs)) <= spec.tolerance[torch.bfloat16]


@pytest.mark.skipif("forkserver" not in multiprocessing.get_all_start_methods(), reason="no fork server here")
def test_compile_workers_start_with_the_kernels_imported_and_take_this_process_environment(monkeypatch):
    from omnitune.measure.precompile import compile_processes
    from omnitune.measure.worker_server import WORKER_PRELOAD
    from tests.worker_probe import imported

    first = compile_processes(1)
    assert first.submit(os.getpid).result(timeout=120) != os.getpid()  # the fork server is up from here on
    first.shutdown()
    monkeypatch.setenv("OMNITUNE_WORKER_PROBE", "set after the fork server started")
    pool = compile_processes(1)
    try:
        assert pool.submit(imported, list(WORKER_PRELOAD)).result(timeout=120) == list(WORKER_PRELOAD)
        seen = pool.submit(os.getenv, "OMNITUNE_WORKER_PROBE").result(timeout=120)
        assert seen == "set after the fork server started"
    finally:
        pool.shutdown()


@pytest.mark.gpu
def test_workers_forked_from_the_preloaded_server_compile_on_the_gpu():
    """No module the fork server preloads may initialize CUDA: its workers could then not use it,
    and every config would fail to precompile (what a launcher asking torch.cuda.is_available()
    at import did)."""
    from omnitune.measure import ahead

    ahead.close_shared_workers()
    torch.cuda.init()  # this process holds a CUDA context, as a search does
    spec = get_spec("kv_cache_write")
    problem = spec.parse_shape("t=37,hkv=2,d=64,block_size=16")
    configs = spec.valid_configs(problem, torch.bfloat16)[:2]
    report = precompile(spec, problem, torch.bfloat16, configs, device="cuda", workers=2)
    assert report.compiled == 2 and not report.failed, report.summary()


def test_importing_what_the_fork_server_preloads_never_asks_for_cuda():
    """What initializes CUDA in the fork server (torch.cuda.is_available() does, on a CUDA build)
    leaves its workers unable to use it; the GPU test above sees that, this one sees the cause on
    any machine: a fresh interpreter imports WORKER_PRELOAD with torch.cuda's queries counted."""
    import subprocess
    import sys

    script = (
        "import torch\n"
        "asked = []\n"
        "for name in ('is_available', 'device_count', 'init', 'get_device_capability', 'get_device_properties'):\n"
        "    setattr(torch.cuda, name, lambda *a, name=name, **k: asked.append(name))\n"
        "from omnitune.measure.worker_server import WORKER_PRELOAD\n"
        "for module in WORKER_PRELOAD:\n"
        "    __import__(module)\n"
        "print(len(WORKER_PRELOAD), asked)\n"
    )
    # As on a GPU: kernels compiled, not interpreted (an interpreted one never asks).
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                         cwd=Path(__file__).resolve().parents[1], env=env)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split()[0].isdigit() and int(run.stdout.split()[0]) >= 5
    assert run.stdout.strip().endswith("[]"), run.stdout


def test_a_workers_gpu_work_holds_the_lanes_gpu_lock(monkeypatch, tmp_path):
    """Drawing a problem's inputs and a launch that could not be captured put work on the GPU: a
    worker does both under its lane's GPU lock (never beside another lane's timings); off the GPU,
    or in a search alone, there is nothing to hold."""
    from omnitune.kernels import _host
    from omnitune.measure import gpu_lock
    from omnitune.measure import precompile as pre

    monkeypatch.delenv(gpu_lock.GPU_LOCK_ENV, raising=False)
    assert pre._alone_on_the_gpu("cuda") is gpu_lock.NO_GPU_LOCK
    monkeypatch.setenv(gpu_lock.GPU_LOCK_ENV, str(tmp_path / "gpu.lock"))
    held = pre._alone_on_the_gpu("cuda")
    assert isinstance(held, gpu_lock.GpuLock) and held is gpu_lock.gpu_lock_from_env()
    assert not isinstance(pre._alone_on_the_gpu("cpu"), gpu_lock.GpuLock)

    # Where the worker holds it: around the inputs it draws and around a real launch.
    inside, events = [], []

    class Recording:
        def __enter__(self):
            inside.append(True)

        def __exit__(self, *exc):
            inside.pop()

    monkeypatch.setattr(pre, "_alone_on_the_gpu", lambda device: Recording())
    monkeypatch.setattr(_host, "_draw_on_target", False)
    monkeypatch.setattr(pre, "_problem_state", {})
    spec = get_spec("kv_cache_write")
    key = "t=9,hkv=2,d=16,block_size=4"
    real_make, real_launch = spec.make_inputs, spec.launch
    traced = dataclasses.replace(
        spec, make_inputs=lambda *a: events.append(("inputs", bool(inside))) or real_make(*a),
        launch=lambda *a: events.append(("launch", bool(inside))) or real_launch(*a))
    monkeypatch.setattr("omnitune.registry.get_spec", lambda name: traced)
    pre._set_problem("kv_cache_write", key, torch.float16, "cpu")
    assert pre._launch_once(spec.default_config(spec.parse_shape(key), torch.float16).as_dict()) is None
    assert events == [("inputs", True), ("launch", True)]


@pytest.mark.gpu
def test_a_worker_draws_its_inputs_only_when_no_lane_holds_the_gpu(monkeypatch, tmp_path):
    from omnitune.measure import ahead, gpu_lock
    from omnitune.measure import precompile as pre

    ahead.close_shared_workers()
    monkeypatch.setenv(gpu_lock.GPU_LOCK_ENV, str(tmp_path / "gpu.lock"))
    spec = get_spec("kv_cache_write")
    key = "t=37,hkv=2,d=64,block_size=16"
    config = spec.default_config(spec.parse_shape(key), torch.bfloat16).as_dict()
    pool = pre.compile_processes(1)
    try:
        # The worker started, with a CUDA context and this config compiled, on another problem: from
        # here it takes well under a second to switch to the next one when nothing holds the GPU.
        warm = ("kv_cache_write", "t=33,hkv=2,d=64,block_size=16", torch.bfloat16, "cuda")
        assert pool.submit(pre._launch_for, warm, config).result(timeout=300).error is None
        with gpu_lock.GpuLock(tmp_path / "gpu.lock"):  # a lane timing its kernels
            future = pool.submit(pre._launch_for, ("kv_cache_write", key, torch.bfloat16, "cuda"), config)
            with pytest.raises(concurrent.futures.TimeoutError):
                future.result(timeout=5)
        assert future.result(timeout=120).error is None
    finally:
        pre.end_workers(pool)


def test_a_worker_puts_no_work_on_the_gpu_outside_the_lanes_lock(monkeypatch):
    """A worker's inputs and the output its launches are given (poisoned: a fill kernel on a GPU)
    are made once per problem, while it holds the lanes' GPU lock, never per config outside it:
    another process's kernels beside a lane's check or timing are what round 34 X2 tripped over."""
    from contextlib import contextmanager

    from omnitune.kernels import _host
    from omnitune.measure import precompile as pre

    monkeypatch.setattr(_host, "_draw_on_target", False)
    monkeypatch.setattr(pre, "_problem_state", {})
    held = []

    @contextmanager
    def lock(device):
        held.append(True)
        try:
            yield
        finally:
            held.pop()

    monkeypatch.setattr(pre, "_alone_on_the_gpu", lock)
    shipped = get_spec("kv_cache_write")
    made = []

    def new_output(inputs):
        made.append(bool(held))
        return shipped.new_output(inputs)

    spec = dataclasses.replace(shipped, new_output=new_output)
    monkeypatch.setattr(registry, "get_spec", lambda name: spec)
    key = "t=9,hkv=2,d=16,block_size=4"
    identity = ("kv_cache_write", key, torch.float16, "cpu")
    configs = spec.valid_configs(spec.parse_shape(key), torch.float16)[:3]
    assert len(configs) == 3
    for config in configs:
        assert pre._launch_for(identity, config.as_dict()).error is None
    assert made == [True]  # once for the problem, under the lock

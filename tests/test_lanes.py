"""Lanes (omnitune.search.lanes): several search processes sharing one GPU under one lock
(omnitune.measure.gpu_lock), each problem searched by the first lane that claims it — the lock's
exclusion across processes, the runner holding it for its GPU work only, the claims, and
`omnitune search --lanes` end to end under the interpreter on a temporary database."""

from __future__ import annotations

import multiprocessing
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time

import pytest
import torch
from typer.testing import CliRunner

from omnitune.cli import app
from omnitune.measure.cuda_start import start_cuda_context
from omnitune.measure.gpu_lock import DETAILED_HOLDINGS, GPU_LOCK_ENV, NO_GPU_LOCK, GpuLock, gpu_lock_from_env
from omnitune.search.lanes import STOP_FILE, LaneProcesses, LaneSession, LanesResult, run_lanes
from omnitune.spec import Config, DeviceLimits
from tests.test_cli_startup import _run
from tests.test_prepare_next import DTYPE, KEYS, _ahead

ON_GPU = torch.cuda.is_available()
MODE = [] if ON_GPU else ["--interpret"]
SHAPES = ["b=1,h=2,hkv=1,lq=17,lk=23,d=64,causal=1", "b=1,h=2,hkv=1,lq=9,lk=23,d=64,causal=1",
          "b=1,h=2,hkv=2,lq=17,lk=17,d=64,causal=0"]


# --- the lock ---------------------------------------------------------------------------------------


def _hold_and_log(path: str, log: str, rounds: int, hold_s: float) -> None:
    lock = GpuLock(path)
    for _ in range(rounds):
        with lock:
            began = time.monotonic()
            time.sleep(hold_s)
            with open(log, "a") as f:
                f.write(f"{os.getpid()} {began} {time.monotonic()}\n")


def test_the_gpu_lock_lets_one_process_at_a_time_hold_it(tmp_path):
    path, log = str(tmp_path / "gpu.lock"), str(tmp_path / "held.log")
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_hold_and_log, args=(path, log, 5, 0.02)) for _ in range(3)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
        assert w.exitcode == 0
    spans = sorted((float(a), float(b), pid) for pid, a, b in (line.split() for line in open(log)))
    assert len(spans) == 15 and len({pid for *_, pid in spans}) == 3
    for (_, end, _), (start, _, _) in zip(spans, spans[1:]):
        assert start >= end  # never two holders at once


def _hold_forever(path: str, ready: str) -> None:
    lock = GpuLock(path)
    lock.__enter__()
    open(ready, "w").close()
    time.sleep(600)


def test_a_holder_that_dies_frees_the_lock(tmp_path):
    path, ready = str(tmp_path / "gpu.lock"), str(tmp_path / "ready")
    holder = multiprocessing.get_context("spawn").Process(target=_hold_forever, args=(path, ready))
    holder.start()
    deadline = time.monotonic() + 60
    while not os.path.exists(ready) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert os.path.exists(ready)
    got = threading.Event()

    def take():
        with GpuLock(path):
            got.set()

    taker = threading.Thread(target=take, daemon=True)
    taker.start()
    assert not got.wait(0.5)  # held by the other process
    holder.kill()
    holder.join()
    assert got.wait(10)


def test_the_lock_is_reentrant_and_accounts_for_its_time(tmp_path):
    lock = GpuLock(tmp_path / "gpu.lock")
    with lock:
        with lock:  # a reference computed inside a measurement takes it again
            time.sleep(0.01)
        assert lock._owner is not None
    assert lock._owner is None and lock.acquisitions == 1
    assert lock.held_s >= 0.01 and lock.waited_s >= 0
    # One holding, however deep, with when it began and ended; and what the holder said it was for.
    assert len(lock.holdings) == 1 and lock.holdings[0][1] - lock.holdings[0][0] >= 0.01
    lock.spent("timing", 0.25)
    lock.spent("timing", 0.5)
    assert lock.phase_s == {"timing": 0.75}
    # A process alone on its GPU counts its time but keeps no holdings (nothing lays them beside others').
    before = len(NO_GPU_LOCK.holdings)
    with NO_GPU_LOCK:
        pass
    assert len(NO_GPU_LOCK.holdings) == before


def test_what_the_first_holdings_were_spent_on_is_kept(tmp_path):
    lock = GpuLock(tmp_path / "gpu.lock")
    for round_ in range(DETAILED_HOLDINGS + 3):
        with lock:
            lock.spent("inputs", 0.5 + round_)
            with lock:  # taken again inside: the same holding
                lock.spent("timing", 0.25)
    first = lock.first_phases
    assert len(first) == DETAILED_HOLDINGS and len(lock.holdings) == DETAILED_HOLDINGS + 3
    assert first[:2] == [{"inputs": 0.5, "timing": 0.25}, {"inputs": 1.5, "timing": 0.25}]
    assert first[-1] == {"inputs": 0.5 + DETAILED_HOLDINGS - 1, "timing": 0.25}


def test_the_cuda_context_made_ahead_says_why_not_where_there_is_no_gpu(monkeypatch):
    monkeypatch.setattr(torch, "empty", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("no driver\nmore")))
    started = start_cuda_context()
    started.wait(timeout_s=30)
    stats = started.as_stats()
    assert stats["cuda_start_error"] == "RuntimeError: no driver"  # one line; the lane's first GPU call says the rest
    assert stats["cuda_start_began"] <= stats["cuda_start_ended"]


@pytest.mark.gpu
def test_the_cuda_context_is_made_ahead_in_a_thread():
    code = ("import torch; from omnitune.measure.cuda_start import start_cuda_context\n"
            "started = start_cuda_context(); started.wait()\n"
            "assert started.error is None, started.error\n"
            "assert torch.cuda.is_initialized()\n"
            "print('made', started.ended - started.began)")
    assert _run(code).startswith("made ")


def test_a_lane_finds_its_lock_in_the_environment_and_a_lone_process_has_none(tmp_path, monkeypatch):
    monkeypatch.delenv(GPU_LOCK_ENV, raising=False)
    assert gpu_lock_from_env() is NO_GPU_LOCK
    monkeypatch.setenv(GPU_LOCK_ENV, str(tmp_path / "gpu.lock"))
    lock = gpu_lock_from_env()
    assert isinstance(lock, GpuLock) and gpu_lock_from_env() is lock  # one per process: its accounting is the lane's


# --- the runner holds it for GPU work, and only then --------------------------------------------------


class RecordingLock:
    def __init__(self):
        self.depth = 0
        self.entered = 0
        self.phases: list[tuple[str, int, float]] = []  # (phase, depth when told, seconds)

    def spent(self, phase, seconds):
        self.phases.append((phase, self.depth, seconds))

    def __enter__(self):
        self.depth += 1
        self.entered += 1
        return self

    def __exit__(self, *exc):
        self.depth -= 1


def test_the_runner_draws_the_inputs_computes_the_reference_and_checks_each_config_under_the_lock(device):
    from omnitune.measure.runner import Runner
    from omnitune.registry import get_spec

    spec = get_spec("attention")
    problem = spec.parse_shape(SHAPES[0])
    lock = RecordingLock()
    seen = []
    original_inputs, original_reference, original_launch = spec.make_inputs, spec.reference, spec.launch

    def make_inputs(*args):
        seen.append(("inputs", lock.depth))
        return original_inputs(*args)

    def reference(inputs):
        seen.append(("reference", lock.depth))
        return original_reference(inputs)

    def launch(inputs, out, config):
        seen.append(("launch", lock.depth))
        return original_launch(inputs, out, config)

    import dataclasses

    watched = dataclasses.replace(spec, make_inputs=make_inputs, reference=reference, launch=launch)
    dtype = torch.float32
    runner = Runner(watched, problem, dtype, interpret=device == "cpu", gpu_lock=lock)
    assert seen == [("inputs", 1), ("reference", 1)] and lock.depth == 0
    config = spec.default_config(problem, dtype)
    result = runner.measure(config)
    assert result.status.value == "ok"
    assert seen[2:] and all(depth == 1 for name, depth in seen[2:])  # every launch under the lock
    assert lock.depth == 0 and lock.entered == 2
    # What the lock was held for is told while it is held, each phase's time never negative.
    timed = ["telemetry", "warm-up", "timing", "telemetry"] if device == "cuda" else []  # none under the interpreter
    assert [phase for phase, _, _ in lock.phases] == ["inputs", "reference", "checking", *timed]
    assert all(depth == 1 and seconds >= 0 for _, depth, seconds in lock.phases)
    # A config a constraint rejects is pruned without the GPU, so without the lock.
    bad = Config({**config.as_dict(), "BLOCK_M": 128, "BLOCK_N": 128, "num_stages": 4})
    assert spec.violations(problem, bad, dtype, runner.limits)
    assert runner.measure(bad).status.value == "pruned" and lock.entered == 2


# --- claims ----------------------------------------------------------------------------------------------


def test_each_problem_goes_to_the_first_lane_that_claims_it(tmp_path):
    first, second = LaneSession(tmp_path, 0), LaneSession(tmp_path, 1)
    key = ("attention", "b=1,h=2", "fp16")
    assert first.claim(key)  # nobody held it
    assert first.claim(key)  # its own claim, asked again
    assert not second.claim(key) and first.claim(key)  # the other lane's, whoever asks again
    many = [("kv_cache_write", f"t={t}", "bf16") for t in range(40)]
    won: dict[int, list] = {0: [], 1: []}

    def claim_all(session):
        for k in many:
            if session.claim(k):
                won[session.index].append(k)

    threads = [threading.Thread(target=claim_all, args=(s,)) for s in (first, second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(won[0] + won[1]) == sorted(many)  # every problem once, none twice


def test_a_lane_started_after_ctrl_c_stops_before_searching(tmp_path):
    session = LaneSession(tmp_path, 0)
    previous = signal.getsignal(signal.SIGINT)
    try:
        session.take_interrupts()  # not interrupted: nothing happens
        (tmp_path / STOP_FILE).touch()
        with pytest.raises(KeyboardInterrupt):
            session.take_interrupts()
    finally:
        signal.signal(signal.SIGINT, previous)


def test_the_next_problem_prepared_ahead_is_claimed_first_and_passes_over_those_other_lanes_claimed(tmp_path):
    from omnitune.registry import get_spec

    spec = get_spec("kv_cache_write")
    problems = [spec.parse_shape(key) for key in KEYS]
    log: list = []
    ahead, _ = _ahead(spec, problems, log)
    other, this = LaneSession(tmp_path, 1), LaneSession(tmp_path, 0)
    other.claim(ahead.keys[1])  # another lane searches the second
    ahead.claim = this.claim
    ahead.prepare_after(spec, problems[0], DTYPE, limits=DeviceLimits(), device_key="cpu")
    assert log and log[0] == ("open", spec.problem_key(problems[2]))  # the third is prepared instead
    # ... and claimed by this lane before its configs were handed to the workers: another lane
    # looking ahead from the same place passes over it, and this lane's search still takes it.
    assert not other.claim(ahead.keys[2]) and this.claim(ahead.keys[2])
    other_ahead, _ = _ahead(spec, problems, other_log := [])
    other_ahead.claim = other.claim
    other_ahead.prepare_after(spec, problems[0], DTYPE, limits=DeviceLimits(), device_key="cpu")
    assert [entry[:2] for entry in other_log if entry[0] == "open"] == [("open", spec.problem_key(problems[1]))]  # its own, never the third


# --- run_lanes and the session's exit code ---------------------------------------------------------


def test_run_lanes_relays_each_lanes_lines_and_reports_their_exit_codes(tmp_path):
    lines: list[tuple[int, str]] = []
    commands = [[sys.executable, "-c", "print('one'); print('two')"],
                [sys.executable, "-c", "import sys; print('three'); sys.exit(3)"]]
    result = run_lanes(commands, tmp_path, echo=lambda lane, line: lines.append((lane, line)))
    assert sorted(lines) == [(0, "one"), (0, "two"), (1, "three")]
    assert result.returncodes == [0, 3] and result.returncode == 3
    assert LanesResult([0, 130, 1], 1.0, []).returncode == 130
    assert LanesResult([0, 0], 1.0, [{"gpu_lock_held_s": 1.5}, {"gpu_lock_held_s": 2.0}]).gpu_held_s == 3.5


_WAITING_LANE = """
import sys
from omnitune.search.lanes import LaneSession
print("starting", flush=True)
lane = LaneSession(sys.argv[1], int(sys.argv[2]))
settings = lane.wait_for_go()
assert settings is None or lane.ready_at <= lane.go_at  # what the session's lane stats report
print("called off" if settings is None else f"go {settings['lanes']}", flush=True)
"""


def test_lanes_started_early_say_nothing_until_the_go_and_take_its_settings(tmp_path):
    lines: list[tuple[int, str]] = []
    commands = [[sys.executable, "-c", _WAITING_LANE, str(tmp_path), str(i)] for i in range(2)]
    started = LaneProcesses(commands, tmp_path, echo=lambda lane, line: lines.append((lane, line)))
    time.sleep(1.0)
    assert lines == []  # their first lines are held back
    started.go({"lanes": 2})
    result = started.wait()
    assert result.returncodes == [0, 0]
    assert sorted(lines) == [(0, "go 2"), (0, "starting"), (1, "go 2"), (1, "starting")]


def test_lanes_called_off_end_without_a_word(tmp_path):
    lines: list[tuple[int, str]] = []
    sleeper = [sys.executable, "-c", "print('starting', flush=True); import time; time.sleep(600)"]
    started = LaneProcesses([sleeper, sleeper], tmp_path, echo=lambda lane, line: lines.append((lane, line)))
    time.sleep(0.5)
    began = time.monotonic()
    started.cancel()
    assert time.monotonic() - began < 30 and all(p.poll() is not None for p in started.processes)
    assert lines == []
    # A lane still waiting for the go when its session calls it off hears it from the stop file.
    assert LaneSession(tmp_path, 0).wait_for_go() is None


def test_a_lane_whose_session_died_before_it_looked_is_called_off(tmp_path):
    # The session gives its pid: a lane that reads its parent only after starting would take the
    # init process (its new parent) for the session and wait for ever.
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    env = dict(os.environ, OMNITUNE_LANE_SESSION_PID=str(gone.pid))
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-c", _WAITING_LANE, str(tmp_path), "0"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.splitlines() == ["starting", "called off"], done.stderr
    assert time.monotonic() - began < 30


_SEARCHING_LANE = """
import os, signal, sys, time
from omnitune.search.lanes import LaneSession
signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a lane starts
session = LaneSession(sys.argv[1], 0)
assert session.wait_for_go() is not None
session.take_interrupts()
print("searching", flush=True)
try:
    time.sleep(600)
except KeyboardInterrupt:
    open(sys.argv[2] + ".part", "w").write("interrupted")
    os.replace(sys.argv[2] + ".part", sys.argv[2])  # whole, never seen half-written
"""

_SESSION = """
import os, subprocess, sys, time
env = dict(os.environ, OMNITUNE_LANE_SESSION_PID=str(os.getpid()))
lane = subprocess.Popen([sys.executable, "-c", sys.argv[3], sys.argv[1], sys.argv[2]], env=env,
                        stdout=subprocess.PIPE, text=True)
open(os.path.join(sys.argv[1], "go"), "w").write("{}")
assert lane.stdout.readline().strip() == "searching"
print(lane.pid, flush=True)
time.sleep(600)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_a_searching_lane_stops_as_on_ctrl_c_when_its_session_is_killed(tmp_path):
    marker = tmp_path / "lane-ended"
    session = subprocess.Popen([sys.executable, "-c", _SESSION, str(tmp_path), str(marker), _SEARCHING_LANE],
                               stdout=subprocess.PIPE, text=True)
    lane_pid = int(session.stdout.readline())
    session.kill()
    session.wait()
    deadline = time.monotonic() + 30
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    try:
        assert marker.read_text() == "interrupted"
    finally:
        try:
            os.kill(lane_pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_lanes_start_early_only_where_the_search_will_likely_run_in_lanes():
    from omnitune.cli.search_lanes import DEFAULT_LANES, lanes_to_start

    common = {"dtype": None, "interpret": False, "isolate": False, "gpus": None}
    assert lanes_to_start(None, shapes=0, model="qwen2.5-omni-7b", **common) == DEFAULT_LANES
    assert lanes_to_start(None, shapes=2, model=None, **common) == DEFAULT_LANES
    assert lanes_to_start(None, shapes=1, model=None, **common) == 0  # one problem: searched in-process
    assert lanes_to_start(None, shapes=1, model=None, **{**common, "dtype": "bf16,fp16"}) == DEFAULT_LANES
    assert lanes_to_start(1, shapes=0, model="qwen2.5-omni-7b", **common) == 0
    assert lanes_to_start(None, shapes=3, model=None, **{**common, "interpret": True}) == 0
    assert lanes_to_start(2, shapes=3, model=None, **{**common, "interpret": True}) == 2
    assert lanes_to_start(None, shapes=3, model=None, **{**common, "isolate": True}) == 0
    assert lanes_to_start(None, shapes=3, model=None, **{**common, "gpus": "0,1"}) == 0


def test_the_session_says_what_the_lanes_held_the_gpu_for():
    from omnitune.cli.search_lanes import lanes_summary

    stats = [{"gpu_lock_held_s": 6.0, "gpu_lock_phase_s": {"timing": 4.0, "checking": 1.0}},
             {"gpu_lock_held_s": 4.0, "gpu_lock_phase_s": {"timing": 3.0, "reference": 0.01}}]
    result = LanesResult([0, 0], 20.0, stats)
    assert result.held_by_phase == {"timing": 7.0, "checking": 1.0, "reference": 0.01}
    assert lanes_summary(result, 2) == ("2 lanes: 20.0 s in all; a lane held the GPU 10.0 s of it (50%): "
                                        "timing 7.0 s, checking 1.0 s, the rest 2.0 s")
    assert lanes_summary(LanesResult([0], 2.0, [{"gpu_lock_held_s": 1.0}]), 1) == (
        "1 lanes: 2.0 s in all; a lane held the GPU 1.0 s of it (50%)")


# --- omnitune search --lanes, for real -------------------------------------------------------------------


def _trials_per_study(db) -> dict[str, int]:
    """Measured trials per problem, the finalists' re-timings (stored as trials too) left out."""
    conn = sqlite3.connect(db)
    try:
        return dict(conn.execute("SELECT problem_key, COUNT(*) FROM trials WHERE status = 'ok' AND "
                                 "extra_json NOT LIKE '%\"finalist\"%' GROUP BY problem_key"))
    finally:
        conn.close()


def test_search_in_lanes_searches_each_problem_once_and_resumes(tmp_db):
    args = ["search", "attention", *sum((["--shape", s] for s in SHAPES), []), "--dtype", "fp32", *MODE,
            "--db", str(tmp_db), "--trials", "2", "--finalists", "0", "--lanes", "2"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "searching in 2 lanes" in result.output
    started = re.findall(r"^([01])│ searching attention (\S+)", result.output, re.M)
    assert sorted(key for _, key in started) == sorted(f"{s},spans=0,span_len=0" for s in SHAPES)
    assert {lane for lane, _ in started} <= {"0", "1"}
    counts = _trials_per_study(tmp_db)
    assert sorted(counts) == sorted(f"{s},spans=0,span_len=0" for s in SHAPES)
    assert set(counts.values()) == {2}
    assert re.search(r"2 lanes: [\d.]+ s in all; a lane held the GPU", result.output)
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0, again.output
    assert again.output.count("(0 new)") == 3 and _trials_per_study(tmp_db) == counts


def test_a_mistake_found_while_the_lanes_start_is_said_once_and_the_lanes_say_nothing(tmp_db):
    bad = ["b=1,h=2,hkv=1,lq=17,lk=23,d=48", "b=1,h=2,hkv=1,lq=9,lk=23,d=64"]  # d=48: not a supported head dim
    args = ["search", "attention", *sum((["--shape", s] for s in bad), []), "--dtype", "fp32", *MODE,
            "--db", str(tmp_db), "--trials", "1", "--lanes", "2"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code != 0
    assert result.output.count("head dim d=48") == 1 and "│" not in result.output
    assert not tmp_db.exists()  # nothing written


def test_lanes_started_for_more_problems_than_there_are_leave_the_extra_lanes_out(tmp_db):
    args = ["search", "attention", "--shape", SHAPES[0], "--shape", SHAPES[2], "--dtype", "fp32", *MODE,
            "--db", str(tmp_db), "--trials", "1", "--finalists", "0", "--lanes", "3"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "searching in 2 lanes" in result.output and "2 lanes: " in result.output
    assert not re.search(r"^2│", result.output, re.M)  # the third lane started, was told it is not needed, said nothing
    assert sorted(_trials_per_study(tmp_db)) == sorted(f"{s},spans=0,span_len=0" for s in (SHAPES[0], SHAPES[2]))


def test_lanes_default_on_a_gpu_and_never_exceed_the_problems():
    from omnitune.cli.search_lanes import DEFAULT_LANES, lanes_to_run
    from omnitune.errors import OmnituneError

    assert lanes_to_run(None, 10, interpret=True, isolate=False, gpus=None, in_lane=False) == 1
    assert lanes_to_run(None, 10, interpret=False, isolate=False, gpus=None, in_lane=False) == DEFAULT_LANES
    assert lanes_to_run(None, 1, interpret=False, isolate=False, gpus=None, in_lane=False) == 1
    assert lanes_to_run(5, 2, interpret=True, isolate=False, gpus=None, in_lane=False) == 2
    assert lanes_to_run(4, 9, interpret=False, isolate=False, gpus=None, in_lane=True) == 1
    assert lanes_to_run(None, 9, interpret=False, isolate=False, gpus=[0, 1], in_lane=False) == 1
    with pytest.raises(OmnituneError, match="--lanes share one GPU"):
        lanes_to_run(2, 9, interpret=False, isolate=False, gpus=[0, 1], in_lane=False)


def test_each_lane_gets_twice_its_share_of_the_compile_processes_and_starts_on_another_kernel():
    from omnitune.cli.search_lanes import in_lane_order, lane_workers

    assert lane_workers(14, 3) == 9 and lane_workers(14, 1) == 14 and lane_workers(14, 2) == 14
    assert lane_workers(2, 8) == 1 and lane_workers(0, 3) == 0  # at least one; none when off
    kernels = ["attention", "kv_cache_write", "paged_decode_attention", "cross_attention_layer"]
    orders = [in_lane_order(kernels, lane) for lane in range(5)]
    assert [order[0] for order in orders] == kernels + kernels[:1]  # lane 4 goes round to the first
    assert all(sorted(order) == sorted(kernels) for order in orders)  # every lane may reach every kernel
    assert orders[2] == ["paged_decode_attention", "cross_attention_layer", "attention", "kv_cache_write"]
    assert in_lane_order([], 3) == []


def test_even_lanes_take_a_kernels_problems_longest_first_and_odd_lanes_shortest_first():
    from omnitune.cli.search_cmd import _SearchTarget
    from omnitune.cli.search_lanes import problems_in_lane_order
    from omnitune.registry import get_spec

    writes = get_spec("kv_cache_write")
    shapes = ["t=64,hkv=4,d=128,block_size=16", "t=16384,hkv=4,d=128,block_size=16", "t=4,hkv=4,d=128,block_size=16"]
    target = _SearchTarget("kv_cache_write", writes, torch.float16, [writes.parse_shape(s) for s in shapes])
    assert [p.t for p in problems_in_lane_order(target, 0).problems] == [16384, 64, 4]
    assert [p.t for p in problems_in_lane_order(target, 3).problems] == [4, 64, 16384]
    assert [p.t for p in problems_in_lane_order(target, 2).problems] == [16384, 64, 4]
    assert [p.t for p in target.problems] == [64, 16384, 4]  # the session's own list is left as it was
    # Compute against bytes: a long causal prefill outweighs a decode that moves more bytes per FLOP.
    attention = get_spec("attention")
    prefill = attention.parse_shape("b=1,h=28,hkv=4,lq=8192,lk=8192,d=128,causal=1")
    decode = attention.parse_shape("b=4,h=28,hkv=4,lq=1,lk=4096,d=128")
    target = _SearchTarget("attention", attention, torch.float16, [decode, prefill])
    assert problems_in_lane_order(target, 0).problems == [prefill, decode]


def test_compile_processes_run_at_a_lower_priority_than_the_search():
    from omnitune.measure.precompile import COMPILE_NICENESS, compile_processes

    pool = compile_processes(1)
    try:
        assert pool.submit(os.nice, 0).result(timeout=120) == min(19, os.nice(0) + COMPILE_NICENESS)
    finally:
        pool.shutdown()


def test_lanes_is_explained_in_the_help():
    result = CliRunner().invoke(app, ["search", "--help"])
    assert "--lanes" in result.output and "--lane-session" not in result.output


# --- on the GPU -------------------------------------------------------------------------------------------


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().view(torch.uint8).clone()


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["attention", "kv_cache_write", "paged_decode_attention", "cross_attention_layer",
                                    "kv_compress"])
def test_a_lane_loads_each_config_without_running_it_then_measures_it_under_the_lock(kernel, tmp_path):
    from omnitune.measure.runner import Runner
    from omnitune.registry import get_spec

    spec = get_spec(kernel)
    dtype = torch.bfloat16 if torch.bfloat16 in spec.tolerance else torch.float16
    lock = GpuLock(tmp_path / "gpu.lock")
    runner = Runner(spec, spec.example_problem, dtype, gpu_lock=lock)
    assert runner._loads_ahead and runner._capture_out is not None
    configs = [spec.default_config(spec.example_problem, dtype),
               *spec.known_good_configs(spec.example_problem, dtype, runner.limits)][:3]
    for config in configs:
        if spec.violations(spec.example_problem, config, dtype, runner.limits):
            continue
        before = _bits(runner._capture_out) if isinstance(runner._capture_out, torch.Tensor) else None
        runner._load_without_running(config)
        torch.cuda.synchronize()
        assert runner._loads_ahead, f"{kernel} {config}: its launch could not be captured"
        if before is not None:
            assert torch.equal(_bits(runner._capture_out), before)  # captured, never run
        held = lock.held_s
        result = runner.measure(config)
        assert result.status.value == "ok", (kernel, config, result.detail)
        assert lock.held_s > held and lock._owner is None


def _compiled_keys_after_loading_ahead(kernel: str, lock_path: str) -> list[str]:
    """In a fresh process (nothing compiled or bound yet): load the default config ahead, measure
    it, and say which compiled facts its trial kept."""
    from omnitune.measure.runner import Runner
    from omnitune.registry import get_spec

    spec = get_spec(kernel)
    runner = Runner(spec, spec.example_problem, torch.bfloat16, gpu_lock=GpuLock(lock_path))
    config = spec.default_config(spec.example_problem, torch.bfloat16)
    runner._load_without_running(config)
    result = runner.measure(config)
    assert result.status.value == "ok", result.detail
    return sorted({k for facts in result.extra.get("compiled", [result.extra]) for k in facts})


@pytest.mark.gpu
def test_the_compilers_facts_of_a_config_loaded_ahead_reach_its_trial(tmp_path):
    import concurrent.futures

    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as pool:
        keys = pool.submit(_compiled_keys_after_loading_ahead, "attention", str(tmp_path / "gpu.lock")).result(300)
    assert "compiled_registers_per_thread" in keys and "compiled_shared_memory_bytes" in keys


@pytest.mark.gpu
def test_search_in_lanes_on_the_gpu(tmp_db):
    args = ["search", "attention", *sum((["--shape", s] for s in SHAPES), []), "--dtype", "bf16", "--db", str(tmp_db),
            "--trials", "4", "--finalists", "2", "--lanes", "2", "--precompile", "2"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    counts = _trials_per_study(tmp_db)
    assert sorted(counts) == sorted(f"{s},spans=0,span_len=0" for s in SHAPES) and set(counts.values()) == {4}
    held = float(re.search(r"a lane held the GPU ([\d.]+) s", result.output).group(1))
    assert held > 0


@pytest.mark.gpu
def test_a_launch_that_cannot_be_captured_is_loaded_under_the_lock_instead(tmp_path):
    import dataclasses

    from omnitune.measure.runner import Runner
    from omnitune.registry import get_spec

    spec = get_spec("attention")
    original = spec.launch

    def syncing_launch(inputs, out, config):
        torch.cuda.synchronize()  # not allowed while a stream is captured: the capture fails
        return original(inputs, out, config)

    syncing = dataclasses.replace(spec, launch=syncing_launch)
    runner = Runner(syncing, spec.example_problem, torch.bfloat16, gpu_lock=GpuLock(tmp_path / "gpu.lock"))
    config = spec.default_config(spec.example_problem, torch.bfloat16)
    for _ in range(2):
        runner._load_without_running(config)
        assert not torch.cuda.is_current_stream_capturing()
        result = runner.measure(config)
        assert result.status.value == "ok", result.detail

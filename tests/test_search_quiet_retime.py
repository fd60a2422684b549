"""An op whose timed call syncs the host (KernelSpec.syncs_host: kv_compress) has its finalists
re-timed on a quiet host: the search's compile-ahead pool settles first (configs no worker has
started withdrawn, those a worker holds waited for) and the next problem is prepared
(on_trials_claimed) only after the re-timing. Other ops keep the overlap. In lanes, the session
re-times such an op's finalists itself once every lane has ended. The fake runner and toy spec of
test_search_driver; real futures for the pool; processes and a GPU only in the gpu-marked test."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import threading
import time

import pytest
import torch

from omnitune.measure.ahead import PrecompilePool
from omnitune.registry import all_specs, get_spec
from omnitune.search.driver import RetimeStatus, SearchInterrupted, StopReason, run_search
from omnitune.spec import Config, KernelSpec
from tests.test_compile_ahead import FakePool
from tests.test_search_driver import DEVICE, PROBLEM, TOY_SPEC, VALID, FakeRunner, toy_time_ms

SYNCING_SPEC = dataclasses.replace(TOY_SPEC, syncs_host=True)


class RetimingRunner(FakeRunner):
    """Also re-times finalists (each config's toy time), noting in `events` when it began and ended."""

    def __init__(self, events: list[str], *, interrupt_retiming: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.events = events
        self.interrupt_retiming = interrupt_retiming

    def time_interleaved(self, configs, rounds):
        self.events.append("retime began")
        if self.interrupt_retiming:
            raise KeyboardInterrupt
        samples = [[toy_time_ms(c)] * rounds for c in configs]
        self.events.append("retime ended")
        return samples


class SettlingPool(FakePool):
    """A FakePool that notes in `events` when it is settled."""

    def __init__(self, runner: FakeRunner, workers: int, events: list[str]):
        super().__init__(runner, workers)
        self.events = events

    def settle(self):
        self.events.append("settled")


def _search(spec: KernelSpec, storage_url: str, events: list[str], *, runner: FakeRunner | None = None,
            trials: int = 8, **kwargs):
    """A search with a settling pool, 3 finalists, and on_trials_claimed noted as "told"."""
    runner = runner or RetimingRunner(events)
    settings = {"compile_ahead": SettlingPool(runner, workers=3, events=events), "finalists": 3,
                "finalist_rounds": 3, "on_trials_claimed": lambda: events.append("told")} | kwargs
    return run_search(spec, PROBLEM, torch.float32, runner_factory=lambda: runner, device=DEVICE,
                      trials=trials, storage_url=storage_url, **settings)


@pytest.fixture
def storage_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'studies.optuna.db'}"


# --- the driver ----------------------------------------------------------------------------------


def test_a_host_syncing_op_settles_its_pool_and_prepares_the_next_problem_after_its_finalists(storage_url):
    events: list[str] = []
    outcome = _search(SYNCING_SPEC, storage_url, events)
    assert outcome.retime_status is RetimeStatus.RETIMED
    assert events == ["settled", "retime began", "retime ended", "told"]
    assert "settling" in outcome.phase_s


def test_other_ops_keep_preparing_the_next_problem_while_their_last_trials_run(storage_url):
    events: list[str] = []
    outcome = _search(TOY_SPEC, storage_url, events)
    assert outcome.retime_status is RetimeStatus.RETIMED
    assert events == ["told", "retime began", "retime ended"]  # told before the re-timing; no settling
    assert "settling" not in outcome.phase_s


def test_the_budget_claimed_early_does_not_tell_a_host_syncing_op_before_its_last_trials(storage_url):
    events: list[str] = []
    runner = RetimingRunner(events)
    measured_when_told = []
    _search(SYNCING_SPEC, storage_url, events, runner=runner, finalists=0,
            on_trials_claimed=lambda: measured_when_told.append(len(runner.calls)))
    # Without the flag this is told while the queue's last trials still wait (test_prepare_next).
    assert measured_when_told == [8]


def test_a_host_syncing_op_is_not_told_after_an_interrupted_retiming_or_a_lost_gpu(storage_url, tmp_path):
    events: list[str] = []
    with pytest.raises(SearchInterrupted):
        _search(SYNCING_SPEC, storage_url, events, runner=RetimingRunner(events, interrupt_retiming=True))
    assert "told" not in events and events[-1] == "retime began"
    events.clear()
    runner = RetimingRunner(events, lose_context_on=TOY_SPEC.default_config(PROBLEM, torch.float32))
    outcome = _search(SYNCING_SPEC, f"sqlite:///{tmp_path / 'lost.db'}", events, runner=runner,
                      trials=len(VALID) + 5)
    assert outcome.stop_reason is StopReason.CONTEXT_LOST and events == []


def test_a_pool_without_settle_still_gets_a_host_syncing_op_searched(storage_url):
    events: list[str] = []
    runner = RetimingRunner(events)
    outcome = _search(SYNCING_SPEC, storage_url, events, runner=runner, compile_ahead=FakePool(runner, workers=3))
    assert outcome.retime_status is RetimeStatus.RETIMED and events == ["retime began", "retime ended", "told"]


# --- the pool ------------------------------------------------------------------------------------


def _pool_over(futures: dict[Config, concurrent.futures.Future], wait_s: float = 5.0) -> PrecompilePool:
    pool = PrecompilePool.__new__(PrecompilePool)  # no processes: an executor's futures stand in
    pool.workers, pool.wait_s, pool.waited_s, pool.started = 1, wait_s, 0.0, time.perf_counter()
    pool.futures = futures
    return pool


def test_settle_withdraws_configs_no_worker_started_and_waits_for_the_one_compiling():
    compiled: list[Config] = []
    started = threading.Event()

    def compile_slowly(config: Config) -> None:
        started.set()
        time.sleep(0.3)
        compiled.append(config)

    compiling, queued, later = Config(A=1), Config(A=2), Config(A=3)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as executor:
        pool = _pool_over({c: executor.submit(compile_slowly, c) for c in (compiling, queued, later)})
        assert started.wait(5.0)
        began = time.perf_counter()
        pool.settle()
        waited = time.perf_counter() - began
        assert pool.futures[compiling].done() and not pool.futures[compiling].cancelled()
        assert pool.futures[queued].cancelled() and pool.futures[later].cancelled()
    assert compiled == [compiling]  # the queued configs never ran
    assert 0.2 <= waited < 5.0
    assert pool.waited_s == 0.0  # measuring's wait, which settling is not
    assert pool.report().compiled == 1


def test_settle_gives_up_on_a_hung_worker_after_wait_s():
    hung = concurrent.futures.Future()
    hung.set_running_or_notify_cancel()  # a worker has it, and never answers
    pool = _pool_over({Config(A=1): hung}, wait_s=0.2)
    began = time.perf_counter()
    pool.settle()
    assert 0.15 <= time.perf_counter() - began < 2.0
    assert not hung.done()  # left to close(), which ends the processes


# --- the specs -----------------------------------------------------------------------------------


def test_only_kv_compress_reads_back_to_the_host_in_its_timed_call():
    assert get_spec("kv_compress").syncs_host
    for name in ("attention", "paged_decode_attention", "kv_cache_write", "cross_attention_layer"):
        assert not get_spec(name).syncs_host, name
    assert [spec.name for spec in all_specs() if spec.syncs_host] == ["kv_compress"]


# --- lanes: the session re-times a host-syncing op's finalists after every lane has ended -------------


def test_a_lane_leaves_a_host_syncing_ops_finalists_to_its_session():
    from omnitune.cli.search_cmd import deferred_retime_targets, finalists_in_lane

    lane = object()  # any LaneSession: only whether there is one matters
    assert finalists_in_lane(SYNCING_SPEC, 3, lane) == 0
    assert finalists_in_lane(SYNCING_SPEC, 3, None) == 3  # alone, it settles its own pool instead
    assert finalists_in_lane(TOY_SPEC, 3, lane) == 3

    @dataclasses.dataclass
    class Target:
        spec: KernelSpec

    syncing, other = Target(SYNCING_SPEC), Target(TOY_SPEC)
    assert deferred_retime_targets([other, syncing, other], 3) == [syncing]
    assert deferred_retime_targets([other, syncing], 0) == []  # --finalists 0: nothing to re-time


def test_the_sessions_re_timing_run_says_it_re_times_rather_than_searches(capsys):
    from omnitune.cli.live import ProgressLines

    ProgressLines(SYNCING_SPEC, PROBLEM, torch.float32, 16, "tpe", retiming=True)
    ProgressLines(SYNCING_SPEC, PROBLEM, torch.float32, 16, "tpe")
    retiming, searching = capsys.readouterr().out.splitlines()
    assert retiming.startswith("re-timing the finalists of toy ") and "16 trials" not in retiming
    assert searching.startswith("searching toy ") and searching.endswith("up to 16 trials, tpe")


def test_a_finished_search_without_finalists_is_re_timed_by_the_next_run_that_asks_for_them(storage_url):
    events: list[str] = []
    lane = _search(SYNCING_SPEC, storage_url, events, finalists=0)
    assert lane.stop_reason is StopReason.BUDGET and lane.retime_status is RetimeStatus.DISABLED
    assert "retime began" not in events
    events.clear()
    runner = RetimingRunner(events)
    session = _search(SYNCING_SPEC, storage_url, events, runner=runner, compile_ahead=None)
    assert session.measured_now == 0 and session.retime_status is RetimeStatus.RETIMED
    assert events == ["retime began", "retime ended", "told"]
    assert len(session.finalists) == 4  # the three fastest and the default beside them
    assert session.best.config == session.finalists[0].config


@pytest.mark.gpu
def test_a_session_in_lanes_re_times_kv_compress_finalists_after_the_lanes(tmp_path):
    import re
    import sqlite3

    from typer.testing import CliRunner

    from omnitune.cli import app

    db = tmp_path / "omnitune.db"
    shapes = ["--shape", "b=1,h=4,hkv=2,n=256,d=64,window=8,recent=4,keep_pct=25",
              "--shape", "b=2,h=4,hkv=2,n=320,d=64,window=8,recent=4,keep_pct=25"]
    result = CliRunner().invoke(app, ["search", "kv_compress", *shapes, "--dtype", "bf16", "-n", "4",
                                      "--finalists", "2", "--lanes", "2", "--precompile", "2", "--db", str(db)])
    assert result.exit_code == 0, result.output
    out = result.output
    assert out.count("finalists left to the session, to re-time once every lane has ended") == 2
    lanes_part, session_part = out.split("re-timing the finalists of 2 kv_compress problem(s) here")
    assert re.search(r"^2 lanes: ", lanes_part, re.MULTILINE)  # the session's re-timing follows the lanes'
    assert "re-timed against each other" not in lanes_part
    assert session_part.count("re-timed against each other, interleaved") == 2
    with sqlite3.connect(db) as rows:
        retimed = dict(rows.execute("select problem_key, count(*) from trials where extra_json like "
                                    "'%\"finalist\"%' group by problem_key").fetchall())
    assert len(retimed) == 2 and all(count >= 2 for count in retimed.values()), retimed


def test_the_session_re_times_what_its_lanes_left_by_searching_those_problems_again(tmp_path, capsys):
    # Under the interpreter (where the session itself re-times nothing: its times mean nothing),
    # the session's run after its lanes: a search of kv_compress, then retime_after_lanes over it
    # and over an attention target, whose lanes re-time their own finalists.
    from typer.testing import CliRunner

    from omnitune.cli import app, search_cmd
    from omnitune.cli.common import load_spec, parse_problems
    from omnitune.search.driver import SamplerName

    db = tmp_path / "omnitune.db"
    shape = "b=1,h=2,hkv=1,n=64,d=32,window=8,recent=4,keep_pct=25"
    searched = CliRunner().invoke(app, ["search", "kv_compress", "--shape", shape, "--dtype", "fp32", "-n", "2",
                                        "--interpret", "--db", str(db)])
    assert searched.exit_code == 0, searched.output
    kv_compress, attention = load_spec("kv_compress", True), load_spec("attention", True)
    targets = [search_cmd._SearchTarget("attention", attention, torch.float32,
                                        parse_problems(attention, ["b=1,h=2,hkv=1,lq=9,lk=23,d=64"])),
               search_cmd._SearchTarget("kv_compress", kv_compress, torch.float32, parse_problems(kv_compress, [shape]))]
    common = {"trials": 2, "deadline": None, "sampler_name": SamplerName.TPE, "seed": 0, "db": str(db),
              "storage": None, "interpret": True, "isolate_timeout_s": None, "try_values": ()}
    capsys.readouterr()
    search_cmd.retime_after_lanes(targets, finalists=3, **common)
    search_cmd.retime_after_lanes(targets, finalists=0, **common)  # --finalists 0: nothing to re-time
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("re-timing the finalists of 1 kv_compress problem(s) here, now that the lanes")
    assert lines[1].startswith("re-timing the finalists of kv_compress b=1,h=2,hkv=1,n=64")
    assert "2 measured (0 new)" in lines[2] and not any("attention" in line for line in lines)
    assert not any(line.startswith("re-timing") for line in lines[3:])

"""The search driver against a fake runner with a known objective: no GPU, no Triton.

The toy kernel has 4 × 3 × 2 = 24 configs; one constraint rejects BLOCK_M·BLOCK_N > 4096 (2
configs), so 22 are valid. Its time is smallest at BLOCK_M=64, BLOCK_N=32, num_warps=8. Some
configs fail in the fake runner: 16×16 tiles do not compile, and BLOCK_M=128 with 4 warps gives
a wrong answer that the fake runner reports as very fast — it must still never be the best.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import socket
import time
from collections import Counter
from dataclasses import dataclass

import optuna
import pytest
import torch

from omnitune.errors import OmnituneError
from omnitune.profile.device import DeviceFacts
from omnitune.search import driver as driver_module
from omnitune.search.driver import (
    PENALTY_FACTOR,
    SamplerName,
    SearchError,
    SearchInterrupted,
    StopReason,
    run_search,
)
from omnitune.trial import TrialResult, TrialStatus
from omnitune.spec import Config, Constraint, KernelSpec, Param
from omnitune.store import open_db

optuna.logging.set_verbosity(optuna.logging.WARNING)


@dataclass(frozen=True)
class ToyProblem:
    n: int


def _tile_limit(problem, config, dtype, limits):
    area = config["BLOCK_M"] * config["BLOCK_N"]
    return f"tile of {area} elements exceeds 4096" if area > 4096 else None


def _toy_default(problem, dtype) -> Config:
    return Config(BLOCK_M=32, BLOCK_N=32, num_warps=4)


def _unused(*args, **kwargs):
    raise AssertionError("the driver must not touch inputs or launch kernels itself")


TOY_SPEC = KernelSpec(
    name="toy",
    description="a fake kernel with a known objective",
    problem_type=ToyProblem,
    params=(
        Param("BLOCK_M", (16, 32, 64, 128)),
        Param("BLOCK_N", (16, 32, 64)),
        Param("num_warps", (4, 8)),
    ),
    constraints=(Constraint("tile_area", _tile_limit),),
    default_config=_toy_default,
    make_inputs=_unused,
    new_output=_unused,
    launch=_unused,
    reference=_unused,
    tolerance={torch.float32: 1e-4},
    flops=lambda problem: 1e9,
    bytes_moved=lambda problem, dtype: 1e6,
    dtypes=(torch.float32,),
    example_problem=ToyProblem(n=8),
    module=__name__,
)
PROBLEM = ToyProblem(n=8)
VALID = TOY_SPEC.valid_configs(PROBLEM, torch.float32)
OPTIMUM = Config(BLOCK_M=64, BLOCK_N=32, num_warps=8)

DEVICE = DeviceFacts(
    name="Fake GPU 9000", compute_capability="9.0", multiprocessors=132, memory_gib=80.0,
    l2_cache_mib=50.0, shared_memory_per_block_kib=227.0, driver="1.0", cuda="12.8",
    torch="2.x", triton="3.x", omnitune="0.1.0", python="3.12",
)


def toy_time_ms(config: Config) -> float:
    return (
        1.0
        + abs(math.log2(config["BLOCK_M"]) - 6)
        + abs(math.log2(config["BLOCK_N"]) - 5)
        + (0.0 if config["num_warps"] == 8 else 0.5)
    )


class FakeRunner:
    """Computes results from the config; counts every call; can be told to be interrupted or to
    lose its CUDA context on a given call."""

    def __init__(self, interrupt_on_call: int | None = None, lose_context_on: Config | None = None):
        self.calls: list[Config] = []
        self.interrupt_on_call = interrupt_on_call
        self.lose_context_on = lose_context_on
        self.context_lost = False

    def measure(self, config: Config) -> TrialResult:
        self.calls.append(config)
        if self.interrupt_on_call is not None and len(self.calls) == self.interrupt_on_call:
            raise KeyboardInterrupt
        if config == self.lose_context_on:
            self.context_lost = True
            return TrialResult(config, TrialStatus.CRASHED, detail="illegal memory access")
        if config["BLOCK_M"] == 16 and config["BLOCK_N"] == 16:
            return TrialResult(config, TrialStatus.COMPILE_ERROR, detail="CompilationError: too small")
        if config["BLOCK_M"] == 128 and config["num_warps"] == 4:
            # A wrong answer that happens to be "fast": it must never become the best.
            return TrialResult(config, TrialStatus.MISMATCH, time_ms=0.001, rel_error=0.7,
                               detail="relative error 0.7 > tolerance 1e-4")
        t = toy_time_ms(config)
        return TrialResult(config, TrialStatus.OK, time_ms=t, p20_ms=t * 0.98, p80_ms=t * 1.02,
                           rel_error=1e-6, tflops=1.0 / t, tbps=0.001 / t)


@pytest.fixture
def storage_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'studies.optuna.db'}"


def search(runner: FakeRunner, storage_url: str, trials: int, **kwargs):
    """A search without the finalists' re-timing (tests/test_finalists.py covers it) unless asked."""
    settings = {"finalists": 0} | kwargs
    return run_search(
        TOY_SPEC, PROBLEM, torch.float32, runner_factory=lambda: runner, device=DEVICE,
        trials=trials, storage_url=storage_url, **settings,
    )


def load_study(storage_url: str) -> optuna.Study:
    return optuna.load_study(study_name="toy|n=8|fp32|Fake_GPU_9000", storage=storage_url)


def assert_each_config_measured_once(calls: list[Config]) -> None:
    repeats = {c.label(): n for c, n in Counter(calls).items() if n > 1}
    assert not repeats, f"configs measured more than once: {repeats}"


def test_enumerates_the_valid_space_when_it_fits_the_budget_and_finds_the_optimum(storage_url, tmp_path):
    runner = FakeRunner()
    db = open_db(tmp_path / "results.db")
    outcome = search(runner, storage_url, trials=100, sampler="tpe", db=db)

    assert len(VALID) == 22
    assert runner.calls[0] == _toy_default(PROBLEM, torch.float32)
    assert sorted(map(Config.label, runner.calls)) == sorted(map(Config.label, VALID))
    assert_each_config_measured_once(runner.calls)
    assert outcome.stop_reason is StopReason.EXHAUSTED
    assert outcome.best is not None and outcome.best.config == OPTIMUM
    assert outcome.best.time_ms == pytest.approx(1.0)
    assert outcome.default is not None and outcome.default.time_ms == pytest.approx(toy_time_ms(outcome.default.config))
    assert outcome.speedup_over_default == pytest.approx(toy_time_ms(outcome.default.config) / 1.0)
    assert outcome.measured_now == outcome.measured_total == 22
    # 16x16 (2 warps settings) fail to compile; BLOCK_M=128 with 4 warps mismatches (BLOCK_N 16, 32)
    assert outcome.failures == {TrialStatus.COMPILE_ERROR: 2, TrialStatus.MISMATCH: 2}

    best_row = next(db.query("SELECT * FROM best"))
    assert best_row["config_json"] == '{"BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 8}'
    assert best_row["default_time_ms"] == pytest.approx(outcome.default.time_ms)
    rows = list(db.query("SELECT * FROM trials ORDER BY trial_number"))
    assert len(rows) == 22
    assert rows[0]["trial_number"] == 0 and rows[0]["is_default"] == 1
    assert sum(r["is_default"] for r in rows) == 1
    assert {r["sampler"] for r in rows} == {"tpe"}
    assert all(r["source_hash"] == TOY_SPEC.source_hash() != "unknown" for r in rows)


def test_a_mismatch_is_never_the_best_even_when_it_reports_the_lowest_time(storage_url):
    outcome = search(FakeRunner(), storage_url, trials=100)
    assert outcome.best.status is TrialStatus.OK
    study = load_study(storage_url)
    mismatches = [t for t in study.trials if t.user_attrs.get("status") == "mismatch"]
    assert mismatches and all(t.value > outcome.best.time_ms for t in mismatches)


def test_failures_carry_their_status_and_a_penalty_the_sampler_learns_from(storage_url, tmp_path):
    db = open_db(tmp_path / "results.db")
    search(FakeRunner(), storage_url, trials=100, db=db)
    study = load_study(storage_url)
    worst_ok_so_far = 0.0
    failed = 0
    for trial in sorted(study.trials, key=lambda t: t.number):
        assert trial.state is optuna.trial.TrialState.COMPLETE  # failures too: TPE ignores FAIL
        status = TrialStatus(trial.user_attrs["status"])
        if status is TrialStatus.OK:
            assert trial.value == pytest.approx(trial.user_attrs["time_ms"])
            worst_ok_so_far = max(worst_ok_so_far, trial.value)
        else:
            failed += 1
            assert trial.value == pytest.approx(PENALTY_FACTOR * worst_ok_so_far)
            assert trial.user_attrs["time_ms"] is None
    assert failed == 4
    rows = {r["config_label"]: r for r in db.query("SELECT * FROM trials")}
    compile_error = rows["BLOCK_M=16 BLOCK_N=16 num_warps=4"]
    assert compile_error["status"] == "compile_error" and compile_error["time_ms"] is None
    assert compile_error["detail"].startswith("CompilationError")
    mismatch = rows["BLOCK_M=128 BLOCK_N=16 num_warps=4"]
    assert mismatch["status"] == "mismatch" and mismatch["rel_error"] == pytest.approx(0.7)


def _unwrapped_sampler(monkeypatch):
    """The sampler's proposals as it makes them, as where a space is too large to list its valid
    configs (where they can be listed, omnitune.search.strategies.valid_only keeps proposals
    valid and new, and these paths are not reached)."""
    monkeypatch.setattr(driver_module, "ValidOnly", lambda inner, *args, **kwargs: inner)


def test_constraint_violations_cost_no_runner_call_and_name_the_constraint(storage_url, tmp_path, monkeypatch):
    _unwrapped_sampler(monkeypatch)
    db = open_db(tmp_path / "results.db")
    runner = FakeRunner()
    # random sampling over the whole space (budget < valid configs) proposes the 2 invalid
    # configs sooner or later; the budget of 21 leaves the sampler in charge throughout.
    search(runner, storage_url, trials=21, sampler="random", seed=3, db=db)
    pruned = list(db.query("SELECT * FROM trials WHERE status = 'pruned'"))
    assert pruned, "the random sampler never proposed an invalid config; pick another seed"
    for row in pruned:
        assert row["detail"].startswith("tile_area: ")
        assert Config(json.loads(row["config_json"])) not in runner.calls
    assert_each_config_measured_once(runner.calls)
    assert db.execute("SELECT COUNT(*) FROM trials WHERE status != 'pruned'").fetchone()[0] == 21


@pytest.mark.parametrize("sampler", [s.value for s in SamplerName])
def test_each_sampler_measures_the_budget_default_first_without_repeats(sampler, storage_url):
    if sampler == "cmaes" and importlib.util.find_spec("cmaes") is None:
        pytest.skip("the cmaes package is not installed")
    runner = FakeRunner()
    outcome = search(runner, storage_url, trials=12, sampler=sampler, seed=1)
    assert outcome.stop_reason is StopReason.BUDGET
    assert outcome.measured_total == outcome.measured_now == 12
    assert len(runner.calls) == 12
    assert runner.calls[0] == _toy_default(PROBLEM, torch.float32)
    assert_each_config_measured_once(runner.calls)
    assert all(c in VALID for c in runner.calls)


def test_grid_enumerates_valid_configs_in_the_spec_order_after_the_default(storage_url):
    runner = FakeRunner()
    search(runner, storage_url, trials=6, sampler="grid")
    default = _toy_default(PROBLEM, torch.float32)
    assert runner.calls == [default] + [c for c in VALID if c != default][:5]


def test_a_sampler_stuck_on_repeats_falls_back_to_unmeasured_configs(storage_url, monkeypatch):
    _unwrapped_sampler(monkeypatch)
    # 22 valid configs, budget 21: the sampler stays in charge, and near the end the random
    # sampler mostly proposes configs already measured.
    runner = FakeRunner()
    outcome = search(runner, storage_url, trials=21, sampler="random", seed=0)
    assert outcome.measured_total == 21
    assert_each_config_measured_once(runner.calls)
    study = load_study(storage_url)
    repeats = [t for t in study.trials if "duplicate_of" in t.user_attrs]
    assert repeats, "the sampler never repeated itself; the test no longer exercises repeats"
    for trial in repeats:
        original = study.trials[trial.user_attrs["duplicate_of"]]
        assert trial.params == original.params and trial.value == original.value


def test_resume_after_ctrl_c_measures_nothing_twice_and_counts_finished_trials(storage_url, tmp_path):
    db = open_db(tmp_path / "results.db")
    first = FakeRunner(interrupt_on_call=5)
    with pytest.raises(SearchInterrupted) as caught:
        search(first, storage_url, trials=10, sampler="tpe", db=db)
    assert isinstance(caught.value, KeyboardInterrupt)
    assert caught.value.outcome.stop_reason is StopReason.INTERRUPTED
    assert caught.value.outcome.measured_total == 4
    in_flight = first.calls[4]
    study = load_study(storage_url)
    states = Counter(t.state for t in study.trials)
    assert states[optuna.trial.TrialState.FAIL] == 1 and states[optuna.trial.TrialState.RUNNING] == 0
    assert db.execute("SELECT COUNT(*) FROM trials").fetchone()[0] == 4 + _pruned(db)
    # the config in flight was never finished: no row, and it stays measurable
    assert in_flight.label() not in {r["config_label"] for r in db.query("SELECT config_label FROM trials")}

    second = FakeRunner()
    outcome = search(second, storage_url, trials=10, sampler="tpe", db=db)
    assert not set(second.calls) & set(first.calls[:4]), "a finished config was measured again"
    assert outcome.measured_total == 10 and outcome.measured_now == 6
    assert_each_config_measured_once(first.calls[:4] + second.calls)
    assert db.execute("SELECT COUNT(*) FROM trials WHERE status != 'pruned'").fetchone()[0] == 10


def test_rerunning_a_finished_search_measures_nothing_and_a_larger_budget_measures_the_difference(storage_url):
    search(FakeRunner(), storage_url, trials=5)
    again = FakeRunner()
    outcome = search(again, storage_url, trials=5)
    assert again.calls == [] and outcome.measured_now == 0 and outcome.measured_total == 5
    more = FakeRunner()
    outcome = search(more, storage_url, trials=8)
    assert len(more.calls) == 3 and outcome.measured_total == 8


def test_a_trial_abandoned_by_a_killed_process_is_failed_and_its_config_measured_again(storage_url):
    search(FakeRunner(), storage_url, trials=3, sampler="grid")
    study = load_study(storage_url)
    # What a killed process leaves behind: a RUNNING trial naming its config and a dead owner.
    abandoned_config = VALID[-1]
    trial = study.ask({p: d for p, d in _distributions().items()})
    trial.set_user_attr("owner", f"{socket.gethostname()}:{_dead_pid()}")
    trial.set_user_attr("config_json", '{"BLOCK_M": %d, "BLOCK_N": %d, "num_warps": %d}' % (
        abandoned_config["BLOCK_M"], abandoned_config["BLOCK_N"], abandoned_config["num_warps"]))
    runner = FakeRunner()
    outcome = search(runner, storage_url, trials=len(VALID), sampler="grid")
    assert load_study(storage_url).trials[trial.number].state is optuna.trial.TrialState.FAIL
    assert abandoned_config in runner.calls
    assert outcome.measured_total == len(VALID)


def test_a_trial_whose_process_stopped_after_storing_its_measurement_is_completed_with_it(storage_url, tmp_path):
    db = open_db(tmp_path / "results.db")
    search(FakeRunner(), storage_url, trials=3, sampler="grid", db=db)
    study = load_study(storage_url)
    finished = study.trials[0]
    # What a process killed between storing a trial's attrs and telling it leaves (or a journal
    # whose last record, the tell, was cut): a RUNNING trial holding a whole measurement.
    measured_config = VALID[-1]
    trial = study.ask({p: d for p, d in _distributions().items()})
    trial.set_user_attr("owner", f"{socket.gethostname()}:{_dead_pid()}")
    trial.set_user_attr("config_json", '{"BLOCK_M": %d, "BLOCK_N": %d, "num_warps": %d}' % (
        measured_config["BLOCK_M"], measured_config["BLOCK_N"], measured_config["num_warps"]))
    for key in ("status", "time_ms", "measurement"):
        trial.set_user_attr(key, finished.user_attrs[key])
    runner = FakeRunner()
    outcome = search(runner, storage_url, trials=len(VALID), sampler="grid", db=db)
    kept = load_study(storage_url).trials[trial.number]
    assert kept.state is optuna.trial.TrialState.COMPLETE and kept.value == finished.user_attrs["time_ms"]
    assert measured_config not in runner.calls  # not measured again
    assert outcome.measured_total == len(VALID)
    labels = [r["config_label"] for r in db.query("SELECT config_label FROM trials WHERE status != 'pruned'")]
    assert measured_config.label() in labels and len(labels) == len(set(labels)) == len(VALID)


def test_a_lost_cuda_context_stops_the_search_and_a_rerun_resumes(storage_url):
    poison = Config(BLOCK_M=64, BLOCK_N=64, num_warps=4)
    first = FakeRunner(lose_context_on=poison)
    outcome = search(first, storage_url, trials=30, sampler="grid")
    assert outcome.stop_reason is StopReason.CONTEXT_LOST
    assert first.calls[-1] == poison
    assert outcome.failures.get(TrialStatus.CRASHED) == 1
    second = FakeRunner()
    outcome = search(second, storage_url, trials=30, sampler="grid")
    assert poison not in second.calls and not set(second.calls) & set(first.calls)
    assert outcome.stop_reason is StopReason.EXHAUSTED


def test_the_timeout_stops_between_trials(storage_url, monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(driver_module.time, "monotonic", lambda: clock[0])

    class SlowRunner(FakeRunner):
        def measure(self, config):
            clock[0] += 10.0  # each measurement takes 10 s of the fake clock
            return super().measure(config)

    runner = SlowRunner()
    outcome = search(runner, storage_url, trials=20, timeout_s=25.0)
    assert outcome.stop_reason is StopReason.TIMEOUT
    assert len(runner.calls) == 3  # started at 0, 10 and 20 s; none after 25 s


def test_progress_is_reported_after_every_trial(storage_url):
    seen = []
    search(FakeRunner(), storage_url, trials=6, sampler="grid", progress=seen.append)
    assert [p.measured_total for p in seen] == [1, 2, 3, 4, 5, 6]
    assert seen[0].chosen_by == "default" and seen[1].chosen_by == "grid"
    assert all(p.budget == 6 and p.study_name == "toy|n=8|fp32|Fake_GPU_9000" for p in seen)
    assert seen[-1].best is not None and seen[-1].best.status is TrialStatus.OK


def test_a_space_too_large_to_list_is_still_searched_without_repeats(storage_url, monkeypatch):
    monkeypatch.setattr(driver_module, "ENUMERABLE_SPACE", 4)
    runner = FakeRunner()
    outcome = search(runner, storage_url, trials=21, sampler="random", seed=0)
    assert outcome.measured_total == 21
    assert_each_config_measured_once(runner.calls)


def test_the_runner_is_built_only_when_something_needs_measuring(storage_url):
    search(FakeRunner(), storage_url, trials=3)
    built = []
    outcome = run_search(
        TOY_SPEC, PROBLEM, torch.float32, runner_factory=lambda: built.append(1) or FakeRunner(),
        device=DEVICE, trials=3, storage_url=storage_url, finalists=0,
    )
    assert built == [] and outcome.stop_reason is StopReason.BUDGET


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"sampler": "anneal"}, "unknown sampler 'anneal'; choose one of tpe, random, grid, cmaes"),
        ({"trials": 0}, "at least 1"),
        ({"timeout_s": 0}, "positive"),
    ],
)
def test_bad_search_settings_are_user_errors(kwargs, message, storage_url):
    settings = {"trials": 5} | kwargs
    with pytest.raises(SearchError, match=message) as caught:
        search(FakeRunner(), storage_url, **settings)
    assert isinstance(caught.value, OmnituneError)


def test_cmaes_without_its_package_is_a_clear_error(storage_url, monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec",
        lambda name, *a: None if name == "cmaes" else real_find_spec(name, *a),
    )
    with pytest.raises(SearchError, match="pip install cmaes"):
        search(FakeRunner(), storage_url, trials=5, sampler="cmaes")


# --- helpers ------------------------------------------------------------------------------------


def _pruned(db) -> int:
    return db.execute("SELECT COUNT(*) FROM trials WHERE status = 'pruned'").fetchone()[0]


def _distributions():
    from omnitune.search.space import ConfigSpace

    return ConfigSpace(TOY_SPEC).distributions


def _dead_pid() -> int:
    pid = 999_999
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except PermissionError:
            pass
        pid -= 1


class SlowFakeRunner(FakeRunner):
    """A FakeRunner that takes a little time, so that several slots' trials overlap."""

    def measure(self, config: Config) -> TrialResult:
        time.sleep(0.01)
        return super().measure(config)


@pytest.mark.parametrize("sampler", ["tpe", "grid"])
def test_several_slots_share_the_study_measuring_each_config_once_within_the_budget(storage_url, tmp_path, sampler):
    runners = [SlowFakeRunner() for _ in range(3)]
    db = open_db(tmp_path / "results.db")
    outcome = run_search(
        TOY_SPEC, PROBLEM, torch.float32, runner_factories=[lambda r=r: r for r in runners], device=DEVICE,
        trials=12, storage_url=storage_url, sampler=sampler, seed=1, finalists=0, db=db,
    )
    calls = [c for r in runners for c in r.calls]
    assert_each_config_measured_once(calls)
    pruned = outcome.failures.get(TrialStatus.PRUNED, 0)
    assert outcome.stop_reason is StopReason.BUDGET and outcome.measured_total == 12 == len(calls)
    assert sum(1 for r in runners if r.calls) >= 2  # the work was shared
    assert calls.count(TOY_SPEC.default_config(PROBLEM, torch.float32)) == 1
    # The catalogue, written by the main thread for the slots, has every trial.
    assert db.execute("SELECT count(*) FROM trials").fetchone()[0] == 12 + pruned
    study = load_study(storage_url)
    assert {t.user_attrs.get("slot") for t in study.trials if "config_json" in t.user_attrs} <= {0, 1, 2}


def test_an_error_in_one_slot_stops_the_search_and_reaches_the_caller(storage_url):
    broken = SlowFakeRunner(interrupt_on_call=2)
    healthy = SlowFakeRunner()
    with pytest.raises(SearchInterrupted):
        run_search(TOY_SPEC, PROBLEM, torch.float32, runner_factories=[lambda: healthy, lambda: broken],
                   device=DEVICE, trials=30, storage_url=storage_url, finalists=0)
    study = load_study(storage_url)
    assert not [t for t in study.trials if t.state is optuna.trial.TrialState.RUNNING]  # nothing left in flight
    assert_each_config_measured_once(healthy.calls + broken.calls)


def test_precompile_is_given_the_planned_configs_still_to_measure_within_the_budget(storage_url):
    handed: list[list[Config]] = []
    first = FakeRunner()
    search(first, storage_url, trials=6, sampler="grid", precompile=handed.append)
    assert handed == [first.calls]  # exactly what the grid then measured, in order, before any of it
    # Resumed with a larger budget: only the configs not measured yet, at most the budget left.
    second = FakeRunner()
    search(second, storage_url, trials=9, sampler="grid", precompile=handed.append)
    assert handed[1] == second.calls and len(second.calls) == 3
    assert not set(handed[1]) & set(first.calls)
    # TPE: the default (and any known-good or warm-start configs) is all the driver knows ahead.
    handed.clear()
    search(FakeRunner(), storage_url.replace("studies", "tpe"), trials=6, sampler="tpe", precompile=handed.append)
    assert handed == [[_toy_default(PROBLEM, torch.float32)]]

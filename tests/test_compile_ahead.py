"""The driver with a precompile pool (--precompile): the next K proposals are asked, claimed and
handed to the pool while the current config is measured, without costing the budget its
exactness, a config a second measurement, or a pruned config a compile. A fake pool and the
fake runner of test_search_driver; no processes, no GPU."""

from __future__ import annotations

from collections import Counter

import optuna
import pytest
import torch

from omnitune.search.driver import SearchInterrupted
from omnitune.spec import Config
from tests.test_search_driver import PROBLEM, TOY_SPEC, VALID, FakeRunner, assert_each_config_measured_once, search


class FakePool:
    """Records every config submitted, with how many the runner had measured by then."""

    def __init__(self, runner: FakeRunner, workers: int):
        self.runner, self.workers = runner, workers
        self.submitted: list[tuple[Config, int]] = []
        self.waited: list[Config] = []

    def submit(self, configs):
        self.submitted += [(c, len(self.runner.calls)) for c in configs]

    def ready(self, config):
        self.waited.append(config)

    @property
    def configs(self) -> list[Config]:
        return [c for c, _ in self.submitted]


@pytest.fixture
def storage_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'studies.optuna.db'}"


def _study(storage_url: str) -> optuna.Study:
    return optuna.load_study(study_name="toy|n=8|fp32|Fake_GPU_9000", storage=storage_url)


class QueueWatchingRunner(FakeRunner):
    """Notes, at each measurement, how many configs the pool holds that are not measured yet."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.pool: FakePool | None = None
        self.ahead: list[int] = []

    def measure(self, config):
        pending = [c for c in self.pool.configs if c not in self.calls and c != config]
        self.ahead.append(len(pending))
        return super().measure(config)


@pytest.mark.parametrize("sampler", ["tpe", "random", "grid"])
def test_keeps_k_candidates_compiling_within_the_budget_and_measures_nothing_twice(sampler, storage_url):
    runner = QueueWatchingRunner()
    pool = runner.pool = FakePool(runner, workers=3)
    budget = 12
    outcome = search(runner, storage_url, trials=budget, sampler=sampler, compile_ahead=pool)
    assert outcome.measured_total == budget and len(runner.calls) == budget
    assert_each_config_measured_once(runner.calls)
    # Every config measured after the first was handed to the pool before the runner reached it...
    assert set(runner.calls[1:]) <= set(pool.configs)
    assert all(measured_before < runner.calls.index(c) for c, measured_before in pool.submitted)
    # ...K of them in flight while each is measured, until the budget's end leaves fewer.
    assert runner.ahead[:budget - 3] == [3] * (budget - 3)
    assert runner.ahead[budget - 3:] == [2, 1, 0]
    assert not set(pool.configs) - set(runner.calls), "a config compiled beyond the budget"
    assert Counter(pool.configs).most_common(1)[0][1] == 1
    assert pool.waited == runner.calls
    # Nothing left claimed and unmeasured in the study.
    assert not [t for t in _study(storage_url).trials if t.state is optuna.trial.TrialState.RUNNING]


class SlowHeadPool(FakePool):
    """Every submitted config compiles at once except every third one, which is still compiling
    until nothing else is queued (a slow compile)."""

    def __init__(self, runner, workers):
        super().__init__(runner, workers)
        self.slow: set[Config] = set()

    def submit(self, configs):
        super().submit(configs)
        self.slow |= {c for i, c in enumerate(self.configs) if i % 3 == 0 and c in configs}

    def compiled(self, config):
        queued = [c for c in self.configs if c not in self.runner.calls and c != config]
        return config not in self.slow or not any(c not in self.slow for c in queued)


def test_compiled_configs_are_measured_before_one_still_compiling(storage_url):
    runner = FakeRunner()
    pool = SlowHeadPool(runner, workers=4)
    budget = 12
    outcome = search(runner, storage_url, trials=budget, sampler="random", seed=5, compile_ahead=pool)
    assert outcome.measured_total == budget
    assert_each_config_measured_once(runner.calls)
    # A slow config queued behind compiled ones is measured after them, not in claiming order.
    order = [c for c in pool.configs if c in runner.calls]
    assert runner.calls != order
    slow_queued_first = [c for c in runner.calls[1:] if c in pool.slow]
    for config in slow_queued_first:
        position = runner.calls.index(config)
        later_claimed = [c for c in order[order.index(config) + 1:] if c not in pool.slow]
        assert not later_claimed or any(runner.calls.index(c) < position for c in later_claimed)


def test_pruned_configs_are_never_sent_to_compile(storage_url):
    runner = FakeRunner()
    pool = FakePool(runner, workers=4)
    search(runner, storage_url, trials=20, sampler="random", seed=3, compile_ahead=pool)
    rejected = [c for c in pool.configs if TOY_SPEC.violations(PROBLEM, c, torch.float32, None)]
    assert not rejected
    assert_each_config_measured_once(runner.calls)


def test_the_whole_space_enumerated_ahead_ends_exhausted(storage_url):
    runner = FakeRunner()
    pool = FakePool(runner, workers=5)
    outcome = search(runner, storage_url, trials=len(VALID) + 10, compile_ahead=pool)
    assert sorted(runner.calls, key=str) == sorted(VALID, key=str)
    assert outcome.measured_total == len(VALID)


def test_an_interrupted_search_fails_its_queue_and_resumes_without_repeats(storage_url):
    first = FakeRunner(interrupt_on_call=4)
    with pytest.raises(SearchInterrupted):
        search(first, storage_url, trials=10, sampler="tpe", compile_ahead=FakePool(first, workers=3))
    study = _study(storage_url)
    states = Counter(t.state for t in study.trials)
    assert states[optuna.trial.TrialState.RUNNING] == 0
    # The config in flight and the queue (and any proposal that repeated a queued config).
    assert states[optuna.trial.TrialState.FAIL] >= 1 + 3
    second = FakeRunner()
    outcome = search(second, storage_url, trials=10, sampler="tpe", compile_ahead=FakePool(second, workers=3))
    assert outcome.measured_total == 10 and outcome.measured_now == 7
    assert_each_config_measured_once(first.calls[:3] + second.calls)


def test_a_timeout_leaves_no_queued_trial_running(storage_url, monkeypatch):
    runner = FakeRunner()
    clock = iter(range(1000))
    import omnitune.search.driver as driver

    monkeypatch.setattr(driver.time, "monotonic", lambda: float(next(clock)))
    search(runner, storage_url, trials=30, sampler="tpe", timeout_s=6, compile_ahead=FakePool(runner, workers=4))
    assert not [t for t in _study(storage_url).trials if t.state is optuna.trial.TrialState.RUNNING]
    assert_each_config_measured_once(runner.calls)


def test_the_pool_reports_how_long_measuring_waited_for_compiles():
    import concurrent.futures
    import threading
    import time

    from omnitune.measure.ahead import PrecompilePool
    from omnitune.spec import Config

    pool = PrecompilePool.__new__(PrecompilePool)  # no processes: futures stand in for the workers
    pool.workers, pool.wait_s, pool.waited_s, pool.started = 2, 5.0, 0.0, time.perf_counter()
    compiling, compiled, queued = Config(A=1), Config(A=2), Config(A=3)
    pool.futures = {config: concurrent.futures.Future() for config in (compiling, compiled, queued)}
    pool.futures[compiling].set_running_or_notify_cancel()  # a worker has it
    pool.futures[compiled].set_running_or_notify_cancel()
    pool.futures[compiled].set_result(None)
    threading.Timer(0.3, pool.futures[compiling].set_result, (None,)).start()
    pool.ready(compiled)  # done already: no wait
    pool.ready(queued)  # no worker started it: cancelled, measured (and compiled) by the caller
    assert pool.waited_s == 0.0 and pool.futures[queued].cancelled()
    pool.ready(compiling)
    assert 0.25 <= pool.waited_s < 5.0
    report = pool.report()
    assert report.compiled == 2 and report.waited_s == pool.waited_s
    assert f"measuring waited {pool.waited_s:.1f} s of it for compiles" in report.summary()

"""Preparing the next problem while this one is measured (omnitune.search.prepare_next): the
driver says when a search has claimed its last trial, and the next problem's first configs are
submitted to its pool before this one's search ends. Fake pools that log what happens, in order;
the searches are real (interpreted kv_cache_write on tiny shapes, or the toy spec)."""

from __future__ import annotations

import logging
import time

import pytest
import torch

from omnitune.registry import get_spec
from omnitune.search.prepare_next import ProblemsAhead, first_configs
from omnitune.spec import DeviceLimits
from tests.test_compile_ahead import FakePool
from tests.test_search_driver import PROBLEM, TOY_SPEC, FakeRunner, search

KEYS = ("t=9,hkv=2,d=16,block_size=4", "t=5,hkv=1,d=32,block_size=8", "t=3,hkv=1,d=16,block_size=4")
DTYPE = torch.float32


class LoggedPool:
    """A pool of one problem that writes what happens to it into a log shared by every pool."""

    workers = 2

    def __init__(self, log: list, key: str, fail_submit: bool = False):
        self.log, self.key, self.fail_submit = log, key, fail_submit
        self.submitted: list = []
        self.waited: list = []

    def submit(self, configs):
        if self.fail_submit:
            raise RuntimeError("the pool broke")
        self.submitted += list(configs)
        self.log.append(("submit", self.key, tuple(configs)))

    def ready(self, config):
        self.waited.append(config)

    def report(self):
        from omnitune.measure.precompile import PrecompileReport

        return PrecompileReport(len(self.submitted), {}, 0.0, self.workers)

    def close(self):
        self.log.append(("close", self.key))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


@pytest.fixture
def kv():
    spec = get_spec("kv_cache_write")
    return spec, [spec.parse_shape(key) for key in KEYS]


def _ahead(spec, problems, log, trials=3, fail_submit_for=()):
    pools = {}

    def make_pool(spec, problem, dtype):
        key = spec.problem_key(problem)
        broken = key in fail_submit_for and key not in pools  # the pool opened ahead breaks, not a later one
        pools.setdefault(key, []).append(LoggedPool(log, key, fail_submit=broken))
        log.append(("open", key))
        return pools[key][-1]

    return ProblemsAhead([(spec, p, DTYPE) for p in problems], workers=2, trials=trials, make_pool=make_pool), pools


def _search(spec, problems, tmp_path, ahead, trials=3, timeout_s=None):
    from omnitune.cli.search_cmd import search_problems

    search_problems(spec, problems, DTYPE, trials=trials, timeout_s=timeout_s, sampler="tpe", seed=0,
                    db=str(tmp_path / "results.db"), storage=None, interpret=True, precompile_workers=2, ahead=ahead)


def test_the_driver_says_when_the_budget_is_claimed_before_its_last_trials_are_measured(tmp_path):
    storage_url = f"sqlite:///{tmp_path / 'studies.optuna.db'}"
    runner = FakeRunner()
    measured_when_told = []
    search(runner, storage_url, trials=8, compile_ahead=FakePool(runner, workers=3),
           on_trials_claimed=lambda: measured_when_told.append(len(runner.calls)))
    assert len(runner.calls) == 8
    # Told once, when the last place was claimed: the queue's last trials were still to measure.
    assert len(measured_when_told) == 1 and measured_when_told[0] < 8 - 1


def test_the_driver_says_so_at_the_loop_end_when_the_space_runs_out_and_not_when_the_gpu_is_lost(tmp_path):
    from omnitune.search.driver import StopReason
    from tests.test_search_driver import VALID

    told = []
    outcome = search(FakeRunner(), f"sqlite:///{tmp_path / 'a.db'}", trials=len(VALID) + 5,
                     on_trials_claimed=lambda: told.append("told"))
    assert outcome.stop_reason is StopReason.EXHAUSTED and told == ["told"]
    told.clear()
    runner = FakeRunner(lose_context_on=TOY_SPEC.default_config(PROBLEM, torch.float32))
    outcome = search(runner, f"sqlite:///{tmp_path / 'b.db'}", trials=len(VALID) + 5,
                     on_trials_claimed=lambda: told.append("told"))
    assert outcome.stop_reason is StopReason.CONTEXT_LOST and told == []


def test_the_next_problems_first_configs_are_submitted_before_this_one_ends(kv, tmp_path):
    spec, problems = kv
    log: list = []
    ahead, pools = _ahead(spec, problems, log)
    with ahead:
        _search(spec, problems, tmp_path, ahead)
    keys = [spec.problem_key(p) for p in problems]
    for this, following, problem in zip(keys, keys[1:], problems[1:]):
        submitted = log.index(next(e for e in log if e[0] == "submit" and e[1] == following))
        assert submitted < log.index(("close", this)), "the next problem waited for this one's end"
        first = log[submitted][2]
        assert first[0] == spec.default_config(problem, DTYPE)
        assert list(first) == first_configs(spec, problem, DTYPE, DeviceLimits(), [])[:3]
    # Each problem's search used the one pool opened for it (the prepared one, after the first),
    # and waited on it for the configs it had submitted ahead.
    assert all(len(opened) == 1 for opened in pools.values())
    for key, problem in zip(keys[1:], problems[1:]):
        assert spec.default_config(problem, DTYPE) in pools[key][0].waited
    # The last problem prepares nothing after it, and nothing is left open.
    assert [e for e in log if e[0] == "open"] == [("open", k) for k in keys]
    assert sorted(e[1] for e in log if e[0] == "close") == sorted(keys)


def test_a_passed_deadline_prepares_nothing_and_a_prepared_pool_never_reached_is_closed(kv, tmp_path):
    spec, problems = kv
    log: list = []
    ahead, pools = _ahead(spec, problems, log)
    ahead.prepare_after(spec, problems[0], DTYPE, limits=DeviceLimits(), device_key="cpu",
                        deadline=time.monotonic() - 1)
    assert ahead.prepared is None and log == []
    ahead.prepare_after(spec, problems[-1], DTYPE, limits=DeviceLimits(), device_key="cpu")  # the last
    assert ahead.prepared is None and log == []
    # A search whose timeout passes during its first problem: the second, never started, is not
    # prepared either. 20 ms: less than the first trial takes under the interpreter, so the timeout
    # passes before the first problem's 14 configs are claimed (with 0.5 s they sometimes were, and
    # the second problem was rightly prepared).
    with ahead:
        _search(spec, problems[:2], tmp_path, ahead, trials=50, timeout_s=0.02)
    second = spec.problem_key(problems[1])
    assert ("open", second) not in log and ahead.prepared is None
    # A problem prepared and then never reached (interrupted, or the timeout) is closed with the session.
    with ahead:
        ahead.prepare_after(spec, problems[0], DTYPE, limits=DeviceLimits(), device_key="cpu")
        assert log[-1][:2] == ("submit", second)
    assert log[-1] == ("close", second)


def test_a_pool_that_breaks_while_preparing_leaves_the_next_problem_to_start_cold(kv, tmp_path, caplog):
    spec, problems = kv
    log: list = []
    ahead, pools = _ahead(spec, problems[:2], log, fail_submit_for={spec.problem_key(problems[1])})
    with caplog.at_level(logging.WARNING, logger="omnitune.search.prepare_next"), ahead:
        _search(spec, problems[:2], tmp_path, ahead)
    assert "could not be prepared ahead" in caplog.text
    second = spec.problem_key(problems[1])
    broken, cold = pools[second]  # the broken pool was closed, not handed on; the search opened its own
    assert ("close", second) in log and broken.submitted == [] and cold.waited


def test_a_resumed_search_passes_over_finished_problems(kv, tmp_path):
    from omnitune.profile.device import current_device_facts

    spec, problems = kv
    _search(spec, problems[:2], tmp_path, _ahead(spec, problems[:2], [])[0], trials=2)
    log: list = []
    ahead, pools = _ahead(spec, problems, log, trials=2)
    device_key = current_device_facts(interpret=True).key
    ahead.prepare_after(spec, problems[0], DTYPE, limits=DeviceLimits(), device_key=device_key,
                        catalogue=tmp_path / "results.db")
    third = spec.problem_key(problems[2])
    assert [e[:2] for e in log] == [("open", third), ("submit", third)]  # the finished second passed over


def test_the_users_tries_are_compiled_ahead_right_after_the_default(kv, tmp_path):
    spec, problems = kv
    log: list = []
    tries = ({"BLOCK_T": 4}, {"BLOCK_T": 2})  # one warp each: more would idle on these tiny tiles
    pools: dict = {}

    def make_pool(spec, problem, dtype):
        key = spec.problem_key(problem)
        pools.setdefault(key, []).append(LoggedPool(log, key))
        log.append(("open", key))
        return pools[key][-1]

    ahead = ProblemsAhead([(spec, p, DTYPE) for p in problems], workers=2, trials=3, make_pool=make_pool, tries=tries)
    with ahead:
        from omnitune.cli.search_cmd import search_problems

        search_problems(spec, problems, DTYPE, trials=3, timeout_s=None, sampler="tpe", seed=0,
                        db=str(tmp_path / "results.db"), storage=None, interpret=True, precompile_workers=2,
                        ahead=ahead, tries=tries)
    following = spec.problem_key(problems[1])
    submitted = next(e[2] for e in log if e[0] == "submit" and e[1] == following)
    expected = [spec.complete_config(values, problems[1], DTYPE) for values in tries]
    assert spec.default_config(problems[1], DTYPE) not in expected
    assert list(submitted) == [spec.default_config(problems[1], DTYPE), *expected]
    assert list(submitted) == first_configs(spec, problems[1], DTYPE, DeviceLimits(), [], tries)[:3]

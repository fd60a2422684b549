"""Re-timing the finalists: interleaved order, median and CV from a fake timing function, the
noisy flag, the winner by re-timed median, and how the driver stores it (Optuna attrs → catalogue
→ report) — all on the CPU, against a fake runner.

The toy kernel has 3 × 2 = 6 configs. Its search times rank C64_W8 < C32_W8 < C64_W4 < …, but
the fake interleaved timer (what a quieter GPU would say) puts C32_W8 first, with a 3 % spread.
"""

from __future__ import annotations

import dataclasses
import json
import re
import statistics
from dataclasses import dataclass

import optuna
import pytest
import torch

from omnitune import report
from omnitune.profile.device import INTERPRETER_DEVICE, DeviceFacts
from omnitune.profile.timing import interleaved_order
from omnitune.search.driver import RetimeStatus, SearchError, run_search
from omnitune.search.finalists import (
    NOISY_CV,
    FinalistTiming,
    pick_finalists,
    ranked,
    retime_finalists,
)
from omnitune.trial import TrialResult, TrialStatus
from omnitune.spec import Config, KernelSpec, Param
from omnitune.store import open_db, rebuild_catalogue

optuna.logging.set_verbosity(optuna.logging.WARNING)


@dataclass(frozen=True)
class ToyProblem:
    n: int


def _unused(*args, **kwargs):
    raise AssertionError("re-timing must go through the runner")


TOY = KernelSpec(
    name="toy_finalists", description="a fake kernel", problem_type=ToyProblem,
    params=(Param("BLOCK", (16, 32, 64)), Param("num_warps", (4, 8))), constraints=(),
    default_config=lambda problem, dtype: Config(BLOCK=16, num_warps=4),
    make_inputs=_unused, new_output=_unused, launch=_unused, reference=_unused,
    tolerance={torch.float32: 1e-4}, flops=lambda problem: 2e9, bytes_moved=lambda problem, dtype: 1e6,
    dtypes=(torch.float32,), example_problem=ToyProblem(n=4), module=__name__,
)
PROBLEM = ToyProblem(n=4)
DEFAULT = Config(BLOCK=16, num_warps=4)
C64_W8, C32_W8, C64_W4 = Config(BLOCK=64, num_warps=8), Config(BLOCK=32, num_warps=8), Config(BLOCK=64, num_warps=4)
SEARCH_MS = {C64_W8: 1.00, C32_W8: 1.02, C64_W4: 1.05, Config(BLOCK=32, num_warps=4): 1.3,
             Config(BLOCK=16, num_warps=8): 1.6, DEFAULT: 2.0}
# What the interleaved timer measures: C32_W8 is the fastest after all, and noisy (±3 %).
RETIMED_MS = {C32_W8: 0.99, C64_W8: 1.01, C64_W4: 1.06, Config(BLOCK=32, num_warps=4): 1.31, DEFAULT: 1.98}
NOISY_SPREAD = {C32_W8: 0.03}
ROUNDS = 6

GPU = DeviceFacts(
    name="Fake GPU 9000", compute_capability="9.0", multiprocessors=132, memory_gib=80.0, l2_cache_mib=50.0,
    shared_memory_per_block_kib=227.0, driver="1.0", cuda="12.8", torch="2.x", triton="3.x", omnitune="0.1.0",
    python="3.12",
)


def fake_samples(config: Config, rounds: int) -> list[float]:
    """Alternating ±spread around the re-timed median: median and CV known by construction."""
    spread = NOISY_SPREAD.get(config, 0.002)
    return [RETIMED_MS[config] * (1 + spread * (1 if i % 2 else -1)) for i in range(rounds)]


class FakeRunner:
    """measure() reports SEARCH_MS; time_interleaved() reports fake_samples, and records its calls."""

    def __init__(self, fail_retiming: bool = False):
        self.measured: list[Config] = []
        self.retimed: list[tuple[list[Config], int]] = []
        self.fail_retiming = fail_retiming

    def measure(self, config: Config) -> TrialResult:
        self.measured.append(config)
        t = SEARCH_MS[config]
        return TrialResult(config, TrialStatus.OK, time_ms=t, p20_ms=t * 0.99, p80_ms=t * 1.01, rel_error=1e-6,
                           tflops=2.0 / t, tbps=0.001 / t, extra={"repetitions": 50})

    def time_interleaved(self, configs, rounds):
        self.retimed.append((list(configs), rounds))
        if self.fail_retiming:
            raise RuntimeError("the GPU fell off the bus")
        return [fake_samples(c, rounds) for c in configs]


def search(runner: FakeRunner, storage_url: str, *, device: DeviceFacts = GPU, db=None, **kwargs):
    settings = {"trials": 6, "sampler": "grid", "finalists": 3, "finalist_rounds": ROUNDS} | kwargs
    return run_search(TOY, PROBLEM, torch.float32, runner_factory=lambda: runner, device=device,
                      storage_url=storage_url, db=db, **settings)


@pytest.fixture
def storage_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'studies.optuna.db'}"


# --- the pure parts ------------------------------------------------------------------------------


def test_interleaved_order_times_each_once_per_round_and_rotates_the_start():
    order = interleaved_order(3, 4)
    assert order == [0, 1, 2, 1, 2, 0, 2, 0, 1, 0, 1, 2]
    rounds = [order[i:i + 3] for i in range(0, 12, 3)]
    assert all(sorted(r) == [0, 1, 2] for r in rounds)
    assert {r[0] for r in rounds} == {0, 1, 2}  # no callable always runs first
    with pytest.raises(ValueError):
        interleaved_order(0, 3)


@pytest.mark.parametrize("spread", [0.005, 0.03])
def test_median_cv_and_the_noisy_flag_follow_the_samples(spread):
    samples = [1.0 * (1 + spread * (1 if i % 2 else -1)) for i in range(10)] + [1.0]
    timing = FinalistTiming.from_samples(C64_W8, samples)
    assert timing.median_ms == statistics.median(samples)
    assert timing.mean_ms == pytest.approx(statistics.fmean(samples))
    assert timing.cv == pytest.approx(statistics.stdev(samples) / statistics.fmean(samples))
    assert timing.rounds == len(samples)
    assert timing.noisy is (timing.cv > NOISY_CV)
    assert timing.noisy is (spread > NOISY_CV)  # ±3 % alternating is a CV of about 3 %


def test_a_spread_needs_two_positive_samples():
    with pytest.raises(ValueError, match="at least 2"):
        FinalistTiming.from_samples(C64_W8, [1.0])
    with pytest.raises(ValueError, match="positive and finite"):
        FinalistTiming.from_samples(C64_W8, [1.0, float("nan")])


C32_W4_SDPA = Config(BACKEND="sdpa", BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1, PACK_GQA=False,
                     USE_TMA=False)


def test_pick_finalists_always_retimes_the_other_backends_that_ran():
    by_search = [C64_W8, C32_W8, C64_W4, DEFAULT]
    backend, never_ran = C32_W4_SDPA, C64_W8.replace(num_stages=1)
    assert pick_finalists(by_search + [backend], 1, DEFAULT, always=[backend, never_ran]) == \
        [C64_W8, DEFAULT, backend]
    assert pick_finalists(by_search + [backend], 0, DEFAULT, always=[backend]) == []  # finalists off


def test_pick_finalists_adds_the_default_after_the_top_k():
    by_search = [C64_W8, C32_W8, C64_W4, Config(BLOCK=32, num_warps=4), DEFAULT]
    assert pick_finalists(by_search, 3, DEFAULT) == [C64_W8, C32_W8, C64_W4, DEFAULT]
    assert pick_finalists(by_search, 5, DEFAULT) == by_search  # already among them: not twice
    assert pick_finalists(by_search[:4], 2, DEFAULT) == [C64_W8, C32_W8]  # the default failed: not re-timed
    assert pick_finalists(by_search, 0, DEFAULT) == []


def test_retime_finalists_times_them_together_and_ranks_by_median():
    runner = FakeRunner()
    configs = [C64_W8, C32_W8, C64_W4]
    timings = retime_finalists(runner, configs, rounds=ROUNDS)
    assert runner.retimed == [(configs, ROUNDS)]  # one interleaved run for all of them
    assert [t.config for t in timings] == configs
    assert [t.median_ms for t in timings] == [statistics.median(fake_samples(c, ROUNDS)) for c in configs]
    assert [t.config for t in ranked(timings)] == [C32_W8, C64_W8, C64_W4]
    assert [t.noisy for t in timings] == [False, True, False]
    with pytest.raises(ValueError, match="at least 2 rounds"):
        retime_finalists(runner, configs, rounds=1)
    with pytest.raises(ValueError, match="different config"):
        retime_finalists(runner, [C64_W8, C64_W8])


# --- in the driver ---------------------------------------------------------------------------------


def test_the_winner_is_the_best_re_timed_median_and_is_stored_for_the_report(storage_url, tmp_path):
    db_path = tmp_path / "results.db"
    runner = FakeRunner()
    outcome = search(runner, storage_url, db=open_db(db_path))

    # The top 3 by search time, and the default beside them, timed together once.
    assert runner.retimed == [([C64_W8, C32_W8, C64_W4, DEFAULT], ROUNDS)]
    assert outcome.retime_status is RetimeStatus.RETIMED
    assert [t.config for t in outcome.finalists] == [C32_W8, C64_W8, C64_W4, DEFAULT]
    winner = outcome.finalists[0]
    assert winner.noisy and not any(t.noisy for t in outcome.finalists[1:])
    assert outcome.best.config == C32_W8  # not the search's fastest, C64_W8
    assert outcome.best.time_ms == pytest.approx(statistics.median(fake_samples(C32_W8, ROUNDS)))
    assert outcome.best.tflops == pytest.approx(2.0 / outcome.best.time_ms)  # rates follow the re-timed median
    assert outcome.default.time_ms == pytest.approx(statistics.median(fake_samples(DEFAULT, ROUNDS)))
    assert outcome.ranking[:4] == (C32_W8, C64_W8, C64_W4, DEFAULT)
    assert set(outcome.ranking) == set(SEARCH_MS)
    assert outcome.measured_total == 6  # re-timings are not measured configs

    # In Optuna: one trial per finalist, its figures in the measurement attr's extra.
    study = optuna.load_study(study_name="toy_finalists|n=4|fp32|Fake_GPU_9000", storage=storage_url)
    retimings = [t for t in study.trials if t.user_attrs["measurement"]["chosen_by"] == "finalist"]
    assert len(retimings) == 4
    for trial in retimings:
        facts = trial.user_attrs["measurement"]["extra"]["finalist"]
        original = study.trials[facts["retime_of"]]
        assert original.user_attrs["config_json"] == trial.user_attrs["config_json"]
        assert facts["session"] == 1 and facts["rounds"] == ROUNDS
        assert facts["search_time_ms"] == original.user_attrs["time_ms"]
        assert trial.user_attrs["time_ms"] == facts["median_ms"] == trial.value

    # In the catalogue, and so in the report: the re-timed winner, its CV, the noisy flag.
    def best_row(path):
        summary = report.summarize(report.load_trials(path))
        assert len(summary) == 1
        return summary.iloc[0]

    row = best_row(db_path)
    assert row["best_config"] == C32_W8.label()
    assert row["time_ms"] == pytest.approx(outcome.best.time_ms)
    assert row["cv"] == pytest.approx(winner.cv) and row["noisy"] is True
    assert row["default_time_ms"] == pytest.approx(outcome.default.time_ms)
    assert row["trials"] == 6  # the re-timings are not counted as trials
    # The catalogue can be rebuilt from Optuna alone: the re-timing travels in the trial attrs.
    rebuilt = tmp_path / "rebuilt.db"
    rebuild_catalogue(open_db(rebuilt), storage_url)
    rebuilt_row = best_row(rebuilt)
    assert (rebuilt_row["best_config"], rebuilt_row["cv"]) == (row["best_config"], row["cv"])


def test_a_rerun_with_the_same_finalists_reuses_their_re_timing(storage_url, tmp_path):
    search(FakeRunner(), storage_url)
    again = FakeRunner()
    outcome = search(again, storage_url)
    assert again.measured == [] and again.retimed == []
    assert outcome.retime_status is RetimeStatus.REUSED
    assert outcome.best.config == C32_W8
    # More finalists than last time: a new re-timing, session 2.
    more = FakeRunner()
    outcome = search(more, storage_url, finalists=4)
    assert outcome.retime_status is RetimeStatus.RETIMED and len(more.retimed) == 1
    study = optuna.load_study(study_name="toy_finalists|n=4|fp32|Fake_GPU_9000", storage=storage_url)
    sessions = [t.user_attrs["measurement"]["extra"]["finalist"]["session"] for t in study.trials
                if "finalist" in t.user_attrs["measurement"]["extra"]]
    assert sorted(set(sessions)) == [1, 2] and sessions.count(2) == 5


def test_no_re_timing_when_disabled_under_the_interpreter_or_when_it_fails(storage_url, tmp_path):
    disabled = FakeRunner()
    outcome = search(disabled, storage_url, finalists=0)
    assert outcome.retime_status is RetimeStatus.DISABLED and disabled.retimed == []
    assert outcome.best.config == C64_W8 and outcome.finalists == ()

    interpreted = FakeRunner()
    outcome = search(interpreted, f"sqlite:///{tmp_path / 'interpreted.db'}",
                     device=dataclasses.replace(GPU, name=INTERPRETER_DEVICE))
    assert outcome.retime_status is RetimeStatus.INTERPRETER and interpreted.retimed == []

    failing = FakeRunner(fail_retiming=True)
    outcome = search(failing, f"sqlite:///{tmp_path / 'failing.db'}")
    assert outcome.retime_status is RetimeStatus.FAILED and "fell off the bus" in outcome.retime_detail
    assert outcome.best.config == C64_W8  # the search's own times stand


def test_the_search_command_lists_the_finalists_winner_first(storage_url):
    from omnitune.cli.live import finalist_lines

    outcome = search(FakeRunner(), storage_url)
    lines = finalist_lines(outcome, DEFAULT)
    assert f"interleaved, {ROUNDS} rounds" in lines[0]
    listed = lines[1:]
    assert [t.config.label() in line for t, line in zip(outcome.finalists, listed)] == [True] * 4
    assert "noisy" in listed[0] and not any("noisy" in line for line in listed[1:])
    assert listed[-1].endswith(f"{DEFAULT.label()} (default)")
    assert "earlier run" in finalist_lines(search(FakeRunner(), storage_url), DEFAULT)[0]


@pytest.mark.parametrize(("kwargs", "message"), [({"finalists": -1}, "0 (no re-timing) or more"),
                                                 ({"finalist_rounds": 1}, "at least 2 rounds")])
def test_bad_finalist_settings_are_user_errors(kwargs, message, storage_url):
    with pytest.raises(SearchError, match=re.escape(message)):
        search(FakeRunner(), storage_url, **kwargs)


@pytest.mark.gpu
def test_interleaved_cuda_timing_gives_one_sample_per_round():
    from omnitune.profile.timing import time_interleaved

    a = torch.randn(2048, 2048, device="cuda")
    b = torch.randn(4096, 4096, device="cuda")
    samples = time_interleaved([lambda: a @ a, lambda: b @ b], rounds=7)
    assert [len(s) for s in samples] == [7, 7]
    # 8× the work: the larger matmul is clearly slower in every round's median.
    assert statistics.median(samples[1]) > 2 * statistics.median(samples[0])
    assert all(t > 0 for s in samples for t in s)
    assert json.dumps(samples)  # plain floats


def test_the_winner_and_then_the_default_are_stored_first():
    # A process killed part-way through storing a re-timing leaves what a report reads first:
    # the winner, then the default its speedup is taken against.
    from omnitune.search.finalists import FinalistTiming, _storing_order
    from omnitune.spec import Config

    def timing(n, ms):
        return FinalistTiming(Config(BLOCK_M=n), ms, ms, 0.01, ms, ms, 5)

    default = Config(BLOCK_M=64)
    timings = [timing(16, 2.0), timing(32, 1.0), timing(64, 3.0), timing(128, 1.5)]
    assert [t.config["BLOCK_M"] for t in _storing_order(timings, default)] == [32, 64, 128, 16]
    assert [t.config["BLOCK_M"] for t in _storing_order(timings, Config(BLOCK_M=32))] == [32, 128, 16, 64]


def test_a_re_timing_cut_short_while_stored_leaves_the_report_on_the_searchs_own_figures(storage_url, tmp_path):
    """A process stopped after storing the re-timed winner but before the default beside it: the
    winner's re-timed median against the search's own time of the default would be a speedup of
    two measurements taken apart. The session says how many configs it re-timed; one with fewer
    rows stored is set aside, and the key reports the search's figures."""
    import sqlite3

    db_path = tmp_path / "results.db"
    search(FakeRunner(), storage_url, db=open_db(db_path))
    with sqlite3.connect(db_path) as conn:
        rows = conn.execute("SELECT trial_number, extra_json FROM trials").fetchall()
        retimings = {number: json.loads(extra)["finalist"] for number, extra in rows if "finalist" in extra}
        assert sorted(f["configs"] for f in retimings.values()) == [4, 4, 4, 4]
        whole = report.summarize(report.load_trials(db_path)).iloc[0]
        assert whole["best_config"] == C32_W8.label()  # the re-timing's winner, as stored whole
        first = min(retimings)  # stored first: the winner
        conn.execute(f"DELETE FROM trials WHERE trial_number IN ({','.join(str(n) for n in retimings if n != first)})")
    row = report.summarize(report.load_trials(db_path)).iloc[0]
    assert row["best_config"] == C64_W8.label() and row["time_ms"] == pytest.approx(SEARCH_MS[C64_W8])
    assert row["default_time_ms"] == pytest.approx(SEARCH_MS[DEFAULT])
    assert row["speedup_vs_default"] == pytest.approx(SEARCH_MS[DEFAULT] / SEARCH_MS[C64_W8])
    assert row["trials"] == 6

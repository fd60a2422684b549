"""Every search strategy through the real driver, over a sweep recorded on an H200 and replayed
(omnitune.measure.replay): no GPU, no kernel launched. Modelled on Kernel Tuner's strategy tests
(each strategy tuned on a simulation cache): every strategy, alone or in the chains the search
uses, measures the budget, each config once, only valid ones, and reports the best of what it
measured; the strategy seam's own contract (propose, propose_batch, tell) holds for each.
"""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest
import torch
from optuna.trial import TrialState

from omnitune.measure.replay import ReplayMiss, ReplayRunner, recorded_results, replay_device
from omnitune.registry import get_spec
from omnitune.search.driver import SearchOptions, StopReason, run_search
from omnitune.search.space import ConfigSpace
from omnitune.search.strategies import STRATEGIES, Setting, make_sampler
from omnitune.search.strategies.base import Told
from omnitune.search.strategies.fallback import SAMPLER_PATIENCE
from omnitune.search.study import Ledger, SharedStudy
from omnitune.spec import DeviceLimits
from omnitune.trial import TrialResult, TrialStatus

optuna.logging.set_verbosity(optuna.logging.WARNING)

SWEEP = Path(__file__).with_name("data") / "sweep_kv_cache_write_t64_h200.json"
SPEC = get_spec("kv_cache_write")
PROBLEM_KEY = "t=64,hkv=4,d=128,block_size=16"
PROBLEM = SPEC.parse_shape(PROBLEM_KEY)
DTYPE = torch.bfloat16
VALID = SPEC.valid_configs(PROBLEM, DTYPE)
RECORDED = recorded_results(json.loads(SWEEP.read_text())["trials"], SPEC, PROBLEM_KEY, "bf16")
# Two configs fail as they would on a GPU, so that penalties are exercised too.
FAILING = VALID[5:7]
for _config in FAILING:
    RECORDED[_config] = TrialResult(_config, TrialStatus.MISMATCH, detail="relative error 1 > tolerance")
BUDGET = 20

# The chains a search runs (omnitune.search.strategies.default_chain) and each strategy alone
# where it can stand alone: every strategy of STRATEGIES is in one (checked below).
CHAINS = {
    "tpe": (("planned", "fallback", "tpe"), "tpe"),
    "random": (("planned", "fallback", "random"), "random"),
    "cmaes": (("planned", "fallback", "cmaes"), "cmaes"),
    "tpe alone": (("tpe",), "tpe"),
    "random, cold": (("fallback", "random"), "random"),
    "grid": (("planned", "grid"), "grid"),
    "grid alone": (("grid",), "grid"),
    "enumeration": (("planned", "enumeration"), "tpe"),
}


def replay(chain, sampler, *, trials=BUDGET, seed=0, recorded=RECORDED, **kwargs):
    runner = ReplayRunner(recorded)
    options = SearchOptions(device=replay_device("NVIDIA H200"), trials=trials, sampler=sampler, seed=seed,
                            finalists=0, strategies=chain, warm_start=())
    storage = optuna.storages.InMemoryStorage()
    outcome = run_search(SPEC, PROBLEM, DTYPE, options, runner_factory=lambda: runner, storage=storage, **kwargs)
    return outcome, runner, storage


def test_every_strategy_is_in_a_tested_chain():
    assert {name for chain, _ in CHAINS.values() for name in chain} == set(STRATEGIES)


def test_the_recording_is_the_exhaustive_sweep_the_tests_need():
    assert set(RECORDED) == set(VALID) and len(VALID) == 65 > BUDGET


@pytest.mark.parametrize("name", list(CHAINS))
def test_each_strategy_measures_the_budget_once_each_and_reports_the_best_it_measured(name):
    chain, sampler = CHAINS[name]
    outcome, runner, storage = replay(chain, sampler)
    assert outcome.stop_reason is StopReason.BUDGET
    assert outcome.measured_total == outcome.measured_now == BUDGET == len(runner.calls)
    assert len(set(runner.calls)) == BUDGET and set(runner.calls) <= set(VALID)
    ok = [RECORDED[c] for c in runner.calls if RECORDED[c].status is TrialStatus.OK]
    assert outcome.best == min(ok, key=lambda r: r.time_ms)
    if "planned" in chain:
        assert runner.calls[0] == SPEC.default_config(PROBLEM, DTYPE)
    study = optuna.load_study(study_name=outcome.study_name, storage=storage)
    chosen = {t.user_attrs["measurement"]["chosen_by"] for t in study.trials if t.state is TrialState.COMPLETE
              and "measurement" in t.user_attrs}
    labels = {"planned": {"default", "known-good", "warm-start"}, "fallback": {"fallback"}}
    assert chosen <= set().union(*(labels.get(n, {n}) for n in chain))
    # Seeded: the same search again measures the same configs in the same order.
    assert replay(chain, sampler)[1].calls == runner.calls


def test_an_enumeration_measures_every_valid_config_and_stops_exhausted():
    outcome, runner, _ = replay(("grid",), "grid", trials=100)
    assert outcome.stop_reason is StopReason.EXHAUSTED and runner.calls == VALID
    assert outcome.failures == {TrialStatus.MISMATCH: 2}
    assert outcome.best == min((r for r in RECORDED.values() if r.status is TrialStatus.OK), key=lambda r: r.time_ms)


def test_stop_when_ends_the_search_once_it_says_so():
    best = min((r for r in RECORDED.values() if r.status is TrialStatus.OK), key=lambda r: r.time_ms)
    outcome, runner, _ = replay(("grid",), "grid", trials=100, stop_when=lambda p: p.result.config == best.config)
    assert outcome.stop_reason is StopReason.TARGET and runner.calls[-1] == best.config
    assert runner.calls == VALID[:VALID.index(best.config) + 1]


def test_a_config_the_recording_lacks_is_an_error_not_a_made_up_figure():
    partial = {c: r for c, r in RECORDED.items() if c != VALID[3]}
    with pytest.raises(ReplayMiss, match="not an exhaustive sweep"):
        replay(("grid",), "grid", trials=10, recorded=partial)


# --- the seam itself --------------------------------------------------------------------------------


def _setting(study: optuna.Study) -> Setting:
    shared = SharedStudy(study)
    space = ConfigSpace(SPEC)
    default = SPEC.default_config(PROBLEM, DTYPE)
    return Setting(spec=SPEC, problem=PROBLEM, dtype=DTYPE, limits=DeviceLimits(), space=space, valid=tuple(VALID), default=default,
                   known_good=tuple(c for c in SPEC.known_good_configs(PROBLEM, DTYPE) if c != default),
                   warm_start=(VALID[-1],), seed=0, sampler="tpe", ask=lambda: shared.ask(space.distributions))


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_each_strategy_keeps_the_seams_contract(name):
    sampler = name if name in ("tpe", "random", "cmaes") else "tpe"
    study = optuna.create_study(sampler=make_sampler(sampler, 0, constant_liar=sampler == "tpe"))
    strategy = STRATEGIES[name](_setting(study))
    ledger = Ledger()
    ledger.add(0, RECORDED[VALID[0]], 1.0)  # measured already: never proposed
    for _ in range(SAMPLER_PATIENCE):  # the fallback proposes only once the sampler has stalled
        strategy.tell(Told(VALID[1], "tpe", None))
    batch = strategy.propose_batch(ledger, 4)
    configs = [p.config for p in batch]
    assert len(batch) <= 4 and VALID[0] not in configs
    if strategy.lookahead or name == "fallback":
        assert set(configs) <= set(VALID)  # a sampler may propose what a constraint then prunes
    if strategy.lookahead:
        assert len(set(configs)) == len(configs)  # as if each were measured before the next
        assert batch and strategy.propose(ledger) == batch[0]  # nothing asked: the same again
        assert all(p.trial is None for p in batch)
    elif name in ("tpe", "random", "cmaes"):
        assert len(batch) == 4 and all(p.trial is not None for p in batch)  # asked trials, running
        assert sum(t.state is TrialState.RUNNING for t in study.trials) == 4
    else:
        assert len(batch) == 1 and batch[0].chosen_by == "fallback"
    strategy.tell(Told(configs[0] if configs else VALID[1], batch[0].chosen_by if batch else name,
                       RECORDED[VALID[1]]))


def test_a_recording_older_than_a_parameter_is_replayed_over_the_space_it_measured():
    """A sweep recorded before attention had BACKEND names no backend: its space is the triton
    kernel's alone, and the known-good SDPA configs are left out of the replay."""
    from omnitune.measure.replay import narrowed_to_recording

    spec = get_spec("attention")
    key = "b=1,h=4,hkv=2,lq=16,lk=32,d=64,causal=0,spans=0,span_len=0"
    old_row = {"kernel": "attention", "problem_key": key, "dtype": "fp16",
               "config_json": json.dumps({"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1,
                                          "PACK_GQA": False, "USE_TMA": False})}
    narrowed = narrowed_to_recording(spec, [old_row], key, "fp16")
    assert narrowed.param("BACKEND").choices == ("triton",) and len(narrowed.known_good) < len(spec.known_good)
    assert all(values.get("BACKEND", "triton") == "triton" for values in narrowed.known_good)
    problem = spec.parse_shape(key)
    assert {c["BACKEND"] for c in narrowed.valid_configs(problem, torch.float16)} == {"triton"}
    assert narrowed_to_recording(SPEC, [], PROBLEM_KEY, "bf16") is SPEC  # nothing added since


def test_the_first_proposals_keep_their_order_and_each_config_its_first_role():
    """The default, the user's tries, known-good, warm start: a config named twice is measured
    once, for the first role it holds (what prepare_next compiles ahead in the same order)."""
    from omnitune.search.strategies import first_proposals

    default, a, b, c = VALID[0], VALID[1], VALID[2], VALID[3]
    proposals = first_proposals(default, (a, default), (b, a), (c, b, default))
    assert proposals == [(default, "default"), (a, "given"), (b, "known-good"), (c, "warm-start")]
    assert first_proposals(default, (), (), ()) == [(default, "default")]

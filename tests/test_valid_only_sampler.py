"""The sampler kept inside the valid, unmeasured configs (omnitune.search.strategies.valid_only):
through the real driver over a recorded sweep, no proposal is pruned by a constraint where the
unwrapped sampler's were; and its rules one by one over a stub sampler."""

from __future__ import annotations

import importlib.util

import optuna
import pytest
from optuna.trial import TrialState

from omnitune.search import driver
from omnitune.search.space import ConfigSpace
from omnitune.search.strategies import make_sampler
from omnitune.search.strategies.valid_only import ValidOnly
from test_strategies import DTYPE, PROBLEM, SPEC, VALID, replay

optuna.logging.set_verbosity(optuna.logging.WARNING)
SPACE = ConfigSpace(SPEC)
SAMPLERS = ["tpe", "random"] + (["cmaes"] if importlib.util.find_spec("cmaes") else [])


def _statuses(storage, outcome) -> list:
    """Each trial's recorded status ('ok', 'pruned', ...; None for a proposal that was a repeat)."""
    return [t.user_attrs.get("status") for t in optuna.load_study(study_name=outcome.study_name, storage=storage).trials]


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_no_proposal_is_pruned_or_repeated_where_the_unwrapped_sampler_wasted_many(sampler, monkeypatch):
    chain = ("planned", "fallback", sampler)
    outcome, runner, storage = replay(chain, sampler, trials=40)
    statuses = _statuses(storage, outcome)
    assert len(statuses) == 40 and "pruned" not in statuses and None not in statuses  # one trial a measurement
    assert len(runner.calls) == len(set(runner.calls)) == 40 and set(runner.calls) <= set(VALID)
    assert replay(chain, sampler, trials=40)[1].calls == runner.calls  # seeded
    # The same search with the sampler as it is: constraints prune its proposals (the 65 valid
    # configs are 37% of the box) and it repeats itself, so the test above can fail.
    monkeypatch.setattr(driver, "ValidOnly", lambda inner, *args, **kwargs: inner)
    unwrapped, _, unwrapped_storage = replay(chain, sampler, trials=40)
    wasted = [s for s in _statuses(unwrapped_storage, unwrapped) if s in ("pruned", None)]
    assert len(wasted) >= 10


class _Proposing(optuna.samplers.BaseSampler):
    """Proposes one fixed point (or nothing: a sampler in its startup)."""

    def __init__(self, params):
        self.params = params

    def infer_relative_search_space(self, study, trial):
        return {}

    def sample_relative(self, study, trial, search_space):
        return dict(self.params)

    def sample_independent(self, study, trial, param_name, param_distribution):
        return param_distribution.low


class _Study:
    """A study whose finished trials' configs a ValidOnly takes as taken (the search's ledger's part)."""

    def __init__(self, inner, valid=VALID):
        self.study = None
        self.sampler = ValidOnly(inner, SPACE, valid, seed=0, taken=self.taken)
        self.study = optuna.create_study(sampler=self.sampler)

    def taken(self):
        return {SPACE.decode(t.params) for t in self.study.get_trials(deepcopy=False) if t.state.is_finished()}

    def ask(self):
        trial = self.study.ask(SPACE.distributions)
        return trial, SPACE.decode(trial.params)


def _steps(a, b) -> int:
    return sum(abs(x - y) for x, y in zip(SPACE.encode(a).values(), SPACE.encode(b).values()))


def test_an_invalid_proposal_becomes_the_nearest_valid_unmeasured_config():
    invalid = next(c for c in SPEC.all_configs() if SPEC.violations(PROBLEM, c, DTYPE))
    search = _Study(_Proposing(SPACE.encode(invalid)))
    first, config = search.ask()
    nearest = min(_steps(invalid, c) for c in VALID)
    assert config in VALID and _steps(invalid, config) == nearest
    search.study.tell(first, 1.0)
    _, second = search.ask()
    assert second in VALID and second != config  # the first is measured: the next nearest
    assert _steps(invalid, second) >= nearest


def test_a_valid_new_proposal_stands_and_a_measured_one_moves():
    wanted = VALID[10]
    search = _Study(_Proposing(SPACE.encode(wanted)))
    trial, config = search.ask()
    assert config == wanted
    search.study.tell(trial, 1.0)
    assert search.ask()[1] != wanted


def test_without_a_proposal_a_random_valid_config_and_when_all_are_taken_the_samplers_own():
    search = _Study(_Proposing({}), VALID[:3])
    seen = []
    for _ in range(3):
        trial, config = search.ask()
        seen.append(config)
        search.study.tell(trial, 1.0)
    assert sorted(map(str, seen)) == sorted(map(str, VALID[:3]))
    # every valid config taken: the inner sampler's own choice (here its independent one) stands
    assert search.ask()[0].params == {n: d.low for n, d in SPACE.distributions.items()}


def test_tpe_wrapped_keeps_its_hooks_and_its_model():
    search = _Study(make_sampler("tpe", 0, constant_liar=True))
    configs = []
    for i in range(25):  # past TPE's 10 startup trials: its relative proposals, kept valid
        trial, config = search.ask()
        configs.append(config)
        search.study.tell(trial, float(i % 7))
    assert set(configs) <= set(VALID) and len(set(configs)) == 25

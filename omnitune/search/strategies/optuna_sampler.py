"""Optuna's samplers as strategies: TPE (multivariate: BLOCK_M and num_warps matter together),
random and CMA-ES, over the space's choice indices (omnitune.search.space).

The sampler lives in the study (Optuna asks it when a trial is asked), so a proposal here is an
asked trial; the study also holds every result, so telling is Optuna's own business. A batch is
`k` trials asked at once: with constant_liar (TPE), each later ask treats the earlier running
ones as bad, so the batch spreads out instead of repeating one proposal.
"""

from __future__ import annotations

import importlib.util
import warnings

import optuna

from omnitune.search.strategies.base import Proposal, SamplerName, Setting, Told, parse_sampler


class OptunaSampler:
    lookahead = False

    def __init__(self, setting: Setting, name: str):
        self.setting = setting
        self.name = name

    def propose(self, ledger) -> Proposal:
        trial = self.setting.ask()
        return Proposal(self.setting.space.decode(trial.params), self.name, trial)

    def propose_batch(self, ledger, k: int) -> list[Proposal]:
        return [self.propose(ledger) for _ in range(k)]

    def tell(self, told: Told) -> None:
        pass


def make_sampler(name: SamplerName | str, seed: int, *, constant_liar: bool = False,
                 startup_trials: int | None = None) -> optuna.samplers.BaseSampler:
    """The Optuna sampler behind --sampler. Grid gets a random sampler that is never consulted:
    every grid trial has its params fixed by the driver. startup_trials: TPE's random trials
    before its model (None: Optuna's 10)."""
    from omnitune.search.outcome import SearchError

    name = parse_sampler(name)
    if name is SamplerName.TPE:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            startup = {} if startup_trials is None else {"n_startup_trials": startup_trials}
            return optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=constant_liar, **startup)
    if name is SamplerName.CMAES:
        if importlib.util.find_spec("cmaes") is None:
            raise SearchError("--sampler cmaes needs the 'cmaes' package (pip install cmaes); or use tpe, random, grid")
        return optuna.samplers.CmaEsSampler(seed=seed, warn_independent_sampling=False)
    return optuna.samplers.RandomSampler(seed=seed)

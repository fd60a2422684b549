"""The search strategies, by name, and the chain each --sampler stands for.

Each strategy is a small module implementing omnitune.search.strategies.base.Strategy; a new
one is a module and a line in STRATEGIES. A search asks a chain of them (SearchOptions.strategies,
or the chain of its --sampler, `default_chain`): the first proposal wins.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import partial

from omnitune.search.strategies.base import Chain, SamplerName, Setting, Strategy, parse_sampler
from omnitune.search.strategies.fallback import RandomUnmeasured
from omnitune.search.strategies.grid import Grid
from omnitune.search.strategies.optuna_sampler import OptunaSampler, make_sampler
from omnitune.search.strategies.planned import Planned, first_proposals, tried_configs, warm_start_configs

__all__ = ["OPTUNA_STRATEGIES", "STRATEGIES", "Chain", "SamplerName", "Setting", "Strategy", "build_chain",
           "default_chain", "first_proposals", "make_sampler", "parse_sampler", "tried_configs", "warm_start_configs"]

STRATEGIES: Mapping[str, Callable[[Setting], Strategy]] = {
    "planned": Planned,                                    # default → --try → known-good → warm start
    "grid": partial(Grid, label="grid"),                   # every valid config, in the spec's order
    "enumeration": partial(Grid, label="enumeration"),     # the same, when they all fit the budget
    "tpe": partial(OptunaSampler, name="tpe"),             # Optuna's samplers, over the choice indices
    "random": partial(OptunaSampler, name="random"),
    "cmaes": partial(OptunaSampler, name="cmaes"),
    "fallback": RandomUnmeasured,                          # a random unmeasured config when the sampler stalls
}
# The strategies that are an Optuna sampler: the study is created with it (at most one per chain).
OPTUNA_STRATEGIES = frozenset({"tpe", "random", "cmaes"})


def default_chain(sampler: SamplerName | str, enumerate_all: bool) -> tuple[str, ...]:
    """The chain `--sampler` stands for: the planned configs first; then every valid config in
    order with grid, or when they all fit the budget; else the sampler, with the fallback ahead
    of it for when it stalls."""
    sampler = parse_sampler(sampler)
    if sampler is SamplerName.GRID:
        return ("planned", "grid")
    if enumerate_all:
        return ("planned", "enumeration")
    return ("planned", "fallback", sampler.value)


def build_chain(names: Sequence[str], setting: Setting) -> Chain:
    return Chain([STRATEGIES[name](setting) for name in names])

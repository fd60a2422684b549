"""The strategy seam: what a strategy is told, what it proposes, and how a chain of them decides.

A strategy proposes the next config to measure (or passes), and is told every trial's outcome.
The driver asks a chain of them in order — the planned configs, then an enumeration or a
sampler, with a random unmeasured config when the sampler keeps repeating itself — and the first
proposal wins. When no strategy of the chain proposes anything, the search is exhausted.

Proposals are made against the study's ledger (omnitune.search.study.Ledger): `ledger.busy` is
every config measured or being measured, here or in another process, and a strategy never
proposes one of those (the driver would not measure it twice anyway, but a strategy that repeats
itself wastes a trial).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from omnitune.errors import OmnituneError
from omnitune.spec import Config, DeviceLimits, KernelSpec
from omnitune.trial import TrialResult, TrialStatus

if TYPE_CHECKING:
    import optuna
    import torch

    from omnitune.search.space import ConfigSpace
    from omnitune.search.study import Ledger


class SamplerName(str, enum.Enum):
    """The choices of --sampler."""

    TPE = "tpe"
    RANDOM = "random"
    GRID = "grid"
    CMAES = "cmaes"


def parse_sampler(name: SamplerName | str) -> SamplerName:
    """The sampler a name (as given to --sampler) stands for; an error listing the choices."""
    from omnitune.search.outcome import SearchError

    try:
        return SamplerName(name.lower() if isinstance(name, str) else name)
    except ValueError:
        raise SearchError(
            f"unknown sampler {name!r}; choose one of {', '.join(s.value for s in SamplerName)}"
        ) from None


@dataclass(frozen=True)
class Setting:
    """What a strategy may know of the search it serves."""

    spec: KernelSpec
    problem: Any
    dtype: torch.dtype
    limits: DeviceLimits
    space: ConfigSpace
    valid: tuple[Config, ...] | None   # every valid config in the spec's order; None: too many to list
    default: Config
    known_good: tuple[Config, ...]     # the spec's, valid here
    warm_start: tuple[Config, ...]     # the nearest tuned problems' winners
    seed: int
    sampler: str                       # what a trial the study's Optuna sampler chose records as chosen_by
    ask: Callable[[], optuna.Trial]    # a new trial of the study's Optuna sampler's choosing
    tried: tuple[Config, ...] = ()     # the user's (search --try), completed here
    # The four lists may name a config twice (the default among the known-good, say): the planned
    # strategy measures it once, for its first role (planned.first_proposals).


@dataclass(frozen=True)
class Proposal:
    """A config to measure and who chose it (the trial's chosen_by). `trial` is the Optuna trial
    already asked for it (a sampler's proposal); otherwise the driver asks one for the config."""

    config: Config
    chosen_by: str
    trial: optuna.Trial | None = None


@dataclass(frozen=True)
class Told:
    """One trial's outcome, as every strategy of the chain hears it: the config, who chose it,
    and its result (None when the trial measured nothing: a repeat, or a config another process
    claimed first)."""

    config: Config
    chosen_by: str
    result: TrialResult | None

    @property
    def measured(self) -> bool:
        """Whether the trial spent a measurement (a constraint's prune or a repeat did not)."""
        return self.result is not None and self.result.status is not TrialStatus.PRUNED


class Strategy(Protocol):
    """A search strategy. `lookahead`: its proposals depend only on the ledger, so `propose_batch`
    may be called before anything is measured (to precompile what it will propose)."""

    lookahead: bool

    def propose(self, ledger: Ledger) -> Proposal | None:
        """The next config to measure, or None to leave the choice to the next strategy."""

    def propose_batch(self, ledger: Ledger, k: int) -> list[Proposal]:
        """The next `k` proposals at most, in order, as if each were measured before the next
        (a sampler asks `k` trials; Optuna's constant liar keeps them apart)."""

    def tell(self, told: Told) -> None:
        """A trial of the chain (chosen by any strategy) has finished."""


class FixedList:
    """Proposes configs from a fixed, labelled list in order, skipping busy ones."""

    lookahead = True

    def __init__(self, items: Sequence[tuple[Config, str]]):
        seen: set[Config] = set()
        self.items = [(c, label) for c, label in items if not (c in seen or seen.add(c))]

    def propose(self, ledger: Ledger) -> Proposal | None:
        batch = self.propose_batch(ledger, 1)
        return batch[0] if batch else None

    def propose_batch(self, ledger: Ledger, k: int) -> list[Proposal]:
        busy = ledger.busy
        return [Proposal(c, label) for c, label in self.items if c not in busy][:k]

    def tell(self, told: Told) -> None:
        pass


class Chain:
    """Strategies asked in order: the first proposal wins; all of them hear every outcome."""

    def __init__(self, strategies: Sequence[Strategy]):
        if not strategies:
            raise OmnituneError("a search needs at least one strategy")
        self.strategies = tuple(strategies)

    def propose(self, ledger: Ledger) -> Proposal | None:
        for strategy in self.strategies:
            proposal = strategy.propose(ledger)
            if proposal is not None:
                return proposal
        return None

    def tell(self, told: Told) -> None:
        for strategy in self.strategies:
            strategy.tell(told)

    def lookahead(self, ledger: Ledger) -> list[Config]:
        """The configs the chain will certainly propose next, in order: those of its leading
        lookahead strategies (the planned configs, an enumeration), up to the first that is not."""
        upcoming: list[Config] = []
        for strategy in self.strategies:
            if not strategy.lookahead:
                break
            upcoming += [p.config for p in strategy.propose_batch(ledger, _ALL) if p.config not in upcoming]
        return upcoming


_ALL = 2**62

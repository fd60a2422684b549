"""The compile-ahead queue (`--precompile` with a sampler): trials asked and claimed ahead of
measuring them, their configs handed to a pool (omnitune.measure.ahead) whose workers compile
while the GPU measures, so that no measurement waits on a compile while work is queued.

The driver says which trials to claim (omnitune.search.driver, _Search._claims_ahead): proposed
(by TPE with Optuna's constant liar, so that a batch spreads out), asked and claimed, so that the
budget and every process count them and a killed process leaves trials a rerun fails as abandoned;
a proposal a constraint rejects is stored as pruned at once, never compiled. The queue keeps
`pool.workers` of them waiting, marks them in the ledger as measured here, hands out first the
oldest one whose compile has finished — in order of claiming when the pool cannot say, or none
has (the driver then waits for the worker compiling the config, `ready`) — and fails those left
when the search stops: their configs stay measurable. Taking a compiled one first matters
because compiles take from one to several seconds: in claiming order, one slow compile at the
head kept the GPU waiting while configs behind it were ready, and a worker that had finished
waited for the next proposal, which comes only when a trial is handed out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from itertools import islice
from typing import TYPE_CHECKING

import optuna

from omnitune.search.strategies.fallback import SAMPLER_PATIENCE
from omnitune.search.study import Ledger
from omnitune.spec import Config

if TYPE_CHECKING:
    from omnitune.measure.ahead import CompilesAhead

# A claimed trial: the trial, its config, and who chose it.
Claimed = tuple[optuna.Trial, Config, str]


class AheadQueue:
    """The trials one search has claimed ahead, measured first in, first out. Every method is
    called under the search's lock."""

    def __init__(self, pool: CompilesAhead, ledger: Ledger):
        self.pool, self.ledger = pool, ledger
        self.trials: list[Claimed] = []

    def __bool__(self) -> bool:
        return bool(self.trials)

    def fill(self, claims: Iterator[Claimed | None]) -> None:
        """Take trials from `claims` until `pool.workers` wait, and hand their configs to the
        pool. `claims` yields None for a proposal that made no progress (a repeat, or a config a
        constraint rejects) and ends when nothing more can be claimed now."""
        if len(self.trials) >= self.pool.workers:
            return
        fresh: list[Config] = []
        # Repeats and rejected proposals make no progress: bounded, as the fallback bounds them.
        for claimed in islice(claims, self.pool.workers * (SAMPLER_PATIENCE + 2)):
            if claimed is not None:
                trial, config, _ = claimed
                self.ledger.queued[trial.number] = config
                self.trials.append(claimed)
                fresh.append(config)
                if len(self.trials) >= self.pool.workers:
                    break
        if fresh:
            self.pool.submit(fresh)

    def pop(self) -> Claimed:
        """The trial queued first whose config is compiled, else the one queued first (claimed
        already: the ledger counts it in flight)."""
        compiled = getattr(self.pool, "compiled", None)
        if compiled is not None:
            for index, (_, config, _) in enumerate(self.trials):
                if compiled(config):
                    return self.trials.pop(index)
        return self.trials.pop(0)

    def take(self, trial: optuna.Trial) -> bool:
        """Whether `trial` was claimed when it was queued; its mark in the ledger goes (the slot
        that measures it puts it in flight)."""
        return self.ledger.queued.pop(trial.number, None) is not None

    def ready(self, config: Config) -> None:
        """Wait for the worker compiling `config`, if one is: it finishes sooner than a compile
        in the measuring process."""
        self.pool.ready(config)

    def drop(self, tell_failed: Callable[[int], None]) -> None:
        """Fail the trials queued and never measured (the search stopped first): their configs
        stay measurable, by a rerun or another process."""
        for trial, _, _ in self.trials:
            tell_failed(trial.number)
        self.trials.clear()
        self.ledger.queued.clear()

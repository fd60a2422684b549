"""A random config not measured yet, when the sampler has proposed nothing new for a while.

Samplers repeat themselves near the end of a small space (TPE's model keeps pointing at the
configs it knows are good) and propose configs that a constraint rejects: each such proposal
costs no measurement but makes no progress either. After SAMPLER_PATIENCE of them in a row this
strategy picks a random unmeasured valid config, then gives the sampler a couple of chances
again before the next: the loop always makes progress.
"""

from __future__ import annotations

import random

from omnitune.search.strategies.base import Proposal, Setting, Told
from omnitune.spec import Config

# Consecutive sampler proposals that measured nothing (repeats, constraint violations) after
# which a random unmeasured valid config is measured instead.
SAMPLER_PATIENCE = 8
# A space too large to list is drawn from at random until a valid, unmeasured config comes up.
DRAWS = 10_000


class RandomUnmeasured:
    lookahead = False
    name = "fallback"

    def __init__(self, setting: Setting):
        self.setting = setting
        self.rng = random.Random(setting.seed)
        self.fruitless = 0  # the sampler's proposals in a row that measured nothing

    def propose(self, ledger) -> Proposal | None:
        if self.fruitless < SAMPLER_PATIENCE:
            return None
        config = self._draw(ledger.busy)
        return Proposal(config, self.name) if config is not None else None

    def propose_batch(self, ledger, k: int) -> list[Proposal]:
        proposal = self.propose(ledger)
        return [proposal] if proposal is not None and k > 0 else []

    def tell(self, told: Told) -> None:
        if told.chosen_by == self.name:
            self.fruitless = SAMPLER_PATIENCE - 2  # a couple of chances for the sampler again
        elif told.chosen_by == self.setting.sampler:
            self.fruitless = 0 if told.measured else self.fruitless + 1

    def _draw(self, busy: set[Config]) -> Config | None:
        s = self.setting
        if s.valid is not None:
            candidates = [c for c in s.valid if c not in busy]
            return self.rng.choice(candidates) if candidates else None
        for _ in range(DRAWS):
            config = s.space.random_config(self.rng)
            if config not in busy and not s.spec.violations(s.problem, config, s.dtype, s.limits):
                return config
        return None

"""An Optuna sampler kept inside the problem's valid, unmeasured configs, where they can be listed.

A kernel's space is a box of choices (omnitune.search.space); its constraints cut most of it away
for a given problem: 8–37% of attention's, the KV write's and the layer's boxes are valid for the
Qwen2.5-Omni-7B preset's decode-sized problems (attention's SDPA backends are one parked config
each, a third of its box). Proposed as they come, a sampler's configs were pruned by a constraint
one after another: in round 9's whole-model search (benchmarks/results/h200_round9_D.log) 22–67
pruned proposals for every 50 measured on 28 of its 35 problems, each an ask and a tell of the
study — host time the GPU waits through. So a proposal is made valid before it becomes a trial:

  - the inner sampler's relative proposal (TPE's, once its startup trials are in) is kept if it is
    valid and not measured yet, else replaced by the nearest such config (fewest choice steps
    apart, summed over the parameters; ties: the space's order) — TPE's model then sees the
    config that was measured, since the trial's params are the replacement's;
  - where the inner sampler proposes nothing relative (TPE's random startup trials, the random
    sampler), a valid unmeasured config drawn at random.

Configs measured, running or claimed by any process count as taken: the search's ledger says
which (refreshed from the study before each ask). When every
valid config is taken, the inner sampler's proposal stands and the driver sees a repeat, as
before. Everything else — independent sampling, the hooks around a trial — is the inner sampler's.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState

from omnitune.search.space import ConfigSpace
from omnitune.spec import Config


# TPE's random startup trials before its model, under this sampler. Optuna's 10 count pruned
# trials too, and about half of them were: with every trial measured, 5 carry what the 10 did. In
# the offline replay of seven recorded H200 sweeps (benchmarks/results/replay_h200_valid_only.json
# against replay_h200.json) TPE so needs, to come within 2% of the best, a median within 2 trials
# of before on every sweep, cold or warm-started, and fewer on four (at most 9 against 14 at the
# KV write's t=1024 and t=64); with 10 it needed 2.5–11 more on four of them.
TPE_STARTUP_TRIALS = 5


class ValidOnly(optuna.samplers.BaseSampler):
    """`inner`'s proposals kept inside `valid` (see the module's docstring)."""

    def __init__(self, inner: optuna.samplers.BaseSampler, space: ConfigSpace, valid: Sequence[Config], seed: int,
                 taken: Callable[[], Iterable[Config]]):
        """taken: the configs measured, running or queued (the search's ledger, refreshed before
        each ask)."""
        self.inner = inner
        self._taken = taken
        self._space = space
        self._names = list(space.distributions)
        self._row = {c: i for i, c in enumerate(valid)}
        encoded = [space.encode(c) for c in valid]
        self._valid = np.array([[e[n] for n in self._names] for e in encoded], dtype=np.int64).reshape(
            len(encoded), len(self._names))
        self._rng = random.Random(seed)

    # --- the relative proposal: where the valid set is applied -----------------------------

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        # Every parameter, from the first trial on: the startup trials are drawn here too.
        return dict(self._space.distributions) if len(self._valid) else \
            self.inner.infer_relative_search_space(study, trial)

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        if not len(self._valid) or set(search_space) != set(self._names):
            return self.inner.sample_relative(study, trial, search_space)
        # The inner sampler models the parameters that have a choice (TPE leaves out single ones).
        varied = {n: d for n, d in search_space.items() if not d.single()}
        proposed = dict(self.inner.sample_relative(study, trial, varied)) if varied else {}
        if set(proposed) >= set(varied):
            proposed.update({n: int(d.low) for n, d in search_space.items() if d.single()})
        free = self._free()
        if not free.any():
            return proposed  # every valid config taken: the driver sees the repeat
        if set(proposed) != set(self._names):  # no model yet: a random valid, unmeasured config
            choice = self._rng.choice(np.flatnonzero(free).tolist())
            return self._params(self._valid[choice])
        point = np.array([int(proposed[n]) for n in self._names], dtype=np.int64)
        row = self._row.get(self._space.decode(proposed))
        if row is not None and free[row]:
            return self._params(point)
        distance = np.abs(self._valid - point).sum(axis=1)
        distance[~free] = np.iinfo(np.int64).max
        return self._params(self._valid[int(np.argmin(distance))])  # the first of the nearest: the space's order

    def _free(self) -> np.ndarray:
        """Which valid configs nothing holds (see `taken`)."""
        free = np.ones(len(self._valid), dtype=bool)
        rows = [self._row.get(c) for c in self._taken()]
        free[[r for r in rows if r is not None]] = False
        return free

    def _params(self, row: np.ndarray) -> dict[str, int]:
        return {n: int(v) for n, v in zip(self._names, row.tolist())}

    # --- the rest is the inner sampler's -------------------------------------------------------

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        return self.inner.sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self.inner.before_trial(study, trial)

    def after_trial(self, study: optuna.Study, trial: FrozenTrial, state: TrialState,
                    values: Sequence[float] | None) -> None:
        self.inner.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self.inner.reseed_rng()
        self._rng.seed()

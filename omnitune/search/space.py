"""A kernel's config space as Optuna sees it.

Every parameter becomes an integer index into its choices (IntDistribution 0..len-1) rather than
a categorical: block sizes, warps and stages are ordered (16 < 32 < 64), and TPE's and CMA-ES's
models can only exploit an order they are shown. The trial's user attrs carry the real values.
"""

from __future__ import annotations

import random
from collections.abc import Mapping

from optuna.distributions import IntDistribution

from omnitune.errors import ConfigError
from omnitune.spec import Config, KernelSpec


class ConfigSpace:
    """Translates between a spec's configs and Optuna's index parameters."""

    def __init__(self, spec: KernelSpec):
        self.spec = spec
        self.distributions: dict[str, IntDistribution] = {
            p.name: IntDistribution(0, len(p.choices) - 1) for p in spec.params
        }

    def encode(self, config: Config) -> dict[str, int]:
        """Optuna params (choice indices) of a config."""
        indices = {}
        for p in self.spec.params:
            value = config[p.name]
            # Compare type and value: True == 1 in Python, but a bool choice is not an int one.
            matches = [i for i, c in enumerate(p.choices) if c == value and type(c) is type(value)]
            if not matches:
                raise ConfigError(f"{p.name}={value!r} is not one of {self.spec.name}'s choices {p.choices}")
            indices[p.name] = matches[0]
        return indices

    def decode(self, params: Mapping[str, int]) -> Config:
        """The config that Optuna params (choice indices) stand for."""
        return Config({p.name: p.choices[int(params[p.name])] for p in self.spec.params})

    def random_config(self, rng: random.Random) -> Config:
        """A config drawn uniformly from the whole space (valid or not)."""
        return Config({p.name: rng.choice(p.choices) for p in self.spec.params})

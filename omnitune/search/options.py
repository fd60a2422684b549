"""What a search is asked to do, as one frozen value: the options `omnitune search` and
`omnitune worker` build once and the driver reads (omnitune.search.driver.run_search).

Validated when built, so that a search that cannot run fails before anything is written.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from omnitune.search.finalists import DEFAULT_FINALISTS, DEFAULT_ROUNDS
from omnitune.search.outcome import SearchError
from omnitune.search.strategies import OPTUNA_STRATEGIES, STRATEGIES, SamplerName, parse_sampler
from omnitune.spec import Config, DeviceLimits

if TYPE_CHECKING:
    from omnitune.trial import DeviceFacts


def default_observers() -> tuple[Callable[[], Any], ...]:
    """NVML telemetry: what every search on a GPU records beside its times (it degrades to
    "not available" where NVML is absent)."""
    from omnitune.profile.telemetry import NvmlSampler

    return (NvmlSampler,)


@dataclass(frozen=True)
class SearchOptions:
    """`device` names the study's device and goes into every trial's provenance; `trials` is the
    study's budget of measured configs (a rerun resumes and counts what is measured); `storage_url`
    is Optuna's storage (run_search may be given a storage object instead); `limits` are the
    device limits constraints check (H100-like defaults when None).

    `finalists` fastest ok configs (and the default) are re-timed interleaved over
    `finalist_rounds` rounds after the search (0: none). `heartbeat_interval_s`: the trials record
    heartbeats, and trials of workers whose heartbeat stopped are failed and retried once.

    `strategies`: the chain of strategies (names of omnitune.search.strategies.STRATEGIES) in
    place of the one `sampler` stands for; `warm_start`: the warm-start configs in place of the
    exported tables' nearest winners (the replay study supplies its own). `tries`: configs the
    user asked to have measured right after the default (`search --try`), partial ones laid over
    each problem's default; one that breaks a constraint for a problem is pruned there, unmeasured.

    `observers`: factories (picklable: isolated workers build their own) of the observers that
    watch the device while each candidate is timed; each runner builds its own instances, and
    each observer's facts land in the trial's extra["observers"][its name]."""

    device: DeviceFacts
    trials: int
    storage_url: str | None = None
    sampler: SamplerName = SamplerName.TPE
    seed: int = 0
    timeout_s: float | None = None
    limits: DeviceLimits = field(default_factory=DeviceLimits)
    finalists: int = DEFAULT_FINALISTS
    finalist_rounds: int = DEFAULT_ROUNDS
    heartbeat_interval_s: int | None = None
    strategies: tuple[str, ...] | None = None
    warm_start: tuple[Config, ...] | None = None
    tries: tuple[Mapping[str, Any], ...] = ()
    observers: tuple[Callable[[], Any], ...] = field(default_factory=default_observers)

    def __post_init__(self) -> None:
        # Normalised in place (the dataclass is frozen): a sampler given as text, limits as None.
        object.__setattr__(self, "sampler", parse_sampler(self.sampler))
        if self.limits is None:
            object.__setattr__(self, "limits", DeviceLimits())
        if self.trials < 1:
            raise SearchError(f"the trial budget must be at least 1, got {self.trials}")
        if self.timeout_s is not None and self.timeout_s <= 0:
            raise SearchError(f"the timeout must be positive, got {self.timeout_s} s")
        if self.finalists < 0:
            raise SearchError(f"the number of finalists must be 0 (no re-timing) or more, got {self.finalists}")
        if self.finalist_rounds < 2:
            raise SearchError(f"re-timing needs at least 2 rounds, got {self.finalist_rounds}")
        if self.strategies is not None:
            self._check_strategies(tuple(self.strategies))
        object.__setattr__(self, "observers", tuple(self.observers))
        object.__setattr__(self, "tries", tuple(dict(values) for values in self.tries))

    def make_observers(self) -> list[Any]:
        """Fresh observer instances for one in-process runner."""
        return [make() for make in self.observers]

    def _check_strategies(self, names: tuple[str, ...]) -> None:
        object.__setattr__(self, "strategies", names)
        unknown = [n for n in names if n not in STRATEGIES]
        if not names or unknown:
            raise SearchError(f"unknown strategies {unknown or names}; choose from {', '.join(STRATEGIES)}")
        samplers = [n for n in names if n in OPTUNA_STRATEGIES]
        # The study's Optuna sampler is the sampler's: a chain may name that one only.
        if len(samplers) > 1 or (samplers and samplers[0] != self.sampler.value):
            raise SearchError(f"the strategies {names} name the Optuna samplers {samplers}; a chain names at most "
                              f"one, the search's sampler ({self.sampler.value})")

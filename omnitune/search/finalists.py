"""Timing you can trust before declaring a winner: the search's top configs re-timed against
each other.

The search times each config once, alone, minutes apart from the others: clocks and temperature
differ between those measurements, so the top few are often within noise of each other. The
finalists — the K fastest ok configs, and the default config beside them so that the speedup
over it compares like with like — are timed again, interleaved round-robin (A B C, B C A, …)
with CUDA events. Each gets the median over the rounds and the coefficient of variation
(std/mean) of its samples; a CV above 2 % flags the result as noisy. The winner is the lowest
re-timed median.

The GPU part is one method of the runner (`time_interleaved`, see TimesInterleaved): everything
here runs on the CPU against a fake. Imports nothing heavy, so that the report can read the
figures it stores.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from omnitune.spec import Config

# The threshold, and about the gap that separates finalists: in the H200 searches of
# 2026-11-29 the first and third configs of 4 of 10 shapes were 0.5–2.4 % apart.
NOISY_CV = 0.02
DEFAULT_FINALISTS = 3
DEFAULT_ROUNDS = 30
MIN_ROUNDS = 2  # one sample has no spread
# The key of a re-timing's figures in a trial's `extra` (and so in the catalogue's extra_json).
FINALIST_KEY = "finalist"


class TimesInterleaved(Protocol):
    """What re-timing needs of a runner (omnitune.measure.runner.Runner is one): per config, one
    time in ms per round, the configs timed round-robin against each other."""

    def time_interleaved(self, configs: Sequence[Config], rounds: int) -> list[list[float]]: ...


@dataclass(frozen=True)
class FinalistTiming:
    """One finalist's re-timing: median, mean and spread over the rounds."""

    config: Config
    median_ms: float
    mean_ms: float
    cv: float
    """Coefficient of variation: sample standard deviation over mean, of the rounds' times."""
    p20_ms: float
    p80_ms: float
    rounds: int

    @property
    def noisy(self) -> bool:
        """The spread exceeds NOISY_CV: the median is less certain than a ranking needs."""
        return self.cv > NOISY_CV

    @classmethod
    def from_samples(cls, config: Config, samples_ms: Sequence[float]) -> FinalistTiming:
        """The figures of one config's samples (at least MIN_ROUNDS, all positive and finite)."""
        if len(samples_ms) < MIN_ROUNDS:
            raise ValueError(f"need at least {MIN_ROUNDS} samples to judge a spread, got {len(samples_ms)}")
        if not all(math.isfinite(t) and t > 0 for t in samples_ms):
            raise ValueError(f"times must be positive and finite, got {list(samples_ms)}")
        from omnitune.profile.timing import summarize

        timing = summarize(list(samples_ms))
        mean_ms = statistics.fmean(samples_ms)
        return cls(
            config=config, median_ms=timing.median_ms, mean_ms=mean_ms,
            cv=statistics.stdev(samples_ms) / mean_ms, p20_ms=timing.p20_ms, p80_ms=timing.p80_ms,
            rounds=len(samples_ms),
        )

    def as_extra(self, *, session: int, retime_of: int, search_time_ms: float) -> dict[str, Any]:
        """What a re-timing trial stores under extra[FINALIST_KEY]: its figures, which re-timing
        of the study it belongs to (`session`, counting from 1) and which trial it re-times."""
        return {
            "session": session, "retime_of": retime_of, "search_time_ms": search_time_ms,
            "median_ms": self.median_ms, "mean_ms": self.mean_ms, "cv": self.cv, "noisy": self.noisy,
            "rounds": self.rounds,
        }

    @classmethod
    def from_extra(cls, config: Config, p20_ms: float, p80_ms: float, stored: Mapping[str, Any]) -> FinalistTiming:
        """The timing a re-timing trial stored (as_extra), e.g. when a search is resumed."""
        return cls(
            config=config, median_ms=float(stored["median_ms"]), mean_ms=float(stored["mean_ms"]),
            cv=float(stored["cv"]), p20_ms=p20_ms, p80_ms=p80_ms, rounds=int(stored["rounds"]),
        )


def finalist_facts(extra: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The re-timing figures in a trial's extra, or None for a trial of the search itself."""
    facts = extra.get(FINALIST_KEY) if isinstance(extra, Mapping) else None
    return facts if isinstance(facts, Mapping) and "session" in facts else None


def pick_finalists(ranked_ok: Sequence[Config], count: int, default: Config | None) -> list[Config]:
    """The configs to re-time: the first `count` of the ok configs (fastest first), and the
    default config after them when it ran ok but is not among them."""
    if count < 0:
        raise ValueError(f"the number of finalists cannot be negative, got {count}")
    chosen = list(ranked_ok[:count])
    if count and default is not None and default in ranked_ok and default not in chosen:
        chosen.append(default)
    return chosen


def retime_finalists(
    runner: TimesInterleaved, configs: Sequence[Config], *, rounds: int = DEFAULT_ROUNDS
) -> list[FinalistTiming]:
    """Time `configs` against each other, interleaved, `rounds` times each; one FinalistTiming
    per config, in the order given (`ranked` orders them)."""
    if rounds < MIN_ROUNDS:
        raise ValueError(f"re-timing needs at least {MIN_ROUNDS} rounds, got {rounds}")
    if not configs:
        return []
    if len(set(configs)) != len(configs):
        raise ValueError("each finalist must be a different config")
    samples = runner.time_interleaved(list(configs), rounds)
    if len(samples) != len(configs):
        raise ValueError(f"the timer returned {len(samples)} sample lists for {len(configs)} configs")
    return [FinalistTiming.from_samples(config, s) for config, s in zip(configs, samples)]


def ranked(timings: Sequence[FinalistTiming]) -> list[FinalistTiming]:
    """Fastest re-timed median first; ties keep their order (the search's ranking)."""
    return sorted(timings, key=lambda t: t.median_ms)

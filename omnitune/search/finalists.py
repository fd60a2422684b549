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
here runs on the CPU against a fake. StudyFinalists stores the re-timings as trials of the study
and reads them back. Optuna is imported inside its methods: the report reads the figures stored
here without importing it.
"""

from __future__ import annotations

import enum
import logging
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from omnitune.errors import one_line

if TYPE_CHECKING:  # the rest on first use: `omnitune --help` reads this module's defaults
    import optuna

    from omnitune.search.space import ConfigSpace
    from omnitune.search.study import Finished
    from omnitune.spec import Config
    from omnitune.trial import TrialResult

log = logging.getLogger(__name__)

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

    def as_extra(self, *, session: int, retime_of: int, search_time_ms: float, configs: int) -> dict[str, Any]:
        """What a re-timing trial stores under extra[FINALIST_KEY]: its figures, which re-timing
        of the study it belongs to (`session`, counting from 1), which trial it re-times, and how
        many configs the session re-timed (`configs`: a session with fewer rows stored was cut
        short, and its rows are not compared with each other)."""
        return {
            "session": session, "retime_of": retime_of, "search_time_ms": search_time_ms, "configs": configs,
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


def pick_finalists(ranked_ok: Sequence[Config], count: int, default: Config | None,
                   always: Sequence[Config] = ()) -> list[Config]:
    """The configs to re-time: the first `count` of the ok configs (fastest first), the default
    config after them when it ran ok but is not among them, and each of `always` (the spec's
    other backends, e.g. SDPA) that ran ok."""
    if count < 0:
        raise ValueError(f"the number of finalists cannot be negative, got {count}")
    chosen = list(ranked_ok[:count])
    if count and default is not None and default in ranked_ok and default not in chosen:
        chosen.append(default)
    if count:
        chosen += [c for c in dict.fromkeys(always) if c in ranked_ok and c not in chosen]
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


def _storing_order(timings: Sequence[FinalistTiming], default: Config) -> list[FinalistTiming]:
    """The re-timings in the order they are stored: the winner, then the default, then the rest.
    A process killed part-way through storing them leaves the rows a report reads first: the
    winner it names, and the default its speedup is taken against."""
    order = ranked(timings)
    head = order[:1] + [t for t in order[1:] if t.config == default]
    return head + [t for t in order if t not in head]


# --- the re-timing as trials of the study ---------------------------------------------------------


class RetimeStatus(str, enum.Enum):
    """What became of the finalists' re-timing after the search loop."""

    RETIMED = "retimed"            # timed against each other now
    REUSED = "reused"              # the same finalists were re-timed by an earlier run: kept
    DISABLED = "disabled"          # finalists=0
    INTERPRETER = "interpreter"    # times under Triton's interpreter mean nothing
    NO_OK_CONFIG = "no_ok_config"  # nothing to re-time
    CONTEXT_LOST = "context_lost"  # the GPU is unusable in this process
    FAILED = "failed"              # timing raised; the search's own times stand (see detail)


@dataclass(frozen=True)
class Retiming:
    """The finalists' re-timing as the outcome reports it: the timings (fastest first) and the
    re-timing trials' results by config."""

    status: RetimeStatus
    timings: tuple[FinalistTiming, ...] = ()
    results: Mapping[Config, TrialResult] = field(default_factory=dict)
    session: int = 0
    detail: str = ""


class StudyFinalists:
    """The finalists of one study, re-timed and stored as trials of it.

    Optuna cannot change a finished trial, so each re-timing is a trial of its own: the same
    config, chosen_by "finalist", its figures under extra[FINALIST_KEY] (session, the trial it
    re-times, median, CV, noisy) — stored, rebuilt and catalogued like every other trial. A rerun
    that would re-time the same finalists reuses the stored re-timing.

    `attrs_of(result)` gives a re-timing trial's user attrs (the driver's provenance and
    sampler); `record(number, attrs)` writes its catalogue row.
    """

    def __init__(self, study: optuna.Study, space: ConfigSpace, attrs_of: Callable[[TrialResult], dict],
                 record: Callable[[int, Mapping[str, Any]], None]):
        self.study, self.space, self.attrs_of, self.record = study, space, attrs_of, record

    def retime(self, runner: TimesInterleaved, ranked_ok: Sequence[Finished], default: Config, *, count: int,
               rounds: int, always: Sequence[Config] = ()) -> Retiming:
        """Re-time the first `count` of `ranked_ok` (and the default) against each other and
        store each re-timing; or reuse the latest one when it re-timed the same configs. A
        re-timing that raises leaves the search's own times standing (status FAILED)."""
        from omnitune.errors import OmnituneError

        if not ranked_ok:
            return Retiming(RetimeStatus.NO_OK_CONFIG)
        searched = {f.result.config: f for f in ranked_ok}
        configs = pick_finalists(list(searched), count, default, always)
        stored = self.latest()
        if stored is not None and set(stored.results) == set(configs):
            return stored
        try:
            timings = retime_finalists(runner, configs, rounds=rounds)
        except OmnituneError:
            raise
        except Exception as exc:  # noqa: BLE001 — the search's results stand without the re-timing
            detail = one_line(exc)
            log.warning("re-timing the finalists of %s failed: %s", self.study.study_name, detail)
            return Retiming(RetimeStatus.FAILED, detail=detail)
        session = (stored.session if stored is not None else 0) + 1
        results = {t.config: self.store(t, session, searched[t.config], len(timings))
                   for t in _storing_order(timings, default)}
        return Retiming(RetimeStatus.RETIMED, tuple(ranked(timings)), results, session)

    def store(self, timing: FinalistTiming, session: int, original: Finished, configs: int) -> TrialResult:
        """Add one finalist's re-timing to the study as a finished trial (and to the catalogue)."""
        import optuna
        from optuna.trial import TrialState

        from omnitune.store import result_from_attrs
        from omnitune.trial import TrialResult, TrialStatus

        searched = original.result
        scale = searched.time_ms / timing.median_ms  # the rates follow the re-timed median
        result = TrialResult(
            timing.config, TrialStatus.OK, time_ms=timing.median_ms, p20_ms=timing.p20_ms,
            p80_ms=timing.p80_ms, rel_error=searched.rel_error, tflops=searched.tflops * scale,
            tbps=searched.tbps * scale, representative=searched.representative,
            extra={FINALIST_KEY: timing.as_extra(session=session, retime_of=original.number,
                                                 search_time_ms=searched.time_ms, configs=configs)},
        )
        attrs = self.attrs_of(result)
        self.study.add_trial(optuna.trial.create_trial(
            params=self.space.encode(timing.config), distributions=self.space.distributions,
            value=timing.median_ms, user_attrs=attrs,
        ))
        # add_trial does not return the trial; find it (newest first: it is at the end).
        for trial in reversed(self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))):
            stored = result_from_attrs(trial.user_attrs)
            facts = finalist_facts(stored.extra) if stored is not None else None
            if facts is not None and facts["session"] == session and stored.config == timing.config:
                self.record(trial.number, trial.user_attrs)
                break
        return result

    def latest(self) -> Retiming | None:
        """The study's most recent re-timing (the highest session), as stored; None if none."""
        from optuna.trial import TrialState

        from omnitune.store import result_from_attrs

        sessions: dict[int, dict[Config, tuple[TrialResult, FinalistTiming]]] = {}
        for trial in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            result = result_from_attrs(trial.user_attrs)
            facts = finalist_facts(result.extra) if result is not None else None
            if facts is None:
                continue
            timing = FinalistTiming.from_extra(result.config, result.p20_ms, result.p80_ms, facts)
            sessions.setdefault(int(facts["session"]), {})[result.config] = (result, timing)
        if not sessions:
            return None
        session = max(sessions)
        latest = sessions[session]
        return Retiming(
            RetimeStatus.REUSED, tuple(ranked([timing for _, timing in latest.values()])),
            {config: result for config, (result, _) in latest.items()}, session,
        )

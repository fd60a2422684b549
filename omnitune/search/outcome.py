"""What a search reports: progress after every trial, the outcome at the end, and why it stopped.

These are the driver's public types (omnitune.search.driver re-exports them); they import
nothing heavy, so that the CLI's live view can name them without importing Optuna.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from omnitune.errors import OmnituneError
from omnitune.search.finalists import FinalistTiming, RetimeStatus
from omnitune.spec import Config
from omnitune.trial import TrialResult, TrialStatus

__all__ = ["MeasuresConfigs", "RetimeStatus", "SearchError", "SearchInterrupted", "SearchOutcome",
           "SearchProgress", "StopReason"]


class SearchError(OmnituneError):
    """A search that cannot start as asked (bad sampler, bad budget, missing package)."""


class StopReason(str, enum.Enum):
    BUDGET = "budget"              # the study holds the requested number of measured configs
    EXHAUSTED = "exhausted"        # every valid config has been measured (or no strategy proposes one)
    TIMEOUT = "timeout"
    INTERRUPTED = "interrupted"    # Ctrl-C
    CONTEXT_LOST = "context_lost"  # a config poisoned the CUDA context; rerun to resume
    TARGET = "target"              # the caller's stop_when was met (the replay study: a good config found)


class MeasuresConfigs(Protocol):
    """What the driver needs of a runner (omnitune.measure.runner.Runner is one). A runner may
    also set `context_lost = True` once its process can no longer use the GPU. Re-timing the
    finalists also needs its `time_interleaved` (omnitune.search.finalists.TimesInterleaved)."""

    def measure(self, config: Config) -> TrialResult: ...


@dataclass(frozen=True)
class SearchProgress:
    """Where a search stands, reported after every trial that measured or pruned a config."""

    study_name: str
    trial_number: int
    result: TrialResult
    chosen_by: str
    measured_total: int
    measured_now: int
    budget: int
    best: TrialResult | None
    default: TrialResult | None
    failures: Mapping[TrialStatus, int]
    elapsed_s: float


# The trial loop's phases, as SearchOutcome.phase_s names them, and how a summary says them.
LOOP_PHASES = {
    "choosing": "choosing",            # the ledger read, the sampler's proposal and tell, ask and claim in the storage
    "compile_wait": "waiting for compiles",  # a compile-ahead worker still compiling the config to measure
    "measuring": "measuring",          # the runner: verification against the reference and timing
    "storing": "storing",              # the trial's attributes, the catalogue row, progress
}


@dataclass(frozen=True)
class SearchOutcome:
    study_name: str
    best: TrialResult | None           # the fastest correct config (re-timed when finalists were), None if none worked
    default: TrialResult | None        # the kernel's default config (None if never measured)
    measured_now: int                  # configs measured by this run
    measured_total: int                # configs measured in the study, this run included
    failures: Mapping[TrialStatus, int]  # over the whole study, constraint prunes included
    wall_s: float
    stop_reason: StopReason
    finalists: tuple[FinalistTiming, ...] = ()  # re-timed (or reused), fastest median first
    retime_status: RetimeStatus = RetimeStatus.DISABLED
    retime_detail: str = ""            # why re-timing failed
    ranking: tuple[Config, ...] = ()   # every ok config, best first: the finalists by re-timed median, then the rest
    # The fixed costs beside the trials, in seconds of wall_s (recorded for `omnitune plan`):
    setup_s: float = 0.0               # building the runners: inputs and the reference output
    retime_s: float = 0.0              # re-timing the finalists
    # The trial loop's time by phase, seconds summed over the slots' threads (LOOP_PHASES): where
    # a search's wall goes besides the GPU's own work (issue 20's question).
    phase_s: Mapping[str, float] = field(default_factory=dict)

    def phase_line(self) -> str:
        """e.g. "trial loop: choosing 3.12 s, waiting for compiles 0.40 s, measuring 6.21 s, storing 1.03 s"
        (hundredths: a phase of a few milliseconds, as on a tiny problem, does not read as none)."""
        parts = [f"{LOOP_PHASES[name]} {self.phase_s[name]:.2f} s" for name in LOOP_PHASES if name in self.phase_s]
        return "trial loop: " + ", ".join(parts) if parts else ""

    @property
    def speedup_over_default(self) -> float | None:
        if self.best is None or self.default is None or self.default.status is not TrialStatus.OK:
            return None
        return self.default.time_ms / self.best.time_ms if self.best.time_ms > 0 else None


class SearchInterrupted(KeyboardInterrupt):
    """Ctrl-C during a search, after the trial in flight was marked failed. Every finished
    trial is stored; `outcome` says where the search stood. Rerun the search to resume."""

    def __init__(self, outcome: SearchOutcome):
        super().__init__("search interrupted")
        self.outcome = outcome

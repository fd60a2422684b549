"""How long `omnitune plan` says a trial and a problem take: measured on this device by earlier
searches (the results database's `search_runs`) when it has them, else the project's constants."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# Seconds per measured trial and per problem besides its trials (inputs, reference, re-timing
# the finalists), measured on the H200 by a whole-model search with compile-ahead workers:
# `omnitune search --model qwen2.5-omni-7b -n 50`, 35 problems, 1,750 trials in 453 s
# (benchmarks/results/search_wall_h200_round9_D.json: the problems' walls less their setup and
# re-timing ÷ trials; their setup + re-timing, averaged).
SECONDS_PER_TRIAL = 0.22
SETUP_S_PER_PROBLEM = 1.5


@dataclass(frozen=True)
class Rates:
    per_trial_s: float
    per_problem_s: float
    source: str  # says where the figures come from, for the plan's last line
    gpu_share: float | None = None
    """The share of a search's own time (its wall less its wait behind other lanes) that it held
    the GPU, measured; None where the database does not say."""
    cores_busy: float | None = None
    """CPU seconds per second of a search's own time — its process's and its compile workers' —
    measured; None where the database does not say."""

    def estimate_s(self, trials: int) -> float:
        return trials * self.per_trial_s + self.per_problem_s

    def in_lanes_s(self, one_lane_s: float, lanes: int, cores: int | None = None) -> float | None:
        """A session of `one_lane_s` (one problem after another) run in `lanes` lanes: the lanes
        overlap one search's host work with another's GPU work, but never run two on the GPU at
        once — so no faster than `lanes` at a time, nor than the GPU's own share of the work, nor
        than the host's `cores` can do its CPU work (compiling, mostly: round 15 measured ~14 s of
        CPU for each second of GPU a whole-model search held)."""
        if self.gpu_share is None or lanes < 1:
            return None
        bounds = [one_lane_s / lanes, one_lane_s * self.gpu_share]
        if self.cores_busy is not None and cores:
            bounds.append(one_lane_s * self.cores_busy / cores)
        return max(bounds)


ASSUMED = Rates(SECONDS_PER_TRIAL, SETUP_S_PER_PROBLEM,
                f"assumed {SECONDS_PER_TRIAL:g} s per trial (measured on the H200 in this project) + "
                f"~{SETUP_S_PER_PROBLEM:g} s per problem (inputs, reference, finalists)")


def measured_rates(db_path: str | Path, device_key: str | None) -> Rates:
    """The rates of `device_key`'s searches in the database (None: the device with the most
    measured trials there), or ASSUMED with the reason when it has none."""
    from omnitune.errors import StoreError
    from omnitune.store import SEARCH_RUN_COLUMNS, read_table, require_intact_pages
    from omnitune.trial import INTERPRETER_DEVICE

    try:
        # search_runs can read well while the trials' pages are damaged: the plan says the file
        # is, rather than "no searches on a GPU" from a database a search would refuse.
        require_intact_pages(db_path)
    except StoreError as exc:
        return _assumed(_without_advice(exc))
    # A database from before the CPU time (schema 4) or the GPU time (schema 3) was recorded:
    # its runs without those columns.
    later = ("cpu_s", "compile_cpu_s", "gpu_s", "lock_wait_s")
    first_error = None
    for missing in ((), later[:2], later):
        try:
            runs = read_table(db_path, "search_runs", [c for c in SEARCH_RUN_COLUMNS if c not in missing])
            break
        except StoreError as exc:
            first_error = first_error or exc
    else:
        return _assumed(_without_advice(first_error))
    runs = runs.assign(**{c: None for c in later if c not in runs.columns})
    runs = runs[runs.device_name != INTERPRETER_DEVICE]
    # Runs that measured nothing (a finished study rerun) say nothing about a trial's cost; one
    # that re-timed finalists (a session in lanes re-times a host-syncing op's after its lanes,
    # omnitune.cli.search_cmd.retime_after_lanes) is part of its problem's cost.
    runs, impossible = _with_possible_times(runs)
    retimed_later = runs[(runs.measured == 0) & (runs.retime_s > 0)]
    runs = runs[runs.measured > 0]
    if device_key is None and len(runs):
        device_key = runs.groupby("device_key").measured.sum().idxmax()
    runs = runs[runs.device_key == device_key]
    retimed_later = retimed_later[retimed_later.device_key == device_key]
    if not len(runs):
        return _assumed(f"no searches on {device_key or 'a GPU'} in {db_path}")
    trials = int(runs.measured.sum())
    # A lane's wait for the GPU behind the others is not the problem's own cost.
    own_s = runs.wall_s - runs.lock_wait_s.astype(float).fillna(0.0)
    trial_s = float((own_s - runs.setup_s - runs.retime_s).sum()) / trials
    problem_s = float((runs.setup_s + runs.retime_s).sum() + retimed_later.wall_s.sum()) / len(runs)
    timed = runs.gpu_s.notna()
    gpu_share = float(runs.gpu_s[timed].astype(float).sum() / own_s[timed].sum()) if timed.any() else None
    counted = runs.cpu_s.notna() & runs.compile_cpu_s.notna()
    cpu = runs.cpu_s[counted].astype(float) + runs.compile_cpu_s[counted].astype(float)
    cores_busy = float(cpu.sum() / own_s[counted].sum()) if counted.any() else None
    name = runs.device_name.iloc[-1] or device_key
    left_out = f"; {impossible} with impossible times left out" if impossible else ""
    return Rates(trial_s, problem_s,
                 f"{trial_s:.2g} s per trial, from {trials} trials measured on {name} + ~{problem_s:.0f} s per "
                 f"problem (inputs, reference, finalists; measured over {len(runs)} searches in {db_path}"
                 f"{left_out})", gpu_share, cores_busy)


# A search run recorded as longer than this is a corrupt row, not a search (a whole-model search
# takes minutes to hours).
MAX_RUN_S = 30 * 24 * 3600.0


def _with_possible_times(runs):
    """The runs whose recorded times a search can give, and how many others there were: a wall
    time in (0, MAX_RUN_S], the parts of it (setup, re-timing, the wait for the GPU, its GPU and
    CPU seconds) finite and not negative, setup, re-timing and the wait within the wall, trials
    counted from 0 up. A negative or huge wall made the plan estimate ~-40 s or ~inf h, a zero one a NaN."""
    import numpy as np
    import pandas as pd

    def seconds(column, optional=False):
        values = pd.to_numeric(runs[column], errors="coerce").astype(float)
        return values, (values.isna() if optional else pd.Series(False, index=runs.index)) | (
            np.isfinite(values) & (values >= 0))

    wall, wall_ok = seconds("wall_s")
    setup, setup_ok = seconds("setup_s")
    retime, retime_ok = seconds("retime_s")
    wait, wait_ok = seconds("lock_wait_s", optional=True)
    ok = (wall_ok & setup_ok & retime_ok & wait_ok & (wall > 0) & (wall <= MAX_RUN_S)
          & (setup + retime + wait.fillna(0.0) <= wall))
    for optional in ("gpu_s", "cpu_s", "compile_cpu_s"):
        ok &= seconds(optional, optional=True)[1]
    measured = pd.to_numeric(runs["measured"], errors="coerce")
    ok &= measured.notna() & (measured >= 0)
    return runs[ok], int((~ok).sum())


def _without_advice(exc: Exception) -> str:
    """A store error's message less its closing advice ("what is wrong; what to do"): the plan goes
    on without the file. Only the last clause goes, so a path or a detail holding "; " is whole."""
    return str(exc).rsplit("; ", 1)[0]


def _assumed(why: str) -> Rates:
    return Rates(ASSUMED.per_trial_s, ASSUMED.per_problem_s, f"{ASSUMED.source} — {why}")

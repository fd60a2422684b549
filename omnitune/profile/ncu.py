"""Hardware counters of a kernel through Nsight Compute (ncu): cache hit rates, DRAM throughput,
achieved occupancy and duration — the why behind a timing.

ncu wraps a separate process (`python -m omnitune.profile.ncu_target ...`), replays each matching
launch with its counters, and prints one CSV row per launch (`--csv --page raw`): a header of
metric names, a row of units, then the launches. `--clock-control none` keeps the GPU's own boost
clocks, as CUDA-event timing sees them, instead of ncu's locked base clocks.

ncu is often missing, or present but barred from the counters (ERR_NVGPUCTRPERM, unless the
driver allows non-admin profiling): every such case is an NcuError with a one-line explanation.
"""

from __future__ import annotations

import csv
import math
import os
import re
import shutil
import statistics
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from omnitune.errors import DeviceError

L1_HIT = "l1tex__t_sector_hit_rate.pct"
L2_HIT = "lts__t_sector_hit_rate.pct"
DRAM_PCT_OF_PEAK = "dram__throughput.avg.pct_of_peak_sustained_elapsed"
ACHIEVED_OCCUPANCY = "sm__warps_active.avg.pct_of_peak_sustained_active"
DURATION = "gpu__time_duration.sum"
METRICS: tuple[str, ...] = (L1_HIT, L2_HIT, DRAM_PCT_OF_PEAK, ACHIEVED_OCCUPANCY, DURATION)

# Where CUDA toolkits put ncu when it is not on PATH.
_NCU_LOCATIONS = ("/usr/local/cuda/bin/ncu", "/opt/nvidia/nsight-compute/ncu")

# ncu scales each column's unit to its values ("nsecond", "usecond", ...): factors to microseconds.
_TO_MICROSECONDS = {
    "nsecond": 1e-3, "ns": 1e-3,
    "usecond": 1.0, "us": 1.0,
    "msecond": 1e3, "ms": 1e3,
    "second": 1e6, "s": 1e6,
}

# Columns ncu writes before the metrics in --page raw.
_KERNEL_NAME_COLUMN = "Kernel Name"
_ID_COLUMN = "ID"


class NcuError(DeviceError):
    """Nsight Compute is missing, cannot read the counters, or profiled nothing."""


@dataclass(frozen=True)
class NcuLaunch:
    """One profiled kernel launch: its name and metric values (durations in microseconds,
    percentages as ncu gives them); a value ncu reported as n/a is absent."""

    launch_id: str
    kernel_name: str
    values: Mapping[str, float]


@dataclass(frozen=True)
class NcuProfile:
    """Counters averaged over the matching launches."""

    kernel_name: str
    launches: int
    duration_us: float | None
    l1_hit_pct: float | None
    l2_hit_pct: float | None
    dram_pct_of_peak: float | None
    achieved_occupancy_pct: float | None
    metrics: Mapping[str, float] = field(default_factory=dict)
    """Every metric's mean over the launches, durations in µs."""
    per_kernel: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    """Kernel name → its metrics' means."""

    def raw(self) -> dict[str, object]:
        """What the profiles table keeps as raw_json."""
        return {"kernel_name": self.kernel_name, "launches": self.launches, "metrics": dict(self.metrics),
                "per_kernel": {k: dict(v) for k, v in self.per_kernel.items()}}


def find_ncu() -> str | None:
    """The ncu executable: on PATH, else a CUDA toolkit's usual place; None if neither."""
    found = shutil.which("ncu")
    if found:
        return found
    return next((p for p in _NCU_LOCATIONS if os.access(p, os.X_OK)), None)


def ncu_available() -> bool:
    return find_ncu() is not None


def _number(text: str) -> float | None:
    """'1,234.5' → 1234.5; 'n/a' and empty → None. ncu writes thousands separators."""
    cleaned = text.strip().replace(",", "")
    if not cleaned or cleaned.lower() in ("n/a", "nan"):
        return None
    try:
        value = float(cleaned)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _in_base_unit(metric: str, value: float, unit: str) -> float:
    if metric == DURATION or unit in _TO_MICROSECONDS:
        factor = _TO_MICROSECONDS.get(unit.strip())
        if factor is None:
            raise ValueError(f"unknown time unit {unit!r} for {metric}")
        return value * factor
    return value


def parse_raw_csv(text: str) -> list[NcuLaunch]:
    """The launches in ncu's `--csv --page raw` output; ncu's ==PROF== lines and the profiled
    program's own output around the table are skipped."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(f'"{_ID_COLUMN}",')), None)
    if start is None:
        return []
    table = [line for line in lines[start:] if line.startswith('"')]
    rows = list(csv.reader(table))
    header = rows[0]
    if _KERNEL_NAME_COLUMN not in header:
        return []
    name_at = header.index(_KERNEL_NAME_COLUMN)
    metric_columns = [(i, name) for i, name in enumerate(header) if "__" in name]
    body = rows[1:]
    units: list[str] = [""] * len(header)
    if body and body[0] and body[0][0] == "":  # the units row: no launch ID
        units = body[0] + [""] * (len(header) - len(body[0]))
        body = body[1:]
    launches = []
    for row in body:
        if len(row) != len(header):
            continue
        values = {}
        for i, metric in metric_columns:
            value = _number(row[i])
            if value is not None:
                values[metric] = _in_base_unit(metric, value, units[i])
        launches.append(NcuLaunch(row[0], row[name_at], values))
    return launches


def _means(launches: Sequence[NcuLaunch]) -> dict[str, float]:
    names = sorted({m for launch in launches for m in launch.values})
    return {m: statistics.fmean(launch.values[m] for launch in launches if m in launch.values) for m in names}


def summarize(launches: Sequence[NcuLaunch], kernel_regex: str = "") -> NcuProfile | None:
    """Mean of each metric over the launches whose kernel name matches kernel_regex
    (re.search, as ncu's `-k regex:`); None when no launch matches.

    A call that launches several kernels (a split-KV decode and its reduction) is averaged over
    all of them; each kernel's own means are kept in per_kernel."""
    pattern = re.compile(kernel_regex)
    matching = [launch for launch in launches if pattern.search(launch.kernel_name)]
    if not matching:
        return None
    means = _means(matching)
    by_kernel: dict[str, list[NcuLaunch]] = {}
    for launch in matching:
        by_kernel.setdefault(launch.kernel_name, []).append(launch)
    return NcuProfile(
        kernel_name=", ".join(sorted(by_kernel)),
        launches=len(matching),
        duration_us=means.get(DURATION),
        l1_hit_pct=means.get(L1_HIT),
        l2_hit_pct=means.get(L2_HIT),
        dram_pct_of_peak=means.get(DRAM_PCT_OF_PEAK),
        achieved_occupancy_pct=means.get(ACHIEVED_OCCUPANCY),
        metrics=means,
        per_kernel={name: _means(group) for name, group in sorted(by_kernel.items())},
    )


def ncu_command(
    ncu: str,
    command: Sequence[str],
    kernel_regex: str,
    *,
    metrics: Sequence[str] = METRICS,
    launch_skip: int = 0,
    launch_count: int | None = None,
) -> list[str]:
    """The ncu command line that profiles `command`'s launches of kernels matching kernel_regex."""
    args = [
        ncu, "--clock-control", "none", "--csv", "--page", "raw",
        "--metrics", ",".join(metrics),
        "-k", f"regex:{kernel_regex}",
        "--launch-skip", str(launch_skip),
        "--target-processes", "all",
    ]
    if launch_count is not None:
        args += ["--launch-count", str(launch_count)]
    return args + list(command)


def explain_failure(output: str) -> str | None:
    """A one-line explanation when ncu's output shows it could not profile at all."""
    if "ERR_NVGPUCTRPERM" in output:
        return (
            "ncu may not read this GPU's performance counters (ERR_NVGPUCTRPERM): run as root, "
            "or load the nvidia driver with NVreg_RestrictProfilingToAdminUsers=0"
        )
    if "LibraryNotLoaded" in output:
        return "ncu could not load its profiling library (LibraryNotLoaded); check the Nsight Compute install"
    return None


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:200] if lines else "no output"


def profile_with_ncu(
    command: Sequence[str],
    kernel_regex: str,
    *,
    metrics: Sequence[str] = METRICS,
    launch_skip: int = 0,
    launch_count: int | None = None,
    timeout_s: float = 900.0,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    ncu: str | None = None,
) -> NcuProfile:
    """Run `command` under ncu and average the counters of its launches of kernels matching
    kernel_regex. Raises NcuError (one line) when ncu is missing, cannot read the counters,
    times out, or profiles no matching launch."""
    executable = ncu or find_ncu()
    if executable is None:
        raise NcuError(
            "Nsight Compute (ncu) is not installed here: put ncu on PATH (it ships with the CUDA toolkit)"
        )
    args = ncu_command(executable, command, kernel_regex, metrics=metrics,
                       launch_skip=launch_skip, launch_count=launch_count)
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=timeout_s,
                              env=dict(env) if env is not None else None, cwd=cwd)
    except subprocess.TimeoutExpired:
        raise NcuError(f"ncu did not finish within {timeout_s:g} s") from None
    except OSError as exc:
        raise NcuError(f"cannot run ncu ({executable}): {exc.strerror or exc}") from None
    output = f"{done.stdout}\n{done.stderr}"
    reason = explain_failure(output)
    if reason:
        raise NcuError(reason)
    profile = summarize(parse_raw_csv(done.stdout), kernel_regex)
    if profile is None:
        raise NcuError(
            f"ncu profiled no launch of a kernel matching {kernel_regex!r} "
            f"(exit {done.returncode}; last output: {_last_line(done.stderr or done.stdout)})"
        )
    return profile


def profile_config(kernel_arg: str, spec, problem, dtype, config, launches: int = 3) -> NcuProfile:
    """One config's counters: ncu wraps a separate process (omnitune.profile.ncu_target) that
    launches the kernel `launches` times; only the kernel module's own @triton.jit kernels count.
    `kernel_arg` is the name the user gave (a built-in name, module path or file), so the target
    process can load the same spec."""
    import json
    import sys

    from omnitune.errors import OmnituneError
    from omnitune.profile.compiled import kernel_names
    from omnitune.spec import dtype_name

    names = kernel_names(sys.modules[spec.module]) if spec.module in sys.modules else []
    if not names:
        raise OmnituneError(f"kernel module {spec.module or kernel_arg!r} defines no @triton.jit function to profile")
    command = [sys.executable, "-m", "omnitune.profile.ncu_target", kernel_arg, spec.problem_key(problem),
               dtype_name(dtype), json.dumps(config.as_dict(), sort_keys=True), "--launches", str(launches)]
    # The target must compile for the GPU even when this process interprets.
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return profile_with_ncu(command, "|".join(re.escape(n) for n in names), env=env)


def profile_record(profile: NcuProfile, *, spec, problem, dtype, device_key: str, config, which):
    """The results-database row (omnitune.store.ProfileRecord) of one profile."""
    from omnitune.spec import dtype_name
    from omnitune.store import ProfileKind, ProfileRecord

    return ProfileRecord(
        kernel=spec.name, problem_key=spec.problem_key(problem), dtype=dtype_name(dtype), device_key=device_key,
        config=config.as_dict(), which=ProfileKind(which), duration_us=profile.duration_us,
        l1_hit_pct=profile.l1_hit_pct, l2_hit_pct=profile.l2_hit_pct, dram_pct_of_peak=profile.dram_pct_of_peak,
        achieved_occupancy_pct=profile.achieved_occupancy_pct, raw=profile.raw(),
    )

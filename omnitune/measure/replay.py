"""Measuring by looking up: a runner that serves the trials of a recorded sweep, so that the real
search driver (every strategy, the claims, the penalties and the fallback) can be run over a
space measured once on a GPU, on any machine, in seconds. Kernel Tuner's simulation runner is
the model; here the recording is rows of the results catalogue.

A recording holds, per config, what measuring it gave: an ok time, or a failure status. Configs
that a constraint rejects are not recorded: the driver prunes them before any runner is asked,
as it does on a GPU. Asking for a config the recording lacks is an error (ReplayMiss): the sweep
was not exhaustive, and any figure drawn from it would be made up.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from omnitune.errors import OmnituneError
from omnitune.spec import Config, KernelSpec
from omnitune.trial import DeviceFacts, TrialResult, TrialStatus


class ReplayMiss(OmnituneError):
    """A config the recorded sweep did not measure."""


class ReplayRunner:
    """Serves recorded results in place of measuring (a drop-in for the driver's runner).
    `calls` lists the configs asked for, in order: what a search would have measured."""

    context_lost = False

    def __init__(self, recorded: Mapping[Config, TrialResult], *, name: str = "the recorded sweep"):
        self.recorded = dict(recorded)
        self.name = name
        self.calls: list[Config] = []

    def measure(self, config: Config) -> TrialResult:
        self.calls.append(config)
        try:
            return self.recorded[config]
        except KeyError:
            raise ReplayMiss(f"{config.label()} was not measured in {self.name}: it is not an exhaustive sweep") from None

    def time_interleaved(self, configs: Sequence[Config], rounds: int) -> list[list[float]]:
        """The finalists' re-timing, from the recording: each config's recorded median, every
        round (a recording has no spread between rounds to replay)."""
        times = [self.measure(c).time_ms for c in configs]
        if not all(math.isfinite(t) for t in times):
            raise ReplayMiss(f"a finalist of {self.name} has no recorded time")
        return [[t] * rounds for t in times]


def recorded_results(rows: Iterable[Mapping[str, Any]], spec: KernelSpec, problem_key: str,
                     dtype: str) -> dict[Config, TrialResult]:
    """Per config, the first recorded measurement of (spec, problem_key, dtype) in catalogue
    rows (omnitune.store.TrialRecord's columns, e.g. store.read_trials(...).to_dict("records")):
    what the search saw, not a finalist's later re-timing. Pruned rows are left out."""
    recorded: dict[Config, TrialResult] = {}
    for row in rows:
        if (row["kernel"], row["problem_key"], row["dtype"]) != (spec.name, problem_key, dtype):
            continue
        if row["status"] == TrialStatus.PRUNED.value:
            continue  # a constraint rejects it: the driver prunes it the same way
        config = spec.coerce_config(json.loads(row["config_json"]))
        if config in recorded:
            continue
        status = TrialStatus(row["status"])
        if status is TrialStatus.OK:
            time_ms = float(row["time_ms"])
            recorded[config] = TrialResult(config, status, time_ms=time_ms,
                                           p20_ms=_number(row.get("p20_ms"), time_ms),
                                           p80_ms=_number(row.get("p80_ms"), time_ms))
        else:
            recorded[config] = TrialResult(config, status, detail=str(row.get("detail") or status.value))
    return recorded


def narrowed_to_recording(spec: KernelSpec, rows: Iterable[Mapping[str, Any]], problem_key: str,
                          dtype: str) -> KernelSpec:
    """`spec` with the space a recording of (problem_key, dtype) could have measured: a parameter
    added after it was recorded (its configs never name it, and the parameter says what a config
    without it means: Param.missing) keeps only that value, and the known-good configs that name
    another value of it are left out. Replaying the whole of today's space over an older sweep
    would meet configs the sweep never measured."""
    named: set[str] = set()
    for row in rows:
        if (row["kernel"], row["problem_key"], row["dtype"]) == (spec.name, problem_key, dtype):
            named |= set(json.loads(row["config_json"]))
    later = {p.name: p.missing for p in spec.params if p.name not in named and p.missing is not None}
    if not later:
        return spec
    params = tuple(dataclasses.replace(p, choices=(p.missing,)) if p.name in later else p for p in spec.params)
    known_good = tuple(values for values in spec.known_good
                       if all(spec.param(k).coerce(v) == later[k] for k, v in values.items() if k in later))
    return dataclasses.replace(spec, params=params, known_good=known_good)


def replay_device(recorded_on: str) -> DeviceFacts:
    """The device a replayed study is filed under: named after the recording's, never equal to
    it, so that a replay can never be mistaken for (or merged with) a measurement."""
    return DeviceFacts(name=f"replay of {recorded_on}", compute_capability="n/a", multiprocessors=0,
                       memory_gib=0.0, l2_cache_mib=0.0, shared_memory_per_block_kib=0.0, driver="n/a",
                       cuda="n/a", torch="n/a", triton="n/a", omnitune="n/a", python="n/a")


def _number(value: Any, missing: float) -> float:
    return missing if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)

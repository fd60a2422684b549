"""The configs a search measures first, before any sampler: the kernel's default (always first,
so that every search has the baseline its speedup is told against), then the configs the user
asked for (search --try), the spec's known-good configs, and the winners of the nearest problems
already tuned (the warm start)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from omnitune.search.strategies.base import FixedList, Setting
from omnitune.spec import Config, DeviceLimits, KernelSpec

log = logging.getLogger(__name__)

# Tuned configs of nearby problems measured right after the known-good ones (a warm start).
WARM_START_CONFIGS = 3


class Planned(FixedList):
    def __init__(self, setting: Setting):
        super().__init__(first_proposals(setting.default, setting.tried, setting.known_good, setting.warm_start))


def first_proposals(default: Config, tried: Sequence[Config], known_good: Sequence[Config],
                    warm_start: Sequence[Config]) -> list[tuple[Config, str]]:
    """The order a search measures its first configs in, each once, with the role it is measured
    for (a trial's chosen_by): the default, the user's tries, known-good, warm start. The planned
    strategy proposes them; omnitune.search.prepare_next compiles them ahead in this order."""
    roles: dict[Config, str] = {}
    for role, configs in (("default", (default,)), ("given", tried), ("known-good", known_good),
                          ("warm-start", warm_start)):
        for config in configs:
            roles.setdefault(config, role)
    return list(roles.items())


def tried_configs(spec: KernelSpec, problem: Any, dtype: torch.dtype,
                  tries: Sequence[Mapping[str, Any]]) -> list[Config]:
    """The user's configs to try first (search --try) for this problem, in the order given: each a
    partial config laid over the problem's default, as --config is. Two that complete to one config
    are measured once (first_proposals)."""
    return [spec.complete_config(values, problem, dtype) for values in tries]


def warm_start_configs(
    spec: KernelSpec, problem: Any, dtype: torch.dtype, device_key: str, limits: DeviceLimits | None = None,
    *, most: int = WARM_START_CONFIGS,
) -> list[Config]:
    """The winners of the tuned problems nearest to `problem` in the exported tables that
    omnitune.runtime reads, nearest first (see omnitune.runtime.nearest_configs); none when a
    table cannot be read: a warm start is a hint, and a hostile table must not stop the search."""
    from omnitune.runtime import nearest_configs

    try:
        return nearest_configs(spec, problem, dtype, device_key, limits, most=most)
    except Exception as exc:  # noqa: BLE001 — whatever a table can make the reader raise
        log.warning("no warm start for %s: a tuned table could not be read (%s: %s)", spec.name,
                    type(exc).__name__, exc)
        return []

"""A config tuned for one problem, carried over to another by the kernel's own rule
(KernelSpec.adapt: paged decode scales its split count so that the grid keeps the tuned problem's
number of programs; attention keeps its long-prefill tile above the length its default takes it
at). Both the nearest rung (an entry's config) and the predictor rung (every
config a neighbouring problem measured) carry configs over before judging them for the problem
asked. A table is untrusted input, and so is what a rule makes of it: nothing here raises."""

from __future__ import annotations

from typing import Any

from omnitune.spec import Config, KernelSpec


def carried_over(spec: KernelSpec, tuned: Any, problem: Any, config: Config) -> Config | None:
    """`config` (tuned for `tuned`) carried over to `problem`, where the kernel has a rule and it
    changes something; None where it has none, changes nothing, raises or leaves the space."""
    if spec.adapt is None:
        return None
    try:
        adapted = spec.adapt(tuned, problem, config)
    except Exception:  # noqa: BLE001 — the config as tuned answers instead
        return None
    if not isinstance(adapted, Config) or adapted == config or outside_space(spec, adapted):
        return None
    return adapted


def outside_space(spec: KernelSpec, config: Config) -> list[tuple[str, str]]:
    """[('the config space', why)] for a config that is not one of the space's, else []: a
    default computed from the problem can land outside it (kv_cache_write's BLOCK_H=32 for
    17..32 kv heads of a small head dim), and so can a carried-over config."""
    try:
        if spec.coerce_config(config.as_dict(), strict=True) == config:
            return []
        return [("the config space", f"{config.label()} is not one of its configs")]
    except Exception as exc:  # noqa: BLE001 — ConfigError naming the value, or a default that is no Config
        return [("the config space", str(exc))]

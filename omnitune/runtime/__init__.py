"""Pick the launch config for a kernel call from the tuned tables — on the production hot path.

    from omnitune.runtime import get_config
    config = get_config("attention", problem, dtype=torch.bfloat16)

The chain: the exact (problem, dtype) tuned on this GPU → the nearest tuned problem that the
kernel's MatchPolicy allows (each dimension within a bounded ratio, so a decode call never snaps
to a prefill config) and whose config is valid for the requested problem → the kernel's default
config. Tables are `<dir>/<kernel>/<device_key>.json`, read from $OMNITUNE_CONFIG_DIR first
(several directories may be joined with os.pathsep), then the repository's tuned_configs/, then
the tuned_configs/ shipped inside the installed package.

A missing, empty, corrupt or stale table never breaks inference: it is logged once (logger
"omnitune.runtime") with the `omnitune search` command that would fill the gap, and the chain
falls through. Only a programming error raises (an unknown kernel, a problem of the wrong type).

Answers are cached per (kernel, problem, dtype, device, $OMNITUNE_CONFIG_DIR): a repeated lookup
costs a dict access. A table rewritten while the process runs is seen by lookups not answered
yet, or by all of them after clear_cache().

Import discipline: this package imports only the standard library, torch and omnitune's spec,
registry and errors — never optuna, pandas, rich, typer or sqlite-utils (a test checks).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

import omnitune
from omnitune.errors import InputError, ShapeError
from omnitune.runtime import _tables
from omnitune.runtime._chain import Lookup, Rung, ranked_entries, resolve
from omnitune.runtime._format import CONFIG_DIR_ENV, SCHEMA_VERSION, search_command, table_path
from omnitune.spec import DTYPE_NAMES, Config, DeviceLimits, KernelSpec, dtype_name

__all__ = [
    "CONFIG_DIR_ENV",
    "SCHEMA_VERSION",
    "Lookup",
    "Rung",
    "cache_generation",
    "clear_cache",
    "config_dirs",
    "get_config",
    "lookup",
    "nearest_configs",
]

_results: dict[tuple, Lookup] = {}
_device_names: dict[int, str] = {}
_limits: list[DeviceLimits] = []
_lock = threading.Lock()
# Bumped by clear_cache: callers that memoise answers (the public ops) start over when it moves.
_generation = [0]


def get_config(
    kernel: str,
    problem: Any,
    dtype: torch.dtype | None = None,
    device_name: str | None = None,
) -> Config:
    """The launch config for one call of `kernel` on `problem` (see lookup for the arguments)."""
    return lookup(kernel, problem, dtype, device_name).config


def lookup(
    kernel: str,
    problem: Any,
    dtype: torch.dtype | None = None,
    device_name: str | None = None,
) -> Lookup:
    """The config for one call and which rung of the chain answered.

    kernel: a registered kernel name (or a module/file that defines SPEC).
    problem: the kernel's problem dataclass (a shape spec string or a mapping is accepted too).
    dtype: the inputs' dtype. None means unknown: tables are keyed by dtype, so the default
        config answers.
    device_name: the GPU's name as torch.cuda.get_device_name() gives it; None means the current
        CUDA device, and without CUDA no table applies (the default config answers).
    """
    if device_name is None:
        device_name = _current_device_name()
    cache_key = (kernel, problem, dtype, device_name, os.environ.get(CONFIG_DIR_ENV))
    try:
        return _results[cache_key]
    except KeyError:
        pass
    except TypeError:  # an unhashable problem (a dict): answer without caching
        cache_key = None
    answer = _lookup_uncached(kernel, problem, dtype, device_name)
    if cache_key is not None:
        _results[cache_key] = answer
    return answer


def config_dirs() -> list[Path]:
    """The directories searched for tables, in order of precedence."""
    dirs = [Path(p) for p in os.environ.get(CONFIG_DIR_ENV, "").split(os.pathsep) if p]
    package_dir = Path(omnitune.__file__).parent
    dirs.append(package_dir.parent / "tuned_configs")  # the repository's (an editable install)
    shipped = package_dir / "tuned_configs"  # inside an installed wheel
    if shipped.is_dir():
        dirs.append(shipped)
    return dirs


def clear_cache() -> None:
    """Forget every answer, parsed table and warning (for tests, or after rewriting tables)."""
    with _lock:
        _results.clear()
        _device_names.clear()
        _limits.clear()
        _generation[0] += 1
    _tables.clear()


def cache_generation() -> int:
    """A counter that clear_cache() advances: memoised answers older than it are stale."""
    return _generation[0]


def _lookup_uncached(kernel: str, problem: Any, dtype: torch.dtype | None, device_name: str | None) -> Lookup:
    from omnitune.profile.device import device_key
    from omnitune.registry import get_spec

    spec = get_spec(kernel)  # an unknown kernel is a programming error: UnknownKernelError
    problem = _as_problem(spec, problem)
    if dtype is None:
        return Lookup(spec.default_config(problem, _widest_dtype(spec)), Rung.DEFAULT)
    if dtype not in spec.dtypes or dtype not in DTYPE_NAMES:
        supported = ", ".join(dtype_name(d) for d in spec.dtypes)
        raise InputError(f"{spec.name} does not support {dtype}; use one of {supported}")
    if device_name is None:
        return Lookup(spec.default_config(problem, dtype), Rung.DEFAULT)

    tables = _tables_for(spec, problem, dtype, device_key(device_name))
    return resolve(spec, problem, dtype, tables, _device_limits())


def nearest_configs(
    spec: KernelSpec, problem: Any, dtype: torch.dtype, device_key: str, limits: DeviceLimits | None = None,
    *, most: int = 3,
) -> list[Config]:
    """The tuned configs of the exported problems nearest to `problem` (same kernel, dtype and
    device, within the spec's MatchPolicy, the exact problem included), nearest first: at most
    `most` distinct configs, each valid for `problem`. What a search warm-starts from."""
    chosen: list[Config] = []
    for _, _, entry in ranked_entries(spec, problem, dtype, _tables_for(spec, problem, dtype, device_key)):
        if len(chosen) >= most:
            break
        if entry.config not in chosen and not spec.violations(problem, entry.config, dtype, limits):
            chosen.append(entry.config)
    return chosen


def _tables_for(spec: KernelSpec, problem: Any, dtype: torch.dtype, key: str) -> list:
    """The readable tables for one kernel and device, in precedence order; a bad file warns once,
    naming the search that would fill the gap, and is skipped."""
    gap = search_command(spec.name, spec.problem_key(problem), dtype_name(dtype))
    tables = []
    for config_dir in config_dirs():
        table = _tables.load_table(table_path(config_dir, spec.name, key), spec, gap)
        if table is not None:
            tables.append(table)
    return tables


def _as_problem(spec: KernelSpec, problem: Any) -> Any:
    if isinstance(problem, spec.problem_type):
        return problem
    if isinstance(problem, str):
        return spec.parse_shape(problem)
    if isinstance(problem, Mapping):
        return spec.problem_from_mapping(problem)
    raise ShapeError(
        f"{spec.name} needs a {spec.problem_type.__name__} (or a shape such as "
        f"{spec.problem_key(spec.example_problem)!r}), got {type(problem).__name__}"
    )


def _widest_dtype(spec: KernelSpec) -> torch.dtype:
    # Without a dtype, the default is computed for the widest element type the kernel supports:
    # a config whose tiles fit in shared memory at that width fits at any narrower one.
    return max(spec.dtypes, key=lambda d: torch.empty((), dtype=d).element_size())


def _current_device_name() -> str | None:
    if not torch.cuda.is_available():
        return None
    index = torch.cuda.current_device()
    name = _device_names.get(index)
    if name is None:
        name = _device_names[index] = torch.cuda.get_device_name(index)
    return name


def _device_limits() -> DeviceLimits:
    # Constraints are checked against the current GPU (the H100/H200 defaults without one).
    if not _limits:
        _limits.append(DeviceLimits.of_current_device())
    return _limits[0]

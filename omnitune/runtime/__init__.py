"""Pick the launch config for a kernel call from the tuned tables — on the production hot path.

    from omnitune.runtime import get_config
    config = get_config("attention", problem, dtype=torch.bfloat16)

The chain: the exact (problem, dtype) tuned on this GPU → the nearest tuned problem that the
kernel's MatchPolicy allows (each dimension within a bounded ratio, so a decode call never snaps
to a prefill config) and whose config is valid for the requested problem → a config predicted
from the trials of the tuned problems nearest to it (a table's predictor block, _predictor.py),
valid for the problem and expected to beat the default → the kernel's default config.
explain() says in words why a lookup was answered as it was. Tables are `<dir>/<kernel>/<device_key>.json`, read from $OMNITUNE_CONFIG_DIR first
(several directories may be joined with os.pathsep), then the repository's tuned_configs/, then
the tuned_configs/ shipped inside the installed package.

A missing, unreadable, corrupt or stale table never breaks inference: it is logged once (logger
"omnitune.runtime", see _tables.py) with the `omnitune search` command that would fill the gap,
and the chain falls through. The config returned never breaks a constraint of the problem: a
default that would is replaced by the first valid config of the space. Lookup raises only for
the caller's mistakes: UnknownKernelError (no such kernel), ShapeError (an InputError: a problem
of the wrong type, or with a value no tensor could have — inf, "1e400", 10**400, any dimension
above 2**31 - 1, b"16", "１６", "1_0"), and InputError (a dtype the kernel does not support, or a
problem no config of the kernel's space can run).

Caching, for a lookup on every call: answers are cached per bucket of problems (fields the
MatchPolicy matches by ratio rounded up, see _buckets.py), so that the steps of a decode loop,
each with a longer context, hit one entry; at most CACHE_ENTRIES answers are kept (least recently
used go first). A cached lookup takes under a microsecond (benchmarks/runtime_lookup.py).
The config directories ($OMNITUNE_CONFIG_DIR included) are read at the first lookup; a table
rewritten while the process runs is seen by lookups of buckets not answered yet, and by all
after clear_cache(), which also re-reads the environment.

Import discipline: this package imports only the standard library, torch and omnitune's spec, coerce,
registry and errors — never optuna, pandas, rich, typer or sqlite-utils (a test checks).
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

import omnitune
from omnitune.coerce import describe
from omnitune.errors import InputError, ShapeError, UnknownKernelError
from omnitune.runtime import _tables
from omnitune.runtime._buckets import Bucketing
from omnitune.runtime._chain import (
    Bucket,
    Impossible,
    Lookup,
    Rung,
    dtypes_to_borrow,
    ranked_entries,
    resolve_bucket,
    resolve_problem,
)
from omnitune.runtime._explain import Explanation
from omnitune.runtime._explain import explain as _explain
from omnitune.runtime._format import CONFIG_DIR_ENV, SCHEMA_VERSION, search_command, table_path
from omnitune.spec import DTYPE_NAMES, Config, DeviceLimits, KernelSpec, dtype_name

__all__ = [
    "CACHE_ENTRIES",
    "CONFIG_DIR_ENV",
    "SCHEMA_VERSION",
    "Explanation",
    "Lookup",
    "Rung",
    "cache_generation",
    "clear_cache",
    "config_dirs",
    "explain",
    "get_config",
    "lookup",
    "nearest_configs",
]

CACHE_ENTRIES = 4096
"""Most answers kept: buckets of problems, plus single problems where a bucket has no shared answer."""

# (kernel, dtype, device_name, bucket key[, problem values]) → Lookup | Bucket | Impossible
_answers: OrderedDict[tuple, Any] = OrderedDict()
_bucket_keys: dict[Any, Callable[[Any], Any]] = {}  # kernel as the caller names it → its key function
_bucketings: dict[str, Bucketing] = {}
_device_names: dict[int, str] = {}
_cuda: list[bool] = []             # torch.cuda.is_available(), asked once: it costs ~0.6 µs a call
_limits: list[DeviceLimits] = []
_dirs: list[list[Path]] = []       # config_dirs() as of the first lookup
_lock = threading.Lock()           # guards writes to the caches above; never held while reading files
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
    # The hot path: one generated key function, one dict access. Anything it cannot answer —
    # not cached yet, a string or mapping, a value that is not a plain int — takes the slow path,
    # which validates the call and raises the caller's mistakes.
    try:
        key = (kernel, dtype, device_name, _bucket_keys[kernel](problem))
        answer = _answers[key]
        _answers.move_to_end(key)
    except Exception:  # noqa: BLE001 — see above: the slow path decides
        return _lookup_slow(kernel, problem, dtype, device_name)
    if answer.__class__ is Lookup:
        return answer
    found = answer.pick(problem)  # a Bucket: its tuned problems, or the answer it shares
    if found is not None:
        return found
    try:  # a bucket with no shared answer: this problem's own
        found = _answers[(*key, answer.values(problem))]
    except Exception:  # noqa: BLE001 — as above
        return _lookup_slow(kernel, problem, dtype, device_name)
    if found.__class__ is Impossible:
        raise InputError(found.message)
    return found


def explain(
    kernel: str,
    problem: Any,
    dtype: torch.dtype | None = None,
    device_name: str | None = None,
) -> Explanation:
    """lookup()'s answer with why this rung answered and what the tables' predictor expects of
    its config (arguments as for lookup). Not for the hot path: it reads the chain again."""
    answer = lookup(kernel, problem, dtype, device_name)
    if device_name is None:
        device_name = _current_device_name()
    spec = _spec_of(kernel)
    problem = _as_problem(spec, problem)
    tables = _tables_for(spec, problem, dtype, device_name)
    return _explain(spec, problem, dtype, device_name, tables, answer, _device_limits())


def config_dirs() -> list[Path]:
    """The directories searched for tables, in order of precedence (from the environment now;
    lookups use them as they were at the first lookup, until clear_cache())."""
    dirs = [Path(p) for p in _env_dirs()]
    package_dir = Path(omnitune.__file__).parent
    dirs.append(package_dir.parent / "tuned_configs")  # the repository's (an editable install)
    shipped = package_dir / "tuned_configs"  # inside an installed wheel
    if shipped.is_dir():
        dirs.append(shipped)
    return dirs


def clear_cache() -> None:
    """Forget every answer, parsed table and warning, and read the environment again (for tests,
    or after rewriting tables)."""
    with _lock:
        _answers.clear()
        _bucket_keys.clear()
        _bucketings.clear()
        _device_names.clear()
        _cuda.clear()
        _limits.clear()
        _dirs.clear()
        _generation[0] += 1
    _tables.clear()


def cache_generation() -> int:
    """A counter that clear_cache() advances: memoised answers older than it are stale."""
    return _generation[0]


def nearest_configs(
    spec: KernelSpec, problem: Any, dtype: torch.dtype, device_key: str, limits: DeviceLimits | None = None,
    *, most: int = 3,
) -> list[Config]:
    """The tuned configs of the exported problems nearest to `problem` (same kernel and device,
    within the spec's MatchPolicy, the exact problem included), nearest first — of the same dtype,
    then of its sibling (fp16 for bf16 and back, as the runtime's chain borrows): at most `most`
    distinct configs, each valid for `problem` on `limits` (None: this GPU's, as lookups judge); a
    same-chip GPU's after this one's own. What a search warm-starts from, and what attention falls
    back on when its entry's backend cannot take a call."""
    limits = _device_limits() if limits is None else limits
    chosen: list[Config] = []
    tables = _own_or_twin_tables(spec, problem, dtype, device_key, config_dirs())
    for source in dtypes_to_borrow(dtype):
        for _, _, entry in ranked_entries(spec, problem, source, tables):
            if len(chosen) >= most:
                return chosen
            if entry.config not in chosen and not spec.violations(problem, entry.config, dtype, limits):
                chosen.append(entry.config)
    return chosen


def _lookup_slow(kernel: Any, problem: Any, dtype: Any, device_name: Any) -> Lookup:
    """Validate the call, then answer from the cache or resolve and cache the answer."""
    spec = _spec_of(kernel)
    problem = _as_problem(spec, problem)
    _check_dtype(spec, dtype)
    if device_name is not None and not isinstance(device_name, str):
        raise InputError(f"device_name must be a GPU's name (a str) or None, got {describe(device_name)}")
    bucketing = _bucketing_of(kernel, spec)
    check_dtype = dtype if dtype is not None else _widest_dtype(spec)
    key = (kernel, dtype, device_name, bucketing.key(problem))
    tables = None

    bucket = _answers.get(key)
    if bucket is None:
        tables = _tables_for(spec, problem, dtype, device_name)
        bucket = resolve_bucket(spec, bucketing, problem, dtype, check_dtype, tables, _device_limits())
        _remember(key, bucket)
    found = bucket if bucket.__class__ is Lookup else bucket.pick(problem)
    if found is not None:
        return found

    # No answer serves the whole bucket: this problem is resolved (and cached) on its own.
    problem_key = (*key, bucketing.values(problem))
    answer = _answers.get(problem_key)
    if answer is None:
        if tables is None:
            tables = _tables_for(spec, problem, dtype, device_name)
        answer = resolve_problem(spec, problem, dtype, check_dtype, tables, _device_limits())
        _remember(problem_key, answer)
    if answer.__class__ is Impossible:
        raise InputError(answer.message)
    return answer


def _remember(key: tuple, answer: Any) -> None:
    with _lock:
        _answers[key] = answer
        _answers.move_to_end(key)
        while len(_answers) > CACHE_ENTRIES:
            _answers.popitem(last=False)


def _spec_of(kernel: Any) -> KernelSpec:
    from omnitune.registry import get_spec

    if not isinstance(kernel, str):
        raise UnknownKernelError(f"kernel must be a kernel's name (a str), got {describe(kernel)}")
    return get_spec(kernel)  # an unknown kernel is a programming error: UnknownKernelError


def _bucketing_of(kernel: str, spec: KernelSpec) -> Bucketing:
    bucketing = _bucketings.get(spec.name)
    if bucketing is None:
        bucketing = Bucketing(spec)
        with _lock:
            _bucketings[spec.name] = bucketing
    with _lock:
        _bucket_keys[kernel] = bucketing.key
    return bucketing


def _tables_for(spec: KernelSpec, problem: Any, dtype: torch.dtype | None, device_name: str | None) -> list:
    """The tables a lookup reads: none without a dtype or a device (the default answers). This
    GPU's own, then those of a GPU made of the same chip (same_chip_keys: an H100 SXM reads the
    H200's) for the shapes its own lack, said once in the log."""
    if dtype is None or device_name is None:
        return []
    from omnitune.profile.device import device_key

    return _own_or_twin_tables(spec, problem, dtype, device_key(device_name), _snapshot_dirs(), device_name)


def _own_or_twin_tables(
    spec: KernelSpec, problem: Any, dtype: torch.dtype, key: str, dirs: list[Path], device_name: str | None = None,
) -> list:
    """The readable tables for device `key` under `dirs`, in precedence order, followed by those of
    the first same-chip GPU that has some. The device's own entries come first at every rung; the
    twin's answer the shapes they lack (a GPU tuned for one shape keeps the twin's entries for every
    other, rather than the default).
    With device_name (a lookup, not a search's warm start), reading a twin's is said once, and so
    is finding no file of this device's and no twin's table."""
    from omnitune.profile.device import same_chip_keys

    gap = search_command(spec.name, spec.problem_key(problem), dtype_name(dtype))
    own, found_any = _tables_at(spec, key, dirs, gap)
    for twin in same_chip_keys(key):
        tables, _ = _tables_at(spec, twin, dirs, gap)
        if tables:
            if device_name is not None:
                _tables.note_twin(spec, device_name, tables[0].path, gap, below_own=bool(own))
            return own + tables
    if not found_any and device_name is not None:
        _tables.warn_missing(spec, device_name, [table_path(d, spec.name, key) for d in dirs], gap)
    return own


def _tables_at(spec: KernelSpec, key: str, dirs: list[Path], gap: str) -> tuple[list, bool]:
    """The readable tables for one kernel and device under `dirs`, in precedence order, and whether
    any directory holds a file for them; a bad file warns once, naming the search that would fill
    the gap (`gap`), and is skipped."""
    tables, found_any = [], False
    for config_dir in dirs:
        path = table_path(config_dir, spec.name, key)
        stamp = _tables.file_stamp(path)
        if stamp is None:
            continue
        found_any = True
        table = _tables.load_stamped(path, stamp, spec, gap)
        if table is not None:
            tables.append(table)
    return tables, found_any


def _as_problem(spec: KernelSpec, problem: Any) -> Any:
    if isinstance(problem, spec.problem_type):
        return spec.canonical_problem(problem)  # inf, 2**40 or "16" in a field: ShapeError
    if isinstance(problem, str):
        return spec.parse_shape(problem)
    if isinstance(problem, Mapping):
        return spec.problem_from_mapping(problem)
    raise ShapeError(
        f"{spec.name} needs a {spec.problem_type.__name__} (or a shape such as "
        f"{spec.problem_key(spec.example_problem)!r}), got {type(problem).__name__}"
    )


def _check_dtype(spec: KernelSpec, dtype: Any) -> None:
    if dtype is None:
        return
    supported = ", ".join(str(d) for d in spec.dtypes)
    if not isinstance(dtype, torch.dtype):
        raise InputError(f"dtype must be a torch.dtype (one of {supported}) or None, got {describe(dtype)}")
    if dtype not in spec.dtypes or dtype not in DTYPE_NAMES:
        raise InputError(f"{spec.name} does not support {dtype}; use one of {supported}")


def _widest_dtype(spec: KernelSpec) -> torch.dtype:
    # Without a dtype, the default is computed for the widest element type the kernel supports:
    # a config whose tiles fit in shared memory at that width fits at any narrower one.
    return max(spec.dtypes, key=lambda d: torch.empty((), dtype=d).element_size())


def _current_device_name() -> str | None:
    if not _cuda:
        _cuda.append(torch.cuda.is_available())
    if not _cuda[0]:
        return None
    index = torch.cuda.current_device()
    name = _device_names.get(index)
    if name is None:
        name = _device_names[index] = torch.cuda.get_device_name(index)
    return name


def _snapshot_dirs() -> list[Path]:
    if not _dirs:
        dirs = config_dirs()
        with _lock:
            if not _dirs:
                _dirs.append(dirs)
        _warn_missing_dirs()
    return _dirs[0]


def _env_dirs() -> list[str]:
    """The folders $OMNITUNE_CONFIG_DIR names, in order."""
    return [p for p in os.environ.get(CONFIG_DIR_ENV, "").split(os.pathsep) if p]


def _warn_missing_dirs() -> None:
    """One warning for each folder $OMNITUNE_CONFIG_DIR names that does not exist: a typo there left
    every table in it unread, without a word."""
    for text in _env_dirs():
        if not os.path.exists(text):
            _tables.warn_once(("missing config dir", text), f"{CONFIG_DIR_ENV} names {text}, which does not exist: "
                              "no table is read from it")


def _device_limits() -> DeviceLimits:
    # Constraints are checked against the current GPU (the H100/H200 defaults without one).
    if not _limits:
        _limits.append(DeviceLimits.of_current_device())
    return _limits[0]

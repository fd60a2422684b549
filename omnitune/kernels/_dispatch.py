"""What every public op does around its launch, priced for the production hot path.

A serving engine calls our ops back to back, thousands of times a second, often inside a CUDA
graph or torch.compile. So the steady-state path of an op:
  - reads no value from the device (no .item(), .tolist(), bool(tensor)): bounds that depend on
    tensor *values* (slots, block numbers, context lengths, span ends) are enforced inside the
    kernels, where an out-of-range entry is masked, never read or written;
  - checks only metadata (shapes, dtypes, devices), which costs no sync;
  - finds its launch config in a small memo keyed by plain ints, so a repeated call does not
    build a problem dataclass or walk the runtime's chain.
The check mode (`check=True`, or OMNITUNE_CHECK=1 in the environment) validates tensor values up
front with a clear InputError before anything is launched or written — what tests and debugging
want, at the price of a sync.

Under torch.compile, the public functions call their torch.library custom op instead
(torch.ops.omnitune.*, each registered beside its public function), so Dynamo records one opaque
node.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Hashable, Mapping
from typing import Any

import torch

from omnitune import runtime
from omnitune.coerce import MAX_DIMENSION
from omnitune.errors import ConfigError, InputError
from omnitune.kernels._host import flag
from omnitune.kernels._launch import bounded_put
from omnitune.runtime._buckets import bucket_bound
from omnitune.spec import Config, KernelSpec

CHECK_ENV = "OMNITUNE_CHECK"
# Distinct call keys kept per op before the memo starts over: a decode loop needs a handful, a
# prefill server with every prompt length a few hundred; dropping everything at the bound keeps
# each hit one dict lookup (no LRU bookkeeping on the hot path).
MEMO_ENTRIES = 4096


def _env_reader(name: str):
    """A getter for one environment variable that costs a dict lookup: os.environ.get encodes
    the name and decodes the value on every call (~1.5 µs, read on every op call here). Reads
    os.environ's own mapping, which every change made through os.environ updates."""
    data = getattr(os.environ, "_data", None)
    encode = getattr(os.environ, "encodekey", None)
    if isinstance(data, dict) and encode is not None:
        raw = encode(name)
        decode = os.environ.decodevalue

        def get() -> str | None:
            value = data.get(raw)
            return None if value is None else decode(value)

        return get
    return lambda: os.environ.get(name)


_check_env = _env_reader(CHECK_ENV)


# OMNITUNE_CHECK's values that leave the check mode off (any case, spaces around): unset, empty, and
# the words a user writes for off — OMNITUNE_CHECK=false turned it on.
_CHECK_OFF = frozenset({"", "0", "false", "no", "off"})


def checking(check: bool | None) -> bool:
    """Whether this call validates tensor values up front (a sync) before launching."""
    if check is None:
        value = _check_env()
        return value is not None and value.strip().lower() not in _CHECK_OFF
    # Not bool(check), which read check="no" (any non-empty string, any object) as True.
    return flag(check, "check", "None, True or False")


def require_compiled_check(check: bool | None) -> None:
    """A caller's `check` under torch.compile, where the ops take none and check as OMNITUNE_CHECK
    says: validated as an eager call validates it (check="no" is refused), and check=True with the
    variable off is refused rather than dropped, since the values it asks to be checked would not be."""
    if check is not None and checking(check) and not checking(None):
        raise InputError(f"check=True cannot reach a compiled op (the ops take no check); set {CHECK_ENV}=1 to "
                         "check values under torch.compile, or call eagerly")


# Length → its bucket, remembered: the ops bucket a length on every call, a serving loop's
# lengths repeat, and the rule is fixed (a dict hit is a tenth of recomputing it).
_buckets: dict[int, int] = {}


def bucket_up(n: int) -> int:
    """n rounded up to a bucket of four per octave (…, 1024, 1280, 1536, 1792, 2048, …), the
    runtime's own rule (omnitune.runtime._buckets): lengths that grow by one token per decode step
    share one config lookup for a long stretch, and a bucket overshoots by at most 25%."""
    if type(n) is not int:  # not kept: a symbolic size under torch.compile, or a numpy integer
        # int() of a symbolic size would specialise the graph on it: traced_bucket_up's range guards do not
        return traced_bucket_up(n) if isinstance(n, torch.SymInt) else bucket_bound(max(int(n), 1))
    found = _buckets.get(n)
    if found is None:
        found = bounded_put(_buckets, n, bucket_bound(max(n, 1)), MEMO_ENTRIES)
    return found


def _all_bucket_bounds() -> tuple[int, ...]:
    """Every bound bucket_up can give, ascending (about 120, up to MAX_DIMENSION)."""
    bounds, value = [], 1
    while value <= MAX_DIMENSION:
        bounds.append(bucket_bound(value))
        value = bounds[-1] + 1
    return tuple(bounds)


_BUCKET_BOUNDS = _all_bucket_bounds()


def traced_bucket_up(n) -> int:
    """bucket_up for a length that torch.compile traces (a SymInt, once it differed between calls),
    found by a binary search of comparisons: Dynamo guards on those (n <= 1280, n > 1024), which
    every length of the bucket passes, so a decode loop compiles once a bucket. int(n), or the memo
    keyed by it, guarded on the exact length (or on the memo's size) and recompiled at every step,
    until Dynamo's recompile limit (an error under fullgraph=True). Every compiled path buckets with it,
    a constant length too: traced code never reads the memo, whose size eager calls change."""
    lo, hi = 0, len(_BUCKET_BOUNDS) - 1
    while lo < hi:  # the first bound >= n (the last one for a length past every bound)
        mid = (lo + hi) // 2
        if n <= _BUCKET_BOUNDS[mid]:
            hi = mid
        else:
            lo = mid + 1
    return _BUCKET_BOUNDS[lo]


class ConfigMemo:
    """Launch configs per raw call key for one op, bounded, and forgotten whenever the runtime's
    caches are (omnitune.runtime.clear_cache, e.g. after tables were rewritten)."""

    def __init__(self, spec_name: str):
        self.spec_name = spec_name
        self._configs: dict[Hashable, Config] = {}
        self._generation = -1
        self._lock = threading.Lock()

    def get(self, key: Hashable, config: Any, make_problem: Callable[[], Any] | None, dtype: torch.dtype,
            default: Callable[[], Config] | None = None) -> Config:
        """The config for one call: `config` None looks it up in the tuned tables; a Config or
        a mapping from the caller is completed and validated once per call key (ConfigError).
        `default`, if given, makes the config instead of any lookup."""
        generation = runtime._generation[0]
        if generation != self._generation:
            with self._lock:
                self._configs.clear()
                self._generation = generation
        if config is not None:
            key = (key, _config_identity(config))
        # No $OMNITUNE_CONFIG_DIR in the key: the runtime reads it at its first lookup and again
        # only after clear_cache(), which moves the generation above and empties this memo.
        memo_key = (key, dtype)
        found = self._configs.get(memo_key)
        if found is not None:
            return found
        cfg = default() if default is not None else self._resolve(config, make_problem(), dtype)
        with self._lock:
            return bounded_put(self._configs, memo_key, cfg, MEMO_ENTRIES)

    def _resolve(self, config: Any, problem: Any, dtype: torch.dtype) -> Config:
        from omnitune.registry import get_spec
        from omnitune.runtime import get_config

        if config is None:
            return get_config(self.spec_name, problem, dtype=dtype)
        spec: KernelSpec = get_spec(self.spec_name)
        return spec.resolve_config(config, problem, dtype, check_given="sizes")

    def clear(self) -> None:
        with self._lock:
            self._configs.clear()


def _config_identity(config: Any) -> Hashable:
    if isinstance(config, Config):
        return config
    if isinstance(config, Mapping):
        return tuple(sorted(config.items()))
    raise ConfigError(f"config must be a Config or a mapping, got {type(config).__name__}")


def _constant_when_traced(fn):
    """torch.compiler.assume_constant_result without importing torch._dynamo (~1.3 s, the larger
    part of importing a kernel module): that decorator only sets this attribute, which Dynamo
    reads when it traces a call (tests/test_dispatch_import.py holds the two the same)."""
    fn._dynamo_marked_constant = True
    return fn


@_constant_when_traced
def config_to_json(config: Config | Mapping | None) -> str:
    """A caller's config as the string the custom ops take (a schema has no dict type); ''
    means look it up. Dynamo runs it once while tracing and keeps the string as a constant."""
    if config is None:
        return ""
    return json.dumps(dict(config), sort_keys=True)


def config_from_json(text: str) -> dict | None:
    return json.loads(text) if text else None


def compiling() -> bool:
    """True while Dynamo traces the caller: the public functions then call their custom op."""
    return torch.compiler.is_compiling()

"""Numerics and speed (GPU): every config those parts launch for a table, handed to compile
workers before its first entry is checked.

Checking an entry launches its config, its fallback and the default, and on a fresh machine each
launch compiles: one config at a time in this process while the host's other cores sit idle. The
workers of omnitune.measure (shared processes, a problem's inputs made once a worker, binaries
loaded by capture, nothing run on the GPU) fill Triton's disk cache ahead instead, and before an
entry is checked `ready` waits for the worker still compiling one of its configs — never longer
than compiling it here, since the worker began first. As for a search, nothing a worker does is a
result: a config that did not compile there is launched, and fails, in the check itself.
"""

from __future__ import annotations

from typing import Any

from omnitune.measure.ahead import PrecompilePool
from omnitune.measure.precompile import PrecompileReport
from omnitune.spec import Config, DeviceLimits, KernelSpec
from omnitune.verify.numerics import run_shape
from omnitune.verify.speed import fallback_config
from omnitune.verify.tables import Entry, TableFile


def configs_checked(spec: KernelSpec, problem: Any, dtype, entry_config: Config, limits: DeviceLimits) -> list[Config]:
    """The Triton configs numerics and speed launch for one entry (its own, its fallback, the
    default), once each, without those that break a constraint here (not launched) or that run
    one of PyTorch's backends (nothing to compile)."""
    backends = {spec.complete_config(values, problem, dtype) for values in spec.backends}
    configs = dict.fromkeys((entry_config, fallback_config(spec, problem, dtype), spec.default_config(problem, dtype)))
    return [c for c in configs if c not in backends and not spec.violations(problem, c, dtype, limits)]


class EntriesAhead:
    """One table's entries, their configs submitted to the compile workers at construction, each
    on the problem and dtype the checks run it on (numerics.run_shape: the interpreter's are smaller)."""

    def __init__(self, table: TableFile, limits: DeviceLimits, *, interpret: bool = False, workers: int | None = None):
        self._pools: dict[str, tuple[PrecompilePool, list[Config]]] = {}
        device = "cpu" if interpret else "cuda"
        for entry in table.entries:
            problem, dtype = run_shape(table.spec, entry, interpret)
            configs = configs_checked(table.spec, problem, dtype, entry.config, limits)
            if configs:
                pool = PrecompilePool(table.spec, problem, dtype, workers=workers, device=device)
                pool.submit(configs)
                self._pools[entry.key] = (pool, configs)

    @property
    def configs(self) -> int:
        return sum(len(configs) for _, configs in self._pools.values())

    @property
    def workers(self) -> int:
        return max((pool.workers for pool, _ in self._pools.values()), default=0)

    def ready(self, entry: Entry) -> None:
        """Return once the workers are done with `entry`'s configs (those no worker has started
        are withdrawn: the check compiles them)."""
        pool, configs = self._pools.get(entry.key, (None, ()))
        for config in configs:
            pool.ready(config)

    def finish(self) -> None:
        """Return once the workers are done with every entry's configs, none withdrawn."""
        for pool, _ in self._pools.values():
            pool.finish()

    def close(self) -> PrecompileReport:
        """Withdraw what no worker has started and say what the workers did, all entries together."""
        reports, failed = [], {}
        for key, (pool, _) in self._pools.items():
            pool.close()
            reports.append(pool.report())
            failed.update({(key, config): reason for config, reason in reports[-1].failed.items()})
        return PrecompileReport(sum(r.compiled for r in reports), failed, max((r.seconds for r in reports), default=0.0),
                                self.workers, sum(r.waited_s or 0.0 for r in reports), sum(r.cpu_s for r in reports))

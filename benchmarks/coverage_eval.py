"""One held-out problem judged for benchmarks/coverage.py: what the runtime picks from the tables,
the kernel's default config, the best a warm-started search finds and the best PyTorch path, all
timed against each other at the end in one interleaved run.

The pieces are the project's own, so that the figures mean what they mean elsewhere: the pick is
omnitune.runtime.explain's answer (the lookup the ops make, with its rung and why); the search
is omnitune.search.driver.run_search, as `omnitune search` drives it (its finalists re-timed,
its compile-ahead pool), warm-started from the pick and the nearest tables' winners; the
baselines are the spec's, as `omnitune bench` runs them; and the final timing is
omnitune.profile.timing.time_interleaved with the runner's settings, as the search re-times
its finalists (omnitune.measure.runner.Runner.time_interleaved), summarised as finalists are.

Every candidate is checked against the reference on a NaN-poisoned output before it is timed.
evaluate() fills its row step by step, so a problem that fails keeps what was found before.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from omnitune.spec import Config, DeviceLimits, KernelSpec
from omnitune.trial import DeviceFacts, TrialStatus, classify_exception, device_key

# The roles a config plays in a row, in the order they are reported.
ROLES = ("pick", "default", "tuned")


class GpuLost(RuntimeError):
    """The CUDA context is unusable: nothing more can be measured in this process."""


@dataclass(frozen=True)
class Setup:
    """What every problem of one run shares."""

    device: DeviceFacts
    """The device the search measures on (the interpreter's pseudo-device under --interpret)."""
    tables_device: str | None
    """The GPU whose tables the runtime reads, by name (None: no table applies)."""
    limits: DeviceLimits
    trials: int
    rounds: int
    interpret: bool
    storage_url: str | None = None
    """Optuna storage shared by the run's studies (--work-dir); None: one in memory per problem."""
    db: Any = None
    """The results database the trials are catalogued in (--work-dir), or None."""
    precompile_workers: int = 0
    finalists: int = 3
    seed: int = 0
    ahead: Any = None
    """The run's look-ahead over its problems (omnitune.search.prepare_next.ProblemsAhead): once a
    search has claimed its last trial, the next problem's first configs compile while this one's
    last trials, finalists and final timing run. None: each problem starts cold."""
    tuned_from: Any = None
    """{(kernel, row key): {"config", "measured_at", "source", "kernel_source_hash"}}: problems
    whose tuned optimum an earlier run's search found (coverage.py --tuned-from); they are not
    searched again. None: every problem is searched."""


@dataclass(frozen=True)
class Candidate:
    """One thing timed in the final interleaved run: a config (named by its roles) or a baseline."""

    name: str
    run: Callable[[], object]
    roles: tuple[str, ...] = ()
    prepared: bool = False  # a baseline that does part of its work ahead (KernelSpec.prepared_baselines)


def evaluate(row: dict, spec: KernelSpec, problem: Any, dtype: torch.dtype, setup: Setup) -> None:
    """Judge one problem, filling `row` as each step finishes (see the module doc)."""
    from omnitune.cli import preflight
    from omnitune.search.driver import StopReason

    preflight.require_fits_in_memory(spec, problem, dtype, setup.interpret)
    pick = record_pick(row, spec, problem, dtype, setup)
    configs = {"pick": pick, "default": spec.default_config(problem, dtype)}
    row["configs"] = {role: config.as_dict() for role, config in configs.items()}
    earlier = (setup.tuned_from or {}).get((spec.name, row["key"]))
    earlier_optimum = Config(earlier["config"]) if earlier else None
    broken = spec.violations(problem, earlier_optimum, dtype, setup.limits) if earlier else []
    if broken:
        # The space or a constraint changed since: that optimum is no longer a config of this
        # kernel, so the problem is searched again.
        name, reason = broken[0]
        row["earlier_optimum_invalid"] = f"{name}: {reason}"
        earlier = None
    if earlier is not None:  # the optimum an earlier run's search found, checked and timed again below
        runner = problem_runner(spec, problem, dtype, setup)
        configs["tuned"] = earlier_optimum
        # Found on other kernel source (or on source not recorded, before rows kept it): that
        # search's best may not be this source's, which the row says.
        row["search"] = {"tuned_from": earlier["source"], "tuned_measured_at": earlier["measured_at"],
                         "tuned_on_this_source": earlier.get("kernel_source_hash") == spec.source_hash()}
        found_by = "the earlier search's best config"
    else:
        warm = warm_start(spec, problem, dtype, setup, pick)
        outcome, runner = tuned_search(spec, problem, dtype, setup, warm)
        row["search"] = search_facts(outcome, warm)
        if getattr(runner, "context_lost", False) or outcome.stop_reason is StopReason.CONTEXT_LOST:
            raise GpuLost("a config of the search crashed the GPU (illegal memory access)")
        if outcome.best is None:
            raise RuntimeError(f"no config ran correctly in the search ({row['search']['failures']})")
        configs["tuned"] = outcome.best.config
        found_by = "the search's best config"
    row["configs"]["tuned"] = configs["tuned"].as_dict()
    row["pick_is_tuned"] = configs["pick"] == configs["tuned"]
    candidates, checks = checked_candidates(spec, problem, runner, configs)
    row["checks"] = checks
    tuned_check = checks[name_of(candidates, "tuned")]
    if tuned_check["status"] != "ok":
        raise RuntimeError(f"{found_by} failed its check again: {tuned_check}")
    timings = time_against_each_other([c for c in candidates if checks[c.name]["status"] == "ok"], runner, setup)
    row["timings"] = timings
    row.update(times_and_ratios(candidates, timings))


def record_pick(row: dict, spec: KernelSpec, problem: Any, dtype: torch.dtype, setup: Setup) -> Config:
    """The runtime's answer for the problem, as `omnitune lookup` explains it: its config, the
    rung that answered and why."""
    import omnitune.runtime as runtime

    found = runtime.explain(spec.name, problem, dtype, setup.tables_device)
    answer = found.lookup
    row.update(rung=answer.rung.value, why=found.why, matched_key=answer.matched_key,
               distance=answer.distance, expected_ratio=found.expected_ratio,
               table=str(answer.source) if answer.source is not None else None)
    return answer.config


def warm_start(spec: KernelSpec, problem: Any, dtype: torch.dtype, setup: Setup, pick: Config) -> tuple[Config, ...]:
    """The pick first, then the winners of the nearest tuned problems, as the search would warm-start
    itself from the tables: the pick is measured among the first trials (after the default and the
    spec's known-good configs), so that the tuned optimum starts from it and any difference is what
    the search found beyond it."""
    from omnitune.search.driver import warm_start_configs

    nearest = []
    if setup.tables_device is not None:
        nearest = warm_start_configs(spec, problem, dtype, device_key(setup.tables_device), setup.limits)
    return tuple(dict.fromkeys([pick, *nearest]))


def tuned_search(spec: KernelSpec, problem: Any, dtype: torch.dtype, setup: Setup, warm: Sequence[Config]):
    """The per-problem optimum: a search through the real driver, and the runner that holds the
    problem's inputs and reference (built here if a resumed study had nothing left to measure)."""
    import optuna

    from omnitune.search.driver import SearchOptions, run_search

    runners: list = []

    def runner():
        if not runners:
            runners.append(problem_runner(spec, problem, dtype, setup))
        return runners[0]

    options = SearchOptions(
        device=setup.device, trials=setup.trials, storage_url=setup.storage_url, seed=setup.seed,
        limits=setup.limits, finalists=0 if setup.interpret else setup.finalists, observers=(),
        warm_start=tuple(warm),
    )
    storage = None if setup.storage_url else optuna.storages.InMemoryStorage()
    prepare_next = None
    if setup.ahead is not None and setup.precompile_workers:
        prepare_next = partial(setup.ahead.prepare_after, spec, problem, dtype, limits=setup.limits,
                               device_key=setup.device.key)
    with compile_pool(spec, problem, dtype, setup) as ahead:
        outcome = run_search(spec, problem, dtype, options, runner_factory=runner, storage=storage, db=setup.db,
                             compile_ahead=ahead, on_trials_claimed=prepare_next)
    return outcome, runner()


def problem_runner(spec: KernelSpec, problem: Any, dtype: torch.dtype, setup: Setup):
    """The runner that holds the problem's inputs and reference, as the search measures with."""
    from omnitune.cli import preflight
    from omnitune.measure.runner import Runner

    with preflight.allocation_errors(spec, problem):
        return Runner(spec, problem, dtype, interpret=setup.interpret, limits=setup.limits)


def compile_pool(spec: KernelSpec, problem: Any, dtype: torch.dtype, setup: Setup):
    """`omnitune search`'s compile-ahead pool — the one the look-ahead opened for this problem
    while the one before it was measured, if it did: it only makes the search quicker, never its
    figures."""
    if not setup.precompile_workers:
        return nullcontext()
    if setup.ahead is not None:
        pool, _ = setup.ahead.take(spec, problem, dtype)
        return pool
    from omnitune.measure.ahead import PrecompilePool

    return PrecompilePool(spec, problem, dtype, workers=setup.precompile_workers)


def search_facts(outcome, warm: Sequence[Config]) -> dict:
    best = outcome.best
    return {
        "warm_start": [c.as_dict() for c in warm],
        "study": outcome.study_name, "measured_total": outcome.measured_total, "measured_now": outcome.measured_now,
        "stop_reason": outcome.stop_reason.value, "retime_status": outcome.retime_status.value,
        "best_search_ms": best.time_ms if best is not None else None, "wall_s": outcome.wall_s,
        "failures": {status.value: count for status, count in outcome.failures.items() if count},
    }


def checked_candidates(spec: KernelSpec, problem: Any, runner, configs: dict[str, Config], *,
                       baselines: bool = True):
    """The distinct configs of `configs` (role → config; one candidate per config, named by the
    roles it plays, in the order given) and, with `baselines`, the spec's baselines, each with its
    check against the reference: (candidates, {name: check})."""
    roles_of: dict[Config, list[str]] = {}
    for role, config in configs.items():
        roles_of.setdefault(config, []).append(role)
    candidates, checks = [], {}
    for config, roles in roles_of.items():
        name = "+".join(roles)
        out = spec.new_output(runner.inputs)
        candidates.append(Candidate(name, lambda config=config, out=out: spec.launch(runner.inputs, out, config),
                                    tuple(roles)))
        status, error, detail = runner.check(config)
        if status is TrialStatus.CRASHED:
            raise GpuLost(f"the {name} config crashed the GPU: {detail}")
        checks[name] = {"status": status.value, "rel_error": finite(error), "detail": detail}
    for name, fn in (spec.baselines(problem) if baselines and spec.baselines is not None else {}).items():
        run = (lambda fn=fn: fn(runner.inputs))
        candidates.append(Candidate(name, run, prepared=name in spec.prepared_baselines))
        checks[name] = check_baseline(spec, run, runner)
    return candidates, checks


def check_baseline(spec: KernelSpec, run: Callable[[], torch.Tensor], runner) -> dict:
    """Run a PyTorch path once and compare it with the reference, as `omnitune bench` does; one
    that cannot run here (a backend SDPA refuses, a CPU without it) is a status, not an error."""
    try:
        with quiet():
            out = run()
        if not runner.interpret:
            torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 — see above
        status, detail = classify_exception(exc)
        if status is TrialStatus.CRASHED:
            raise GpuLost(detail) from exc
        return {"status": "not available", "rel_error": None, "detail": detail}
    error = spec.compare(out, runner.reference)
    status = "ok" if error <= runner.tolerance else "mismatch"
    return {"status": status, "rel_error": finite(error), "detail": ""}


def time_against_each_other(candidates: Sequence[Candidate], runner, setup: Setup) -> dict[str, dict]:
    """Every candidate timed round-robin against the others in one run; per name, the finalists'
    figures of its samples."""
    runs = [c.run for c in candidates]
    with quiet():
        if setup.interpret:
            samples = wall_clock_interleaved(runs, setup.rounds)
        else:
            samples = gpu_interleaved(runs, runner, setup.rounds)
    return {c.name: figures(s, representative=not setup.interpret) for c, s in zip(candidates, samples)}


def gpu_interleaved(runs: Sequence[Callable[[], object]], runner, rounds: int) -> list[list[float]]:
    """The search's re-timing of its finalists, with baselines among the callables: CUDA events,
    L2 flushed before each call, a round-robin order, each callable given the kernel-time budget
    it had in the search (Runner.time_interleaved)."""
    from omnitune.profile.timing import L2Flusher, time_interleaved

    settings = runner.settings
    return time_interleaved(runs, rounds=rounds, warmup=settings.warmup, max_seconds=settings.max_seconds * len(runs),
                            flusher=L2Flusher())


def wall_clock_interleaved(runs: Sequence[Callable[[], object]], rounds: int) -> list[list[float]]:
    """Under Triton's interpreter: the same round-robin order, host wall clock (meaningless as a
    speed, kept so that every step of the harness runs on a CPU)."""
    from omnitune.profile.timing import interleaved_order

    for run in runs:
        run()  # a warm-up call each, as on the GPU: the first call also compiles
    samples: list[list[float]] = [[] for _ in runs]
    for index in interleaved_order(len(runs), rounds):
        start = time.perf_counter()
        runs[index]()
        samples[index].append((time.perf_counter() - start) * 1e3)
    return samples


def figures(samples: Sequence[float], *, representative: bool) -> dict:
    """Median over the rounds, mean, CV and spread, as a re-timed finalist reports them."""
    from omnitune.search.finalists import FinalistTiming

    timing = FinalistTiming.from_samples(Config(), samples)  # the config plays no part in the figures
    return {"median_ms": timing.median_ms, "mean_ms": timing.mean_ms, "cv": timing.cv, "noisy": timing.noisy,
            "p20_ms": timing.p20_ms, "p80_ms": timing.p80_ms, "rounds": timing.rounds,
            "representative": representative}


def times_and_ratios(candidates: Sequence[Candidate], timings: dict[str, dict]) -> dict:
    """Per role its time, the fastest baseline's, and each over the tuned config's time. The
    fastest baseline of all (best_pytorch) and, where some baseline is prepared ahead, the fastest
    of those a caller holding the op's inputs could run instead (best_pytorch_same_inputs)."""
    times: dict[str, float | None] = {role: None for role in ROLES}
    for c in candidates:
        for role in c.roles:
            times[role] = timings[c.name]["median_ms"] if c.name in timings else None
    baselines = {c.name: timings[c.name]["median_ms"] for c in candidates if not c.roles and c.name in timings}
    same_inputs = {c.name: baselines[c.name] for c in candidates if c.name in baselines and not c.prepared}
    best = min(baselines, key=baselines.get) if baselines else None
    best_same = min(same_inputs, key=same_inputs.get) if same_inputs else None
    times["best_pytorch"] = baselines[best] if best is not None else None
    times["best_pytorch_same_inputs"] = same_inputs[best_same] if best_same is not None else None
    tuned = times["tuned"]
    ratios = {f"{role}_over_tuned": ratio(times[role], tuned) for role in ("pick", "default", "best_pytorch")}

    def slower(than: str | None) -> bool | None:
        return None if times["pick"] is None or than is None else times["pick"] > baselines[than]

    return {"times_ms": times, "best_pytorch": best, "best_pytorch_same_inputs": best_same, "ratios": ratios,
            "pick_slower_than_pytorch": slower(best), "pick_slower_than_pytorch_same_inputs": slower(best_same),
            "prepared_baselines": sorted(c.name for c in candidates if c.prepared)}


def name_of(candidates: Sequence[Candidate], role: str) -> str:
    return next(c.name for c in candidates if role in c.roles)


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def finite(value: float) -> float | None:
    """JSON has no NaN: a relative error that could not be computed is null."""
    return float(value) if value is not None and math.isfinite(value) else None


@contextmanager
def quiet() -> Iterator[None]:
    """SDPA explains at length why each backend it was not asked for went unused: not news here."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        yield

"""Offline replay of search strategies over a stored exhaustive sweep: how many trials each needs
to come within 2% of the best config, without a GPU.

Each strategy is run by the real search driver (omnitune.search.driver.run_search) — its chain of
strategies, claims, penalties and fallback, over an in-memory Optuna storage — with a runner that
looks the recorded result up instead of measuring (omnitune.measure.replay.ReplayRunner), until it
measures a config within 2% of the sweep's best. The sampler proposes only valid, unmeasured
configs (omnitune.search.strategies.valid_only), as on a GPU; replay_h200.json was made before it,
when constraint-rejected proposals were pruned without counting as a trial. Strategies (chains of
omnitune.search.strategies): TPE cold, TPE warm-started (the spec's default and known-good
configs first, as `omnitune search` does), TPE warm-started with the other sweeps' winners too,
random, CMA-ES (the space is integer indices, so it applies), each with the random fallback, and
grid (valid configs in the spec's order); for attention, also the autotune list of Triton's
fused-attention tutorial (BLOCK_M 64/128 × BLOCK_N 32/64/128 × 3/4 stages × 4/8 warps, no GQA
packing, no TMA; the tutorial's 7-stage configs are beyond this kernel's stage choices): 24
configs that Triton's @autotune would all time, so its count is fixed and it may never reach 2%.

    python benchmarks/replay.py [--trials-json PATH | --db PATH] [--kernel K --problem KEY]
                                [--seeds 50] [--out benchmarks/results/replay_decode_like.json]
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import math
import multiprocessing
import os
import statistics
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import optuna
import torch

from omnitune import store
from omnitune.errors import OmnituneError
from omnitune.measure.replay import ReplayRunner, narrowed_to_recording, recorded_results, replay_device
from omnitune.registry import get_spec
from omnitune.search.driver import SearchOptions, run_search
from omnitune.spec import Config, KernelSpec, MatchPolicy, dtype_name, parse_dtype
from omnitune.trial import TrialResult, TrialStatus

TOLERANCE = 0.02
DEFAULT_TRIALS_JSON = Path(__file__).parent / "results" / "search_trials_h200.json"
DECODE_LIKE_PROBLEM = "b=64,h=28,hkv=4,lq=1,lk=4096,d=128,causal=0,spans=0,span_len=0"
TRITON_TUTORIAL_ATTENTION = tuple(
    Config(BLOCK_M=bm, BLOCK_N=bn, num_stages=s, num_warps=w, PACK_GQA=False, USE_TMA=False)
    for bm in (64, 128) for bn in (32, 64, 128) for s in (3, 4) for w in (4, 8)
)
# The seeded strategies of the study: label, chain (omnitune.search.strategies), Optuna sampler,
# and whether the other sweeps' winners warm-start it.
SEEDED = (
    ("tpe (cold)", ("fallback", "tpe"), "tpe", False),
    ("tpe (warm: default + known-good)", ("planned", "fallback", "tpe"), "tpe", False),
    ("tpe (warm: + other problems' winners)", ("planned", "fallback", "tpe"), "tpe", True),
    ("random", ("fallback", "random"), "random", False),
    ("cmaes", ("fallback", "cmaes"), "cmaes", False),
)
GRID = ("grid (spec order)", ("grid",), "grid")


@dataclass(frozen=True)
class Sweep:
    """One problem's exhaustive sweep: what measuring every valid config gave."""

    spec: KernelSpec
    problem: object
    dtype: torch.dtype
    results: Mapping[Config, TrialResult]
    device_name: str = "the GPU"

    @functools.cached_property
    def times_ms(self) -> dict[Config, float | None]:
        """Every recorded config's time (None: it failed)."""
        return {c: r.time_ms if r.status is TrialStatus.OK else None for c, r in self.results.items()}

    @functools.cached_property
    def best_ms(self) -> float:
        return min(t for t in self.times_ms.values() if t is not None)

    def good_enough(self, config: Config) -> bool:
        t = self.times_ms.get(config)
        return t is not None and t <= self.best_ms * (1 + TOLERANCE)


@dataclass(frozen=True)
class StrategyResult:
    strategy: str
    runs: int
    median_trials: float
    p90_trials: float
    never_reached: int  # runs that measured everything they would without coming within 2%
    best_ratio: float   # the strategy's best found / the exhaustive best (1.0 when it reaches 2%)


def sweep_from_rows(rows: Sequence[Mapping], kernel: str, problem_key: str, dtype: str) -> Sweep:
    """A sweep from catalogue rows (the trials JSON's or a results db's `trials` table)."""
    spec = narrowed_to_recording(get_spec(kernel), rows, problem_key, dtype)
    problem = spec.parse_shape(problem_key)
    recorded = recorded_results(rows, spec, problem_key, dtype)
    valid = spec.valid_configs(problem, parse_dtype(dtype))
    missing = [c for c in valid if c not in recorded]
    if missing or not any(r.status is TrialStatus.OK for r in recorded.values()):
        raise SystemExit(f"{kernel} {problem_key}: not an exhaustive sweep ({len(missing)} of {len(valid)} "
                         "valid configs unmeasured)")
    names = {r.get("device_name") for r in rows if r["kernel"] == kernel and r["problem_key"] == problem_key}
    device = next(iter(names)) if len(names) == 1 and None not in names else "the GPU"
    # Only what the driver can propose here: a config recorded but rejected by a constraint now
    # could never be measured, so it cannot be the best to reach either.
    valid_here = set(valid)
    return Sweep(spec, problem, parse_dtype(dtype), {c: r for c, r in recorded.items() if c in valid_here}, device)


def load_rows(trials_json: Path | None, db: Path | None) -> list[dict]:
    if db is not None:
        return store.read_trials(db).to_dict("records")
    return json.loads(Path(trials_json or DEFAULT_TRIALS_JSON).read_text())["trials"]


def trials_to_good(sweep: Sweep, chain: Sequence[str], sampler: str, seed: int,
                   warm_start: Sequence[Config] = ()) -> int | None:
    """One search by the real driver over the sweep: the measured trials until a config within 2%
    of the best was measured; None if every valid config was measured without one (impossible
    for an exhaustive sweep, kept for safety)."""
    runner = ReplayRunner(sweep.results, name=f"the sweep of {sweep.spec.problem_key(sweep.problem)}")
    reached: list[int] = []

    def good_enough(progress) -> bool:
        if progress.result.status is TrialStatus.OK and sweep.good_enough(progress.result.config):
            reached.append(progress.measured_now)
        return bool(reached)

    options = SearchOptions(device=replay_device(sweep.device_name), trials=len(sweep.results), sampler=sampler,
                            seed=seed, finalists=0, strategies=tuple(chain), warm_start=tuple(warm_start))
    run_search(sweep.spec, sweep.problem, sweep.dtype, options, runner_factory=lambda: runner,
               storage=optuna.storages.InMemoryStorage(), stop_when=good_enough)
    return reached[0] if reached else None


def neighbour_winners(sweep: Sweep, others: Sequence[Sweep], most: int = 3) -> list[Config]:
    """The best configs of the other sweeps of the same kernel and dtype, nearest problem first,
    leave-one-out: what the driver's warm start would try had those problems been tuned before.
    Nearness is the spec's MatchPolicy distance without its ratio cap (the presets' problems are
    deliberately more than 4x apart); problems it cannot compare at all come last."""
    relaxed = MatchPolicy(exact=sweep.spec.match.exact, max_ratio=math.inf)
    ranked = []
    for other in others:
        if other is sweep or other.spec.name != sweep.spec.name or other.dtype != sweep.dtype:
            continue
        distance = relaxed.distance(sweep.problem, other.problem)
        times = other.times_ms
        winner = min((c for c, t in times.items() if t is not None), key=lambda c: times[c])
        ranked.append((math.inf if distance is None else distance, winner))
    chosen: list[Config] = []
    for _, winner in sorted(ranked, key=lambda pair: pair[0]):
        if winner in sweep.results and winner not in chosen and len(chosen) < most:
            chosen.append(winner)
    return chosen


def summarize(strategy: str, counts: Sequence[int | None], best_ratio: float = 1.0) -> StrategyResult:
    reached = sorted(c for c in counts if c is not None)
    never = len(counts) - len(reached)
    if not reached:
        return StrategyResult(strategy, len(counts), math.nan, math.nan, never, best_ratio)
    p90 = reached[min(len(reached) - 1, math.ceil(0.9 * len(reached)) - 1)]
    return StrategyResult(strategy, len(counts), statistics.median(reached), float(p90), never, best_ratio)


def replay(sweep: Sweep, seeds: int, others: Sequence[Sweep] = ()) -> list[StrategyResult]:
    """Every strategy over the sweep, the seeded ones `seeds` times. `others`: the other sweeps,
    whose winners warm-start one strategy (left out when they offer none)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logging.getLogger("omnitune").setLevel(logging.ERROR)
    neighbours = neighbour_winners(sweep, others)
    results = []
    for label, chain, sampler, from_others in SEEDED:
        if from_others and not neighbours:
            continue
        warm = neighbours if from_others else ()
        results.append(summarize(label, [trials_to_good(sweep, chain, sampler, seed, warm) for seed in range(seeds)]))
    label, chain, sampler = GRID
    results.append(summarize(label, [trials_to_good(sweep, chain, sampler, 0)]))
    if sweep.spec.name == "attention":
        times = sweep.times_ms
        # Through coerce_config: a parameter added since (BACKEND) takes the value it had then.
        tutorial = [c for c in map(sweep.spec.coerce_config, TRITON_TUTORIAL_ATTENTION) if c in times]
        found = [times[c] for c in tutorial if times[c] is not None]
        best = min(found) / sweep.best_ms if found else math.inf
        reaches = any(sweep.good_enough(c) for c in tutorial)
        # @autotune times its whole list, valid or not, before the first call returns.
        results.append(summarize(f"triton tutorial autotune list ({len(tutorial)}/24 valid here)",
                                 [len(TRITON_TUTORIAL_ATTENTION) if reaches else None], best))
    return results


def table_text(sweep: Sweep, results: Sequence[StrategyResult]) -> str:
    lines = [f"{sweep.spec.name} {sweep.spec.problem_key(sweep.problem)}: {len(sweep.times_ms)} valid configs, "
             f"best {sweep.best_ms:.4g} ms; trials to come within {TOLERANCE:.0%} of it",
             f"{'strategy':<48} {'runs':>5} {'median':>7} {'p90':>6} {'never':>6} {'best/opt':>9}"]
    for r in results:
        lines.append(f"{r.strategy:<48} {r.runs:>5} {r.median_trials:>7.1f} {r.p90_trials:>6.1f} "
                     f"{r.never_reached:>6} {r.best_ratio:>9.3f}")
    return "\n".join(lines)


def exhaustive_sweeps(rows: Sequence[Mapping]) -> list[Sweep]:
    """Every (kernel, problem, dtype) in the rows whose valid configs were all measured."""
    found = []
    for kernel, problem_key, dtype in sorted({(r["kernel"], r["problem_key"], r["dtype"]) for r in rows}):
        try:
            found.append(sweep_from_rows(rows, kernel, problem_key, dtype))
        except (SystemExit, OmnituneError):
            continue  # a search, not a sweep (or a problem this version's spec no longer parses)
    return found


def sweep_doc(sweep: Sweep, results: Sequence[StrategyResult], seeds: int) -> dict:
    return {"kernel": sweep.spec.name, "problem_key": sweep.spec.problem_key(sweep.problem),
            "dtype": dtype_name(sweep.dtype), "valid_configs": len(sweep.times_ms), "best_ms": sweep.best_ms,
            "tolerance": TOLERANCE, "seeds": seeds, "strategies": [_finite(asdict(r)) for r in results]}


def plot(docs: Sequence[dict], path: Path) -> None:
    """Median trials to within 2% per strategy and sweep (p90 as the whisker), as a share of the
    sweep's valid configs, log scale; a strategy that never came within 2% is marked ×."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def family(name: str) -> str:
        return name.split(" (")[0] if name.startswith("triton") else name

    strategies = list(dict.fromkeys(family(r["strategy"]) for d in docs for r in d["strategies"]))
    colors = {name: f"C{i}" for i, name in enumerate(strategies)}
    fig, ax = plt.subplots(figsize=(max(9, 1.9 * len(docs)), 5.2))
    width = 0.8 / len(strategies)
    for i, name in enumerate(strategies):
        xs, med, hi, never = [], [], [], []
        for j, doc in enumerate(docs):
            for r in doc["strategies"]:
                if family(r["strategy"]) != name:
                    continue
                x = j + (i - (len(strategies) - 1) / 2) * width
                if r["median_trials"] is None:
                    never.append(x)
                    continue
                share = 100.0 / doc["valid_configs"]
                xs.append(x)
                med.append(r["median_trials"] * share)
                hi.append((r["p90_trials"] - r["median_trials"]) * share)
        if xs:
            ax.bar(xs, med, width, yerr=[[0.0] * len(hi), hi], capsize=2, color=colors[name], label=name)
        if never:
            ax.scatter(never, [100.0] * len(never), marker="x", color=colors[name],
                       label=f"{name}: never within 2%" if not xs else None)
    ax.axhline(10, color="gray", linestyle="--", linewidth=1)
    ax.text(-0.45, 10.8, "10% of the space", ha="left", va="bottom", fontsize=8, color="gray")
    ax.set_yscale("log")
    ax.set_ylabel("trials to within 2% of the best (% of valid configs)\nbar: median, whisker: p90")
    ax.set_xticks(range(len(docs)))
    ax.set_xticklabels([f"{d['kernel']}\n{_short(d['problem_key'])}\n{d['valid_configs']} configs" for d in docs],
                       fontsize=7)
    ax.set_title("Search efficiency replayed over exhaustive H200 sweeps")
    ax.legend(fontsize=7, ncol=2, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def _short(problem_key: str) -> str:
    """The fields of a problem key that differ from their usual values, for an axis label."""
    skip = {"d=128", "causal=0", "spans=0", "span_len=0", "h=28", "hkv=4", "block_size=16"}
    kept = [p for p in problem_key.split(",") if p not in skip]
    return "\n".join(",".join(kept[i:i + 3]) for i in range(0, len(kept), 3))


_SWEEPS: list[Sweep] = []


def _replay_one(index: int, seeds: int) -> list[StrategyResult]:
    return replay(_SWEEPS[index], seeds, _SWEEPS)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials-json", type=Path, action="append", default=None)
    parser.add_argument("--db", type=Path, action="append", default=None, help="results databases to read too")
    parser.add_argument("--all", action="store_true", help="replay every exhaustive sweep found")
    parser.add_argument("--kernel", default="attention")
    parser.add_argument("--problem", default=DECODE_LIKE_PROBLEM)
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--seeds", type=int, default=50)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--plot", type=Path, default=None, help="PNG of the --all results")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="sweeps replayed at once (--all)")
    args = parser.parse_args(argv)
    rows: list[dict] = []
    for path in args.trials_json or ([] if args.db else [None]):
        rows += load_rows(path, None)
    for path in args.db or []:
        rows += load_rows(None, path)
    if args.all:
        sweeps = exhaustive_sweeps(rows)
        _SWEEPS[:] = sweeps
        # One process per sweep (forked: they share the loaded sweeps); the seeds stay sequential.
        with multiprocessing.get_context("fork").Pool(max(1, min(args.jobs, len(sweeps)))) as pool:
            per_sweep = pool.map(functools.partial(_replay_one, seeds=args.seeds), range(len(sweeps)))
        docs = []
        for sweep, results in zip(sweeps, per_sweep):
            print(table_text(sweep, results) + "\n", flush=True)
            docs.append(sweep_doc(sweep, results, args.seeds))
        if args.out is not None:
            args.out.write_text(json.dumps({"sweeps": docs}, indent=1) + "\n")
        if args.plot is not None and docs:
            plot(docs, args.plot)
        return
    sweep = sweep_from_rows(rows, args.kernel, args.problem, args.dtype)
    results = replay(sweep, args.seeds)
    print(table_text(sweep, results))
    if args.out is not None:
        args.out.write_text(json.dumps(sweep_doc(sweep, results, args.seeds), indent=1) + "\n")


def _finite(row: dict) -> dict:
    """NaN and inf (a strategy that never reached 2%, or had no valid config) as JSON null."""
    return {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in row.items()}


if __name__ == "__main__":
    sys.exit(main())

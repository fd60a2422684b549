"""Offline replay of search strategies over a stored exhaustive sweep: how many trials each needs
to come within 2% of the best config, without a GPU.

Given one problem's table of config → measured time (every valid config measured), each strategy
is run as the driver runs it — Optuna's ask/tell with the same integer encoding of the space,
configs a constraint rejects told a penalty without counting as a trial, a config measured before
told its stored value again, failed configs told PENALTY_FACTOR × the slowest ok time so far, and
a random unmeasured config after SAMPLER_PATIENCE fruitless proposals — except that "measuring"
looks the time up. Strategies: TPE cold, TPE warm-started (the spec's default and known-good
configs first, as the driver does), random, grid (valid configs in the spec's order), CMA-ES
(the space is integer indices, so it applies), and, for attention, the autotune list of Triton's
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
import math
import multiprocessing
import os
import random
import sqlite3
import statistics
import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import optuna
import torch

from omnitune.errors import OmnituneError
from omnitune.registry import get_spec
from omnitune.search.driver import PENALTY_BEFORE_ANY_OK_MS, PENALTY_FACTOR, SAMPLER_PATIENCE, make_sampler
from omnitune.search.space import ConfigSpace
from omnitune.spec import Config, KernelSpec, MatchPolicy, dtype_name, parse_dtype

TOLERANCE = 0.02
DEFAULT_TRIALS_JSON = Path(__file__).parent / "results" / "search_trials_h200.json"
DECODE_LIKE_PROBLEM = "b=64,h=28,hkv=4,lq=1,lk=4096,d=128,causal=0,spans=0,span_len=0"
TRITON_TUTORIAL_ATTENTION = tuple(
    Config(BLOCK_M=bm, BLOCK_N=bn, num_stages=s, num_warps=w, PACK_GQA=False, USE_TMA=False)
    for bm in (64, 128) for bn in (32, 64, 128) for s in (3, 4) for w in (4, 8)
)


@dataclass(frozen=True)
class Sweep:
    """One problem's exhaustive sweep: every measured config's time (None: it failed)."""

    spec: KernelSpec
    problem: object
    dtype: torch.dtype
    times_ms: Mapping[Config, float | None]

    @property
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
    spec = get_spec(kernel)
    problem = spec.parse_shape(problem_key)
    times: dict[Config, float | None] = {}
    for row in rows:
        if row["kernel"] != kernel or row["problem_key"] != problem_key or row["dtype"] != dtype:
            continue
        if row["status"] == "pruned":
            continue  # the constraints reject it: the replay prunes it the same way
        config = spec.coerce_config(json.loads(row["config_json"]))
        time_ms = row["time_ms"] if row["status"] == "ok" else None
        if config not in times or times[config] is None:
            times[config] = time_ms  # the first measurement, as the search saw it (not a re-timing)
    valid = spec.valid_configs(problem, parse_dtype(dtype))
    missing = [c for c in valid if c not in times]
    if missing or not any(t is not None for t in times.values()):
        raise SystemExit(f"{kernel} {problem_key}: not an exhaustive sweep ({len(missing)} of {len(valid)} "
                         "valid configs unmeasured)")
    return Sweep(spec, problem, parse_dtype(dtype), times)


def load_rows(trials_json: Path | None, db: Path | None) -> list[dict]:
    if db is not None:
        with sqlite3.connect(db) as con:
            con.row_factory = sqlite3.Row
            return [dict(r) for r in con.execute(
                "SELECT kernel, problem_key, dtype, config_json, status, time_ms FROM trials")]
    return json.loads(Path(trials_json or DEFAULT_TRIALS_JSON).read_text())["trials"]


def trials_to_good(sweep: Sweep, propose: Callable[[], Config], tell: Callable[[Config, float], None],
                   rng: random.Random, first: Sequence[Config] = ()) -> int | None:
    """Measured trials until a config within 2% of the best is measured; None if every valid
    config was measured without one (impossible for an exhaustive sweep, kept for safety)."""
    measured: dict[Config, float] = {}
    ok_times: list[float] = []
    fruitless = 0
    queue = list(first)
    valid = [c for c in sweep.times_ms]
    while len(measured) < len(valid):
        if queue:
            config = queue.pop(0)
        elif fruitless >= SAMPLER_PATIENCE:
            config = rng.choice([c for c in valid if c not in measured])
            fruitless = SAMPLER_PATIENCE - 2
        else:
            config = propose()
        if config in measured:
            tell(config, measured[config])
            fruitless += 1
            continue
        penalty = PENALTY_FACTOR * max(ok_times) if ok_times else PENALTY_BEFORE_ANY_OK_MS
        if config not in sweep.times_ms:  # a constraint rejects it: no GPU time, no trial
            tell(config, penalty)
            fruitless += 1
            continue
        time_ms = sweep.times_ms[config]
        value = time_ms if time_ms is not None else penalty
        if time_ms is not None:
            ok_times.append(time_ms)
        measured[config] = value
        tell(config, value)
        fruitless = 0
        if sweep.good_enough(config):
            return len(measured)
    return None


def run_optuna(sweep: Sweep, sampler_name: str, seed: int, first: Sequence[Config] = ()) -> int | None:
    """One seeded run of an Optuna sampler over the sweep, measuring `first` before asking it."""
    space = ConfigSpace(sweep.spec)
    study = optuna.create_study(sampler=make_sampler(sampler_name, seed))
    pending: dict[Config, list] = {}

    def propose() -> Config:
        trial = study.ask(space.distributions)
        config = space.decode(trial.params)
        pending.setdefault(config, []).append(trial)
        return config

    def tell(config: Config, value: float) -> None:
        if pending.get(config):
            study.tell(pending[config].pop(), value)
        else:  # a config the replay chose itself: the sampler learns it as an enqueued trial
            study.enqueue_trial(space.encode(config))
            study.tell(study.ask(space.distributions), value)

    return trials_to_good(sweep, propose, tell, random.Random(seed), first)


def warm_configs(sweep: Sweep) -> list[Config]:
    """The driver's first configs: the default, then the known-good ones valid here."""
    default = sweep.spec.default_config(sweep.problem, sweep.dtype)
    known = sweep.spec.known_good_configs(sweep.problem, sweep.dtype)
    return [default] + [c for c in known if c != default]


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
        winner = min((c for c, t in other.times_ms.items() if t is not None), key=lambda c: other.times_ms[c])
        ranked.append((math.inf if distance is None else distance, winner))
    chosen: list[Config] = []
    for _, winner in sorted(ranked, key=lambda pair: pair[0]):
        if winner in sweep.times_ms and winner not in chosen and len(chosen) < most:
            chosen.append(winner)
    return chosen


def grid_order(sweep: Sweep) -> int | None:
    """The valid configs in the spec's enumeration order."""
    for position, config in enumerate((c for c in sweep.spec.all_configs() if c in sweep.times_ms), 1):
        if sweep.good_enough(config):
            return position
    return None


def summarize(strategy: str, counts: Sequence[int | None], best_ratio: float = 1.0) -> StrategyResult:
    reached = sorted(c for c in counts if c is not None)
    never = len(counts) - len(reached)
    if not reached:
        return StrategyResult(strategy, len(counts), math.nan, math.nan, never, best_ratio)
    p90 = reached[min(len(reached) - 1, math.ceil(0.9 * len(reached)) - 1)]
    return StrategyResult(strategy, len(counts), statistics.median(reached), float(p90), never, best_ratio)


def replay(sweep: Sweep, seeds: int, others: Sequence[Sweep] = ()) -> list[StrategyResult]:
    """Every strategy over the sweep, the seeded ones `seeds` times. `others`: the other sweeps,
    whose winners warm-start one strategy."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
    driver_first = warm_configs(sweep)
    strategies = [("tpe (cold)", "tpe", []), ("tpe (warm: default + known-good)", "tpe", driver_first)]
    neighbours = neighbour_winners(sweep, others)
    if neighbours:
        first = driver_first + [c for c in neighbours if c not in driver_first]
        strategies.append(("tpe (warm: + other problems' winners)", "tpe", first))
    strategies += [("random", "random", []), ("cmaes", "cmaes", [])]
    results = []
    for label, sampler, first in strategies:
        results.append(summarize(label, [run_optuna(sweep, sampler, seed, first) for seed in range(seeds)]))
    results.append(summarize("grid (spec order)", [grid_order(sweep)]))
    if sweep.spec.name == "attention":
        tutorial = [c for c in TRITON_TUTORIAL_ATTENTION if c in sweep.times_ms]
        times = [sweep.times_ms[c] for c in tutorial if sweep.times_ms[c] is not None]
        best = min(times) / sweep.best_ms if times else math.inf
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

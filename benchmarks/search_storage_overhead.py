"""What a trial costs the search's host in each kind of Optuna storage, the GPU taken out: the real
driver (run_search: strategies, TPE with the constant liar, claims, the compile-ahead queue of
nine trials a lane keeps) on a real problem of each kernel, its runner answering at once with a
made-up time, its pool compiling nothing. Everything it times is host work a lane does between
two measurements; per storage (a SQLite file, as `omnitune search` kept its studies before, and
the journal file it keeps now), the loop's choosing and storing seconds and the wall, per trial.
CPU only; this machine's figures.

    PYTHONPATH=$PWD python benchmarks/search_storage_overhead.py --out benchmarks/results/search_storage_overhead.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

import optuna
import torch

# One problem of each kernel, from the Qwen2.5-Omni-7B preset (the search `omnitune search --model` makes).
PROBLEMS = {
    "attention": "b=1,h=28,hkv=4,lq=8510,lk=8510,d=128,causal=1,spans=1,span_len=256",
    "paged_decode_attention": "b=4,h=28,hkv=4,lq=1,ctx=16384,d=128,block_size=16",
    "kv_cache_write": "t=1024,hkv=4,d=128,block_size=16",
    "cross_attention_layer": "b=2,lq=1,lk=2048,hidden=3584,h=28,hkv=4,d=128,bias=0,kv_cached=1",
}
STORAGES = ("sqlite", "journal")
TRIALS = 50
AHEAD = 9  # the compile-ahead queue of a lane: 2 × 14 workers / 3 lanes (omnitune.cli.search_lanes)


class InstantRunner:
    """Answers every config at once: what is left of a trial is the search's own host work."""

    context_lost = False

    def __init__(self, seed: int):
        self.random = random.Random(seed)

    def measure(self, config):
        from omnitune.trial import TrialResult, TrialStatus

        ms = 0.1 + self.random.random()
        return TrialResult(config, TrialStatus.OK, time_ms=ms, p20_ms=ms, p80_ms=ms, rel_error=1e-3, tflops=1.0,
                           tbps=1.0, extra={"repetitions": 50})

    def time_interleaved(self, configs, rounds):
        return [[0.5 + self.random.random() * 0.01 for _ in range(rounds)] for _ in configs]


class CompiledPool:
    """A compile-ahead pool whose configs are always compiled already."""

    workers = AHEAD

    def submit(self, configs):
        pass

    def ready(self, config):
        pass

    def compiled(self, config):
        return True


def storage_url(kind: str, folder: Path) -> str:
    return {"sqlite": f"sqlite:///{folder / 'studies.optuna.db'}",
            "journal": f"journal:///{folder / 'studies.optuna.log'}"}[kind]


def one_search(kernel: str, kind: str, seed: int) -> dict:
    from omnitune.measure.replay import replay_device
    from omnitune.registry import get_spec
    from omnitune.search.driver import SearchOptions, run_search
    from omnitune.store import open_db

    spec = get_spec(kernel)
    problem = spec.parse_shape(PROBLEMS[kernel])
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        options = SearchOptions(device=replay_device("NVIDIA H200"), trials=TRIALS, seed=seed, finalists=3,
                                storage_url=storage_url(kind, folder), warm_start=())
        started = time.perf_counter()
        outcome = run_search(spec, problem, torch.bfloat16, options, runner_factory=lambda: InstantRunner(seed),
                             db=open_db(folder / "results.db"), compile_ahead=CompiledPool())
        wall = time.perf_counter() - started
    measured = outcome.measured_now
    phases = dict(outcome.phase_s)
    return {"kernel": kernel, "storage": kind, "seed": seed, "measured": measured, "wall_s": round(wall, 3),
            "choosing_s": round(phases.get("choosing", 0.0), 3), "storing_s": round(phases.get("storing", 0.0), 3),
            "host_ms_per_trial": round(1000 * (phases.get("choosing", 0.0) + phases.get("storing", 0.0))
                                       / max(measured, 1), 1)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seeds", type=int, default=2)
    args = parser.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    rows = []
    for kernel in PROBLEMS:
        for seed in range(args.seeds):
            for kind in STORAGES:
                row = one_search(kernel, kind, seed)
                rows.append(row)
                print(f"{kernel:24s} {kind:8s} seed {seed}: {row['measured']} measured, wall {row['wall_s']:.2f} s, "
                      f"choosing {row['choosing_s']:.2f} s, storing {row['storing_s']:.2f} s, "
                      f"{row['host_ms_per_trial']:.1f} ms a trial", flush=True)
    totals = {}
    for kind in STORAGES:
        mine = [r for r in rows if r["storage"] == kind]
        host = sum(r["choosing_s"] + r["storing_s"] for r in mine)
        measured = sum(r["measured"] for r in mine)
        totals[kind] = {"host_s": round(host, 2), "ms_per_trial": round(1000 * host / measured, 1)}
    print("per trial, all kernels:", ", ".join(f"{k} {v['ms_per_trial']} ms" for k, v in totals.items()))
    report = {"command": " ".join(sys.argv), "machine": platform.processor() or platform.machine(),
              "cpus": os.cpu_count(), "optuna": optuna.__version__, "trials": TRIALS, "ahead": AHEAD,
              "problems": PROBLEMS, "rows": rows, "totals": totals}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

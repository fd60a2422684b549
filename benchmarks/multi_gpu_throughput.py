"""Search throughput on the GPU: in-process measuring, one isolated worker, and one isolated worker
per GPU (--gpus 0,1) on one shared study; the isolation overhead; and the fault-injection sweep
with a real illegal memory access.

Each mode runs in a fresh process with a Triton cache of its own, so that no mode gets the kernels
another one compiled, and with a fresh study (same sampler and seed: the same configs). On a
machine with one GPU the two-GPU mode is skipped, and the summary says so.

    python benchmarks/multi_gpu_throughput.py --out results/multi_gpu.json [--trials 24]

Writes one JSON object (every mode's wall time, trials/s, per-trial time, statuses; the ratios)
and prints a short summary. About 2-4 minutes on H200s.

--interpret runs the same modes on the CPU through Triton's interpreter (two CPU workers stand in
for the GPUs; pass a tiny --shape and --dtype fp32): a check of this script, not a measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FAULT_KERNEL = str(REPO / "tests" / "fault_kernel.py")
DEFAULT_SHAPE = "b=1,h=8,hkv=2,lq=1024,lk=1024,d=128,causal=1"
MODES = ("in_process", "isolated", "two_gpus", "faults")
# Seconds a fault-sweep trial may take: a first compile fits; the hanging config costs this much.
FAULT_TRIAL_TIMEOUT_S = 15.0


def run_mode(mode: str, args: argparse.Namespace) -> dict:
    """One mode, in this process: search, and return its figures."""
    import torch

    from omnitune.profile.device import current_device_facts
    from omnitune.registry import get_spec
    from omnitune.search.driver import run_search
    from omnitune.measure.runner import Runner
    from omnitune.measure.worker import IsolatedRunner
    from omnitune.spec import DeviceLimits, parse_dtype

    kernel = FAULT_KERNEL if mode == "faults" else args.kernel
    spec = get_spec(kernel)
    problem = spec.parse_shape("n=4096" if mode == "faults" else args.shape)
    dtype = torch.float32 if mode == "faults" else parse_dtype(args.dtype)
    interpret = args.interpret
    limits = DeviceLimits() if interpret else DeviceLimits.of_current_device()
    runners: list = []

    def isolated(gpu: int, timeout_s: float = 120.0):
        def make():
            runner = IsolatedRunner(kernel, problem, dtype, limits=limits, timeout_s=timeout_s, gpu=gpu,
                                    interpret=interpret)
            runners.append(runner)
            return runner
        return make

    def in_process():
        runner = Runner(spec, problem, dtype, limits=limits, interpret=interpret)
        runners.append(runner)
        return runner

    factories = {
        "in_process": [in_process],
        "isolated": [isolated(0)],
        "two_gpus": [isolated(0), isolated(1)],
        "faults": [isolated(0, FAULT_TRIAL_TIMEOUT_S)],
    }[mode]
    stamps: list[float] = []
    workdir = Path(tempfile.mkdtemp(prefix=f"omnitune-bench-{mode}-"))
    started = time.perf_counter()
    try:
        outcome = run_search(
            spec, problem, dtype, runner_factories=factories, device=current_device_facts(interpret),
            trials=100 if mode == "faults" else args.trials, storage_url=f"sqlite:///{workdir / 'study.db'}",
            sampler="grid" if mode == "faults" else "random", seed=args.seed, limits=limits, finalists=0,
            progress=lambda p: stamps.append(time.perf_counter() - started),
        )
    finally:
        for runner in runners:
            getattr(runner, "close", lambda: None)()
    wall_s = time.perf_counter() - started
    import optuna

    study = optuna.load_study(study_name=outcome.study_name, storage=f"sqlite:///{workdir / 'study.db'}")
    from omnitune.store import result_from_attrs

    results = [result_from_attrs(t.user_attrs) for t in study.trials]
    results = [r for r in results if r is not None]
    measured = [r for r in results if r.status.value != "pruned"]
    steady = (stamps[-1] - stamps[0]) / (len(stamps) - 1) if len(stamps) > 1 else None
    figures = {
        "mode": mode, "kernel": spec.name, "problem": spec.problem_key(problem), "dtype": str(dtype),
        "workers": len(factories), "wall_s": wall_s, "measured": len(measured), "pruned": len(results) - len(measured),
        "trials_per_s": len(measured) / wall_s if wall_s > 0 else None,
        "first_trial_s": stamps[0] if stamps else None,  # worker start, inputs, first compile
        "steady_s_per_trial": steady,  # between the first and the last stored trial
        "statuses": dict(Counter(r.status.value for r in measured)),
        "workers_started": sum(getattr(r, "workers_started", 0) for r in runners),
        "stop_reason": outcome.stop_reason.value,
        "best_ms": outcome.best.time_ms if outcome.best else None,
    }
    if mode == "faults":
        figures["by_config"] = {r.config.label(): {"status": r.status.value, "detail": r.detail} for r in results}
    return figures


def spawn_mode(mode: str, args: argparse.Namespace, cache_root: Path) -> dict:
    """Run one mode in a fresh process with its own Triton cache; its figures, or why not."""
    out = cache_root / f"{mode}.json"
    env = dict(os.environ, TRITON_CACHE_DIR=str(cache_root / f"triton-{mode}"),
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    if args.interpret:
        env["TRITON_INTERPRET"] = "1"
    command = [sys.executable, __file__, "--mode", mode, "--out", str(out), "--kernel", args.kernel,
               "--shape", args.shape, "--dtype", args.dtype, "--trials", str(args.trials), "--seed", str(args.seed)] + (["--interpret"] if args.interpret else [])
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=args.mode_timeout)
    if done.returncode != 0 or not out.exists():
        return {"mode": mode, "error": (done.stderr or done.stdout).strip()[-2000:]}
    return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--kernel", default="attention")
    parser.add_argument("--shape", default=DEFAULT_SHAPE)
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--trials", type=int, default=24)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--interpret", action="store_true", help="CPU check of this script (not a measurement)")
    parser.add_argument("--mode", choices=MODES, help="(internal) run one mode in this process")
    parser.add_argument("--mode-timeout", type=float, default=150.0, help="seconds one mode may take")
    args = parser.parse_args()
    if args.mode is not None:
        Path(args.out).write_text(json.dumps(run_mode(args.mode, args), indent=2, default=str))
        return

    import torch

    if args.interpret:
        gpus, device = 2, "CPU (Triton interpreter): not a measurement"
    elif not torch.cuda.is_available():
        sys.exit("needs a CUDA GPU (or --interpret for a CPU check of this script)")
    else:
        gpus, device = torch.cuda.device_count(), torch.cuda.get_device_name(0)
    report: dict = {"device": device, "gpus": gpus, "trials": args.trials,
                    "kernel": args.kernel, "shape": args.shape, "dtype": args.dtype, "modes": {}}
    with tempfile.TemporaryDirectory(prefix="omnitune-bench-") as root:
        for mode in MODES:
            if mode == "two_gpus" and gpus < 2:
                report["modes"][mode] = {"mode": mode, "skipped": f"needs 2 GPUs, this machine has {gpus}"}
                continue
            report["modes"][mode] = spawn_mode(mode, args, Path(root))
            print(f"{mode}: {summary_line(report['modes'][mode])}", flush=True)
    modes = report["modes"]

    def ratio(a: str, b: str, key: str):
        x, y = modes[a].get(key), modes[b].get(key)
        return x / y if x and y else None

    report["isolation_overhead_per_trial"] = ratio("isolated", "in_process", "steady_s_per_trial")
    report["isolation_overhead_wall"] = ratio("isolated", "in_process", "wall_s")
    report["two_gpu_speedup_trials_per_s"] = ratio("two_gpus", "isolated", "trials_per_s")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2, default=str))
    print(f"isolation overhead per trial (isolated ÷ in-process, steady state): {fmt(report['isolation_overhead_per_trial'])}")
    print(f"isolation overhead, whole sweep: {fmt(report['isolation_overhead_wall'])}")
    if "skipped" in modes["two_gpus"]:
        print(f"two GPUs: skipped ({modes['two_gpus']['skipped']})")
    else:
        print(f"two GPUs vs one isolated worker, trials/s: {fmt(report['two_gpu_speedup_trials_per_s'])}")
    faults = modes["faults"].get("by_config", {})
    print("fault sweep: " + ", ".join(f"{label.split('FAULT=')[-1]}@{label.split()[0]}={v['status']}"
                                      for label, v in faults.items()))
    print(f"wrote {args.out}")


def summary_line(figures: dict) -> str:
    if "skipped" in figures:
        return f"skipped: {figures['skipped']}"
    if "error" in figures:
        return "failed: " + figures["error"].splitlines()[-1] if figures["error"] else "failed"
    return (f"{figures['measured']} measured in {figures['wall_s']:.1f} s ({fmt(figures['trials_per_s'])} trials/s; "
            f"first {fmt(figures['first_trial_s'])} s, then {fmt(figures['steady_s_per_trial'])} s/trial), "
            f"statuses {figures['statuses']}")


def fmt(value) -> str:
    return "n/a" if value is None else f"{value:.2f}"


if __name__ == "__main__":
    main()

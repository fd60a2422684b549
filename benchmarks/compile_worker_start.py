"""How compile workers start, and what it costs: for each way (fresh interpreters, "spawn"; or
forked from a fork server that imported a list of modules first), a pool of WORKERS processes is
made and each compiles and loads one KV-write config (omnitune.measure.precompile._launch_for, what
a search's worker does first), from an empty Triton cache. Reported per way: how many workers
succeeded, the first error, the seconds until the first and the last finished, and the workers'
CPU time. Each way runs in a process of its own, so that each starts its own fork server.
A way whose workers cannot use CUDA (a module it preloads initialized CUDA in the fork server)
shows as failures here.

    python benchmarks/compile_worker_start.py --out benchmarks/results/compile_worker_start_h200.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORKERS = 9  # a lane's share on the H200's host (omnitune.cli.search_lanes.lane_workers)
KERNEL, SHAPE = "kv_cache_write", "t=1024,hkv=4,d=128,block_size=16"
WAYS = {
    "spawn": None,
    "forkserver: torch": ["torch"],
    "forkserver: torch, triton": ["torch", "triton"],
    "forkserver: torch, triton, omnitune's worker modules": [
        "torch", "triton", "omnitune.measure.precompile", "omnitune.registry"],
    "forkserver: WORKER_PRELOAD (with the kernels)": "default",
}


def one_way(preload) -> dict:
    """In this process: make the pool the way `preload` says and time WORKERS first configs."""
    import multiprocessing

    import torch

    from omnitune.measure import precompile, worker_server
    from omnitune.registry import get_spec

    if preload is None:
        precompile.worker_start_method = lambda: multiprocessing.get_context("spawn")
    elif preload != "default":
        worker_server.WORKER_PRELOAD = tuple(preload)
    spec = get_spec(KERNEL)
    problem = spec.parse_shape(SHAPE)
    configs = spec.valid_configs(problem, torch.bfloat16)[:WORKERS]
    identity = precompile.problem_identity(spec, problem, torch.bfloat16, "cuda")
    started = time.perf_counter()
    pool = precompile.compile_processes(WORKERS)
    futures = [pool.submit(precompile._launch_for, identity, c.as_dict()) for c in configs]
    done, errors, cpu_s = [], [], 0.0
    for future in futures:
        try:
            launched = future.result(timeout=300)
            cpu_s += launched.cpu_s
            if launched.error:
                errors.append(launched.error)
        except Exception as exc:  # noqa: BLE001 — a worker that died
            errors.append(f"{type(exc).__name__}: {exc}"[:300])
        done.append(time.perf_counter() - started)
    pool.shutdown()
    return {"workers": WORKERS, "ok": len(configs) - len(errors), "first_error": errors[0] if errors else None,
            "first_done_s": round(min(done), 2), "all_done_s": round(max(done), 2),
            "workers_cpu_s": round(cpu_s, 2)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--way", help=argparse.SUPPRESS)  # internal: run one way in this process
    args = parser.parse_args(argv)
    if args.way is not None:
        print(json.dumps(one_way(WAYS[args.way])))
        return 0
    rows = []
    for way in WAYS:
        env = dict(os.environ, TRITON_CACHE_DIR=tempfile.mkdtemp(prefix="worker_start_triton_"))
        run = subprocess.run([sys.executable, __file__, "--out", str(args.out), "--way", way], cwd=REPO, env=env,
                             capture_output=True, text=True, timeout=400)
        lines = [line for line in run.stdout.splitlines() if line.startswith("{")]
        row = {"way": way, **(json.loads(lines[-1]) if lines else {"error": run.stderr.strip()[-600:]})}
        rows.append(row)
        print(json.dumps(row), flush=True)
    report = {"command": " ".join(sys.argv), "kernel": KERNEL, "shape": SHAPE, "cpus": os.cpu_count(), "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

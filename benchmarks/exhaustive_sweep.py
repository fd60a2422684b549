"""Exhaustive sweeps for the search-efficiency study: every valid config of a kernel measured on a
problem, through `omnitune search --sampler grid` (so each one is checked against the reference,
timed and stored exactly as a search would), after compiling all of them in parallel.

The problems are Qwen2.5-Omni-7B's own (its preset), so the sweeps also fill the shipped tables:

    python benchmarks/exhaustive_sweep.py --db DB --out sweeps.json [--sweep NAME ...] [--workers N]

`benchmarks/replay.py --db DB --all` then replays the samplers over every sweep in the database.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

from omnitune.registry import get_spec
from omnitune.measure.precompile import precompile
from omnitune.spec import DeviceLimits, parse_dtype

# name → (kernel, problem). Qwen2.5-Omni-7B: 28 query heads over 4 KV heads of 128.
SWEEPS = {
    "attn_cross_128x256": ("attention", "b=1,h=28,hkv=4,lq=128,lk=256,d=128,causal=0"),
    "attn_cross_1024x256": ("attention", "b=1,h=28,hkv=4,lq=1024,lk=256,d=128,causal=0"),
    "attn_short_prefill_765": ("attention", "b=1,h=28,hkv=4,lq=765,lk=765,d=128,causal=1,spans=1,span_len=256"),
    "kvw_t4": ("kv_cache_write", "t=4,hkv=4,d=128,block_size=16"),
    "kvw_t64": ("kv_cache_write", "t=64,hkv=4,d=128,block_size=16"),
    "kvw_t1024": ("kv_cache_write", "t=1024,hkv=4,d=128,block_size=16"),
    "kvw_t16384": ("kv_cache_write", "t=16384,hkv=4,d=128,block_size=16"),
}


def run_sweep(name: str, db: Path, dtype: str, workers: int | None) -> dict:
    kernel, shape = SWEEPS[name]
    spec = get_spec(kernel)
    problem = spec.parse_shape(shape)
    torch_dtype = parse_dtype(dtype)
    valid = spec.valid_configs(problem, torch_dtype, DeviceLimits.of_current_device())
    report = precompile(spec, problem, torch_dtype, valid, workers=workers)
    print(f"[{name}] {report.summary()}", flush=True)
    start = time.perf_counter()
    command = [sys.executable, "-m", "omnitune", "search", kernel, "--shape", shape, "--dtype", dtype,
               "--sampler", "grid", "--trials", str(len(valid)), "--finalists", "3", "--db", str(db),
               "--precompile", "0"]  # compiled above, and timed apart
    rc = subprocess.call(command)
    search_s = time.perf_counter() - start
    print(f"[{name}] {len(valid)} valid configs: precompile {report.seconds:.0f} s, search {search_s:.0f} s, rc {rc}",
          flush=True)
    return {"name": name, "kernel": kernel, "problem_key": spec.problem_key(problem), "dtype": dtype,
            "valid_configs": len(valid), "precompile_s": report.seconds, "precompile_workers": report.workers,
            "precompile_failed": len(report.failed), "search_s": search_s, "search_rc": rc,
            "command": " ".join(command)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--sweep", action="append", choices=sorted(SWEEPS), help="default: all")
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--workers", type=int, default=None)
    args = parser.parse_args(argv)
    results = []
    for name in args.sweep or list(SWEEPS):
        results.append(run_sweep(name, args.db, args.dtype, args.workers))
        # Written after every sweep: a run cut short keeps what it finished.
        args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
                                        "sweeps": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What compiling one config costs the host, and how much of it Triton's line info is, measured on a
machine without a GPU (Triton's compiler for sm_90 and its bundled ptxas, as a compile worker runs
them).

A whole-model search is bound by compiling in its second half (issue 20: the host's cores 86-99%
busy while the GPU dips, 540-900 s of the compile workers' CPU per search). Triton compiles with
line info by default: a debug-info pass in LLVM and `ptxas -lineinfo`. TRITON_DISABLE_LINE_INFO=1
drops both; it is one of the variables Triton's cache key includes, so a search would have to set
it for its measuring process and its workers alike. This measures what it would save on the
kernel that costs a whole-model search the most compiling (paged decode, ~300 of 677 s in round 20
part D): 18 configs of its split kernel compiled from an empty cache, once with line info and once
without, alternating, each in a fresh process; per compile, the process's CPU time and ptxas's
(its child), and whether the two cubins' code is the same (their SASS from cuobjdump, comments
dropped).

    PYTHONPATH=$PWD python benchmarks/compile_cost_offline.py --out benchmarks/results/compile_cost_offline.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DECODE = [{"kernel": "paged_decode", "block_n": n, "warps": w, "stages": s} for n in (32, 64, 128)
          for w in (2, 4, 8) for s in (2, 3)]


def compile_one(case: dict):
    from decode_registers_offline import compile_split

    return compile_split(False, block_n=case["block_n"], warps=case["warps"], stages=case["stages"])


def _cpu(who) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def child(cases: list[dict]) -> list[dict]:
    """In a fresh process with TRITON_CACHE_DIR empty: each case compiled, timed (the imports
    before, as in a compile worker forked from its preloaded server)."""
    sys.path.insert(0, str(HERE))
    import decode_registers_offline  # noqa: F401

    rows = []
    for case in cases:
        began, own, kids = time.perf_counter(), _cpu(resource.RUSAGE_SELF), _cpu(resource.RUSAGE_CHILDREN)
        kernel = compile_one(case)
        rows.append({**case, "wall_s": time.perf_counter() - began, "cpu_s": _cpu(resource.RUSAGE_SELF) - own,
                     "ptxas_cpu_s": _cpu(resource.RUSAGE_CHILDREN) - kids, "sass": sass(kernel)})
    return rows


def sass(kernel) -> str:
    """The kernel's instructions (benchmarks/cubin.py), without the comments and labels that line
    info adds or moves."""
    from cubin import sass_instructions

    return "\n".join(text for _, text in sass_instructions(kernel))


def run_mode(line_info: bool, cases: list[dict]) -> list[dict]:
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    if line_info:
        env.pop("TRITON_DISABLE_LINE_INFO", None)
    else:
        env["TRITON_DISABLE_LINE_INFO"] = "1"
    with tempfile.TemporaryDirectory() as cache:
        env["TRITON_CACHE_DIR"] = cache
        done = subprocess.run([sys.executable, __file__, "--child", json.dumps(cases)], env=env, capture_output=True,
                              text=True, check=False, timeout=1800)
    if done.returncode:
        raise SystemExit(f"the compiling child failed: {done.stderr.strip().splitlines()[-1:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--repeats", type=int, default=2, help="alternations of the two modes")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        print(json.dumps(child(json.loads(args.child))))
        return 0
    runs = []
    for repeat in range(args.repeats):
        for line_info in (True, False) if repeat % 2 == 0 else (False, True):
            rows = run_mode(line_info, DECODE)
            runs.append({"line_info": line_info, "repeat": repeat, "rows": rows})
            total = sum(r["cpu_s"] + r["ptxas_cpu_s"] for r in rows)
            print(f"line info {'on ' if line_info else 'off'} (repeat {repeat}): {len(rows)} configs, "
                  f"{total:.1f} s of CPU, ptxas {sum(r['ptxas_cpu_s'] for r in rows):.1f} s", flush=True)
    summary, sass_of = {}, {}
    for line_info in (True, False):
        rows = [r for run in runs if run["line_info"] == line_info for r in run["rows"]]
        summary[f"paged_decode, line info {'on' if line_info else 'off'}"] = {
            "configs_compiled": len(rows),
            "cpu_s_per_config": sum(r["cpu_s"] + r["ptxas_cpu_s"] for r in rows) / len(rows),
            "ptxas_cpu_s_per_config": sum(r["ptxas_cpu_s"] for r in rows) / len(rows),
        }
        # Each config's SASS (of its last compile) in this mode, keyed by the config.
        sass_of[line_info] = {(r["block_n"], r["warps"], r["stages"]): r["sass"] for r in rows}
    on, off = sass_of[True], sass_of[False]
    summary["same_sass"] = f"{sum(on[k] == off[k] for k in on)} of {len(on)} configs"
    for name, figures in summary.items():
        print(name, figures if isinstance(figures, str) else {k: round(v, 3) for k, v in figures.items()})
    if args.out is not None:
        for run in runs:
            for row in run["rows"]:
                row.pop("sass")
        args.out.write_text(json.dumps({"summary": summary, "runs": runs}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

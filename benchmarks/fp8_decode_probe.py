"""Why paged decode over an fp8 cache is not as much faster than over a bf16 one as half the
bytes allow (up to 2x; round 7 measured 0.87x at batch 64, 4k context, then 1.14x): a sweep of the split
kernel's configs over both caches, timed as CUDA-graph replays, with each compiled kernel's
registers, spills and shared memory, and the Triton IR and PTX of the tuned configs kept for
reading. A diagnostic, not a figure to quote.

    PYTHONPATH=$PWD python benchmarks/fp8_decode_probe.py --out $OUT/fp8_decode_probe_h200.json --asm $OUT/asm

--few-warps sweeps fp8 over programs of one or two warps (16- to 64-key tiles, 2-16 splits, 2-4
stages). Round 8's searches sampled one and two warps only over 64- and 128-key tiles (2.3x the
best and slower at b64 4k: up to 255 registers, 4 programs an SM); 16- and 32-key tiles fit 7-12. The
loop issues about as many instructions a key at any warp count (benchmarks/decode_registers_offline.py
--loop), but with one warp to a tile no warp waits at a barrier for the others. Each config's
output (poisoned first) is compared with its cache's tuned config's. --fused-reduce: each fp8
config but the first also with the splits combined in the same launch (FUSED_REDUCE).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ops_bench import capture, graph_call_us  # noqa: E402


# (NUM_SPLITS, BLOCK_N, num_warps, num_stages)
FEW_WARPS_GRID = list(itertools.product((2, 4, 8, 16), (16, 32, 64), (1, 2), (2, 3, 4)))
TUNED = {"bf16": (2, 64, 4, 2), "fp8": (2, 64, 4, 3)}


class _Recorder:
    """Stands in for the split kernel's DirectLauncher for one call: the launcher it binds goes
    through the JIT, which hands back the compiled kernel (registers, spills, assembly)."""

    def __init__(self, jit):
        self.jit, self.kernel = jit, None

    def bind(self, constexprs: dict, objects: int):
        def launch(grid, args, dtypes=None):
            self.kernel = self.jit[grid](*args, **constexprs)
        return launch


def _recorded_kernel(pda, launch):
    """The split kernel `launch()` compiles, recorded through a plan built for the occasion: the
    launch plans are emptied before and after, so that the timed calls bind the real launcher."""
    from omnitune.kernels._launch import PlanCache

    recorder, launcher = _Recorder(pda._paged_decode_split), pda._SPLIT
    pda._SPLIT, pda._launch_plans = recorder, PlanCache(pda._launch_plan)
    try:
        launch()
    finally:
        pda._SPLIT, pda._launch_plans = launcher, PlanCache(pda._launch_plan)
    return recorder.kernel


def _problem(ctx: int, cache: str):
    """The probe's problem (batch 64, h28/4, d=128, pages of 16) over the named cache."""
    from omnitune.kernels import paged_decode_attention as pda

    return pda.PagedDecodeProblem(b=64, h=28, hkv=4, lq=1, ctx=ctx, d=128,
                                  cache_dtype="fp8_e4m3" if cache == "fp8" else "auto")


def _config_list(text: str) -> list[tuple[int, int, int, int]]:
    """--configs: 'S/N/W/ST,...' as (NUM_SPLITS, BLOCK_N, num_warps, num_stages) tuples."""
    try:
        rows = [tuple(int(x) for x in item.split("/")) for item in text.split(",") if item.strip()]
    except ValueError:
        rows = []
    if not rows or any(len(row) != 4 for row in rows):
        raise argparse.ArgumentTypeError(f"{text!r}: give NUM_SPLITS/BLOCK_N/num_warps/num_stages, comma-separated")
    return rows


def _configs(cache: str, args) -> list:
    """The configs swept over one cache, in the order they are timed (the first is the one the
    others' outputs are compared with)."""
    from omnitune.spec import Config

    grid = (list(itertools.product((2, 4, 8), (64, 128), (4,), (2, 3, 4)))
            + [(8, 32, 4, 2), (2, 128, 8, 3), (2, 64, 8, 2), (2, 64, 8, 3)])
    if args.quick:
        grid = [(2, 64, 4, 2)] if cache == "bf16" else [(2, 64, 4, 2), (2, 64, 4, 3), (2, 128, 4, 3)]
    if args.few_warps:  # the tuned config first: the others' outputs are compared with its
        grid = [TUNED[cache]] + (FEW_WARPS_GRID if cache == "fp8" else [])
    if args.configs:  # the fp8 configs named, after each cache's tuned config (the reference)
        grid = [TUNED[cache]] + (args.configs if cache == "fp8" else [])
    fused = (False, True) if args.fused_reduce and cache == "fp8" else (False,)
    rows = [(*grid[0], False)] + [(*g, f) for g in grid[1:] for f in fused]
    return [Config(NUM_SPLITS=splits, BLOCK_N=block_n, num_warps=warps, num_stages=stages, PACK_GQA=True,
                   FUSED_REDUCE=fused_reduce) for splits, block_n, warps, stages, fused_reduce in rows]


def main(argv=None) -> int:
    from omnitune.kernels import _fp8
    from omnitune.kernels import paged_decode_attention as pda
    from omnitune.measure.precompile import precompile

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--asm", type=Path, required=True)
    parser.add_argument("--ctx", type=int, default=4096)
    parser.add_argument("--quick", action="store_true",
                        help="bf16's tuned config and three fp8 configs only (a kernel variant checked in a minute)")
    parser.add_argument("--few-warps", action="store_true",
                        help="fp8 over 1-2 warps a program (72 configs) beside each cache's tuned config")
    parser.add_argument("--configs", type=_config_list, default=None, metavar="S/N/W/ST,...",
                        help="fp8 configs to sweep instead (NUM_SPLITS/BLOCK_N/num_warps/num_stages each), beside "
                             "each cache's tuned config: a variant timed in a short call")
    parser.add_argument("--fused-reduce", action="store_true",
                        help="each fp8 config after the first also with FUSED_REDUCE (the combine in the same launch)")
    parser.add_argument("--no-precompile", dest="precompile", action="store_false",
                        help="compile each config in this process as it is first timed (by default every config "
                             "is compiled first, in parallel processes: omnitune.measure.precompile)")
    parser.add_argument("--ncu-pair", action="store_true",
                        help="launch the split kernel once per cache with one config (for ncu -k _paged_decode_split)")
    args = parser.parse_args(argv)
    problem = _problem(args.ctx, "bf16")
    inputs = pda.SPEC.make_inputs(problem, torch.bfloat16, "cuda", 0)
    kc = inputs.key_cache.masked_fill(inputs.key_cache.isinf(), 0)
    vc = inputs.value_cache.masked_fill(inputs.value_cache.isinf(), 0)
    ks, vs = _fp8.kv_cache_scale(kc), _fp8.kv_cache_scale(vc)
    caches = {"bf16": (kc, vc, None, None), "fp8": (_fp8.quantize(kc, ks), _fp8.quantize(vc, vs), ks, vs)}
    out = torch.empty_like(inputs.q)
    rows = []
    first_out: dict[str, torch.Tensor] = {}  # each cache's first config's output
    keep = {("bf16", (2, 64, 4, 2)), ("fp8", (2, 64, 4, 2)), ("fp8", (8, 32, 4, 2)), ("fp8", (2, 128, 8, 3))}
    args.asm.mkdir(parents=True, exist_ok=True)
    swept = {name: _configs(name, args) for name in caches}
    compiled = {}
    if args.precompile and not args.ncu_pair:
        compiled = {name: precompile(pda.SPEC, _problem(args.ctx, name), torch.bfloat16, configs).summary()
                    for name, configs in swept.items()}
        print(compiled, flush=True)
    for name, (k, v, k_scale, v_scale) in caches.items():
        for cfg in (swept[name][:1] if args.ncu_pair else swept[name]):
            splits, block_n, warps, stages = (cfg[p] for p in ("NUM_SPLITS", "BLOCK_N", "num_warps", "num_stages"))
            fused_reduce = cfg["FUSED_REDUCE"]
            row = {"cache": name, "config": cfg.as_dict()}
            try:
                kernel = _recorded_kernel(pda, lambda: pda._launch(
                    inputs.q, k, v, inputs.block_tables, inputs.context_lens, inputs.sm_scale, out, cfg, None,
                    k_scale, v_scale))
                row.update(registers=kernel.n_regs, spills=kernel.n_spills, shared_bytes=kernel.metadata.shared)
                if args.ncu_pair:
                    torch.cuda.synchronize()
                    rows.append(row)
                    continue
                scratch = pda._Scratch.make(64, 28, 1, 128, 4, cfg, "cuda")
                out.fill_(float("nan"))
                graph = capture(lambda: pda._launch(inputs.q, k, v, inputs.block_tables, inputs.context_lens,
                                                    inputs.sm_scale, out, cfg, scratch, k_scale, v_scale))
                row["graph_us"] = min(graph_call_us(graph) for _ in range(3))
                first = first_out.setdefault(name, out.float().clone())
                row["rel_diff_to_first"] = float((out.float() - first).norm() / first.norm())
                if name != "bf16" and "bf16" in first_out:  # beside the 16-bit cache's result: a variant's
                    bf16 = first_out["bf16"]                # error, where rel_diff_to_first compares it with itself
                    row["rel_diff_to_bf16"] = float((out.float() - bf16).norm() / bf16.norm())
                if (name, (splits, block_n, warps, stages)) in keep and not fused_reduce:
                    stem = f"{name}_s{splits}_n{block_n}_w{warps}_st{stages}"
                    for kind in ("ttgir", "ptx"):
                        (args.asm / f"{stem}.{kind}").write_text(kernel.asm[kind])
            except Exception as exc:  # noqa: BLE001 — a config that fails is a row, not the end
                row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            rows.append(row)
            print(row, flush=True)
    moved = {name: pda.SPEC.bytes_moved(_problem(args.ctx, name), torch.bfloat16) for name in caches}
    best = {n: min((r["graph_us"] for r in rows if r["cache"] == n and "graph_us" in r), default=None) for n in caches}
    report = {"command": " ".join(sys.argv), "device": torch.cuda.get_device_name(), "problem": problem.__dict__,
              "bytes_moved": moved, "best_graph_us": best, "precompiled": compiled, "rows": rows}
    args.out.write_text(json.dumps(report, indent=1))
    print("best", best)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

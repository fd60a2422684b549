"""A decode loop under torch.compile, as a serving engine runs one: each step writes the batch's new
K/V into the paged cache and attends over it, the longest context one token longer every step,
passed as `max_context_len`. Ours (write_kv_cache + paged_decode_attention) beside PyTorch's
(index_copy_ into the caches, the pages gathered through the block table into a buffer of the
table's capacity, SDPA under a padding mask: static shapes), both compiled the same way
(`torch.compile(step, fullgraph=True)`, --backend) and both run eager, in one process.

Per implementation and mode:
  - graphs: how many graphs Dynamo compiled over the whole loop (a length a graph is specialised
    on costs a compile: ours buckets the length, four buckets an octave, so a loop from 1,000 to
    2,000 tokens should compile about five);
  - first_pass_s: the loop's wall time the first time through, compiles included;
  - eager_step_us, compiled_step_us (and _min): the loop's wall time per step, every graph
    compiled, host work included, one synchronize at the end (what a serving loop's host sees):
    the median (and fastest) of --repeats passes of each, eager and compiled taking turns;
  - max_rel_err: the compiled outputs against the eager ones of the same implementation, and
    ours against PyTorch's, over every step.

    PYTHONPATH=$PWD python benchmarks/compiled_decode_loop.py --out $OUT/compiled_decode_loop_h200.json
    TRITON_INTERPRET=1 python benchmarks/compiled_decode_loop.py --tiny --backend aot_eager   # the CPU

    python benchmarks/compiled_decode_loop.py --backend eager,aot_eager,inductor \
        --impls omnitune,pytorch,omnitune_write,pytorch_write,omnitune_decode,pytorch_decode --profile $OUT/prof
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from _emit import emit

from omnitune.kernels import _dispatch
from omnitune.kernels.kv_cache_write import write_kv_cache
from omnitune.kernels.paged_decode_attention import paged_decode_attention

# (batch, heads, kv heads, head dim, page size, first length, steps): Qwen2.5-Omni-7B's thinker at
# batch 8 from a 1,000-token prompt; --tiny is a shape the interpreter runs in seconds.
REAL = (8, 28, 4, 128, 16, 1000, 1024)
TINY = (2, 4, 2, 64, 8, 17, 24)


def loop_inputs(b, h, hkv, d, block_size, start, steps, dtype, device, seed=0):
    """The loop's caches (each sequence's pages scattered), block tables, and every step's new
    K/V, queries and slots, drawn beforehand."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    pages = math.ceil((start + steps) / block_size)
    blocks = b * pages + 3
    table = torch.randperm(blocks, generator=gen)[: b * pages].view(b, pages).to(torch.int32)
    caches = [torch.randn(blocks, block_size, hkv, d, generator=gen).to(device, dtype) for _ in range(2)]
    steps_in = []
    for n in range(start, start + steps):  # sequence i holds n - 3i tokens before the step
        lens = torch.tensor([max(n - 3 * i, 1) for i in range(b)], dtype=torch.int32)
        slots = torch.stack([table[i, (lens[i] - 1) // block_size] * block_size + (lens[i] - 1) % block_size
                             for i in range(b)]).to(torch.int64)
        steps_in.append(dict(
            q=torch.randn(b, h, 1, d, generator=gen).to(device, dtype),
            k=torch.randn(b, hkv, d, generator=gen).to(device, dtype),
            v=torch.randn(b, hkv, d, generator=gen).to(device, dtype),
            slots=slots.to(device), lens=lens.to(device), longest=int(lens.max())))
    return caches, table.to(device), steps_in


def omnitune_step(q, k, v, key_cache, value_cache, table, slots, lens, longest):
    write_kv_cache(k, v, key_cache, value_cache, slots)
    return paged_decode_attention(q, key_cache, value_cache, table, lens, max_context_len=longest)


def pytorch_write(k, v, key_cache, value_cache, slots):
    hkv, d = key_cache.shape[2:]
    key_cache.view(-1, hkv, d).index_copy_(0, slots, k)
    value_cache.view(-1, hkv, d).index_copy_(0, slots, v)


def written_rows(key_cache, value_cache, slots):
    """What a write-only step returns: the rows it wrote, read back through the slots."""
    hkv, d = key_cache.shape[2:]
    return torch.cat([key_cache.view(-1, hkv, d)[slots], value_cache.view(-1, hkv, d)[slots]], dim=1)


def omnitune_write_step(q, k, v, key_cache, value_cache, table, slots, lens, longest):
    write_kv_cache(k, v, key_cache, value_cache, slots)
    return written_rows(key_cache, value_cache, slots)


def pytorch_write_step(q, k, v, key_cache, value_cache, table, slots, lens, longest):
    pytorch_write(k, v, key_cache, value_cache, slots)
    return written_rows(key_cache, value_cache, slots)


def omnitune_decode_step(q, k, v, key_cache, value_cache, table, slots, lens, longest):
    return paged_decode_attention(q, key_cache, value_cache, table, lens, max_context_len=longest)


def pytorch_step(q, k, v, key_cache, value_cache, table, slots, lens, longest):
    pytorch_write(k, v, key_cache, value_cache, slots)
    return pytorch_decode_step(q, k, v, key_cache, value_cache, table, slots, lens, longest)


def pytorch_decode_step(q, k, v, key_cache, value_cache, table, slots, lens, longest):
    hkv = key_cache.shape[2]
    b, h = q.shape[:2]
    keys = key_cache[table].flatten(1, 2).transpose(1, 2)    # [b, hkv, capacity, d]
    values = value_cache[table].flatten(1, 2).transpose(1, 2)
    visible = torch.arange(keys.shape[2], device=q.device)[None, :] < lens[:, None]
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=visible[:, None, None, :],
                                          enable_gqa=h != hkv)


def run_loop(step, caches, table, steps_in, sync, keep: bool = False) -> tuple[list[torch.Tensor], float]:
    """Every step once on fresh copies of the caches: the wall time, and each step's output if
    keep (copied as it comes: a graph replayed by torch.compile's reduce-overhead mode writes its
    next output over the last)."""
    key_cache, value_cache = (c.clone() for c in caches)
    outs = []
    sync()
    t0 = time.perf_counter()
    for s in steps_in:
        out = step(s["q"], s["k"], s["v"], key_cache, value_cache, table, s["slots"], s["lens"], s["longest"])
        if keep:
            outs.append(out.clone())
    sync()
    return outs, time.perf_counter() - t0


def max_rel(outs, refs) -> float:
    return max(float((o.float() - r.float()).norm() / r.float().norm().clamp_min(1e-12))
               for o, r in zip(outs, refs, strict=True))


def profile_table(step, caches, table, steps_in, sync, path: Path, steps: int = 64) -> None:
    """torch.profiler over the loop's first steps (already compiled): host and device time by op,
    the ops with the most host time first, written to path."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities) as prof:
        run_loop(step, caches, table, steps_in[:steps], sync)
    path.write_text(f"{min(steps, len(steps_in))} steps\n"
                    + prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30) + "\n")


def why(exc: Exception) -> str:
    """An exception's message in a line: its first line and, where the cause is named last (as in
    a backend's failure wrapped by Dynamo), its last."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    if not lines:
        return ""
    return (lines[0] if len(lines) == 1 else f"{lines[0]} … {lines[-1]}")[:400]


def measure(name, step, backend, caches, table, steps_in, sync, profile_dir: Path | None = None,
            mode: str | None = None, repeats: int = 5) -> dict:
    """One step's loop eager and compiled: the compiled loop's first pass (its compiles), then
    `repeats` passes of each, taking turns, their median and fastest per step; each loop's outputs
    from an untimed pass."""
    from torch._dynamo.utils import counters

    eager_outs, _ = run_loop(step, caches, table, steps_in, sync, keep=True)  # warm: lookups, kernels compiled
    torch._dynamo.reset()
    counters.clear()
    # The backend by name, so that a mode applies (a backend object takes none).
    compiled = torch.compile(step, fullgraph=True, backend=backend, mode=mode)
    row = {"impl": name, "backend": backend, "mode": mode or "default"}
    try:
        _, first_s = run_loop(compiled, caches, table, steps_in, sync)
        outs, _ = run_loop(compiled, caches, table, steps_in, sync, keep=True)
        times = {"eager": [], "compiled": []}
        for _ in range(repeats):
            times["eager"].append(run_loop(step, caches, table, steps_in, sync)[1])
            times["compiled"].append(run_loop(compiled, caches, table, steps_in, sync)[1])
    except Exception as exc:  # noqa: BLE001 — a loop that cannot be compiled is a result
        return {**row, "compiled": f"failed: {type(exc).__name__}: {why(exc)}"}
    if profile_dir is not None:
        profile_table(step, caches, table, steps_in, sync, profile_dir / f"{name}_uncompiled.txt")
        profile_table(compiled, caches, table, steps_in, sync, profile_dir / f"{name}_{backend}.txt")
    per_step = {m: sorted(t / len(steps_in) * 1e6 for t in ts) for m, ts in times.items()}
    return {**row, "graphs": counters["stats"]["unique_graphs"], "first_pass_s": first_s,
            "eager_step_us": statistics.median(per_step["eager"]), "eager_step_us_min": per_step["eager"][0],
            "compiled_step_us": statistics.median(per_step["compiled"]),
            "compiled_step_us_min": per_step["compiled"][0],
            "max_rel_err_compiled_vs_eager": max_rel(outs, eager_outs), "outs": outs}


# Each implementation of a step: the whole step (write, then attend) and each half alone, so that
# what compiling costs can be told op by op.
STEPS = {
    "omnitune": omnitune_step, "pytorch": pytorch_step,
    "omnitune_write": omnitune_write_step, "pytorch_write": pytorch_write_step,
    "omnitune_decode": omnitune_decode_step, "pytorch_decode": pytorch_decode_step,
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="a shape the interpreter runs (the CPU)")
    parser.add_argument("--steps", type=int, help="decode steps (default: the shape's)")
    parser.add_argument("--backend", default="inductor",
                        help="torch.compile backends, comma-separated (aot_eager on the CPU; eager, aot_eager and "
                             "inductor tell Dynamo's, AOTAutograd's and Inductor's shares apart)")
    parser.add_argument("--mode", help="torch.compile's mode (reduce-overhead: its CUDA graphs); default: none")
    parser.add_argument("--repeats", type=int, default=5, help="timed passes of each loop, eager and compiled")
    parser.add_argument("--impls", default="omnitune,pytorch",
                        help=f"steps to run, comma-separated, of: {', '.join(STEPS)}")
    parser.add_argument("--profile", type=Path, metavar="DIR",
                        help="also write torch.profiler's table of each step eager and compiled into DIR")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    impls = args.impls.split(",")
    if unknown := [name for name in impls if name not in STEPS]:
        parser.error(f"unknown step {unknown[0]!r}: one of {', '.join(STEPS)}")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32  # the interpreter gets bf16 wrong
    b, h, hkv, d, block_size, start, steps = TINY if args.tiny else REAL
    steps = args.steps or steps
    caches, table, steps_in = loop_inputs(b, h, hkv, d, block_size, start, steps, dtype, device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    rows, outs = [], {}
    for backend in args.backend.split(","):
        for name in impls:
            row = measure(name, STEPS[name], backend, caches, table, steps_in, sync, args.profile, args.mode,
                          args.repeats)
            outs[name] = row.pop("outs", None)
            rows.append(row)
        for row in rows:  # ours beside PyTorch's same step, compiled by this backend
            theirs = outs.get(row["impl"].replace("omnitune", "pytorch"))
            if row["backend"] == backend and row["impl"].startswith("omnitune") and outs.get(row["impl"]) and theirs:
                row["max_rel_err_vs_pytorch"] = max_rel(outs[row["impl"]], theirs)
    lengths = [s["longest"] for s in steps_in]
    result = {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu (Triton interpreter)",
        "torch": torch.__version__, "dtype": str(dtype).removeprefix("torch."),
        "shape": dict(b=b, h=h, hkv=hkv, d=d, block_size=block_size, first_length=start, steps=steps),
        "length_buckets": len({_dispatch.bucket_up(n) for n in lengths}),
        "rows": rows,
    }
    emit(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

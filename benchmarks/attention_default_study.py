"""Which answer serves attention best where nothing is tuned: measured on problems of our own
choosing, none of them held out (benchmarks/coverage_set.py judges the result, so it must not
pick it) and none a preset point (those are what the tables are tuned on).

The runtime's untuned answer (omnitune.kernels.attention.untuned_config) sends span-free problems
of ≥ 1,024 query rows, and non-causal grids of fewer programs than SMs over ≥ 1,024 keys, to
PyTorch's SDPA, and everything else to this kernel's default (64×64 tiles, 4 warps, 3 stages,
TMA; 128-key tiles for ≤ 32-row tiles over ≥ 1,024 keys on small grids). On the held-out set it
fell short in two places: span-free problems of 512–1,023 query rows, where SDPA was faster, and
query-light causal problems (a few to ~100 query rows over thousands of keys), where the
default's tiles waste work. Those are questions to measure, not a fit. This study times the
candidates on TRAINING, which spans the same axes:
  (a) span-free prefill, Lq = Lk from 256 to 1,500 rows (several points below 1,024), causal
      and not, batches 1–16 — where SDPA starts beating this kernel's default;
  (b) query-light problems, 1–160 query rows over 1,200–20,000 keys, causal (bottom-right) and
      not, batches 1–32, grids from 4 programs to ten times the SMs — which tile serves them;
  (c) cross-attention-like Lq ≠ Lk: 256–1,024 queries over 4k–24k keys, causal and not.

Per problem, each candidate is verified against the reference and timed (omnitune.profile.bench.
run_bench: CUDA events, L2 flushed before each repetition, the median of 50):
  - default: default_config as it stands; untuned: untuned_config as it stands (one of the
    others, recorded as `same_as` it);
  - sdpa: Config(BACKEND="sdpa", **PARKED), SDPA as it dispatches; sdpa_cudnn: SDPA's cuDNN backend;
  - tile variants of this kernel: PREFILL_TILES where there are ≥ 256 query rows (128-row tiles
    over 8 warps, 128-key tiles, 2 stages, pointer loads), QUERY_LIGHT_TILES below (16/32/64-row
    tiles, 64/128 keys, 8 warps, 2 stages, pointer loads, GQA packing flipped).
A candidate that breaks a constraint on a problem is left out there; one whose config another
candidate has already is measured once and recorded as `same_as` it, so every name that applies
has a time and a rule can be scored by name. Every row records each candidate's full config.

Compiling dominates (~1.2 s a config on the H200, and nearly every problem specialises the kernel
anew: its group, mask, head dim, dtype and length classes are part of the binary's key), so every
config of every problem is first compiled by a pool of worker processes that launch it once
(Triton's disk cache keeps the binary); the measuring process then only loads binaries, and times
with no worker on the GPU.

The summary gives per candidate the geometric mean and the worst of (its time / the fastest
candidate's) and how often it is within 5%; and the two questions' data laid out: (a) by query
rows, the default against SDPA; (b) which candidate wins by rows, keys, programs against the SMs
and mask. `--analyze FILE` scores candidate rules on a results file: for each, how many problems
it puts within 5% of the fastest candidate.

    PYTHONPATH=$PWD python benchmarks/attention_default_study.py --out $OUT/attention_default_study_h200.json
    PYTHONPATH=$PWD python benchmarks/attention_default_study.py --analyze $OUT/attention_default_study_h200.json
    TRITON_INTERPRET=1 PYTHONPATH=$PWD python benchmarks/attention_default_study.py --tiny --out /tmp/x.json
"""

from __future__ import annotations

import argparse
import concurrent.futures
import functools
import json
import math
import multiprocessing
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import triton

from omnitune.kernels.attention import PARKED, SPEC, AttentionProblem
from omnitune.presets import PRESETS, preset_problems
from omnitune.profile.bench import run_bench
from omnitune.spec import Config, DeviceLimits

sys.path.insert(0, str(Path(__file__).resolve().parent))
from coverage_set import HELD_OUT
from training_set import ATTENTION as ATTENTION_TRAINING
from decode_default_study import failed_checks

A = AttentionProblem
TRAINING = ATTENTION_TRAINING  # benchmarks/training_set.py: training problems live there
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def held_out_keys() -> set[str]:
    return {SPEC.problem_key(p) for p, _ in HELD_OUT["attention"]}


def preset_keys() -> set[str]:
    """Every attention problem a model preset produces (what the shipped tables are tuned on)."""
    return {SPEC.problem_key(pp.problem) for preset in PRESETS.values()
            for pp in preset_problems(preset, "attention")}


def _training_is_our_own() -> None:
    """The study may choose a rule only from problems nobody judges it on nor tunes for: a
    problem shared with the held-out set or a preset would let the rule be fitted to it."""
    keys = [SPEC.problem_key(p) for p, _ in TRAINING]
    assert len(set(keys)) == len(keys), "a training problem is listed twice"
    assert not set(keys) & held_out_keys(), f"held-out problems in TRAINING: {set(keys) & held_out_keys()}"
    assert not set(keys) & preset_keys(), f"preset problems in TRAINING: {set(keys) & preset_keys()}"


_training_is_our_own()

# Problems of at most this many query rows (Lq ≠ Lk) are query-light: the tiles of (b).
QUERY_LIGHT_MAX_ROWS = 160
SDPA = Config(BACKEND="sdpa", **PARKED)
SDPA_CUDNN = Config(BACKEND="sdpa_cudnn", **PARKED)

# A tile: (BLOCK_M, BLOCK_N, num_warps, num_stages, USE_TMA).
# Tiles of this kernel for ≥ 256 query rows: the tuned table's prefill winners (128×128 and 128×64
# over 8 warps, 64×128 over 4; 3 stages, TMA) and the default with 2 stages or pointer loads.
PREFILL_TILES = {
    "m128_n128_w8_s3": (128, 128, 8, 3, True),
    "m128_n64_w8_s3": (128, 64, 8, 3, True),
    "m64_n128_w4_s3": (64, 128, 4, 3, True),
    "m64_n64_w4_s2": (64, 64, 4, 2, True),
    "m64_n64_w4_s3_ptr": (64, 64, 4, 3, False),
}
# Tiles for query-light problems, GQA packed as the default packs (today: group > 1, < 64 query rows):
# the table's decode winners (16×128, 2 stages, 4 or 8 warps), the default's tiles at 16/32/64
# rows with 64 or 128 keys, and the wide tile through pointer loads.
QUERY_LIGHT_TILES = {
    "m16_n64_w4_s3": (16, 64, 4, 3, True),
    "m16_n128_w4_s3": (16, 128, 4, 3, True),
    "m16_n128_w4_s2": (16, 128, 4, 2, True),
    "m16_n128_w8_s2": (16, 128, 8, 2, True),
    "m32_n128_w4_s3": (32, 128, 4, 3, True),
    "m64_n128_w4_s3": (64, 128, 4, 3, True),
    "m16_n128_w4_s3_ptr": (16, 128, 4, 3, False),
}
# One more candidate for query-light problems: the default's tile with GQA packing flipped (where
# the group allows it). Packed, a program reads K/V once for its group; unpacked, each head's rows
# fill tiles of their own, in more programs.
PACK_FLIPPED = "pack_flipped"


def kind_of(problem: AttentionProblem) -> str:
    """prefill (Lq = Lk), query_light (Lq ≠ Lk, ≤ QUERY_LIGHT_MAX_ROWS query rows) or cross."""
    if problem.lq == problem.lk:
        return "prefill"
    return "query_light" if problem.lq <= QUERY_LIGHT_MAX_ROWS else "cross"


def programs(problem: AttentionProblem, config: Config) -> int:
    """The kernel's grid size under `config` (what the default's rules compare with the SMs)."""
    pack = bool(config["PACK_GQA"]) and problem.group > 1
    rows = problem.group * problem.lq if pack else problem.lq
    return triton.cdiv(rows, int(config["BLOCK_M"])) * problem.b * (problem.hkv if pack else problem.h)


def tile_config(tile: tuple, pack: bool) -> Config:
    block_m, block_n, warps, stages, tma = tile
    return Config(BACKEND="triton", BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps, num_stages=stages,
                  PACK_GQA=pack, USE_TMA=tma)


def tile_variants(problem: AttentionProblem, default: Config) -> dict[str, Config]:
    """The kernel's tiles this problem's kind tries, before constraints."""
    if kind_of(problem) == "query_light":
        pack = bool(default["PACK_GQA"])
        variants = {name: tile_config(tile, pack) for name, tile in QUERY_LIGHT_TILES.items()}
        if problem.group > 1:
            variants[PACK_FLIPPED] = default.replace(PACK_GQA=not bool(default["PACK_GQA"]))
        return variants
    return {name: tile_config(tile, False) for name, tile in PREFILL_TILES.items()}


def candidates(problem: AttentionProblem, dtype: torch.dtype, *, most_tiles: int | None = None) -> dict[str, Config]:
    """Every candidate name that applies to the problem → its config (duplicates kept: they are
    measured once, see measured_once). `most_tiles` keeps only the first tile variants that apply
    and differ from the default (--tiny)."""
    named = {"default": SPEC.default_config(problem, dtype), "sdpa": SDPA}
    if {"BACKEND": "sdpa_cudnn"} in [dict(b) for b in SPEC.backends] and most_tiles is None:
        named["sdpa_cudnn"] = SDPA_CUDNN
    tiles = {name: config for name, config in tile_variants(problem, named["default"]).items()
             if not SPEC.violations(problem, config, dtype)}
    if most_tiles is not None:  # the default's own tile costs nothing more: it stays, under its name
        others = [name for name, config in tiles.items() if config != named["default"]][:most_tiles]
        tiles = {name: config for name, config in tiles.items() if config == named["default"] or name in others}
    named.update(tiles)
    # Last, so that it is recorded as the same as the candidate it is (default or sdpa), not the
    # other way round.
    named["untuned"] = SPEC.untuned_answer(problem, dtype)
    return {name: config for name, config in named.items() if not SPEC.violations(problem, config, dtype)}


def measured_once(configs: dict[str, Config]) -> tuple[dict[str, Config], dict[str, str]]:
    """(the distinct configs under their first name, each other name → the name measured for it)."""
    first: dict[Config, str] = {}
    aliases = {}
    for name, config in configs.items():
        if config in first:
            aliases[name] = first[config]
        else:
            first[config] = name
    return {name: config for config, name in first.items()}, aliases


# --- compiling ahead, in worker processes ---------------------------------------------------------

_worker_inputs: dict = {}


def _start_worker() -> None:
    from omnitune.kernels._host import draw_on_target

    draw_on_target()  # these launches only fill the disk cache: their inputs' values never matter


def _compile_in_worker(problem_key: str, dtype_name: str, values: dict, device: str = "cuda") -> str | None:
    """Launch one config once (Triton compiles it and keeps the binary on disk); None, or why not.
    A worker keeps one problem's inputs at a time."""
    try:
        identity = (problem_key, dtype_name, device)
        if _worker_inputs.get("identity") != identity:
            _worker_inputs.clear()
            if device == "cuda":
                torch.cuda.empty_cache()
            problem = SPEC.parse_shape(problem_key)
            _worker_inputs.update(identity=identity, inputs=SPEC.make_inputs(problem, DTYPES[dtype_name], device, 0))
        inputs = _worker_inputs["inputs"]
        SPEC.launch(inputs, SPEC.new_output(inputs), Config(values))
        if device == "cuda":
            torch.cuda.synchronize()
        return None
    except Exception as exc:  # noqa: BLE001 — the measuring process meets the config again and records it
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return f"{type(exc).__name__}: {text}"[:300]


def compile_ahead(jobs: list[tuple[str, str, Config]], workers: int, deadline_s: float = 600.0) -> int:
    """Compile every (problem key, dtype, config) of this kernel in `workers` processes, all
    before any timing starts: a worker launching on the GPU would disturb the timed kernels.
    Returns how many failed (they fail again, and are recorded, when measured)."""
    start = time.perf_counter()
    pool = concurrent.futures.ProcessPoolExecutor(max_workers=workers, initializer=_start_worker,
                                                  mp_context=multiprocessing.get_context("spawn"))
    futures = [pool.submit(_compile_in_worker, key, dtype_name, config.as_dict()) for key, dtype_name, config in jobs]
    failed = 0
    try:
        for done, future in enumerate(concurrent.futures.as_completed(futures, timeout=deadline_s), 1):
            try:
                error = future.result()
            except Exception as exc:  # noqa: BLE001 — a worker lost (a crash): the pool is broken
                error = f"worker lost: {type(exc).__name__}"
            if error is not None:
                failed += 1
                if failed <= 3:
                    print(f"  did not compile: {error}", flush=True)
            if done % 25 == 0 or done == len(futures):
                print(f"compiled {done}/{len(futures)} in {time.perf_counter() - start:.0f} s ({failed} failed)",
                      flush=True)
    except concurrent.futures.TimeoutError:
        print(f"compiling ahead stopped after {deadline_s:.0f} s; the rest compile when measured", flush=True)
        _end_workers(pool)
    else:
        pool.shutdown(wait=True)  # every worker gone (and its GPU memory freed) before timing starts
    return failed


def _end_workers(pool: concurrent.futures.ProcessPoolExecutor) -> None:
    """Stop a pool whose workers may hang: cancel what has not started, kill this pool's processes."""
    processes = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        if process.is_alive():
            process.kill()


# --- measuring ------------------------------------------------------------------------------------


def _candidate_record(config: Config, row) -> dict:
    record = {"config": config.as_dict(), "status": row.status, "time_ms": row.time_ms, "p20_ms": row.p20_ms,
              "p80_ms": row.p80_ms, "rel_error": row.rel_error}
    if row.status != "ok":
        record["detail"] = row.detail
    return record


def measure(problem: AttentionProblem, dtype_name: str, configs: dict[str, Config], *, interpret: bool,
            repetitions: int, sms: int) -> dict:
    """One problem's row: every candidate verified and timed (each distinct config once)."""
    dtype = DTYPES[dtype_name]
    distinct, aliases = measured_once(configs)
    t0 = time.perf_counter()
    bench = run_bench(SPEC, problem, dtype, distinct, interpret=interpret, baselines=False, repetitions=repetitions)
    results = {name: _candidate_record(distinct[name], row) for name, row in zip(distinct, bench)}
    for name, measured_as in aliases.items():
        results[name] = dict(results[measured_as], config=configs[name].as_dict(), same_as=measured_as)
    results = {name: results[name] for name in configs}  # in the candidates' order
    ok = {n: r["time_ms"] for n, r in results.items() if r["status"] == "ok" and "same_as" not in r}
    best = min(ok.values()) if ok else None
    for r in results.values():
        r["over_best"] = r["time_ms"] / best if best and r["status"] == "ok" else None
    default = configs["default"]
    return {"problem": SPEC.problem_key(problem), "dtype": dtype_name, "kind": kind_of(problem),
            "group": problem.group, "default_packs": bool(default["PACK_GQA"]) and problem.group > 1,
            "default_programs": programs(problem, default), "sms": sms,
            "fastest": min(ok, key=ok.get) if ok else None, "candidates": results,
            "wall_s": time.perf_counter() - t0}


def _shown(row: dict) -> str:
    return "  ".join(f"{n} " + (r["status"] if r["over_best"] is None else f"{r['over_best']:.3f}")
                     for n, r in row["candidates"].items() if "same_as" not in r)


def study(problems, *, interpret: bool, repetitions: int, most_tiles: int | None = None,
          on_row=lambda rows: None) -> list[dict]:
    """`on_row(rows)` after each problem: the caller keeps what a time limit would cut short."""
    sms = DeviceLimits.of_current_device().multiprocessors
    rows = []
    for i, (problem, dtype_name) in enumerate(problems, 1):
        configs = candidates(problem, DTYPES[dtype_name], most_tiles=most_tiles)
        row = measure(problem, dtype_name, configs, interpret=interpret, repetitions=repetitions, sms=sms)
        rows.append(row)
        print(f"[{i}/{len(problems)}] {dtype_name} {row['problem']} ({row['wall_s']:.1f} s): {_shown(row)}",
              flush=True)
        on_row(rows)
    return rows


# --- summary --------------------------------------------------------------------------------------


def _geomean(values: list[float]) -> float:
    return math.exp(sum(map(math.log, values)) / len(values))


def candidate_summary(rows: list[dict]) -> dict:
    """Per candidate: over how many problems it ran, the geometric mean and the worst of its time
    over the fastest candidate's, and on how many it was within 5% of the fastest."""
    names = list(dict.fromkeys(n for r in rows for n in r["candidates"]))
    out = {}
    for name in names:
        ratios = [r["candidates"][name]["over_best"] for r in rows
                  if name in r["candidates"] and r["candidates"][name]["over_best"] is not None]
        if ratios:
            out[name] = {"problems": len(ratios), "geomean_over_best": _geomean(ratios),
                         "worst_over_best": max(ratios), "within_5pct": sum(x <= 1.05 for x in ratios)}
    return out


def _ms(row: dict, name: str) -> float | None:
    found = row["candidates"].get(name)
    return found["time_ms"] if found and found["status"] == "ok" else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _fastest_triton(row: dict) -> str | None:
    ok = {n: r["time_ms"] for n, r in row["candidates"].items()
          if r["status"] == "ok" and r["config"].get("BACKEND", "triton") == "triton"}
    return min(ok, key=ok.get) if ok else None


def sdpa_by_rows(rows: list[dict], kind: str) -> list[dict]:
    """Question (a): per problem of `kind` by query rows, this kernel's default and its fastest
    tile against SDPA (as it dispatches, and cuDNN)."""
    laid_out = []
    for row in rows:
        if row["kind"] != kind:
            continue
        problem = SPEC.parse_shape(row["problem"])
        triton_best = _fastest_triton(row)
        laid_out.append({
            "problem": row["problem"], "dtype": row["dtype"], "lq": problem.lq, "lk": problem.lk,
            "causal": problem.causal, "default_programs": row["default_programs"],
            "default_ms": _ms(row, "default"), "sdpa_ms": _ms(row, "sdpa"), "sdpa_cudnn_ms": _ms(row, "sdpa_cudnn"),
            "default_over_sdpa": _ratio(_ms(row, "default"), _ms(row, "sdpa")),
            "fastest_triton": triton_best,
            "fastest_triton_over_sdpa": _ratio(_ms(row, triton_best) if triton_best else None, _ms(row, "sdpa")),
            "fastest": row["fastest"],
        })
    return sorted(laid_out, key=lambda r: (r["lq"], r["lk"], r["problem"]))


def query_light_winners(rows: list[dict]) -> list[dict]:
    """Question (b): per query-light problem, which candidate wins, by query rows (and rows a
    program packs), keys, the default's programs against the SMs, and mask."""
    laid_out = []
    for row in rows:
        if row["kind"] != "query_light":
            continue
        problem = SPEC.parse_shape(row["problem"])
        triton_best = _fastest_triton(row)
        fastest = row["fastest"]
        laid_out.append({
            "problem": row["problem"], "dtype": row["dtype"], "lq": problem.lq, "lk": problem.lk,
            "causal": problem.causal, "group": problem.group,
            "rows_a_program": problem.lq * (problem.group if row["default_packs"] else 1),
            "default_programs": row["default_programs"],
            "programs_over_sms": row["default_programs"] / row["sms"],
            "fastest": fastest, "fastest_triton": triton_best,
            "fastest_triton_config": row["candidates"][triton_best]["config"] if triton_best else None,
            "default_over_best": row["candidates"]["default"]["over_best"],
            "untuned_over_best": row["candidates"]["untuned"]["over_best"],
            "fastest_triton_over_best": row["candidates"][triton_best]["over_best"] if triton_best else None,
        })
    return sorted(laid_out, key=lambda r: (not r["causal"], r["lq"], r["lk"]))


def summary(rows: list[dict]) -> dict:
    return {"candidates": candidate_summary(rows), "prefill_by_rows": sdpa_by_rows(rows, "prefill"),
            "cross_by_rows": sdpa_by_rows(rows, "cross"), "query_light_winners": query_light_winners(rows)}


def _f(value: float | None, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def print_summary(report: dict) -> None:
    s = report["summary"]
    print("\nper candidate (time / the fastest candidate's):")
    for name, c in sorted(s["candidates"].items(), key=lambda item: item[1]["geomean_over_best"]):
        print(f"  {name:20s} {c['problems']:3d} problems  geomean {c['geomean_over_best']:.3f}  worst "
              f"{c['worst_over_best']:.3f}  within 5%: {c['within_5pct']}")
    for title, key in (("(a) span-free Lq = Lk, by query rows", "prefill_by_rows"),
                       ("(a') cross-attention-like Lq ≠ Lk, by query rows", "cross_by_rows")):
        print(f"\n{title}: default / sdpa, the fastest tile of this kernel / sdpa")
        for r in s[key]:
            print(f"  lq {r['lq']:5d} lk {r['lk']:6d} {'causal' if r['causal'] else 'full  '} "
                  f"{r['default_programs']:5d} programs  default {_f(r['default_ms'], 4)} ms  sdpa "
                  f"{_f(r['sdpa_ms'], 4)}  cudnn {_f(r['sdpa_cudnn_ms'], 4)}  default/sdpa "
                  f"{_f(r['default_over_sdpa'])}  best tile {r['fastest_triton']}/sdpa {_f(r['fastest_triton_over_sdpa'])}"
                  f"  fastest {r['fastest']}  [{r['dtype']} {r['problem']}]")
    print("\n(b) query-light: the winner by rows, keys, programs / SMs and mask")
    for r in s["query_light_winners"]:
        print(f"  {'causal' if r['causal'] else 'full  '} lq {r['lq']:4d} ({r['rows_a_program']:4d} rows a program) "
              f"lk {r['lk']:6d}  {r['default_programs']:5d} programs ({r['programs_over_sms']:.2f}x SMs)  fastest "
              f"{r['fastest']}, tile {r['fastest_triton']} ({_f(r['fastest_triton_over_best'])})  default "
              f"{_f(r['default_over_best'])}  untuned {_f(r['untuned_over_best'])}  [{r['dtype']} {r['problem']}]")


# --- rules, scored offline on a results file (--analyze) -----------------------------------------
#
# A rule is a pure function of (problem, results) — results: the row's candidates, name → record —
# that answers a candidate's name, or None where it has nothing to say (then the next rule of a
# composition answers, and in the end today's untuned answer). A rule may ask which candidates
# apply (a name is absent where its config breaks a constraint, which the runtime knows too), never
# how they measured.

Rule = Callable[[AttentionProblem, dict], "str | None"]


def untuned_today(problem: AttentionProblem, results: dict) -> str:
    return "untuned"


def default_config_only(problem: AttentionProblem, results: dict) -> str:
    """This kernel's default everywhere: what SDPA's share of the untuned answer is worth."""
    return "default"


def sdpa_from_rows(problem: AttentionProblem, results: dict, *, rows: int, backend: str = "sdpa") -> str | None:
    """SDPA for span-free problems of ≥ `rows` query rows."""
    return backend if not problem.spans and problem.lq >= rows and backend in results else None


def query_light_tile(problem: AttentionProblem, results: dict, *, tile: str, causal_only: bool = True,
                     min_keys: int = 1000) -> str | None:
    """A candidate (a tile of this kernel, or SDPA) for query-light problems (≤ QUERY_LIGHT_MAX_ROWS
    query rows over ≥ `min_keys` keys; causal only, unless told), where its config applies."""
    if kind_of(problem) != "query_light" or problem.lk < min_keys or (causal_only and not problem.causal):
        return None
    return tile if tile in results else None


def smallest_wide_tile(problem: AttentionProblem, results: dict, *, causal_only: bool = True) -> str | None:
    """For query-light problems, the smallest 128-key tile of 16 or 32 rows that holds a
    program's rows (packed as the default packs; 16 where they are more than 32)."""
    packed = bool(results["default"]["config"]["PACK_GQA"]) and problem.group > 1
    rows_a_program = problem.lq * (problem.group if packed else 1)
    tile = "m32_n128_w4_s3" if 16 < rows_a_program <= 32 else "m16_n128_w4_s3"
    return query_light_tile(problem, results, tile=tile, causal_only=causal_only)


def first_of(problem: AttentionProblem, results: dict, *, rules: tuple[Rule, ...]) -> str:
    """The first rule's answer that is not None, else today's untuned answer."""
    for rule in rules:
        answer = rule(problem, results)
        if answer is not None:
            return answer
    return "untuned"


def _rule(*rules: Rule) -> Rule:
    return functools.partial(first_of, rules=rules)


def _p(fn, **kwargs) -> Rule:
    return functools.partial(fn, **kwargs)


RULES: dict[str, Rule] = {
    "untuned today": untuned_today,
    "default only": default_config_only,
    **{f"sdpa from {n} rows": _rule(_p(sdpa_from_rows, rows=n)) for n in (256, 384, 512, 640, 768, 1024)},
    "sdpa_cudnn from 512 rows": _rule(_p(sdpa_from_rows, rows=512, backend="sdpa_cudnn")),
    **{f"query-light causal: {tile}": _rule(_p(query_light_tile, tile=tile))
       for tile in ("m16_n128_w4_s3", "m32_n128_w4_s3", "m16_n128_w4_s2", "m16_n128_w8_s2", "m16_n64_w4_s3")},
    "query-light causal: smallest 128-key tile": _rule(smallest_wide_tile),
    "query-light causal: sdpa": _rule(_p(query_light_tile, tile="sdpa")),
    "query-light (any mask): m16_n128_w4_s3": _rule(_p(query_light_tile, tile="m16_n128_w4_s3", causal_only=False)),
    "sdpa from 512 + query-light causal m16_n128_w4_s3": _rule(_p(sdpa_from_rows, rows=512),
                                                             _p(query_light_tile, tile="m16_n128_w4_s3")),
    "sdpa from 512 + query-light causal smallest 128-key tile": _rule(_p(sdpa_from_rows, rows=512),
                                                                     smallest_wide_tile),
}


def score(rows: list[dict], rule: Rule) -> dict:
    """How the rule's answers measured: over every problem and over those where it differs from
    today's untuned answer, how many are within 5% of the fastest candidate, the geometric mean
    and the worst of time / fastest; `failed`: answers that did not run or did not match."""
    ratios, changed, failed = [], [], 0
    for row in rows:
        problem = SPEC.parse_shape(row["problem"])
        answer = rule(problem, row["candidates"])
        record = row["candidates"].get(answer)
        ratio = record["over_best"] if record else None
        if ratio is None:
            failed += 1
            continue
        ratios.append(ratio)
        if record["config"] != row["candidates"]["untuned"]["config"]:
            changed.append(ratio)
    return {"problems": len(rows), "within_5pct": sum(x <= 1.05 for x in ratios),
            "geomean_over_best": _geomean(ratios) if ratios else None, "worst_over_best": max(ratios, default=None),
            "changed": len(changed), "changed_within_5pct": sum(x <= 1.05 for x in changed), "failed": failed}


def analyze(rows: list[dict], rules: dict[str, Rule] = RULES) -> dict[str, dict]:
    return {name: score(rows, rule) for name, rule in rules.items()}


def print_analysis(scores: dict[str, dict]) -> None:
    print("\nrules: problems within 5% of the fastest candidate (all; where the rule changes today's answer)")
    for name, s in scores.items():
        print(f"  {name:58s} {s['within_5pct']:3d}/{s['problems']:<3d} changed {s['changed_within_5pct']:3d}/"
              f"{s['changed']:<3d} geomean {_f(s['geomean_over_best'])} worst {_f(s['worst_over_best'])}"
              + (f"  failed {s['failed']}" if s["failed"] else ""))


# --- command line -------------------------------------------------------------------------------

# Small enough for the interpreter, large enough that the rules have something to change: 256 rows
# of prefill (an SDPA threshold), a query-light causal problem over 1,024 keys (the tile rules).
TINY = [
    (A(b=1, h=1, hkv=1, lq=256, lk=256, d=64, causal=True), "fp32"),
    (A(b=1, h=4, hkv=2, lq=2, lk=1024, d=64, causal=True), "fp16"),
    (A(b=1, h=2, hkv=2, lq=1, lk=72, d=64, causal=False), "fp32"),
    (A(b=1, h=2, hkv=1, lq=20, lk=48, d=64, causal=False), "fp16"),
]


def _report(rows: list[dict], *, interpret: bool) -> dict:
    return {"command": " ".join(sys.argv),
            "device": torch.cuda.get_device_name() if torch.cuda.is_available() and not interpret else "cpu",
            "timing": "interpreter: times not representative" if interpret else "CUDA events, L2 flushed, median",
            "versions": {"torch": torch.__version__, "triton": triton.__version__},
            "rows": rows, "summary": summary(rows)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="the results JSON to write")
    parser.add_argument("--analyze", type=Path, metavar="FILE",
                        help="score the candidate rules on a results file (no GPU)")
    parser.add_argument("--tiny", action="store_true",
                        help="check the script on the CPU (TRITON_INTERPRET=1): four small problems, three "
                             "candidates, verified, timed by the interpreter (not representative)")
    parser.add_argument("--workers", type=int, default=max(1, min(14, (os.cpu_count() or 2) - 2)),
                        help="processes compiling ahead (0: compile as measured)")
    parser.add_argument("--repetitions", type=int, default=50)
    args = parser.parse_args(argv)

    if args.analyze:
        report = json.loads(args.analyze.read_text())
        print_summary({"summary": summary(report["rows"])})
        print_analysis(analyze(report["rows"]))
        return 0
    if args.out is None:
        parser.error("--out is required (or --analyze FILE)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    interpret = args.tiny

    def write(rows):
        report = _report(rows, interpret=interpret)
        args.out.write_text(json.dumps(report, indent=1))
        return report

    if args.tiny:
        if os.environ.get("TRITON_INTERPRET") != "1":
            print("--tiny runs under TRITON_INTERPRET=1", file=sys.stderr)
            return 2
        rows = study(TINY, interpret=True, repetitions=1, most_tiles=1, on_row=write)
        if failed_checks(rows):
            return 1
    else:
        if not torch.cuda.is_available():
            print("attention_default_study needs a CUDA GPU (or --tiny under TRITON_INTERPRET=1)", file=sys.stderr)
            return 2
        start = time.perf_counter()
        if args.workers > 0:
            jobs = [(SPEC.problem_key(p), d, c) for p, d in TRAINING
                    for c in measured_once(candidates(p, DTYPES[d]))[0].values() if c["BACKEND"] == "triton"]
            compile_ahead(jobs, args.workers)
        rows = study(TRAINING, interpret=False, repetitions=args.repetitions, on_row=write)
        print(f"study took {time.perf_counter() - start:.0f} s", flush=True)
    report = write(rows)
    print_summary(report)
    print_analysis(analyze(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

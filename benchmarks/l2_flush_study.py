"""What the L2 flush before each timed repetition does to memory-bound figures, on one GPU.

Every timing in omnitune flushes the L2 before the start event, so that a kernel reads its inputs
from HBM as a layer in a model does. Two ways to flush:
  write  zero a 256 MiB buffer (what omnitune did until this study): the L2 is left full of dirty
         lines, which the timed kernel must write back to HBM as its own reads evict them;
  read   read the buffer: the L2 is left holding clean lines, which cost nothing to evict.
For each workload below, the same call is timed with no flush, a read flush and a write flush,
interleaved round-robin (omnitune.profile.timing.time_interleaved with one flusher per entry), so
that the three figures are side by side:
  - a plain read of 32 MiB (fits in the L2: with no flush it is served from the L2, so the flush's
    effect shows) and of 128 MiB (torch.amax);
  - paged decode attention on issue 5's two shapes (bf16): a few configs each, and SDPA over a
    contiguous cache;
  - the KV-cache write on issue 5's shape (65,536 tokens × 8 kv heads × 128), its shipped config,
    and index_copy_.
The copy bandwidth (read + write of 1 GiB, no flush) is measured in the same run: the roof the
KV-cache goals are stated against.

    PYTHONPATH=$PWD python benchmarks/l2_flush_study.py --out $OUT/l2_flush_study_h200.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from omnitune import runtime
from omnitune.kernels import kv_cache_write, paged_decode_attention
from omnitune.profile.calibrate import measure_copy_tbps
from omnitune.profile.device import current_device_facts
from omnitune.profile.timing import L2Flusher, summarize, tbps, time_interleaved
from omnitune.spec import Config

MODES = ("none", "read", "write")
DECODE_SHAPES = {
    "b4_ctx16384": "b=4,h=32,hkv=4,lq=1,ctx=16384,d=128,block_size=16",
    "b64_ctx4096": "b=64,h=28,hkv=4,lq=1,ctx=4096,d=128,block_size=16",
}
PACKED = dict(num_warps=4, PACK_GQA=True)
# Around the shipped config of each shape: the split count and depth that decide the long context.
DECODE_CONFIGS = {
    "b4_ctx16384": {
        "s16_n64_st3": dict(PACKED, NUM_SPLITS=16, BLOCK_N=64, num_stages=3, FUSED_REDUCE=False),
        "s24_n64_st3": dict(PACKED, NUM_SPLITS=24, BLOCK_N=64, num_stages=3, FUSED_REDUCE=False),
        "s32_n64_st2": dict(PACKED, NUM_SPLITS=32, BLOCK_N=64, num_stages=2, FUSED_REDUCE=False),
        "s48_n64_st2": dict(PACKED, NUM_SPLITS=48, BLOCK_N=64, num_stages=2, FUSED_REDUCE=False),
        "s64_n64_st2": dict(PACKED, NUM_SPLITS=64, BLOCK_N=64, num_stages=2, FUSED_REDUCE=False),
        "s64_n128_st2_fused": dict(PACKED, NUM_SPLITS=64, BLOCK_N=128, num_stages=2, FUSED_REDUCE=True),
    },
    "b64_ctx4096": {
        "s2_n64_st2": dict(PACKED, NUM_SPLITS=2, BLOCK_N=64, num_stages=2, FUSED_REDUCE=False),
        "s4_n64_st3_fused": dict(PACKED, NUM_SPLITS=4, BLOCK_N=64, num_stages=3, FUSED_REDUCE=True),
    },
}
KV_WRITE_SHAPE = "t=65536,hkv=8,d=128,block_size=16"


def _flushers() -> dict[str, L2Flusher | None]:
    return {"none": None, "read": L2Flusher(mode="read"), "write": L2Flusher(mode="write")}


def _time_modes(calls: dict[str, object], byte_count: float, copy: float, flushers) -> list[dict]:
    """Each call under each flush mode, all interleaved; one row per (call, mode)."""
    fns, keys = [], []
    for name, fn in calls.items():
        for mode in MODES:
            fns.append(fn)
            keys.append((name, mode))
    samples = time_interleaved(fns, rounds=40, flusher=[flushers[mode] for _, mode in keys])
    rows = []
    for (name, mode), s in zip(keys, samples):
        t = summarize(s)
        rate = tbps(byte_count, t.median_ms)
        rows.append({"name": name, "flush": mode, "time_ms": t.median_ms, "p20_ms": t.p20_ms, "p80_ms": t.p80_ms,
                     "tbps": rate, "pct_of_copy": 100 * rate / copy})
        print(f"  {name:28s} flush={mode:5s} {t.median_ms * 1000:8.1f} µs  {rate:5.2f} TB/s  {100 * rate / copy:5.1f}%",
              flush=True)
    return rows


def _plain_reads(copy: float, flushers) -> list[dict]:
    groups = []
    for mib in (32, 128):
        x = torch.ones(mib * 2**20 // 4, dtype=torch.float32, device="cuda")
        print(f"read {mib} MiB (amax)")
        groups.append({"workload": f"read_{mib}MiB", "bytes": float(x.numel() * 4),
                       "rows": _time_modes({"torch.amax": lambda x=x: x.amax()}, x.numel() * 4, copy, flushers)})
    return groups


def _checked(spec, inputs, out, config: Config, ref) -> None:
    spec.launch(inputs, out, config)
    error = spec.compare(out, ref)
    if error > spec.tolerance[torch.bfloat16]:
        raise SystemExit(f"{spec.name} {config.label()} mismatches the reference: {error:.3g}")


def _paged_decode(copy: float, flushers) -> list[dict]:
    spec = paged_decode_attention.SPEC
    groups = []
    for name, shape in DECODE_SHAPES.items():
        problem = spec.parse_shape(shape)
        inputs = spec.make_inputs(problem, torch.bfloat16, "cuda", 0)
        ref = spec.reference(inputs)
        configs = {label: spec.complete_config(values, problem, torch.bfloat16)
                   for label, values in DECODE_CONFIGS[name].items()}
        configs["shipped"] = runtime.get_config(spec.name, problem, torch.bfloat16)
        calls = {}
        for label, cfg in configs.items():
            out = spec.new_output(inputs)
            _checked(spec, inputs, out, cfg, ref)
            calls[label] = lambda cfg=cfg, out=out: spec.launch(inputs, out, cfg)
        sdpa = spec.baselines(problem)["sdpa_contiguous_cache"]  # made once: it builds the contiguous cache
        calls["sdpa_contiguous_cache"] = lambda: sdpa(inputs)
        print(f"paged decode {name}")
        byte_count = spec.bytes_moved(problem, torch.bfloat16)
        groups.append({"workload": f"paged_decode_{name}", "shape": shape, "bytes": byte_count,
                       "configs": {label: cfg.as_dict() for label, cfg in configs.items()},
                       "rows": _time_modes(calls, byte_count, copy, flushers)})
        del inputs, ref
    return groups


def _kv_write(copy: float, flushers) -> dict:
    spec = kv_cache_write.SPEC
    problem = spec.parse_shape(KV_WRITE_SHAPE)
    inputs = spec.make_inputs(problem, torch.bfloat16, "cuda", 0)
    cfg = runtime.get_config(spec.name, problem, torch.bfloat16)
    out = spec.new_output(inputs)
    spec.launch(inputs, out, cfg)
    calls = {"shipped": lambda: spec.launch(inputs, out, cfg)}
    for label, baseline in spec.baselines(problem).items():
        calls[label] = lambda baseline=baseline: baseline(inputs)
    print("kv cache write")
    byte_count = spec.bytes_moved(problem, torch.bfloat16)
    return {"workload": "kv_cache_write", "shape": KV_WRITE_SHAPE, "bytes": byte_count, "config": cfg.as_dict(),
            "rows": _time_modes(calls, byte_count, copy, flushers)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON results file to write")
    args = parser.parse_args()
    started = time.perf_counter()
    copy, copy_detail = measure_copy_tbps("cuda")
    print(f"copy bandwidth (read + write, 1 GiB, no flush): {copy:.3f} TB/s")
    flushers = _flushers()
    groups = _plain_reads(copy, flushers) + _paged_decode(copy, flushers) + [_kv_write(copy, flushers)]
    args.out.write_text(json.dumps({
        "command": "python benchmarks/l2_flush_study.py --out " + str(args.out),
        "device": current_device_facts().as_dict(), "copy_tbps": copy, "copy_detail": copy_detail,
        "modes": MODES, "groups": groups, "wall_s": time.perf_counter() - started,
    }, indent=1) + "\n")


if __name__ == "__main__":
    main()

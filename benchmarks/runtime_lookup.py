"""Host time of a cached omnitune.runtime lookup, as a serving engine makes one on every call.

A decode loop looks its config up once per step with a context one token longer each time: the
runtime buckets the context before its cache, so every step after the first in a bucket is a
cache hit. Timed with timeit on the CPU (no GPU needed: the device is named, the shipped tables
are read), best of several repeats.

    python benchmarks/runtime_lookup.py
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import timeit

import torch

import omnitune.runtime as runtime
from omnitune.kernels.attention import AttentionProblem
from omnitune.kernels.kv_cache_write import KVCacheWriteProblem
from omnitune.kernels.paged_decode_attention import PagedDecodeProblem

DEVICE = "NVIDIA H200"


def per_call_ns(call, number: int, repeat: int) -> float:
    return min(timeit.repeat(call, number=number, repeat=repeat)) / number * 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()

    step = PagedDecodeProblem(b=64, h=28, hkv=4, lq=1, ctx=4097, d=128)
    steps = itertools.cycle([dataclasses.replace(step, ctx=c) for c in range(4097, 5121)])  # one bucket
    prefill = AttentionProblem(b=1, h=28, hkv=4, lq=2048, lk=2048, d=128, causal=True)
    write = KVCacheWriteProblem(t=256, hkv=4, d=128)
    cases = {
        "paged_decode_attention, a decode loop (ctx 4097..5120)": lambda: runtime.get_config(
            "paged_decode_attention", next(steps), torch.bfloat16, DEVICE),
        "paged_decode_attention, one problem": lambda: runtime.get_config(
            "paged_decode_attention", step, torch.bfloat16, DEVICE),
        "attention, prefill l=2048": lambda: runtime.get_config("attention", prefill, torch.bfloat16, DEVICE),
        "kv_cache_write, 256 tokens": lambda: runtime.get_config("kv_cache_write", write, torch.bfloat16, DEVICE),
    }
    baseline = per_call_ns(lambda: next(steps), args.number, args.repeat)  # what building the argument costs
    print(f"cached runtime.get_config, ns per call (best of {args.repeat} × {args.number:,}):")
    for name, call in cases.items():
        call()  # the first call resolves and caches
        ns = per_call_ns(call, args.number, args.repeat)
        if "decode loop" in name:
            ns -= baseline
        print(f"  {ns:7.0f}  {name}")


if __name__ == "__main__":
    main()

"""Long prefill as users call it (issue 15's shapes): the public `attention()` with the shipped
tables beside SDPA's cuDNN backend and its default dispatch, called the same way — eager back to
back and as CUDA-graph replays, in one run (benchmarks/ops_bench.py's method). b1, 32 query heads
over 4 and 24 over 24, 8k and 16k tokens, causal and not, bf16, head dim 128. Each case's notes
name the config the runtime picked.

    PYTHONPATH=$PWD python benchmarks/prefill_bench.py --out $OUT/prefill_bench_h200.json
    OMNITUNE_CONFIG_DIR=DIR ... (tables to judge, ahead of the shipped ones)
"""

from __future__ import annotations

from ops_bench import attention_case, cases_main

# The shapes of issue 15's goal: (heads, kv heads, length, causal).
SHAPES = [(h, hkv, l, causal) for h, hkv in ((32, 4), (24, 24)) for l in (8192, 16384) for causal in (True, False)]


def cases(device) -> list:
    # Calls take 1–7 ms: 20 eager calls and 2 replays of a 10-call graph per round are enough.
    return [lambda h=h, hkv=hkv, l=l, causal=causal: attention_case(device, h=h, hkv=hkv, l=l, causal=causal, calls=20,
                                                                     graph_replays=2)
            for h, hkv, l, causal in SHAPES]


def main(argv=None) -> int:
    return cases_main(__doc__.splitlines()[0], "prefill_bench", cases, argv)


if __name__ == "__main__":
    raise SystemExit(main())

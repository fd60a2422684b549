"""Long prefill as users call it (issue 15's shapes): the public `attention()` with the shipped
tables beside SDPA's cuDNN backend and its default dispatch, called the same way — eager back to
back and as CUDA-graph replays, in one run (benchmarks/ops_bench.py's method). b1, 32 query heads
over 4 and 24 over 24, 8k and 16k tokens, causal and not, bf16, head dim 128. Each case's notes
name the config the runtime picked.

    PYTHONPATH=$PWD python benchmarks/prefill_bench.py --out $OUT/prefill_bench_h200.json
    OMNITUNE_CONFIG_DIR=DIR ... (tables to judge, ahead of the shipped ones)
    PYTHONPATH=$PWD python benchmarks/prefill_bench.py --gluon --out F   # + the Gluon kernel, + UNTUNED

--gluon adds, to every case, the op called with the Gluon ping-pong kernel's config given
explicitly (BACKEND=gluon_pingpong, 128-key tiles, 2 stages: its measured winner; sm_90 only), and
adds UNTUNED's shapes: lengths no table holds and no multiple of 128, and cross-attention with
Lq ≠ Lk (not causal: SDPA's is_causal is top-left aligned, the op's bottom-right), and SPANS:
causal prefill with image spans, beside SDPA over the dense mask they make. Every --gluon case also
times the Gluon config (and a tables' pick of the Triton kernel with USE_TMA) launched with its TMA
descriptors built and encoded on every call, as the op did before it kept them (*_descriptors_per_call):
the same run's baseline for the host time the kept tensor maps save.
"""

from __future__ import annotations

import sys

from omnitune.kernels.attention import GLUON_WINNER

from ops_bench import attention_case, cases_main

# The shapes of issue 15's goal: (batch, heads, kv heads, query length, key length, causal).
SHAPES = [(1, h, hkv, n, n, causal) for h, hkv in ((32, 4), (24, 24)) for n in (8192, 16384)
          for causal in (True, False)]
# Shapes nobody tuned: odd lengths (no multiple of 128), batches, and cross-attention (Lq ≠ Lk,
# 32k queries over 512 text tokens as issue 14's extreme, and the reverse).
UNTUNED = [(1, 32, 4, 6000, 6000, True), (2, 28, 4, 3000, 3000, True), (1, 28, 4, 1000, 1000, True),
           (1, 24, 24, 4680, 4680, False), (4, 16, 2, 2100, 2100, False), (1, 32, 4, 4096, 1500, False),
           (1, 32, 4, 256, 8192, False), (1, 32, 32, 32768, 512, False)]
# The presets' prefill with image spans (docs/presets: 512² and 448² images, 256 tokens each), one
# span a sequence: (batch, heads, kv heads, length, spans).
SPANS = [(1, 28, 4, 8510, [(1024, 1280)]), (1, 28, 4, 765, [(384, 640)]), (2, 16, 2, 4096, [(512, 768), (2048, 2304)])]
GLUON = {"omnitune_gluon": dict(GLUON_WINNER)}


def cases(device, gluon: bool = False) -> list:
    # Calls take 1–7 ms: 20 eager calls and 2 replays of a 10-call graph per round are enough.
    plain = [lambda b=b, h=h, hkv=hkv, lq=lq, lk=lk, causal=causal: attention_case(
                 device, b=b, h=h, hkv=hkv, l=lq, lk=lk, causal=causal, calls=20, graph_replays=2,
                 configs=GLUON if gluon else None)
             for b, h, hkv, lq, lk, causal in SHAPES + (UNTUNED if gluon else [])]
    spans = [lambda b=b, h=h, hkv=hkv, n=n, spans=spans: attention_case(
                 device, b=b, h=h, hkv=hkv, l=n, spans=spans, calls=20, graph_replays=2, configs=GLUON)
             for b, h, hkv, n, spans in (SPANS if gluon else [])]
    return [with_descriptors_per_call(make) for make in plain + spans] if gluon else plain


def with_descriptors_per_call(make):
    """The case `make` builds, plus the op with the Gluon config — and the op with the tables'
    pick where that pick loads K/V through TMA — launched as before omnitune/kernels/_tma_launch.py,
    their descriptors built and encoded on every call: the same run's baseline for the host time
    the kept tensor maps save."""
    def made():
        case = make()
        case.impls["omnitune_gluon_descriptors_per_call"] = descriptors_per_call(case.impls["omnitune_gluon"])
        if "USE_TMA=1" in case.notes and "BACKEND=triton" in case.notes:
            case.impls["omnitune_descriptors_per_call"] = descriptors_per_call(case.impls["omnitune"])
        return case
    return made


def descriptors_per_call(call):
    """`call` with every TmaLaunch taking its bound launcher's path: descriptors built, keyed and
    encoded on every launch."""
    from omnitune.kernels._tma_launch import TmaLaunch

    def run():
        kept = TmaLaunch.__call__
        TmaLaunch.__call__ = lambda self, grid, args: self._bound(grid, self._bound_args(args))
        try:
            return call()
        finally:
            TmaLaunch.__call__ = kept
    return run


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    gluon = "--gluon" in argv
    if gluon:
        argv.remove("--gluon")
    return cases_main(__doc__.splitlines()[0], "prefill_bench", lambda device: cases(device, gluon), argv)


if __name__ == "__main__":
    raise SystemExit(main())

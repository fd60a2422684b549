"""Training problems: shapes searched so that the shipped tables (their entries, and the predictor
block export fits over every stored trial) cover more than the presets, chosen apart from the
held-out set that judges those tables (benchmarks/coverage_set.py, issue 14) and from the preset
points. tests/test_training_set.py holds them apart, valid and distinct.

The held-out problems were answered mostly by the default config: the H200 tables hold the
presets' points alone (paged decode: batch 1-64, one query token, pages of 16; kv_compress: one
entry; attention: the presets' prefill and decode shapes), and the runtime's nearest rung and its
predictor have nothing near most other shapes. Each kernel's list below spans what its held-out
list spans, at other points. Attention's are the problems its default study chose its untuned
rules on (benchmarks/attention_default_study.py).

    python benchmarks/training_set.py kv_compress bf16     # its bf16 problems as --shape arguments
    omnitune search kv_compress $(python benchmarks/training_set.py kv_compress bf16) -n 40
"""

from __future__ import annotations

import sys

from omnitune.kernels.attention import AttentionProblem
from omnitune.kernels.kv_compress import KVCompressProblem
from omnitune.kernels.paged_decode_attention import PagedDecodeProblem

A = AttentionProblem
# Chosen for attention's default study (benchmarks/attention_default_study.py), which measures its
# untuned rules on them: three families the held-out misses fell in, at other points.
ATTENTION = [
    # (a) span-free prefill, Lq = Lk: where SDPA starts beating the default
    (A(b=8, h=32, hkv=8, lq=256, lk=256, d=128, causal=True), "bf16"),
    (A(b=16, h=16, hkv=16, lq=320, lk=320, d=64, causal=False), "bf16"),
    (A(b=4, h=28, hkv=4, lq=384, lk=384, d=128, causal=True), "bf16"),
    (A(b=2, h=32, hkv=4, lq=512, lk=512, d=128, causal=True), "bf16"),
    (A(b=4, h=16, hkv=16, lq=576, lk=576, d=64, causal=False), "fp16"),
    (A(b=1, h=40, hkv=8, lq=640, lk=640, d=128, causal=True), "bf16"),
    (A(b=2, h=24, hkv=24, lq=768, lk=768, d=128, causal=False), "bf16"),
    (A(b=4, h=32, hkv=8, lq=896, lk=896, d=128, causal=True), "fp16"),
    (A(b=1, h=64, hkv=8, lq=1024, lk=1024, d=128, causal=True), "bf16"),
    (A(b=8, h=28, hkv=4, lq=1200, lk=1200, d=128, causal=True), "bf16"),
    (A(b=1, h=16, hkv=2, lq=1500, lk=1500, d=128, causal=True), "bf16"),
    # (b) query-light: 1–160 query rows over long keys; grids from 4 programs to ~10x the SMs
    (A(b=1, h=32, hkv=8, lq=1, lk=12000, d=128, causal=False), "bf16"),
    (A(b=32, h=16, hkv=2, lq=1, lk=1200, d=128, causal=False), "bf16"),
    (A(b=1, h=28, hkv=4, lq=64, lk=20000, d=128, causal=False), "bf16"),
    (A(b=8, h=32, hkv=8, lq=4, lk=4000, d=128, causal=True), "bf16"),
    (A(b=16, h=32, hkv=4, lq=2, lk=3500, d=128, causal=True), "fp16"),
    (A(b=2, h=16, hkv=2, lq=8, lk=5000, d=128, causal=True), "bf16"),
    (A(b=12, h=32, hkv=4, lq=24, lk=4500, d=128, causal=True), "bf16"),
    (A(b=4, h=28, hkv=4, lq=16, lk=6000, d=128, causal=True), "bf16"),
    (A(b=32, h=32, hkv=8, lq=8, lk=1500, d=128, causal=True), "bf16"),
    (A(b=4, h=16, hkv=16, lq=32, lk=8000, d=64, causal=True), "bf16"),
    (A(b=4, h=8, hkv=1, lq=3, lk=10000, d=64, causal=True), "fp16"),
    (A(b=24, h=28, hkv=4, lq=80, lk=3300, d=128, causal=True), "bf16"),
    (A(b=1, h=64, hkv=8, lq=128, lk=16000, d=128, causal=True), "bf16"),
    (A(b=8, h=24, hkv=8, lq=160, lk=2500, d=128, causal=True), "fp16"),
    # (c) cross-attention-like, Lq ≠ Lk: hundreds of queries over thousands of keys
    (A(b=1, h=32, hkv=8, lq=256, lk=16000, d=128, causal=False), "bf16"),
    (A(b=2, h=28, hkv=4, lq=1024, lk=4096, d=128, causal=False), "bf16"),
    (A(b=1, h=16, hkv=2, lq=640, lk=24000, d=128, causal=True), "bf16"),
    (A(b=4, h=32, hkv=4, lq=384, lk=8192, d=128, causal=True), "fp16"),
]

P = PagedDecodeProblem
# A spread over what the held-out set spans (batch 1-128, 1-16 query tokens, 1k-128k contexts,
# pages of 16, 32 and 64 tokens, head dims 64 and 128, other models' heads), where the table holds
# only the presets' points (batch 1-64, one query token, 4k-64k, pages of 16, head dim 128).
PAGED_DECODE = [
    (P(b=1, h=32, hkv=8, lq=1, ctx=24000, d=128, block_size=16), "bf16"),
    (P(b=1, h=28, hkv=4, lq=1, ctx=98304, d=128, block_size=32), "bf16"),
    (P(b=1, h=40, hkv=8, lq=4, ctx=40000, d=128, block_size=64), "bf16"),
    (P(b=2, h=16, hkv=2, lq=1, ctx=120000, d=128, block_size=16), "bf16"),
    (P(b=2, h=64, hkv=8, lq=2, ctx=16000, d=128, block_size=32), "fp16"),
    (P(b=3, h=28, hkv=4, lq=1, ctx=45000, d=128, block_size=64), "bf16"),
    (P(b=6, h=24, hkv=8, lq=1, ctx=10000, d=128, block_size=16), "bf16"),
    (P(b=6, h=16, hkv=16, lq=1, ctx=20000, d=64, block_size=32), "bf16"),
    (P(b=8, h=32, hkv=4, lq=8, ctx=6000, d=128, block_size=16), "bf16"),
    (P(b=10, h=28, hkv=4, lq=2, ctx=12000, d=128, block_size=64), "fp16"),
    (P(b=16, h=40, hkv=8, lq=1, ctx=9000, d=128, block_size=32), "bf16"),
    (P(b=16, h=32, hkv=8, lq=4, ctx=3500, d=128, block_size=16), "bf16"),
    (P(b=20, h=16, hkv=2, lq=1, ctx=5000, d=64, block_size=16), "bf16"),
    (P(b=32, h=24, hkv=4, lq=1, ctx=7000, d=128, block_size=64), "bf16"),
    (P(b=32, h=28, hkv=4, lq=1, ctx=3000, d=128, block_size=32), "fp16"),
    (P(b=40, h=32, hkv=8, lq=1, ctx=2200, d=128, block_size=16), "bf16"),
    (P(b=64, h=40, hkv=8, lq=1, ctx=6000, d=128, block_size=16), "bf16"),
    (P(b=64, h=28, hkv=4, lq=2, ctx=2048, d=128, block_size=32), "bf16"),
    (P(b=80, h=16, hkv=4, lq=1, ctx=3000, d=64, block_size=16), "fp16"),
    (P(b=128, h=32, hkv=8, lq=1, ctx=2000, d=128, block_size=64), "bf16"),
    (P(b=128, h=28, hkv=4, lq=1, ctx=1024, d=128, block_size=16), "fp16"),
    (P(b=4, h=28, hkv=4, lq=16, ctx=9000, d=128, block_size=16), "bf16"),
    (P(b=2, h=64, hkv=8, lq=8, ctx=25000, d=128, block_size=16), "bf16"),
    (P(b=12, h=28, hkv=4, lq=1, ctx=30000, d=128, block_size=16), "bf16"),
]


C = KVCompressProblem
# Its table held one entry (b4 h28/4 over 3,072 tokens), and the default missed by 6-16% on long
# single sequences of the held-out set (round 21).
KV_COMPRESS = [
    (C(b=b, h=h, hkv=hkv, n=n, d=d, window=window, recent=recent, keep_pct=keep, merge=merge), dtype)
    for b, h, hkv, n, d, window, recent, keep, merge, dtype in (
        (1, 28, 4, 4096, 128, 32, 0, 30, "average", "bf16"), (1, 32, 8, 8000, 128, 32, 32, 20, "pivotal", "bf16"),
        (1, 16, 2, 12288, 128, 64, 0, 15, "average", "bf16"), (1, 40, 8, 18000, 128, 32, 16, 20, "weighted", "bf16"),
        (1, 28, 4, 24576, 128, 32, 0, 10, "average", "bf16"), (1, 32, 4, 32768, 128, 48, 32, 15, "none", "bf16"),
        (1, 24, 24, 6000, 64, 32, 0, 30, "average", "bf16"), (1, 64, 8, 10000, 128, 32, 64, 25, "average", "fp16"),
        (2, 28, 4, 2048, 128, 16, 16, 40, "average", "bf16"), (2, 16, 16, 5000, 64, 32, 0, 35, "pivotal", "fp16"),
        (2, 40, 8, 9000, 128, 64, 32, 20, "average", "bf16"), (3, 32, 8, 3000, 128, 32, 0, 50, "weighted", "bf16"),
        (4, 24, 8, 2500, 64, 32, 16, 30, "none", "bf16"), (4, 28, 4, 6000, 128, 32, 32, 25, "average", "fp16"),
        (6, 64, 8, 1536, 128, 16, 0, 45, "average", "bf16"), (8, 16, 2, 1024, 128, 32, 32, 60, "pivotal", "bf16"),
    )
]

TRAINING = {"attention": ATTENTION, "paged_decode_attention": PAGED_DECODE, "kv_compress": KV_COMPRESS}


def shape_arguments(kernel: str, dtype: str) -> list[str]:
    """The kernel's training problems of one dtype as `omnitune search` arguments."""
    from omnitune.registry import get_spec

    spec = get_spec(kernel)
    arguments: list[str] = []
    for problem, dtype_name in TRAINING[kernel]:
        if dtype_name == dtype:
            arguments += ["--shape", spec.problem_key(problem)]
    return arguments


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in TRAINING:
        print(f"usage: python benchmarks/training_set.py KERNEL DTYPE (KERNEL: {', '.join(TRAINING)})",
              file=sys.stderr)
        return 2
    arguments = shape_arguments(*argv)
    if not arguments:
        print(f"{argv[0]} has no {argv[1]} training problem", file=sys.stderr)
        return 2
    print(" ".join(arguments))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

"""Training problems: shapes searched so that the shipped tables (their entries and the predictor
block export fits over every stored trial) cover more than the presets, chosen apart from the
held-out set that judges those tables (benchmarks/coverage_set.py, issue 14) and from the preset
points. tests/test_training_set.py holds them apart, valid and distinct.

kv_compress: no preset produces its traffic, and its H200 table held one entry (b4 h28/4 over 3,072
tokens), so the runtime answered every other problem with the default; on the held-out set the
default missed by 6–16% on long single sequences (round 21). These sixteen span what the held-out
set spans — batch 1 to 8, 16 to 64 query heads over 2 to 16 kv heads, head dims 64 and 128,
1,024 to 32,768 tokens, every merge mode, windows of 16 to 64 queries, bf16 and fp16 — at other
points, long single sequences among them. (Attention's training problems belong to its default
study: benchmarks/attention_default_study.py.)

    python benchmarks/training_set.py kv_compress bf16     # its bf16 problems as --shape arguments
    omnitune search kv_compress $(python benchmarks/training_set.py kv_compress bf16) -n 40
"""

from __future__ import annotations

import sys

from omnitune.kernels.kv_compress import KVCompressProblem

C = KVCompressProblem
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

TRAINING = {"kv_compress": KV_COMPRESS}


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

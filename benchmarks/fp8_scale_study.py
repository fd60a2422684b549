"""Per-tensor or per-kv-head scales for an fp8 KV cache: what each costs in accuracy.

e4m3 is a floating-point format, so its relative precision (3 mantissa bits) does not depend on
the scale as long as a value stays in its normal range (≥ 2^-6 of the scale's unit): one scale
for the whole cache loses nothing on heads whose magnitudes differ, until a head is so much
smaller than the largest that its values fall into e4m3's subnormals or flush to zero. This
study measures where that happens: keys with one head scaled down by a factor (the "spread",
1 to 10^5), quantized with one scale per tensor and with one per kv head (each amax / 448),
and the relative error (Frobenius, float64) of the dequantized keys — over all heads, and for
the small head alone — and of decode attention outputs over them (float64 reference math, no
kernel: this is about the format). Real K activations differ per head by one to two orders of
magnitude (outlier channels), which is inside the range where both choices agree.

Numerics only, so it runs on the CPU (PyTorch's quantization is the kernels', bit for bit:
tests/test_fp8_kv_cache.py):

    PYTHONPATH=$PWD python benchmarks/fp8_scale_study.py --out benchmarks/results/fp8_scale_study.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from omnitune.kernels import _fp8

SPREADS = (1, 10, 100, 1_000, 10_000, 100_000)
TOKENS, HEADS, DIM, QUERY_HEADS_PER_KV = 4096, 4, 128, 7


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    # q [H, D] (one decode token per query head), k/v [T, Hkv, D]
    k = k.permute(1, 0, 2).repeat_interleave(QUERY_HEADS_PER_KV, 0)
    v = v.permute(1, 0, 2).repeat_interleave(QUERY_HEADS_PER_KV, 0)
    scores = torch.einsum("hd,htd->ht", q, k) / DIM ** 0.5
    return torch.einsum("ht,htd->hd", scores.softmax(-1), v)


def study(seed: int = 0) -> list[dict]:
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for spread in SPREADS:
        magnitude = torch.ones(HEADS, dtype=torch.float64)
        magnitude[-1] = 1.0 / spread
        k = torch.randn(TOKENS, HEADS, DIM, generator=gen, dtype=torch.float64) * magnitude.view(1, -1, 1)
        v = torch.randn(TOKENS, HEADS, DIM, generator=gen, dtype=torch.float64) * magnitude.view(1, -1, 1)
        # Queries scaled inversely to their kv head's keys, so that every head's scores are O(1):
        # the small head's attention is as sharp as the others', not uniform.
        q = torch.randn(HEADS * QUERY_HEADS_PER_KV, DIM, generator=gen, dtype=torch.float64)
        q = q / magnitude.repeat_interleave(QUERY_HEADS_PER_KV).view(-1, 1)
        exact = _attention(q, k, v)
        row = {"spread": spread}
        for name, per_head in (("per_tensor", False), ("per_head", True)):
            ks, vs = _fp8.kv_cache_scale(k, per_head=per_head), _fp8.kv_cache_scale(v, per_head=per_head)
            kq = _fp8.dequantize(_fp8.quantize(k, ks), ks, torch.float64)
            vq = _fp8.dequantize(_fp8.quantize(v, vs), vs, torch.float64)
            small = slice(HEADS * QUERY_HEADS_PER_KV - QUERY_HEADS_PER_KV, None)
            row[name] = {
                "keys_rel_error": _rel(kq, k),
                "small_head_keys_rel_error": _rel(kq[:, -1], k[:, -1]),
                "small_head_zeroed_fraction": float((kq[:, -1] == 0).double().mean()),
                "decode_output_rel_error": _rel(_attention(q, kq, vq), exact),
                "small_head_decode_output_rel_error": _rel(_attention(q, kq, vq)[small], exact[small]),
            }
        rows.append(row)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    rows = study()
    report = {"command": " ".join(sys.argv), "measured_on": "CPU, float64 (numerics of the format, not speed)",
              "tokens": TOKENS, "kv_heads": HEADS, "head_dim": DIM, "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"{'spread':>8}  {'small-head key error: per tensor / per head':>46}  {'small-head output error':>26}")
    for r in rows:
        t, h = r["per_tensor"], r["per_head"]
        print(f"{r['spread']:>8}  {t['small_head_keys_rel_error']:>22.4f} / {h['small_head_keys_rel_error']:<21.4f}  "
              f"{t['small_head_decode_output_rel_error']:>12.4f} / {h['small_head_decode_output_rel_error']:<12.4f}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""kv_compress fidelity on the CPU: does thresholded merging beat, tie or lose to no merging?

The benchmark's structured cache (kv_compress_bench.make_cache: topic directions a tenth of the
keys carry, image tokens in runs of 4 near-duplicate patches, audio in runs of 2) at the
Qwen2.5-Omni layout's token counts and head dim (3,058 tokens, D 128: cosine similarities depend
on D), but one sequence and fewer heads, in fp32. The compression is the float64 reference
(kv_compress.SPEC.reference: pure PyTorch, the same selection and merge rules as the kernels), so
no GPU and no interpreter is needed. For each merge mode and merge threshold, and for "none" and
the benchmark's equal-budget baselines (random eviction, recent only), it prints the relative
error of held-out attention outputs over the compressed cache against the full cache, at the
default budgets (image 0.4, audio 0.3), averaged over a few seeds; and the share of evicted
tokens each threshold merges. A fidelity check of the rules, not a timing.

    PYTHONPATH=$PWD python benchmarks/kv_compress_fidelity_cpu.py --out /tmp/kvc_fidelity.json

About 20 s on a 2-core CPU with the defaults (3 seeds).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kv_compress_bench as bench  # noqa: E402  (the cache generator and the baselines)

from omnitune.kernels import kv_compress as kvc  # noqa: E402
from omnitune.kernels.kv_compress import KVCompressInputs, Modality  # noqa: E402
from omnitune.spec import relative_error  # noqa: E402

THRESHOLDS = (-1.0, 0.5, 0.7, 0.8, 0.85, 0.9)
MERGING = ("average", "pivotal", "weighted")


def reduced_layout(heads: int, kv_heads: int) -> bench.Layout:
    """The benchmark's Qwen2.5-Omni cache (same spans, D, window, recent), one sequence."""
    return replace(bench.omni_layout(), b=1, h=heads, hkv=kv_heads)


def merged_share(inputs: KVCompressInputs, threshold: float) -> float:
    """Of the evicted tokens that have a kept token of their modality, the share whose best
    cosine similarity reaches the threshold (what that threshold merges), float64."""
    scores = kvc.reference_importance(inputs.q_window, inputs.k, inputs.sm_scale)
    keep = kvc.select_tokens(scores, inputs.modality, inputs.quotas, inputs.recent)
    merged = total = 0
    for bi in range(keep.shape[0]):
        for hk in range(keep.shape[1]):
            mods = inputs.modality[bi]
            kept = keep[bi, hk].nonzero().flatten()
            evicted = (~keep[bi, hk] & (mods != Modality.TEXT)).nonzero().flatten()
            unit = torch.nn.functional.normalize(inputs.k[bi, hk].double(), dim=-1)
            sim = (unit[evicted] @ unit[kept].T).masked_fill(mods[evicted][:, None] != mods[kept][None, :],
                                                            float("-inf"))
            best = sim.max(dim=1).values
            has_pivot = torch.isfinite(best)
            total += int(has_pivot.sum())
            merged += int((has_pivot & ((threshold <= -1) | (best >= threshold))).sum())
    return merged / max(1, total)


def one_seed(lay: bench.Layout, seed: int, budget: dict) -> dict:
    q_window, q_held, k, v, modality = bench.make_cache(lay, torch.float32, "cpu", seed=seed)
    full = bench.attend(q_held, k, v)
    quotas = kvc._quotas(modality, budget, lay.recent)
    base = KVCompressInputs(q_window, k, v, modality, quotas, lay.recent, 1 / math.sqrt(lay.d), "none")

    def error(inputs):
        out = kvc.SPEC.reference(inputs)
        keep = kvc.select_tokens(kvc.reference_importance(q_window, k, inputs.sm_scale), modality, quotas, lay.recent)
        lengths = keep.sum(-1)[:, 0]
        return relative_error(bench.attend(q_held, out[0].float(), out[1].float(), lengths), full)

    rows = {"none": error(base)}
    for mode in MERGING:
        for t in THRESHOLDS:
            rows[f"{mode}@{t:g}"] = error(replace(base, merge=mode, merge_threshold=t))
    keep = kvc.select_tokens(kvc.reference_importance(q_window, k, base.sm_scale), modality, quotas, lay.recent)
    gen = torch.Generator().manual_seed(seed + 1000)
    keep_random = kvc.select_tokens(torch.rand(keep.shape, generator=gen), modality, quotas, lay.recent)
    kk, vv, ln, _ = bench.gather_kept(k, v, keep_random)
    rows["random eviction"] = relative_error(bench.attend(q_held, kk, vv, ln), full)
    n = k.shape[2]
    keep_recent = torch.arange(n)[None, None, :] >= (n - keep.sum(-1, keepdim=True))
    kk, vv, ln, _ = bench.gather_kept(k, v, keep_recent)
    rows["keep recent only"] = relative_error(bench.attend(q_held, kk, vv, ln), full)
    shares = {f"{t:g}": merged_share(base, t) for t in THRESHOLDS}
    return {"rel_error": rows, "merged_share": shares}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON results file to write")
    parser.add_argument("--seeds", type=int, default=3, help="caches to average over (default 3)")
    parser.add_argument("--heads", type=int, default=14, help="query heads (default 14)")
    parser.add_argument("--kv-heads", type=int, default=2, help="kv heads (default 2)")
    args = parser.parse_args()
    started = time.perf_counter()
    lay = reduced_layout(args.heads, args.kv_heads)
    budget = bench.DEFAULT_BUDGET
    per_seed = [one_seed(lay, seed, budget) for seed in range(args.seeds)]
    mean = {row: sum(s["rel_error"][row] for s in per_seed) / len(per_seed) for row in per_seed[0]["rel_error"]}
    shares = {t: sum(s["merged_share"][t] for s in per_seed) / len(per_seed) for t in per_seed[0]["merged_share"]}
    print(f"cache: b=1 h={lay.h}/{lay.hkv} d={lay.d} n={lay.n}, fp32 in, float64 reference; budget {budget}; "
          f"{args.seeds} seeds")
    print("held-out attention rel. error (mean over seeds):")
    print(f"  {'threshold':>9s} " + " ".join(f"{m:>9s}" for m in MERGING) + "   merged share")
    for t in THRESHOLDS:
        print(f"  {t:9g} " + " ".join(f"{mean[f'{m}@{t:g}']:9.4f}" for m in MERGING) + f"   {shares[f'{t:g}']:.3f}")
    print(f"  none {mean['none']:.4f}; random eviction {mean['random eviction']:.4f}; "
          f"keep recent only {mean['keep recent only']:.4f}")
    payload = {
        "command": f"python benchmarks/kv_compress_fidelity_cpu.py --seeds {args.seeds} --heads {args.heads} "
                   f"--kv-heads {args.kv_heads} --out {args.out}",
        "layout": {"b": 1, "h": lay.h, "hkv": lay.hkv, "d": lay.d, "n": lay.n, "window": lay.window,
                   "recent": lay.recent, "spans": [[m.name.lower(), t, r] for m, t, r in lay.spans]},
        "budget": budget, "thresholds": THRESHOLDS, "mean_rel_error": mean, "merged_share": shares,
        "per_seed": per_seed, "wall_s": time.perf_counter() - started,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")
    print(f"wrote {args.out} in {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()

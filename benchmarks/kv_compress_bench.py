"""kv_compress on a realistic multimodal cache: throughput, bytes saved, modality shares, fidelity.

Cache (Qwen2.5-Omni-7B thinker: 28 query heads over 4 kv heads, head dim 128, bf16, batch 4):
text 1,536 tokens, one 512² image (the preset's count: 18² = 324 tokens), text 64, 30 s of
audio (25 tokens/s: 750), text 384 whose last 32 are the observation window: 3,058 tokens.

Structure (random K/V would make attention nearly uniform and every fidelity number meaningless).
Per (sequence, kv head) there are R = 8 orthonormal topic directions u_r. Every key is Gaussian
noise (norm ≈ √D); a salient tenth of all tokens also carries a·u_r for a random topic r, and
every query carries a·u_r for one topic, with a = √(G·√D): a query's scaled score of the salient
keys of its topic rises by G = 6 (its other scores have a spread of about 1), so each query
attends strongly to a few dozen tokens. Image tokens come in runs of 4 neighbouring patches
sharing a base key and value (plus 0.3 noise), audio in runs of 2, so a token merged into its most
similar kept token loses little. The window queries and the held-out queries are independent
draws from the same topic mix: what the window marks important is what later queries need, as in
a real prompt. Values are Gaussian (shared per run, as above).

Measured (bf16, CUDA events, L2 flushed): the score accumulation (omnitune.kernels.kv_compress.
importance: its two kernels), the selection and compaction in PyTorch (select_tokens and the
kept/evicted positions, from given scores), the merge kernel alone (plain at the default merge
threshold and at -1, where every evicted token merges; similarity-weighted), and the whole
compress_kv call in each merge mode (average, pivotal, weighted, none; default threshold); ms and GB/s
of cache read (the full K and V, 2·B·Hkv·N·D·2 bytes, over the time; the score pass reads only K,
so its GB/s count K alone). Then, at the default budgets (image 0.4, audio 0.3: the middle of the
design's 0.3–0.5 and 0.2–0.4) and at two others: bytes saved, the cache share per modality before
and after, and fidelity — the relative error ‖o_c − o_f‖/‖o_f‖ of attention outputs of 16 held-out
queries per head over the compressed cache (o_c) against the full cache (o_f) — for each merge
mode at the default merge threshold (average, pivotal, weighted, and "none": our selection
without merging), so the run shows which merge helps, beside two baselines with the same byte
budget (the same kept length per sequence and kv head): random eviction within each modality, and
keeping the most recent tokens only. At the default budgets also each merging mode at the merge
thresholds MERGE_THRESHOLDS (-1: every evicted token merges, as before the threshold existed), with
the share of evicted tokens each threshold merges (JSON: budgets.default.fidelity_by_threshold,
merged_share_by_threshold).

    PYTHONPATH=$PWD python benchmarks/kv_compress_bench.py --out $OUT/kv_compress_bench_h200.json
    TRITON_INTERPRET=1 PYTHONPATH=$PWD python benchmarks/kv_compress_bench.py --tiny --out /tmp/kvc.json

About 30 s on one H200 before the merge modes; they add six timed calls (≤ 1 s each), four
compressions per budget and 18 more at the default budget, so well under 90 s is expected (not yet
measured). --tiny (a small
cache, on the CPU under the interpreter) checks the script.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from omnitune.kernels import kv_compress as kvc
from omnitune.kernels.kv_compress import Modality, compress_kv, importance, select_tokens
from omnitune.spec import relative_error

TOPICS = 8
SALIENT_SHARE = 0.1
TOPIC_LOGIT_BOOST = 6.0  # G: what a salient key of its topic adds to a query's scaled score
RUN_NOISE = 0.3          # spread of the tokens of one image/audio run around their shared base
HELD_OUT_QUERIES = 16
DEFAULT_BUDGET = {"image": 0.4, "audio": 0.3}
OTHER_BUDGETS = {"aggressive": {"image": 0.2, "audio": 0.15}, "generous": {"image": 0.6, "audio": 0.5}}
MERGE_ROWS = {"average": "merge average", "pivotal": "merge pivotal", "weighted": "merge weighted",
              "none": "select, no merge"}
MERGE_THRESHOLDS = (-1.0, 0.5, 0.7, 0.8, kvc.DEFAULT_MERGE_THRESHOLD, 0.9)


@dataclass(frozen=True)
class Layout:
    b: int
    h: int
    hkv: int
    d: int
    spans: tuple[tuple[Modality, int, int], ...]  # (modality, tokens, run length)
    window: int
    recent: int

    @property
    def n(self) -> int:
        return sum(t for _, t, _ in self.spans)


def omni_layout() -> Layout:
    from omnitune.presets import get_preset

    p = get_preset("qwen2.5-omni-7b")
    return Layout(b=4, h=p.heads, hkv=p.kv_heads, d=p.head_dim, window=32, recent=32, spans=(
        (Modality.TEXT, 1536, 1), (Modality.IMAGE, p.image_tokens(512), 4), (Modality.TEXT, 64, 1),
        (Modality.AUDIO, p.audio_tokens(30.0), 2), (Modality.TEXT, 384, 1)))


def tiny_layout() -> Layout:
    return Layout(b=2, h=4, hkv=1, d=32, window=8, recent=8, spans=(
        (Modality.TEXT, 48, 1), (Modality.IMAGE, 64, 4), (Modality.TEXT, 8, 1),
        (Modality.AUDIO, 40, 2), (Modality.TEXT, 24, 1)))


def make_cache(lay: Layout, dtype, device, seed: int = 0):
    """q_window, held-out queries, k, v, modality, built as the docstring says (in fp32 on the CPU)."""
    gen = torch.Generator().manual_seed(seed)
    b, hkv, d, n, group = lay.b, lay.hkv, lay.d, lay.n, lay.h // lay.hkv
    scale = math.sqrt(d)
    topics = torch.linalg.qr(torch.randn(b, hkv, d, TOPICS, generator=gen)).Q.transpose(-1, -2)  # [b,hkv,R,d]
    modality = torch.cat([torch.full((t,), int(m)) for m, t, _ in lay.spans])
    # Runs: tokens of one run share a base key and value (image patches, audio frames).
    run_id, start = [], 0
    for _, tokens, run in lay.spans:
        run_id.append(start + torch.arange(tokens) // run)
        start += -(-tokens // run)
    run_id = torch.cat(run_id)
    base_k = torch.randn(b, hkv, start, d, generator=gen)
    base_v = torch.randn(b, hkv, start, d, generator=gen)
    k = base_k[:, :, run_id] + RUN_NOISE * torch.randn(b, hkv, n, d, generator=gen)
    v = base_v[:, :, run_id] + RUN_NOISE * torch.randn(b, hkv, n, d, generator=gen)
    salient = torch.rand(b, hkv, n, generator=gen) < SALIENT_SHARE
    topic_of = torch.randint(TOPICS, (b, hkv, n), generator=gen)
    direction = torch.gather(topics, 2, topic_of[..., None].expand(b, hkv, n, d))
    gain = math.sqrt(TOPIC_LOGIT_BOOST * scale)  # (gain·u)·(gain·u)/√D = G
    k = k + salient[..., None] * gain * direction

    def queries(count):
        pick = torch.randint(TOPICS, (b, hkv, group * count), generator=gen)
        dirs = torch.gather(topics, 2, pick[..., None].expand(b, hkv, group * count, d))
        q = torch.randn(b, hkv, group * count, d, generator=gen) + gain * dirs
        return q.view(b, hkv, group, count, d).reshape(b, lay.h, count, d)

    def to(t):
        return t.to(device=device, dtype=dtype)

    return (to(queries(lay.window)), to(queries(HELD_OUT_QUERIES)), to(k), to(v),
            modality.expand(b, n).contiguous().to(device))


def attend(q, k, v, lengths=None):
    """softmax(q kᵀ/√D) v in fp32, GQA by repeating kv heads; keys past lengths[b] masked."""
    group = q.shape[1] // k.shape[1]
    kf = k.float().repeat_interleave(group, 1)
    vf = v.float().repeat_interleave(group, 1)
    scores = q.float() @ kf.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if lengths is not None:
        valid = torch.arange(k.shape[2], device=k.device)[None, :] < lengths[:, None]
        scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    return torch.softmax(scores, -1) @ vf


def gather_kept(k, v, keep):
    """Compact keep [B, Hkv, N] (the same count in every row of a sequence) into [B, Hkv, L, D]."""
    counts = keep.sum(-1)
    longest = int(counts.max())
    pos = kvc._positions_of(keep, longest)
    valid = pos >= 0
    idx = pos.clamp(min=0)[..., None].expand(*pos.shape, k.shape[-1])
    return (torch.where(valid[..., None], k.gather(2, idx), 0), torch.where(valid[..., None], v.gather(2, idx), 0),
            counts[:, 0], pos)


def shares(modality, positions, lengths_total):
    """Share of the cache's tokens per modality, over all sequences and kv heads."""
    out = {}
    valid = positions >= 0
    mods = torch.gather(modality[:, None, :].expand(-1, positions.shape[1], -1), 2, positions.clamp(min=0))
    for m in Modality:
        out[m.name.lower()] = float(((mods == int(m)) & valid).sum()) / lengths_total
    return out


def timed(fn, device, repetitions=30):
    if device == "cuda":
        from omnitune.profile.timing import time_cuda

        return time_cuda(fn, repetitions=repetitions, max_seconds=1.0).median_ms
    start = time.perf_counter()
    fn()
    return 1e3 * (time.perf_counter() - start)


def merge_launcher(q_window, k, v, modality, quotas, recent, config, merge="average",
                   threshold=kvc.DEFAULT_MERGE_THRESHOLD):
    """The merge kernel alone, set up as _compress sets it up (selection done beforehand); the
    average and pivotal modes launch the same kernel, weighted the similarity-weighted one."""
    b, hkv, _, d = k.shape
    scores = importance(q_window, k, 1 / math.sqrt(d), config)
    keep = select_tokens(scores, modality, quotas, recent)
    evict = ~keep & (modality != Modality.TEXT)[:, None, :]
    longest, evicted_max = int(keep.sum(-1).max()), int(evict.sum(-1).max())
    kept_pos, evicted_pos = kvc._positions_of(keep, longest), kvc._positions_of(evict, evicted_max)
    sum_k = torch.zeros((b, hkv, longest, d), dtype=torch.float32, device=k.device)
    sum_v, count = torch.zeros_like(sum_k), torch.zeros((b, hkv, longest), device=k.device)
    modality_ids = modality.to(torch.int32).contiguous()
    block_e = int(config["BLOCK_E"])

    def run():
        kvc._merge_evicted[(max(1, -(-evicted_max // block_e)), b * hkv)](
            k, v, modality_ids, kept_pos, evicted_pos, sum_k, sum_v, count,
            *k.stride(), *v.stride(), modality_ids.stride(0), hkv, longest, evicted_max,
            kvc._kernel_threshold(threshold), HEAD_DIM=d, BLOCK_D=triton_next_pow2(d), BLOCK_E=block_e, BLOCK_K=int(config["BLOCK_K"]),
            IEEE_DOT=k.dtype == torch.float32, SIM_WEIGHTED=merge == "weighted", num_warps=int(config["num_warps"]),
            num_stages=int(config["num_stages"]))
    return run, evicted_max


def triton_next_pow2(x: int) -> int:
    return 1 << (x - 1).bit_length()


def selection_launcher(q_window, k, modality, quotas, recent, config):
    """Step 2 and the positions of step 4 alone, as _compress runs them (scores computed
    beforehand; the kept and evicted widths known, so no device sync inside)."""
    scores = importance(q_window, k, 1 / math.sqrt(k.shape[-1]), config)
    keep = select_tokens(scores, modality, quotas, recent)
    evict = ~keep & (modality != Modality.TEXT)[:, None, :]
    longest, evicted_max = int(keep.sum(-1).max()), int(evict.sum(-1).max())

    def run():
        kept = select_tokens(scores, modality, quotas, recent)
        dropped = ~kept & (modality != Modality.TEXT)[:, None, :]
        kvc._positions_of(kept, longest), kvc._positions_of(dropped, evicted_max)
    return run


def merged_share(q_window, k, modality, quotas, recent, config, threshold):
    """Of the evicted tokens with a kept token of their modality, the share whose best cosine
    similarity reaches the threshold (what it merges); fp32 on the device."""
    keep = select_tokens(importance(q_window, k, 1 / math.sqrt(k.shape[-1]), config), modality, quotas, recent)
    unit = torch.nn.functional.normalize(k.float(), dim=-1)
    merged = total = 0
    for bi in range(k.shape[0]):
        for hk in range(k.shape[1]):
            kept = keep[bi, hk].nonzero().flatten()
            evicted = (~keep[bi, hk] & (modality[bi] != Modality.TEXT)).nonzero().flatten()
            sim = unit[bi, hk, evicted] @ unit[bi, hk, kept].T
            sim = sim.masked_fill(modality[bi, evicted][:, None] != modality[bi, kept][None, :], float("-inf"))
            best = sim.max(dim=1).values if kept.numel() else torch.full_like(evicted, float("-inf"), dtype=sim.dtype)
            has_pivot = torch.isfinite(best)
            total += int(has_pivot.sum())
            merged += int((has_pivot & ((threshold <= -1) | (best >= threshold))).sum())
    return merged / max(1, total)


def threshold_rows(lay, q_window, q_held, k, v, modality, budget, config):
    """Each merging mode at each of MERGE_THRESHOLDS: relative error of held-out attention, and
    the share of evicted tokens each threshold merges."""
    full = attend(q_held, k, v)
    errors = {}
    for mode in ("average", "pivotal", "weighted"):
        errors[mode] = {}
        for t in MERGE_THRESHOLDS:
            out = compress_kv(q_window, k, v, modality, keep_ratio=budget, recent=lay.recent, config=config,
                              merge=mode, merge_threshold=t)
            errors[mode][f"{t:g}"] = relative_error(attend(q_held, out.k, out.v, out.lengths.to(k.device)), full)
    quotas = kvc._quotas(modality, budget, lay.recent)
    shares_ = {f"{t:g}": merged_share(q_window, k, modality, quotas, lay.recent, config, t) for t in MERGE_THRESHOLDS}
    return errors, shares_


def fidelity_rows(lay, q_window, q_held, k, v, modality, budget, config, seed):
    """Our compression in each merge mode and the equal-budget baselines: relative error of
    held-out attention. "select, no merge" is compress_kv's merge="none"."""
    full = attend(q_held, k, v)
    rows, cache = {}, None
    for mode in MERGE_ROWS:
        out = compress_kv(q_window, k, v, modality, keep_ratio=budget, recent=lay.recent, config=config, merge=mode)
        rows[MERGE_ROWS[mode]] = relative_error(attend(q_held, out.k, out.v, out.lengths.to(k.device)), full)
        if cache is None:
            cache = out  # the kept tokens do not depend on the mode
        assert torch.equal(out.positions, cache.positions), mode
    quotas = kvc._quotas(modality, budget, lay.recent)
    keep = select_tokens(importance(q_window, k, 1 / math.sqrt(lay.d), config), modality, quotas, lay.recent)
    gen = torch.Generator().manual_seed(seed)
    random_scores = torch.rand(keep.shape, generator=gen).to(k.device)
    keep_random = select_tokens(random_scores, modality, quotas, lay.recent)
    kk, vv, ln, _ = gather_kept(k, v, keep_random)
    rows["random eviction"] = relative_error(attend(q_held, kk, vv, ln), full)
    # Keep-recent: the same kept length L per sequence, the last L tokens, whatever they are.
    n = k.shape[2]
    keep_recent = torch.arange(n, device=k.device)[None, None, :] >= (n - keep.sum(-1, keepdim=True))
    kk, vv, ln, _ = gather_kept(k, v, keep_recent)
    rows["keep recent only"] = relative_error(attend(q_held, kk, vv, ln), full)
    total_before = k.shape[0] * k.shape[1] * n
    total_after = int(cache.lengths.sum()) * k.shape[1]
    all_pos = torch.arange(n, device=k.device).expand(k.shape[0], k.shape[1], n)
    elt = k.element_size()
    return {
        "keep_ratio": budget, "fidelity_rel_error": rows,
        "bytes_before": 2 * total_before * lay.d * elt, "bytes_after": 2 * total_after * lay.d * elt,
        "bytes_saved": 2 * (total_before - total_after) * lay.d * elt,
        "saved_fraction": 1 - total_after / total_before,
        "share_before": shares(modality, all_pos, total_before),
        "share_after": shares(modality, cache.positions.to(k.device), total_after),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON results file to write")
    parser.add_argument("--tiny", action="store_true",
                        help="a small cache on the CPU (set TRITON_INTERPRET=1): checks the script, measures nothing")
    args = parser.parse_args()
    started = time.perf_counter()
    lay = tiny_layout() if args.tiny else omni_layout()
    device = "cpu" if args.tiny else "cuda"
    dtype = torch.float32 if args.tiny else torch.bfloat16  # the interpreter gets bf16 wrong
    q_window, q_held, k, v, modality = make_cache(lay, dtype, device)
    budget = DEFAULT_BUDGET
    quotas = kvc._quotas(modality, budget, lay.recent)
    kept = int(quotas[:, 1:].sum()) // lay.b
    problem = kvc.KVCompressProblem(b=lay.b, h=lay.h, hkv=lay.hkv, n=lay.n, d=lay.d, window=lay.window,
                                    recent=min(lay.recent, kvc.tail_length(lay.n)),
                                    keep_pct=max(1, round(100 * kept / max(1, int((modality[0] != 0).sum())))))
    config = kvc.SPEC.default_config(problem, dtype)
    print(f"cache: b={lay.b} h={lay.h}/{lay.hkv} d={lay.d} n={lay.n} "
          + " + ".join(f"{m.name.lower()} {t}" for m, t, _ in lay.spans) + f"; {dtype}; config {config.label()}")

    kv_bytes = 2 * k.numel() * k.element_size()
    sm_scale = 1 / math.sqrt(lay.d)
    merge, evicted = merge_launcher(q_window, k, v, modality, quotas, lay.recent, config)
    merge_weighted, _ = merge_launcher(q_window, k, v, modality, quotas, lay.recent, config, "weighted")
    merge_always, _ = merge_launcher(q_window, k, v, modality, quotas, lay.recent, config, threshold=-1.0)
    selection = selection_launcher(q_window, k, modality, quotas, lay.recent, config)
    timings = {
        "importance": (timed(lambda: importance(q_window, k, sm_scale, config), device), kv_bytes / 2),
        # the selection reads no K/V: its GB/s count K and V like the whole call's, for comparison
        "selection_and_positions": (timed(selection, device), kv_bytes),
        "merge_kernel": (timed(merge, device), kv_bytes),
        "merge_kernel[threshold -1]": (timed(merge_always, device), kv_bytes),
        "merge_kernel[weighted]": (timed(merge_weighted, device), kv_bytes),
    }
    for mode in MERGE_ROWS:
        def call(mode=mode):
            compress_kv(q_window, k, v, modality, keep_ratio=budget, recent=lay.recent, config=config, merge=mode)
        # merge="none" reads K twice (the importance) and never V: its GB/s still count K and V
        timings[f"compress_kv[{mode}]"] = (timed(call, device), kv_bytes)
    throughput = {name: {"ms": ms, "bytes_read_model": b, "gbps": b / (ms * 1e-3) / 1e9}
                  for name, (ms, b) in timings.items()}
    for name, t in throughput.items():
        print(f"  {name:24s} {t['ms']:8.3f} ms {t['gbps']:8.1f} GB/s")

    budgets = {"default": DEFAULT_BUDGET, **OTHER_BUDGETS}
    fidelity = {}
    for name, bud in budgets.items():
        fidelity[name] = fidelity_rows(lay, q_window, q_held, k, v, modality, bud, config, seed=1)
        f = fidelity[name]
        print(f"  budget {name} {bud}: saved {100 * f['saved_fraction']:.1f}% ({f['bytes_saved'] / 2**20:.1f} MiB); "
              "share before/after " + ", ".join(
                  f"{m} {100 * f['share_before'][m]:.0f}/{100 * f['share_after'][m]:.0f}%"
                  for m in f["share_before"] if f["share_before"][m] > 0))
        print("    held-out attention rel. error: " + ", ".join(
            f"{k_}: {e:.4f}" for k_, e in f["fidelity_rel_error"].items()))
        ours = {row: f["fidelity_rel_error"][row] for row in MERGE_ROWS.values()}
        f["best_of_ours"] = min(ours, key=ours.get)
        print(f"    best of our modes: {f['best_of_ours']}")
        if name == "default":
            f["fidelity_by_threshold"], f["merged_share_by_threshold"] = threshold_rows(
                lay, q_window, q_held, k, v, modality, bud, config)
            print(f"    by merge threshold (held-out error; 'none' {f['fidelity_rel_error']['select, no merge']:.4f}):")
            for t in MERGE_THRESHOLDS:
                key = f"{t:g}"
                print(f"      {key:>5s}: " + ", ".join(
                    f"{mode} {f['fidelity_by_threshold'][mode][key]:.4f}" for mode in f["fidelity_by_threshold"])
                    + f"; merges {100 * f['merged_share_by_threshold'][key]:.1f}% of the evicted")

    from omnitune.profile.device import current_device_facts

    facts = current_device_facts(interpret=args.tiny)
    payload = {
        "device": facts.as_dict() if facts else None, "source_hash": kvc.SPEC.source_hash(),
        "command": "python benchmarks/kv_compress_bench.py" + (" --tiny" if args.tiny else "") + f" --out {args.out}",
        "layout": {"b": lay.b, "h": lay.h, "hkv": lay.hkv, "d": lay.d, "n": lay.n, "window": lay.window,
                   "recent": lay.recent, "spans": [[m.name.lower(), t, r] for m, t, r in lay.spans]},
        "dtype": str(dtype).removeprefix("torch."), "config": config.as_dict(), "evicted_per_row_max": evicted,
        "structure": {"topics": TOPICS, "salient_share": SALIENT_SHARE, "topic_logit_boost": TOPIC_LOGIT_BOOST,
                      "run_noise": RUN_NOISE,
                      "held_out_queries": HELD_OUT_QUERIES},
        "merge_rows": MERGE_ROWS, "merge_threshold": kvc.DEFAULT_MERGE_THRESHOLD,
        "merge_thresholds": MERGE_THRESHOLDS, "throughput": throughput, "budgets": fidelity,
        "wall_s": time.perf_counter() - started,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(payload, indent=2, sort_keys=True, default=str) + "\n")
    print(f"wrote {args.out} in {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()

"""Does the order in which attention's Gluon ping-pong kernel walks its grid cost it L2 reuse?

The kernel's grid is (b·h, ⌈Lq / 128⌉) with the heads fastest, so a wave of 132 programs reads the
K/V of every head at once: with no GQA (h24/24), 16k keys, that is 24 heads × 8 MB of K/V against a
50–60 MB L2, where h32/4 reads 4 kv heads'. benchmarks/variants/gluon_head_groups.patch walks the
launch order in sections of HEAD_GROUP (batch·head)s instead (FlashAttention-3's L2 sections):
a wave then reads the K/V of HEAD_GROUP heads. This times the attention op with the Gluon config
(as users call it: the public `attention()`, CUDA-graph replays) at several section sizes, beside
SDPA's cuDNN backend, in interleaved rounds; every section size's output must equal the unpatched
order's bit for bit (each tile's arithmetic is unchanged, only which program computes it).

It also times each of them in graphs of 10x as many calls (about a second of
sustained load a replay), to see whether sustained load moves their ratio (clocks under power).

    git apply benchmarks/variants/gluon_head_groups.patch
    python benchmarks/gluon_head_groups.py --out $OUT/gluon_head_groups_h100.json
    git apply -R benchmarks/variants/gluon_head_groups.patch

The patch applies to the kernel as it was before it adopted sections of 8 (commit 87a0f3a; run
`git checkout 87a0f3a -- omnitune/kernels/attention_gluon.py` first, and restore it after):
benchmarks/results/gluon_head_groups_h100.json (cuDNN and the default order sustained) and
gluon_head_groups_h100_sustained.json (every section size sustained) were measured there.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hopper_probe_timing import environment, time_rounds, timed_graph  # noqa: E402

from omnitune.kernels import attention_gluon  # noqa: E402
from omnitune.kernels.attention import GLUON_WINNER as GLUON  # noqa: E402
from omnitune.kernels.attention import attention  # noqa: E402

# (b, h, hkv, lq, lk, causal): issue 15's eight shapes, then a GQA batch and cross-attention
SHAPES = [(1, h, hkv, n, n, causal) for h, hkv in ((24, 24), (32, 4)) for n in (16384, 8192)
          for causal in (False, True)] + [(2, 28, 4, 3000, 3000, True), (1, 32, 32, 32768, 512, False)]
GROUPS = (None, 1, 2, 4, 8, 16)
ROUNDS = 10
SUSTAINED = 10  # the sustained graphs hold this many times the calls


def shape_name(b, h, hkv, lq, lk, causal) -> str:
    length = f"l{lq}" if lq == lk else f"lq{lq} lk{lk}"
    return f"b{b} h{h}/{hkv} {length} {'causal' if causal else 'no mask'}"


def flops(b, h, hkv, lq, lk, causal) -> float:
    full = 4.0 * b * h * lq * lk * 128
    return full / 2 if causal and lq == lk else full


def cudnn(q, k, v, causal):
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def call():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=q.shape[1] != k.shape[1])
    return call


def with_group(group, q, k, v, causal):
    """The op with the Gluon config, its launches walking sections of `group` heads (None: the
    kernel's own order). The group is read at each launch: a graph keeps the one it captured."""
    def call():
        attention_gluon.HEAD_GROUP = group
        try:
            return attention(q, k, v, causal=causal, config=GLUON)
        finally:
            attention_gluon.HEAD_GROUP = None
    return call


def run_shape(shape, rounds: int) -> list[dict]:
    b, h, hkv, lq, lk, causal = shape
    gen = torch.Generator(device="cuda").manual_seed(hash(shape) % 2**31)
    q = torch.randn(b, h, lq, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    k = torch.randn(b, hkv, lk, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn(b, hkv, lk, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    reference = cudnn(q, k, v, causal)().float() if lq == lk or not causal else None
    calls, outs, rows = {"sdpa_cudnn": cudnn(q, k, v, causal)}, {}, {}
    for group in GROUPS:
        name = f"gluon_group_{group or 'all'}"
        calls[name] = with_group(group, q, k, v, causal)
        outs[name] = calls[name]()
    torch.cuda.synchronize()
    base = outs["gluon_group_all"]
    for name, out in outs.items():
        row = rows[name] = {"identical_to_default_order": bool(torch.equal(out, base))}
        if reference is not None:
            err = (out.float() - reference)
            row["rel_rms_vs_cudnn"] = float(err.norm() / reference.norm())
    launches = max(3, min(10, round(4e12 / flops(*shape))))
    replays, keep = {}, []
    for name, call in calls.items():
        replay, how, graph = timed_graph(call, launches)
        replays[name], rows.setdefault(name, {})["timing"] = replay, how
        keep.append(graph)
    for name in calls:
        replay, how, graph = timed_graph(calls[name], launches * SUSTAINED)
        replays[f"{name}_sustained"] = replay
        rows[f"{name}_sustained"] = {"timing": how}
        keep.append(graph)
    short = {n: r for n, r in replays.items() if not n.endswith("_sustained")}
    times = time_rounds(short, launches, rounds)
    times.update(time_rounds({n: r for n, r in replays.items() if n.endswith("_sustained")},
                             launches * SUSTAINED, max(4, rounds // 2)))
    cudnn_ms = statistics.median(times["sdpa_cudnn"])
    sustained_cudnn_ms = statistics.median(times["sdpa_cudnn_sustained"])
    out = []
    for name, ms_list in times.items():
        ms = statistics.median(ms_list)
        base_ms = sustained_cudnn_ms if name.endswith("_sustained") else cudnn_ms
        out.append(dict(shape=shape_name(*shape), impl=name, ms=ms, ms_rounds=ms_list,
                        tflops=flops(*shape) / ms / 1e9, vs_cudnn=base_ms / ms, **rows.get(name, {})))
    del keep, replays
    torch.cuda.empty_cache()
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("gluon_head_groups needs a CUDA GPU", file=sys.stderr)
        return 2
    if not hasattr(attention_gluon, "HEAD_GROUP"):
        print("apply benchmarks/variants/gluon_head_groups.patch first", file=sys.stderr)
        return 2
    rows = []
    for shape in SHAPES:
        rows += run_shape(shape, args.rounds)
        for row in rows[-2 * (len(GROUPS) + 1):]:
            print(f"{row['shape']:28s} {row['impl']:28s} {row['tflops']:6.0f} TFLOP/s  x{row['vs_cudnn']:.3f} cuDNN"
                  f"  same={row.get('identical_to_default_order', '-')}  rms={row.get('rel_rms_vs_cudnn', '-')}",
                  flush=True)
        with open(args.out, "w") as f:
            json.dump(dict(environment=environment(), command=" ".join(sys.argv), rounds=args.rounds, rows=rows), f,
                      indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

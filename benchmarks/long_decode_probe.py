"""A probe, not a library kernel: does reading a long context in many one-tile programs — the form
that read the same bytes at 94–100% of copy bandwidth in one launch (benchmarks/read_ceiling.py,
round 15 part A) — make few-sequence paged decode reach issue 15's 85%, where no config of the
library's looping split kernel did (66% at batch 1 with 32k, 81% at 64k and at batch 2 with 32k:
benchmarks/long_decode_sweep.py, round 15 part B)?

Each program of the probe's split kernel takes one tile of T keys of one (sequence, kv head) —
as many programs as tiles, no loop — loads its K and V tiles at once through the block table,
computes the tile's softmax partial for all query heads of the kv head (GQA packed) and stores it;
a second launch combines the partials, each program one (sequence, head) and a slice of the head
dim. Both launches captured together as a CUDA graph (10 calls a graph, medians of 5 rounds of 10
replays), beside the library's PagedDecodePlan.run at its best sweep config, % of the copy
bandwidth measured in the same run by the kernel's byte model (the K/V bytes; the partials'
round trip is the probe's own cost). Checked against SDPA over the same context first.
Assumes what the probe's shapes have: one query token, contexts a multiple of T, T a multiple of
the page size.

    PYTHONPATH=$PWD python benchmarks/long_decode_probe.py --out $OUT/long_decode_probe_h200.json
    TRITON_INTERPRET=1 PYTHONPATH=$PWD python benchmarks/long_decode_probe.py --tiny
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

SHAPES = ((1, 32768), (1, 65536), (2, 32768))
HEADS, KV_HEADS, HEAD_DIM, PAGE = 28, 4, 128, 16
VARIANTS = [(tile, warps) for tile in (64, 128, 256) for warps in (4, 8, 16)]
LIBRARY_BEST = {  # the sweep's fastest config per shape (long_decode_sweep_h200_round15_B.json)
    (1, 32768): dict(NUM_SPLITS=64, BLOCK_N=64, num_warps=4, num_stages=3),
    (1, 65536): dict(NUM_SPLITS=128, BLOCK_N=32, num_warps=2, num_stages=3),
    (2, 32768): dict(NUM_SPLITS=64, BLOCK_N=32, num_warps=2, num_stages=3),
}
COMBINE_SLICE = 32  # head-dim elements per combine program
ROUNDS, REPLAYS = 5, 10


@triton.jit
def _one_tile(Q, K, V, Tables, PartM, PartL, PartAcc, qk_scale,
              stride_qb, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, stride_tb,
              H, TILES,
              GROUP: tl.constexpr, BLOCK_M: tl.constexpr, T: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr):
    tile, hk, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    keys = tile * T + tl.arange(0, T)
    dims = tl.arange(0, D)
    pages = tl.load(Tables + b.to(tl.int64) * stride_tb + keys // PAGE).to(tl.int64)
    slots = (keys % PAGE).to(tl.int64)
    # Both tiles' loads first: nothing they need comes from the arithmetic below.
    k = tl.load(K + pages[:, None] * stride_kb + slots[:, None] * stride_ks + hk * stride_kh + dims[None, :])
    v = tl.load(V + pages[:, None] * stride_vb + slots[:, None] * stride_vs + hk * stride_vh + dims[None, :])
    rows = tl.arange(0, BLOCK_M)
    valid = rows < GROUP
    head = hk * GROUP + rows
    q = tl.load(Q + b.to(tl.int64) * stride_qb + head[:, None] * stride_qh + dims[None, :],
                mask=valid[:, None], other=0.0)
    scores = tl.dot(q, tl.trans(k)) * qk_scale
    m = tl.max(scores, 1)
    p = tl.math.exp2(scores - m[:, None])
    l = tl.sum(p, 1)
    acc = tl.dot(p.to(v.dtype), v)
    part = (b.to(tl.int64) * H + head) * TILES + tile
    tl.store(PartM + part, m, mask=valid)
    tl.store(PartL + part, l, mask=valid)
    tl.store(PartAcc + part[:, None] * D + dims[None, :], acc, mask=valid[:, None])


@triton.jit
def _combine(PartM, PartL, PartAcc, Out, TILES, D: tl.constexpr, SLICE: tl.constexpr, BLOCK_S: tl.constexpr):
    row, piece = tl.program_id(0).to(tl.int64), tl.program_id(1)
    splits = tl.arange(0, BLOCK_S)
    dims = piece * SLICE + tl.arange(0, SLICE)
    m_max = tl.full([BLOCK_S], float("-inf"), tl.float32)
    for start in range(0, TILES, BLOCK_S):
        m_max = tl.maximum(m_max, tl.load(PartM + row * TILES + start + splits, mask=start + splits < TILES,
                                          other=float("-inf")))
    top = tl.max(m_max, 0)
    denom = tl.zeros([BLOCK_S], tl.float32)
    acc = tl.zeros([SLICE], tl.float32)
    for start in range(0, TILES, BLOCK_S):
        at = start + splits
        inside = at < TILES
        weight = tl.math.exp2(tl.load(PartM + row * TILES + at, mask=inside, other=float("-inf")) - top)
        denom += weight * tl.load(PartL + row * TILES + at, mask=inside, other=0.0)
        part = tl.load(PartAcc + (row * TILES + at)[:, None] * D + dims[None, :], mask=inside[:, None], other=0.0)
        acc += tl.sum(weight[:, None] * part, 0)
    tl.store(Out + row * D + dims, (acc / tl.sum(denom, 0)).to(Out.dtype.element_ty))


class Probe:
    """The probe's two launches for one shape and tile, with their partials allocated once."""

    def __init__(self, q, key_cache, value_cache, tables, ctx: int, tile: int, warps: int, sm_scale: float):
        b, h = q.shape[0], q.shape[1]
        self.q, self.k, self.v, self.tables = q, key_cache, value_cache, tables
        self.tile, self.warps, self.tiles = tile, warps, ctx // tile
        self.group = h // key_cache.shape[2]
        self.block_m = max(16, triton.next_power_of_2(self.group))
        self.scale = sm_scale * 1.4426950408889634  # exp2
        device = q.device
        self.part_m = torch.empty(b * h * self.tiles, device=device, dtype=torch.float32)
        self.part_l = torch.empty_like(self.part_m)
        self.part_acc = torch.empty(b * h * self.tiles, q.shape[-1], device=device, dtype=torch.float32)
        self.out = torch.empty(b, h, q.shape[-1], device=device, dtype=q.dtype)

    def __call__(self) -> torch.Tensor:
        q, k, v, t = self.q, self.k, self.v, self.tables
        b, h, d = q.shape[0], q.shape[1], q.shape[-1]
        _one_tile[(self.tiles, k.shape[2], b)](
            q, k, v, t, self.part_m, self.part_l, self.part_acc, self.scale,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2),
            t.stride(0), h, self.tiles,
            GROUP=self.group, BLOCK_M=self.block_m, T=self.tile, D=d, PAGE=k.shape[1], num_warps=self.warps)
        _combine[(b * h, d // COMBINE_SLICE)](self.part_m, self.part_l, self.part_acc, self.out, self.tiles,
                                               D=d, SLICE=COMBINE_SLICE, BLOCK_S=64, num_warps=4)
        return self.out


def shape_inputs(b: int, ctx: int, device, dtype, heads=HEADS, kv_heads=KV_HEADS, head_dim=HEAD_DIM):
    from omnitune.kernels import paged_decode_attention as pda

    problem = pda.PagedDecodeProblem(b=b, h=heads, hkv=kv_heads, lq=1, ctx=ctx, d=head_dim, block_size=PAGE)
    inputs = pda.SPEC.make_inputs(problem, dtype, device, seed=0)
    k_dense, v_dense = pda.contiguous_context(inputs, ctx)
    q = inputs.q[:, :, 0]  # [B, H, D]: one query token
    expected = F.scaled_dot_product_attention(q[:, :, None].float(), k_dense.float(), v_dense.float(),
                                              scale=inputs.sm_scale, enable_gqa=True)[:, :, 0]
    return problem, inputs, q, expected


def rel_error(out: torch.Tensor, expected: torch.Tensor) -> float:
    return ((out.float() - expected).norm() / expected.norm()).item()


def run_shape(device, b: int, ctx: int, copy_tbps: float) -> dict:
    from benchmarks.ops_bench import capture, graph_call_us
    from omnitune.kernels import paged_decode_attention as pda

    dtype = torch.bfloat16
    problem, inputs, q, expected = shape_inputs(b, ctx, device, dtype)
    moved = pda.SPEC.bytes_moved(problem, dtype)
    calls = {}
    errors = {}
    for tile, warps in VARIANTS:
        probe = Probe(q, inputs.key_cache, inputs.value_cache, inputs.block_tables, ctx, tile, warps, inputs.sm_scale)
        name = f"probe_t{tile}_w{warps}"
        try:
            errors[name] = rel_error(probe(), expected)
            calls[name] = probe
        except Exception as exc:  # noqa: BLE001 — a variant that does not compile is a row saying why
            errors[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200]
    library = pda.SPEC.default_config(problem, dtype).replace(PACK_GQA=True, FUSED_REDUCE=False,
                                                                **LIBRARY_BEST[(b, ctx)])
    plan = pda.PagedDecodePlan(batch=b, num_heads=HEADS, num_kv_heads=KV_HEADS, head_dim=HEAD_DIM, block_size=PAGE,
                               max_blocks=inputs.block_tables.shape[1], max_context_len=ctx, dtype=dtype,
                               device=device, config=library)
    args = (inputs.q, inputs.key_cache, inputs.value_cache, inputs.block_tables, inputs.context_lens)
    errors["library_best"] = rel_error(plan.run(*args)[:, :, 0], expected)
    calls["library_best"] = lambda: plan.run(*args)
    timed = {name: fn for name, fn in calls.items() if isinstance(errors[name], float) and errors[name] < 2e-2}
    graphs = {name: capture(fn) for name, fn in timed.items()}
    samples = {name: [] for name in graphs}
    for _ in range(ROUNDS):  # interleaved: every variant once a round
        for name, graph in graphs.items():
            samples[name].append(graph_call_us(graph, replays=REPLAYS))
    graph_us = {name: statistics.median(v) for name, v in samples.items()}
    pct = {name: 100 * moved / (us * 1e-6) / 1e12 / copy_tbps for name, us in graph_us.items()}
    return {"bytes_moved": moved, "library_config": library.label(), "errors": errors, "graph_us": graph_us,
            "pct_of_copy": pct}


def tiny() -> int:
    """Under TRITON_INTERPRET=1 on the CPU: the probe against SDPA on a small fp32 shape."""
    for tile in (16, 32):
        problem, inputs, q, expected = shape_inputs(2, 64, "cpu", torch.float32, heads=4, kv_heads=2, head_dim=32)
        probe = Probe(q, inputs.key_cache, inputs.value_cache, inputs.block_tables, 64, tile, 4, inputs.sm_scale)
        error = rel_error(probe(), expected)
        print(f"tile {tile}: relative error {error:.2e}")
        if not error < 1e-4:
            return 1
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--tiny", action="store_true", help="check the probe on the CPU (TRITON_INTERPRET=1)")
    args = parser.parse_args(argv)
    if args.tiny:
        return tiny()
    if not torch.cuda.is_available() or args.out is None:
        print("long_decode_probe needs a CUDA GPU and --out (or --tiny)", file=sys.stderr)
        return 2
    from benchmarks.ops_bench import copy_bandwidth_report

    device = torch.device("cuda")
    copy_tbps, report = copy_bandwidth_report(device, shapes={})
    for b, ctx in SHAPES:
        result = run_shape(device, b, ctx, copy_tbps)
        report["shapes"][f"b{b} ctx{ctx}"] = result
        print(f"== b{b} ctx{ctx} ({result['bytes_moved'] / 1e6:.0f} MB)", flush=True)
        for name, us in sorted(result["graph_us"].items(), key=lambda item: item[1]):
            print(f"   {name:20s} {us:7.1f} µs  {result['pct_of_copy'][name]:5.1f}% of copy  "
                  f"error {result['errors'][name]:.1e}", flush=True)
        for name, error in result["errors"].items():
            if not isinstance(error, float) or not error < 2e-2:
                print(f"   {name:20s} not timed: {error}", flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1))
        torch.cuda.empty_cache()
    print(f"copy bandwidth {copy_tbps:.2f} TB/s; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

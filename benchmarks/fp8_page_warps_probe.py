"""Would paged decode over fp8 go faster if each warp owned whole pages? A probe kernel of that
layout, compiled for sm_90 without a GPU (--offline), checked against the spec's reference under
Triton's interpreter (tests/test_fp8_page_warps_probe.py), and on a GPU checked and timed beside
the library's kernel.

Nsight Compute found the fp8 split kernel issue-bound (round 9 part A,
benchmarks/results/ncu_decode_stalls_h200_round9_A.txt): 760 SASS instructions and 8 CTA barriers
per 64-key tile in its loop, four warps splitting each tile's keys, so every tile's row max and
sum cross warps through shared memory. Here the tile is [W pages, page size, D], the dots are
batched over pages (Triton places the warps along that dimension: warpsPerCTA [W, 1, 1]), each
page keeps its own running max, sum and accumulator, and the W partials combine once after the
loop; the split partials then go through the library's combine kernel. One layout only: one query
token, GQA packed (all query heads of a kv head in one program), fp8 K/V with per-cache scales,
2 splits. A probe, not a kernel of the library.

    PYTHONPATH=$PWD python benchmarks/fp8_page_warps_probe.py --offline     # no GPU: registers, loop counts
    PYTHONPATH=$PWD python benchmarks/fp8_page_warps_probe.py --out $OUT/fp8_page_warps_h200.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cubin import cubin_resources, loop_counts  # noqa: E402
from decode_registers_offline import compile_sm90, compile_split  # noqa: E402

from omnitune.kernels import paged_decode_attention as pda  # noqa: E402

LOG2E = 1.4426950408889634
SPLITS = 2
# (pages per iteration, warps, stages) of the probe; the library's best fp8 config beside them.
PROBE_CONFIGS = ((4, 4, 2), (4, 4, 3), (2, 2, 3), (2, 2, 4))  # (4 pages, 2 warps) spills: 255 registers
LIBRARY_CONFIG = dict(NUM_SPLITS=SPLITS, BLOCK_N=64, num_warps=4, num_stages=3, PACK_GQA=True, FUSED_REDUCE=False)


@triton.jit
def _fp8_pages_split(
    Q, KeyCache, ValueCache, BlockTables, ContextLens, PartM, PartL, PartAcc, KScale, VScale,
    stride_qb, stride_qh, stride_kcb, stride_kcs, stride_kch, stride_vcb, stride_vcs, stride_vch,
    stride_btb, H, qk_scale,
    PAGE: tl.constexpr, D: tl.constexpr, GROUP: tl.constexpr, BLOCK_M: tl.constexpr, W: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
):
    b = tl.program_id(0)
    hk = tl.program_id(1)
    split = tl.program_id(2)
    rows = tl.arange(0, BLOCK_M)
    head = hk * GROUP + rows
    row_valid = rows < GROUP
    ctx = tl.load(ContextLens + b)
    pages = tl.cdiv(ctx, PAGE)
    p_start = tl.cdiv(split * pages, NUM_SPLITS)
    p_end = tl.cdiv((split + 1) * pages, NUM_SPLITS)
    offs_d = tl.arange(0, D)
    q = tl.load(Q + b * stride_qb + head[:, None] * stride_qh + offs_d[None, :], mask=row_valid[:, None], other=0.0)
    # q in fp16 with sm_scale·log2(e) applied, k_scale on the scores, V through v_scale's
    # significand and the accumulator through its power of two: as the library's kernel does.
    q = (q.to(tl.float32) * qk_scale).to(tl.float16)
    k_scale = tl.load(KScale)
    v_bits = tl.load(VScale).to(tl.int32, bitcast=True)
    v_mant = ((v_bits & 0x007FFFFF) | 0x3F800000).to(tl.float32, bitcast=True)
    v_exp = (v_bits & 0x7F800000).to(tl.float32, bitcast=True)
    q3 = tl.broadcast_to(q[None, :, :], (W, BLOCK_M, D))
    offs_w = tl.arange(0, W)
    offs_j = tl.arange(0, PAGE)
    table = BlockTables + b * stride_btb
    k_head = KeyCache + hk * stride_kch
    v_head = ValueCache + hk * stride_vch
    m = tl.full([W, BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([W, BLOCK_M], tl.float32)
    acc = tl.zeros([W, BLOCK_M, D], tl.float32)
    for p0 in range(p_start, p_end, W):
        pidx = p0 + offs_w
        pvalid = pidx < p_end
        pg = tl.load(table + pidx, mask=pvalid, other=0).to(tl.int64)
        key = pidx[:, None] * PAGE + offs_j[None, :]                      # [W, PAGE]
        kvalid = pvalid[:, None] & (key < ctx)
        kmask = kvalid[:, :, None]
        k = tl.load(k_head + pg[:, None, None] * stride_kcb + offs_j[None, :, None] * stride_kcs
                    + offs_d[None, None, :], mask=kmask, other=0.0)
        v = tl.load(v_head + pg[:, None, None] * stride_vcb + offs_j[None, :, None] * stride_vcs
                    + offs_d[None, None, :], mask=kmask, other=0.0)
        k = k.to(tl.float16)
        v = (v.to(tl.float32) * v_mant).to(tl.float16)
        s = tl.dot(q3, tl.trans(k, (0, 2, 1)))                            # [W, M, PAGE]
        s = tl.where(kvalid[:, None, :], s * k_scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 2))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(s - m_safe[:, :, None])
        alpha = tl.math.exp2(m - m_safe)
        l = l * alpha + tl.sum(p, 2)
        acc = acc * alpha[:, :, None]
        acc = tl.dot(p.to(tl.float16), v, acc)
        m = m_new
    big = tl.max(m, 0)
    big_safe = tl.where(big == float("-inf"), 0.0, big)
    f = tl.math.exp2(m - big_safe[None, :])
    l_all = tl.sum(l * f, 0)
    acc_all = tl.sum(acc * f[:, :, None], 0) * v_exp
    part = ((b * H + head) * NUM_SPLITS + split)
    tl.store(PartM + part, big, mask=row_valid)
    tl.store(PartL + part, l_all, mask=row_valid)
    tl.store(PartAcc + part[:, None] * D + offs_d[None, :], acc_all, mask=row_valid[:, None])


def compile_pages(pages: int, warps: int, stages: int):
    pointers = {"Q": "*bf16", "KeyCache": "*fp8e4nv", "ValueCache": "*fp8e4nv", "BlockTables": "*i32",
                "ContextLens": "*i32", "PartM": "*fp32", "PartL": "*fp32", "PartAcc": "*fp32",
                "KScale": "*fp32", "VScale": "*fp32"}
    constexprs = dict(PAGE=16, D=128, GROUP=7, BLOCK_M=16, W=pages, NUM_SPLITS=2)
    return compile_sm90(_fp8_pages_split, pointers, constexprs, warps, stages)


def launch_probe(inputs: pda.PagedDecodeInputs, pages: int, warps: int, stages: int) -> torch.Tensor:
    """The probe's split kernel, then the library's combine kernel: the attention [B, H, 1, D]."""
    q, kc, vc = inputs.q, inputs.key_cache, inputs.value_cache
    b, h, lq, d = q.shape
    block, hkv = kc.shape[1], kc.shape[2]
    group = h // hkv
    assert lq == 1 and kc.dtype == torch.float8_e4m3fn and inputs.k_scale.numel() == 1, "one layout only"
    assert q.stride(3) == 1 and kc.stride(3) == 1 and vc.stride(3) == 1 and inputs.block_tables.stride(1) == 1
    rows = b * h * SPLITS
    flat = torch.empty(rows * (d + 2), dtype=torch.float32, device=q.device)
    part_m, part_l, part_acc = flat[:rows], flat[rows:2 * rows], flat[2 * rows:]
    _fp8_pages_split[(b, hkv, SPLITS)](
        q, kc, vc, inputs.block_tables, inputs.context_lens, part_m, part_l, part_acc, inputs.k_scale, inputs.v_scale,
        q.stride(0), q.stride(1), kc.stride(0), kc.stride(1), kc.stride(2), vc.stride(0), vc.stride(1), vc.stride(2),
        inputs.block_tables.stride(0), h, inputs.sm_scale * LOG2E,
        PAGE=block, D=d, GROUP=group, BLOCK_M=max(16, triton.next_power_of_2(group)), W=pages, NUM_SPLITS=SPLITS,
        num_warps=warps, num_stages=stages)
    out = torch.empty_like(q)
    pda._paged_decode_combine[(b * h * lq,)](
        part_m, part_l, part_acc, out, *out.stride(), h, lq,
        HEAD_DIM=d, BLOCK_D=triton.next_power_of_2(d), NUM_SPLITS=SPLITS, BLOCK_S=triton.next_power_of_2(SPLITS),
        num_warps=1)
    return out


def offline() -> int:
    production = compile_split(True, 64, 4, 3)
    rows = [("library, 64-key tiles, 4 warps, 3 stages", production, 4, 64)]
    for pages, warps, stages in PROBE_CONFIGS:
        rows.append((f"pages per warp: {pages} pages, {warps} warps, {stages} stages",
                     compile_pages(pages, warps, stages), warps, 16 * pages))
    for name, kernel, warps, keys in rows:
        loop = {k: v for k, v in loop_counts(kernel).items() if k != "opcodes"}
        registers = cubin_resources(kernel)["registers"]
        per_64 = loop["instructions"] * warps * 64 // keys
        print(f"{name}: {registers} registers, {kernel.metadata.shared // 1024} KiB shared, "
              f"{65536 // (registers * warps * 32)} programs per SM by registers; loop per iteration "
              f"({keys} keys): {loop}; instructions per 64 keys, all warps: {per_64}")
    return 0


def on_gpu(out_path: str, rounds: int = 7) -> int:
    """Per context (b64 h28/4 d128, pages of 16, fp8 cache): each probe config checked against the
    reference (poisoned output), then every correct one and the library's best fp8 config timed
    as CUDA-graph replays, interleaved over `rounds` rounds, medians."""
    from ops_bench import capture, graph_call_us  # noqa: E402 — benchmarks/ is on the path

    config = pda.SPEC.coerce_config(LIBRARY_CONFIG)
    report = {"device": torch.cuda.get_device_name(), "triton": triton.__version__, "torch": torch.__version__,
              "library_config": LIBRARY_CONFIG, "rows": []}
    for ctx in (4096, 16384):
        problem = pda.PagedDecodeProblem(b=64, h=28, hkv=4, lq=1, ctx=ctx, d=128, block_size=16, cache_dtype="fp8_e4m3")
        inputs = pda.SPEC.make_inputs(problem, torch.bfloat16, "cuda", 7)
        expected = pda.SPEC.reference(inputs)
        library_out = torch.full_like(inputs.q, float("nan"))
        calls = {"library": lambda: pda.launch(inputs, library_out, config)}
        rows = {"library": {"ctx": ctx, "impl": "library", "config": LIBRARY_CONFIG}}
        calls["library"]()
        rows["library"]["rel_error"] = float(pda.SPEC.compare(library_out, expected))
        for pages, warps, stages in PROBE_CONFIGS:
            name = f"pages{pages}_w{warps}_s{stages}"
            row = rows[name] = {"ctx": ctx, "impl": name, "pages": pages, "warps": warps, "stages": stages}
            try:
                got = launch_probe(inputs, pages, warps, stages)
                torch.cuda.synchronize()
            except Exception as exc:  # noqa: BLE001 — a config that does not compile is a row
                row["status"] = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                continue
            row["rel_error"] = float(pda.SPEC.compare(got, expected))
            row["status"] = "ok" if row["rel_error"] <= pda.SPEC.tolerance[torch.bfloat16] else "wrong"
            if row["status"] == "ok":
                calls[name] = lambda p=pages, w=warps, s=stages: launch_probe(inputs, p, w, s)
        graphs = {name: capture(fn) for name, fn in calls.items()}
        samples = {name: [] for name in graphs}
        for _ in range(rounds):
            for name, graph in graphs.items():
                samples[name].append(graph_call_us(graph))
        for name, values in samples.items():
            rows[name]["graph_us"] = statistics.median(values)
            rows[name]["vs_library"] = statistics.median(samples["library"]) / rows[name]["graph_us"]
        for row in rows.values():
            print(json.dumps(row), flush=True)
        report["rows"] += list(rows.values())
        del graphs, inputs, expected
        torch.cuda.empty_cache()
    Path(out_path).write_text(json.dumps(report, indent=1))
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--offline", action="store_true", help="no GPU: compile for sm_90 and count")
    parser.add_argument("--out", help="on a GPU: the results JSON")
    args = parser.parse_args(argv)
    if args.offline:
        return offline()
    if not torch.cuda.is_available() or not args.out:
        print("needs a CUDA GPU and --out (or --offline)", file=sys.stderr)
        return 2
    return on_gpu(args.out)


if __name__ == "__main__":
    raise SystemExit(main())

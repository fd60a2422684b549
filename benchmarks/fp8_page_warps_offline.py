"""Offline (no GPU): would paged decode over fp8 issue fewer instructions per key tile if each warp
owned whole pages? Compiled for sm_90 with Triton's bundled ptxas, read with cuobjdump.

Nsight Compute found the fp8 split kernel issue-bound (round 9 part A,
benchmarks/results/ncu_decode_stalls_h200_round9_A.txt): 760 SASS instructions and 8 CTA barriers
per 64-key tile in its loop, four warps splitting each tile's keys, so every tile's row max and
sum cross warps through shared memory. The kernel below is a sketch of the other layout: the tile
is [W pages, 16 tokens, D], the dots are batched over pages (Triton places the warps along that
dimension: warpsPerCTA [W, 1, 1]), each page keeps its own running max, sum and accumulator, and
the W partials combine once after the loop. It writes the split partials as the production kernel
does, but it is a probe, not a kernel of the library: nothing checks its results, and it knows
one layout only (lq=1, GQA packed, pages of 16, fp8 K/V).

Prints, per (W, warps, stages): registers, shared memory, the loop's instructions and barriers,
beside the production split kernel at its best fp8 config.

    PYTHONPATH=$PWD python benchmarks/fp8_page_warps_offline.py
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cubin import BIN, cubin_resources  # noqa: E402
from decode_registers_offline import compile_split  # noqa: E402



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
    fn = _fp8_pages_split
    pointers = {"Q": "*bf16", "KeyCache": "*fp8e4nv", "ValueCache": "*fp8e4nv", "BlockTables": "*i32",
                "ContextLens": "*i32", "PartM": "*fp32", "PartL": "*fp32", "PartAcc": "*fp32",
                "KScale": "*fp32", "VScale": "*fp32"}
    constexprs = dict(PAGE=16, D=128, GROUP=7, BLOCK_M=16, W=pages, NUM_SPLITS=2)
    names = fn.arg_names
    signature = {n: "constexpr" if n in constexprs else pointers.get(n, "fp32" if n == "qk_scale" else "i32")
                 for n in names}
    values = {(names.index(n),): v for n, v in constexprs.items()}
    aligned = [n for n in names if signature[n] != "constexpr" and (n in pointers or n.startswith("stride_"))]
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in aligned}
    source = ASTSource(fn=fn, signature=signature, constexprs=values, attrs=attrs)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps, num_stages=stages))


def loop_counts(kernel) -> dict:
    """The innermost backward branch's body: instructions, CTA barriers, shuffles, shared loads/stores."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        sass = subprocess.run([os.path.join(BIN, "cuobjdump"), "-sass", f.name], capture_output=True, text=True).stdout
    instructions = [(int(m.group(1), 16), m.group(2)) for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]
    for address, text in instructions:
        target = re.search(r"BRA\s+(?:\S+\s+)?0x([0-9a-f]+)", text)
        if target and int(target.group(1), 16) < address:
            body = [t for a, t in instructions if int(target.group(1), 16) <= a <= address]
            return {"instructions": len(body), "barriers": sum("BAR.SYNC" in t for t in body),
                    "shuffles": sum("SHFL" in t for t in body),
                    "shared_loads": sum(re.search(r"\bLDS", t) is not None for t in body),
                    "shared_stores": sum(re.search(r"\bSTS", t) is not None for t in body)}
    return {}


def main() -> int:
    production = compile_split(True, 64, 4, 3)
    rows = [("production, 64-key tiles, 4 warps, 3 stages", production, 4, 64)]
    for pages, warps, stages in ((4, 4, 2), (4, 4, 3), (2, 2, 3)):
        rows.append((f"pages per warp: {pages} pages, {warps} warps, {stages} stages",
                     compile_pages(pages, warps, stages), warps, 16 * pages))
    for name, kernel, warps, keys in rows:
        loop = loop_counts(kernel)
        registers = cubin_resources(kernel)["registers"]
        per_64 = loop["instructions"] * warps * 64 // keys
        print(f"{name}: {registers} registers, {kernel.metadata.shared // 1024} KiB shared, "
              f"{65536 // (registers * warps * 32)} programs per SM by registers; loop per iteration "
              f"({keys} keys): {loop}; instructions per 64 keys, all warps: {per_64}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

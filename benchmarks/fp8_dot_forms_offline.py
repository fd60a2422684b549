"""Which tensor-core instruction Triton 3.6 gives an fp8 × fp8 `tl.dot` on sm_90, by the dot's
shape and warps: compiled on a machine without a GPU (Triton's compiler and bundled ptxas;
cuobjdump reads the cubin), no speed measured.

Why it matters (issue 16): over an fp8 KV cache the decode loop is instruction-bound on the H200,
and a quarter of its instructions a key are the fp8 → fp16 unpacks (F2FP) of K and V
(benchmarks/results/decode_loop_offline*.json). A QK dot over e4m3 keys and an e4m3 query would
drop K's unpacks only if the dot runs on the tensor cores in fp8 (wgmma's QGMMA). Each probe
here is one dot of keys [M, 128] by a query [N, 128] transposed (or [128, N] as stored), both
e4m3 in global memory, beside the same dot after widening both to fp16; the row says which MMA
instruction the SASS holds and how many F2FP it issues.

    PYTHONPATH=$PWD python benchmarks/fp8_dot_forms_offline.py --out benchmarks/results/fp8_dot_forms_offline.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cubin

HEAD_DIM = 128
# (M keys, N query columns, warps): decode's transposed dots (8 columns: GQA ≤ 8 at one token),
# 16 and 32 columns (GQA 7 over 2–4 query tokens, padded), one and two warpgroups.
SHAPES = ((32, 8, 1), (64, 8, 4), (128, 8, 8), (64, 16, 4), (128, 16, 4), (128, 16, 8), (64, 32, 4))


@triton.jit
def _keys_by_query(K, Q, O, M: tl.constexpr, N: tl.constexpr, D: tl.constexpr, Q_TRANSPOSED: tl.constexpr,
                   FP8_DOT: tl.constexpr):
    m = tl.arange(0, M)
    n = tl.arange(0, N)
    d = tl.arange(0, D)
    k = tl.load(K + m[:, None] * D + d[None, :])
    if Q_TRANSPOSED:
        q = tl.trans(tl.load(Q + n[:, None] * D + d[None, :]))  # stored [N, D], as decode's query rows
    else:
        q = tl.load(Q + d[:, None] * N + n[None, :])  # stored [D, N]
    if not FP8_DOT:
        k = k.to(tl.float16)
        q = q.to(tl.float16)
    tl.store(O + m[:, None] * N + n[None, :], tl.dot(k, q))


def probe(m: int, n: int, warps: int, q_transposed: bool, fp8_dot: bool) -> dict:
    kernel = cubin.compile_sm90(_keys_by_query, {"K": "*fp8e4nv", "Q": "*fp8e4nv", "O": "*fp32"},
                                {"M": m, "N": n, "D": HEAD_DIM, "Q_TRANSPOSED": q_transposed, "FP8_DOT": fp8_dot}, warps, 1)
    opcodes = Counter(cubin.opcode(text) for _, text in cubin.sass_instructions(kernel))
    mma = sorted({op for op in opcodes if "MMA" in op})
    return {"M": m, "N": n, "K": HEAD_DIM, "num_warps": warps, "q_transposed": q_transposed,
            "operands": "e4m3" if fp8_dot else "widened to fp16", "mma": mma,
            "mma_count": sum(c for op, c in opcodes.items() if "MMA" in op),
            "f2fp": sum(c for op, c in opcodes.items() if op.startswith("F2FP")),
            "registers": cubin.cubin_resources(kernel)["registers"], "shared_bytes": kernel.metadata.shared,
            "native_fp8": any("E4M3" in op for op in mma)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="the results JSON")
    parser.add_argument("--shape", action="append", default=[], metavar="MxNxWARPS",
                        help="only these dots (keys x query columns x warps, e.g. 64x16x4); default: all of SHAPES")
    args = parser.parse_args(argv)
    shapes = SHAPES
    if args.shape:
        try:
            shapes = [tuple(int(x) for x in text.split("x")) for text in args.shape]
        except ValueError:
            parser.error(f"--shape takes MxNxWARPS, got {args.shape}")
        if any(len(shape) != 3 for shape in shapes):
            parser.error(f"--shape takes MxNxWARPS, got {args.shape}")
    rows = []
    for m, n, warps in shapes:
        for fp8_dot in (True, False):
            for q_transposed in (True, False):
                rows.append(probe(m, n, warps, q_transposed, fp8_dot))
                r = rows[-1]
                print(f"[{m}, {HEAD_DIM}] x [{HEAD_DIM}, {n}]{' (q transposed)' if q_transposed else ''}, "
                      f"{warps} warps, {r['operands']}: {', '.join(r['mma'])} x{r['mma_count']}, "
                      f"{r['f2fp']} F2FP", flush=True)
    if args.out:
        args.out.write_text(json.dumps({"command": "python " + " ".join(sys.argv), "triton": triton.__version__,
                                        "target": "sm_90", "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

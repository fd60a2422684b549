"""The KV write kernel's static SASS for sm_90, compiled on a machine without a GPU (Triton's
compiler and its bundled ptxas; cuobjdump reads the cubin): registers and instructions per
program at a few configs, over an fp8 and a bf16 cache (head dim 128, bf16 tokens, pages of 16).

At the H200 table's config for 65,536 tokens (8 tokens × 1 kv head a program, 2 warps) each
thread writes 16 elements of K and 16 of V, so the program's fixed work — the slot's block and
offset, addresses, the scale's reciprocal — is most of what it issues. The signature mimics a
real call's specialisation (unit innermost strides as constants; pointers, other strides and the
page size divisible by 16); the page size is passed as the kernel declares it (a constant where
it is a tl.constexpr). Static counts, not executed ones or speed.

    PYTHONPATH=$PWD python benchmarks/write_instructions_offline.py --out benchmarks/results/write_instructions_offline.json
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from pathlib import Path

import triton

from omnitune.kernels import kv_cache_write as kvw

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cubin import compile_sm90, cubin_resources, sass_instructions  # noqa: E402

# (BLOCK_T, BLOCK_H, num_warps): the H200 table's fp8 config at 65,536 tokens and at 8,192, and larger tiles.
CONFIGS = ((8, 1, 2), (4, 2, 2), (16, 1, 4), (32, 2, 4))
BLOCK_SIZE = 16


def compile_write(fp8: bool, block_t: int, block_h: int, warps: int):
    fn = kvw._kv_cache_write
    cache = "fp8e4nv" if fp8 else "bf16"
    pointers = {"Key": "*bf16", "Value": "*bf16", "KeyCache": f"*{cache}", "ValueCache": f"*{cache}",
                "SlotMapping": "*i64", "KScale": "*fp32", "VScale": "*fp32"}
    constexprs = dict(HEAD_DIM=128, BLOCK_D=128, BLOCK_T=block_t, BLOCK_H=block_h, QUANTIZE=fp8,
                      EXACT_ROUNDING=False, stride_kd=1, stride_vd=1, stride_kcd=1, stride_vcd=1)
    if any(p.name == "BLOCK_SIZE" and p.is_constexpr for p in fn.params):
        constexprs["BLOCK_SIZE"] = BLOCK_SIZE
    return compile_sm90(fn, pointers, constexprs, warps, 1, aligned=("BLOCK_SIZE", "CAPACITY"))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    rows = []
    for fp8 in (True, False):
        for block_t, block_h, warps in CONFIGS:
            kernel = compile_write(fp8, block_t, block_h, warps)
            body = [re.sub(r"^@!?U?P\w+\s+", "", text) for _, text in sass_instructions(kernel)]
            opcodes = Counter(text.split()[0].split(".")[0] for text in body)
            elements = block_t * block_h * 128 // (32 * warps)  # of K (and as many of V) per thread
            rows.append({"cache": "fp8" if fp8 else "bf16", "BLOCK_T": block_t, "BLOCK_H": block_h,
                         "num_warps": warps, **cubin_resources(kernel), "instructions": len(body),
                         "elements_per_thread": elements, "opcodes": dict(opcodes.most_common())})
            print(f"{rows[-1]['cache']:4s} BLOCK_T={block_t:2d} BLOCK_H={block_h} warps={warps}: "
                  f"{rows[-1]['registers']} registers, {len(body)} instructions a thread for {elements} elements "
                  f"of K and of V", flush=True)
    if args.out:
        args.out.write_text(json.dumps({"command": " ".join(sys.argv), "triton": triton.__version__,
                                        "target": "sm_90", "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Registers and shared memory of the paged-decode split kernel for sm_90, compiled on a machine
without a GPU (Triton's compiler and its bundled ptxas; cuobjdump reads the cubin).

The fp8 decode's speed is bound by how many programs fit an SM (round 7 part E: 168 registers per
thread over fp8 against 126 over bf16 at the same config), and that is decided at compile time,
so a change to the kernel can be judged here before it costs device time. The signature mimics
the real call's specialisation (unit innermost strides and LQ = 1 as constants, pointers, strides
and page counts divisible by 16), and reproduces what the H200 reported
(benchmarks/results/fp8_decode_probe_h200.json): 126 / 164 / 126 registers over bf16 and
168 / 199 / 128 over fp8 at (BLOCK_N, warps, stages) = (64, 4, 2), (128, 4, 3), (128, 8, 3) — and,
for the kernel of round 8 (V through its scale's significand), 100 / 158 / 102 over fp8
(benchmarks/results/fp8_decode_probe_h200_round8_A.json).

    PYTHONPATH=$PWD python benchmarks/decode_registers_offline.py
    python benchmarks/decode_registers_offline.py --loop --out benchmarks/results/decode_loop_offline.json
    python benchmarks/decode_registers_offline.py --rows --out benchmarks/results/decode_default_tiles_offline.json

--loop counts the instructions of the split kernel's key loop in its SASS (one iteration: one tile
of BLOCK_N keys, per warp), over both caches at the configs the searches and sweeps explored, and
divides by the keys each warp's share covers: instructions issued per key, all warps together.
Over an fp8 cache a key is half the bytes, so at the same issue rate the loop would have to issue
half as many instructions per key as over bf16 to read as fast; this says how far it is from that.
Static counts of one iteration, not executed counts or speed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import triton

from omnitune.kernels import paged_decode_attention as pda

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cubin
from cubin import cubin_resources, loop_counts

_UNIT = ("stride_qd", "stride_kcd", "stride_vcd", "stride_od", "stride_btp", "LQ")


# Extra constexprs for every compiled kernel (--set NAME=VALUE): the switches of a kernel variant of
# benchmarks/variants applied to the working tree.
EXTRA_CONSTEXPRS: dict[str, int] = {}


def compile_split(kv_fp8: bool, block_n: int = 64, warps: int = 4, stages: int = 2, splits: int = 2,
                  block_m: int = 16):
    """The split kernel for b×28 query heads over 4 kv heads (GQA 7, packed), d=128, pages of 16."""
    fn = pda._paged_decode_split
    kv = "fp8e4nv" if kv_fp8 else "bf16"
    pointers = {"Q": "*bf16", "KeyCache": f"*{kv}", "ValueCache": f"*{kv}", "BlockTables": "*i32",
                "ContextLens": "*i32", "Out": "*bf16", "PartM": "*fp32", "PartL": "*fp32", "PartAcc": "*fp32",
                "Tickets": "*i32", "KScale": "*fp32", "VScale": "*fp32"}
    constexprs = dict(PAGE_SIZE=16, HEAD_DIM=128, BLOCK_D=128, GROUP=7, BLOCK_M=block_m, BLOCK_N=block_n,
                      NUM_SPLITS=splits, PACK_GQA=True, FUSED_REDUCE=False, BLOCK_S=triton.next_power_of_2(splits),
                      IEEE_DOT=False, PAGE_GUARD=2, KV_FP8=kv_fp8, ROWS_32=True, **{name: 1 for name in _UNIT},
                      **EXTRA_CONSTEXPRS)
    return compile_sm90(fn, pointers, constexprs, warps, stages)


def compile_sm90(fn, pointers: dict, constexprs: dict, warps: int, stages: int):
    """A decode split kernel compiled for sm_90 as a real call specialises it: `pointers` typed as
    given, `constexprs` fixed, qk_scale fp32 and every other argument i32; pointers, strides and
    page counts divisible by 16."""
    return cubin.compile_sm90(fn, pointers, constexprs, warps, stages, aligned=("NUM_BLOCKS", "MAX_PAGES"),
                              floats=("qk_scale",))


def resources(kernel) -> dict:
    return {**cubin_resources(kernel), "shared_bytes": kernel.metadata.shared}


# (BLOCK_N, warps, stages): the tuned fp8 and bf16 configs at b64 4k (64, 4, 3 and 64, 4, 2), and
# fewer warps a program, smaller tiles, larger tiles.
LOOP_CONFIGS = ((64, 4, 3), (64, 4, 2), (128, 4, 3), (32, 4, 3), (64, 2, 3), (32, 2, 3), (16, 2, 3),
                (64, 1, 3), (32, 1, 3), (16, 1, 3))
# Opcode families reported per key: the tensor-core MMAs, the conversions (fp8 → fp16 unpacks and
# fp32 → fp16 packs), fp16 → fp32 widening (HADD2.F32) and fp32 multiplies, integer multiply-adds
# (addresses, and register moves as IMAD.MOV), and the shared-memory and cross-lane traffic.
LOOP_FAMILIES = ("HMMA", "F2FP", "HADD2", "FMUL", "IMAD", "LDS", "LDSM", "STS", "STSM", "SHFL", "BAR")


def loop_rows(block_m: int = 16) -> list[dict]:
    rows = []
    for kv_fp8 in (True, False):
        for block_n, warps, stages in LOOP_CONFIGS:
            kernel = compile_split(kv_fp8, block_n, warps, stages, block_m=block_m)
            loop = loop_counts(kernel)
            per_key = warps / block_n  # one iteration per warp covers BLOCK_N keys with the others
            rows.append({"cache": "fp8" if kv_fp8 else "bf16", "BLOCK_N": block_n, "num_warps": warps,
                         "num_stages": stages, **resources(kernel), "loop_instructions_per_warp": loop["instructions"],
                         "instructions_per_key": round(loop["instructions"] * per_key, 2),
                         "per_key": {f: round(loop["opcodes"].get(f, 0) * per_key, 2) for f in LOOP_FAMILIES},
                         "barriers": loop["barriers"], "opcodes": loop["opcodes"]})
            row = rows[-1]
            print(f"{row['cache']:4s} BLOCK_N={block_n:3d} warps={warps} stages={stages}: "
                  f"{row['registers']} registers, "
                  f"{row['shared_bytes'] // 1024} KiB shared; loop {loop['instructions']} instructions a warp, "
                  f"{row['instructions_per_key']} a key: {row['per_key']}", flush=True)
    return rows


# The 16-bit tile default_config gives a program by the query rows it serves (GQA group × query
# tokens, padded), head dim 128, 3 stages: (rows, BLOCK_N, num_warps).
DEFAULT_TILES = ((16, 64, 4), (32, 32, 2), (64, 64, 4), (128, 64, 8))
# sm_90: 228 KiB of shared memory an SM, of which 1 KiB is reserved per resident block; 64K registers.
SHARED_PER_SM, SHARED_RESERVED_PER_BLOCK, REGISTERS_PER_SM = 233472, 1024, 65536


def programs_per_sm(row: dict, warps: int) -> int:
    """How many programs of a compiled tile an SM holds at once, by shared memory and registers."""
    by_shared = SHARED_PER_SM // (row["shared_bytes"] + SHARED_RESERVED_PER_BLOCK)
    by_registers = REGISTERS_PER_SM // (row["registers"] * warps * 32)
    return min(by_shared, by_registers)


def default_tile_rows() -> list[dict]:
    """Each default tile's registers, shared memory and programs an SM (default_config's waves)."""
    rows = []
    for block_m, block_n, warps in DEFAULT_TILES:
        row = resources(compile_split(False, block_n, warps, 3, block_m=block_m))
        rows.append({"rows": block_m, "BLOCK_N": block_n, "num_warps": warps, "num_stages": 3, **row,
                     "programs_per_sm": programs_per_sm(row, warps)})
        print(f"{block_m:3d} rows, BLOCK_N={block_n:3d} warps={warps}: {row['registers']} registers, "
              f"{row['shared_bytes']} B shared: {rows[-1]['programs_per_sm']} programs an SM", flush=True)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loop", action="store_true", help="count the key loop's instructions per key")
    parser.add_argument("--rows", action="store_true",
                        help="the default tile for each count of query rows (bf16, head dim 128, 3 stages): how "
                             "many programs an SM holds")
    parser.add_argument("--out", type=Path, help="with --loop or --rows: the results JSON")
    parser.add_argument("--block-m", type=int, default=16,
                        help="with --loop: the tile's query rows (the 7 of GQA 7 padded to this; 8 for a kernel "
                             "variant whose dots run transposed below 16 rows)")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=INT",
                        help="an extra constexpr for every kernel compiled (a variant's switch, e.g. Q_FP8=1 with "
                             "benchmarks/variants/decode_fp8_query_e4m3.patch applied)")
    args = parser.parse_args(argv)
    for item in args.set:
        name, _, value = item.partition("=")
        if not name.isidentifier() or not value.lstrip("-").isdigit():
            parser.error(f"--set takes NAME=INT, got {item!r}")
        EXTRA_CONSTEXPRS[name] = int(value)
    if args.rows:
        rows = default_tile_rows()
        if args.out:
            args.out.write_text(json.dumps({"command": "python benchmarks/decode_registers_offline.py --rows",
                                            "triton": triton.__version__, "target": "sm_90",
                                            "problem": "b x 28 query heads over 4 kv heads, d=128, pages of 16, "
                                                       "bf16, 2 splits", "rows": rows}, indent=1))
        return 0
    if args.loop:
        rows = loop_rows(args.block_m)
        if args.out:
            args.out.write_text(json.dumps({"command": "python " + " ".join(sys.argv),
                                            "triton": triton.__version__, "target": "sm_90",
                                            "problem": "b x 28 query heads over 4 kv heads, d=128, pages of 16, "
                                                       "one query token, 2 splits", "block_m": args.block_m,
                                            "rows": rows}, indent=1))
        return 0
    for kv_fp8 in (False, True):
        for block_n, warps, stages in ((64, 4, 2), (128, 4, 3), (128, 8, 3)):
            row = resources(compile_split(kv_fp8, block_n, warps, stages))
            per_sm = 65536 // (row["registers"] * warps * 32)
            print(f"{'fp8 ' if kv_fp8 else 'bf16'} BLOCK_N={block_n:3d} warps={warps} stages={stages}: "
                  f"{row['registers']} registers, {row['shared_bytes'] // 1024} KiB shared, "
                  f"{per_sm} programs per SM by registers")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

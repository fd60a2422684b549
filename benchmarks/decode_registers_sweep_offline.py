"""The split kernel's registers, shared memory, programs per SM and K/V bytes in flight per SM
over a grid of configs, bf16 and fp8 caches, compiled for sm_90 without a GPU (see
decode_registers_offline.py). An estimate of occupancy, not of speed.

    PYTHONPATH=$PWD python benchmarks/decode_registers_sweep_offline.py
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import decode_registers_offline as D  # noqa: E402

SHARED_PER_SM = 228 * 1024
for fp8 in (False, True):
    for bn in (64, 128):
        for w in (4, 8):
            for st in (2, 3, 4):
                r = D.resources(D.compile_split(fp8, bn, w, st))
                regs, sh = r["registers"], r["shared_bytes"]
                by_regs = 65536 // (((regs + 7) // 8 * 8) * w * 32)  # allocated per thread in units of 8
                by_smem = SHARED_PER_SM // (sh + 1024)  # 1 KiB reserved per block
                programs = min(by_regs, by_smem, 32)
                in_flight = programs * max(1, st - 1) * bn * 128 * (1 if fp8 else 2) * 2
                print(f"{'fp8 ' if fp8 else 'bf16'} BLOCK_N={bn} warps={w} stages={st}: {regs} registers, "
                      f"{sh // 1024} KiB shared -> {programs} programs/SM, {in_flight // 1024} KiB of K/V in flight")

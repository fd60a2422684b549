"""benchmarks/decode_registers_offline.py --loop's count on the CPU: the paged-decode split kernel
compiled for sm_90 (Triton's bundled ptxas; read with cuobjdump), its key loop found in the SASS
and its instructions counted. Run in a child process without TRITON_INTERPRET (the suite
interprets kernels when there is no GPU; this compiles them for real)."""

from __future__ import annotations

import json

from conftest import compile_for_sm90

_COUNT = """
import json, sys
sys.path.insert(0, "benchmarks")
from decode_registers_offline import compile_split
from cubin import loop_counts
print(json.dumps({cache: loop_counts(compile_split(cache == "fp8", 64, 4, 3)) for cache in ("fp8", "bf16")}))
"""


def test_the_key_loop_is_found_and_counted():
    done = compile_for_sm90(["-c", _COUNT])
    assert done.returncode == 0, done.stderr[-2000:]
    loops = json.loads(done.stdout.strip().splitlines()[-1])
    for cache, loop in loops.items():
        opcodes = loop["opcodes"]
        assert sum(opcodes.values()) == loop["instructions"] > 100, cache
        # One 64-key tile over 4 warps: q·kᵀ [16, 64] and p·v [16, 128] are 64 + 64 m16n8k16 MMAs.
        assert opcodes["HMMA"] * 4 == 128, cache
        assert loop["barriers"] >= 1 and opcodes["BRA"] >= 1, cache
    # Over fp8 both K and V are widened from e4m3 in the loop: 2 × 64 × 128 elements, two an
    # unpack, over 128 threads — at least 64 unpacks a thread; over bf16 there is nothing to widen.
    assert loops["fp8"]["opcodes"]["F2FP"] >= 64 > loops["bf16"]["opcodes"].get("F2FP", 0)


_TILES = """
import json, sys
sys.path.insert(0, "benchmarks")
from decode_registers_offline import default_tile_rows
print(json.dumps({row["rows"]: row["programs_per_sm"] for row in default_tile_rows()}))
"""


def test_the_default_waves_are_the_programs_an_sm_holds_of_each_tile():
    """default_config's programs an SM, per tile, are what the compiler makes of those tiles for
    sm_90 (shared memory and registers): a kernel change that moves them fails here."""
    from omnitune.kernels import paged_decode_attention as pda

    done = compile_for_sm90(["-c", _TILES])
    assert done.returncode == 0, done.stderr[-2000:]
    per_sm = {int(rows): n for rows, n in json.loads(done.stdout.strip().splitlines()[-1]).items()}
    assert per_sm[16] == pda._PROGRAMS_PER_SM_3_STAGES
    assert per_sm[32] == pda._PROGRAMS_PER_SM_32_ROWS
    assert per_sm[128] == pda._PROGRAMS_PER_SM_128_ROWS
    assert per_sm[64] == 2  # the rule keeps 3 here: no measured problem tells the two apart

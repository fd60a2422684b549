"""benchmarks/long_decode_sweep.py's grid (no GPU): every config it would time is valid for the
shape, and --fused-reduce measures each config both ways."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sweep = pytest.importorskip("benchmarks.long_decode_sweep")


def test_the_fused_reduce_grid_holds_every_config_both_ways_and_only_valid_ones():
    from omnitune.kernels.paged_decode_attention import SPEC, PagedDecodeProblem

    problem = PagedDecodeProblem(b=1, h=28, hkv=4, lq=1, ctx=32768, d=128, block_size=16)
    plain = sweep.configs_for(problem, torch.bfloat16)
    both = sweep.configs_for(problem, torch.bfloat16, {**sweep.GRID, "FUSED_REDUCE": (False, True)})
    assert plain and not any(c["FUSED_REDUCE"] for c in plain)
    assert {c.replace(FUSED_REDUCE=False) for c in both if c["FUSED_REDUCE"]} == set(plain)
    assert len(both) == 2 * len(plain)
    assert not any(SPEC.violations(problem, c, torch.bfloat16) for c in both)

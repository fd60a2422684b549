"""benchmarks/decode_all_heads_probe.py's split kernel (every kv head of a sequence in one program,
whole cache slots a tile) against the float64 reference of the paged cache, through the library's
combine: under Triton's interpreter in fp16 on the CPU, in bf16 on a GPU. The probe's timings are
only worth reading if its outputs are right."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

probe = pytest.importorskip("decode_all_heads_probe")
from omnitune.kernels import paged_decode_attention as pda  # noqa: E402


@pytest.mark.parametrize("b, ctx, splits, block_n", probe.CHECK_CASES)
def test_the_probe_matches_the_reference(device, b, ctx, splits, block_n):
    dtype = torch.float16 if device == "cpu" else torch.bfloat16
    out, want, _ = probe.checked_case(b, ctx, splits, block_n, torch.device(device), dtype)
    tolerance = 5e-3 if dtype == torch.float16 else 2e-2  # the spec's per-dtype tolerance
    assert torch.isfinite(out).all()
    assert probe._rel(out, want) < tolerance


def test_the_probe_refuses_what_it_does_not_decode(device):
    problem = pda.PagedDecodeProblem(b=1, h=8, hkv=2, lq=2, ctx=40, d=32, block_size=16)
    dtype = torch.float16 if device == "cpu" else torch.bfloat16
    inputs = pda.SPEC.make_inputs(problem, dtype, torch.device(device), seed=0)
    with pytest.raises(ValueError, match="one token"):
        probe.AllHeadsDecode(inputs, 2, 16, 4, 2)

"""benchmarks/fp8_page_warps_probe.py's kernel (warps that own whole pages) against the spec's
reference over an fp8 cache, under Triton's interpreter on the CPU in fp16 (the interpreter gets
bf16 wrong; the probe's dots are fp16 whatever the activations, as the library's are for 16-bit
ones, so fp32's tolerance is not its to meet), bf16 on a GPU."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from omnitune.kernels import paged_decode_attention as pda  # noqa: E402

probe = pytest.importorskip("fp8_page_warps_probe")


@pytest.mark.parametrize("pages, warps", [(4, 4), (2, 2)])
def test_the_probe_matches_the_reference_over_an_fp8_cache(device, pages, warps):
    dtype = torch.float16 if device == "cpu" else torch.bfloat16
    # 3 sequences of 7 query heads over 1 kv head and 2 sequences' lengths that end mid-page.
    problem = pda.PagedDecodeProblem(b=3, h=14, hkv=2, lq=1, ctx=200, d=32, block_size=16, cache_dtype="fp8_e4m3")
    inputs = pda.SPEC.make_inputs(problem, dtype, device, 3)
    inputs.context_lens.copy_(torch.tensor([200, 131, 77], dtype=torch.int32))
    expected = pda.SPEC.reference(inputs)
    got = probe.launch_probe(inputs, pages, warps, 2)
    assert not got.isnan().any()
    assert pda.SPEC.compare(got, expected) <= pda.SPEC.tolerance[dtype]


def test_a_wrong_scale_is_caught_by_the_same_check(device):
    dtype = torch.float16 if device == "cpu" else torch.bfloat16
    problem = pda.PagedDecodeProblem(b=2, h=4, hkv=2, lq=1, ctx=96, d=32, block_size=16, cache_dtype="fp8_e4m3")
    inputs = pda.SPEC.make_inputs(problem, dtype, device, 4)
    expected = pda.SPEC.reference(inputs)
    inputs.v_scale.mul_(1.5)  # the kernel reads a scale the reference did not use
    assert pda.SPEC.compare(probe.launch_probe(inputs, 4, 4, 2), expected) > pda.SPEC.tolerance[dtype]

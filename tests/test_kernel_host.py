"""omnitune.kernels._host: the helpers the kernel modules share outside their device code."""

from __future__ import annotations

import math

import torch

from omnitune.kernels._host import LOG2E, seeded_rand


def test_log2e():
    assert LOG2E == math.log2(math.e)


def test_seeded_rand_draws_float32_on_the_cpu_then_moves():
    rand = seeded_rand(torch.Generator().manual_seed(5), "cpu", torch.float16)
    expected_gen = torch.Generator().manual_seed(5)
    a, b = rand(3, 4), rand(2, scale=0.5)
    assert a.dtype == torch.float16 and a.shape == (3, 4)
    assert torch.equal(a, torch.randn((3, 4), generator=expected_gen, dtype=torch.float32).to(torch.float16))
    assert torch.equal(b, (torch.randn((2,), generator=expected_gen, dtype=torch.float32) * 0.5).to(torch.float16))
    raw = seeded_rand(torch.Generator().manual_seed(5))(3)
    assert raw.dtype == torch.float32

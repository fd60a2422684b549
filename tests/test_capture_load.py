"""Loading a launch by capturing it (omnitune.measure.capture_load) on the GPU: a launch that breaks
the capture raises from load, and leaves this process able to draw random numbers on the GPU and to
load the next launch."""

from __future__ import annotations

import pytest
import torch


@pytest.mark.gpu
def test_a_launch_that_breaks_the_capture_leaves_the_random_generator_usable():
    from omnitune.measure.capture_load import CaptureLoader

    loader = CaptureLoader()
    x = torch.rand(1 << 16, device="cuda")

    def syncs():
        x.add_(1.0)
        return float(x.sum().item())  # a host sync: not allowed while capturing

    with pytest.raises(Exception):
        loader.load(syncs)
    assert loader.usable
    torch.manual_seed(3)
    first = torch.randn(1024, device="cuda")  # failed before: "Offset increment outside graph capture"
    torch.manual_seed(3)
    assert torch.equal(first, torch.randn(1024, device="cuda"))
    before = x.clone()
    loader.load(lambda: x.mul_(2.0))  # captured, not run
    torch.cuda.synchronize()
    assert torch.equal(x, before)

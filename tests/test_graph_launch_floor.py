"""benchmarks/graph_launch_floor.py's read kernel, the floor under any decode's read of its K and V:
it must read every element once (its sum against torch's, under Triton's interpreter on the CPU in
fp16, bf16 on a GPU), and the check that guards the floor must catch a reader that skips bytes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

probe = pytest.importorskip("graph_launch_floor")


@pytest.mark.parametrize("programs, block", [(3, 64), (8, 128), (1, 32)])
def test_the_read_kernel_reads_every_element_once(device, programs, block):
    dtype = torch.float16 if device == "cpu" else torch.bfloat16
    flat = torch.randn(block * 37, device=device, dtype=dtype)  # 37 blocks: programs do not divide them
    probe.read_sum_checked(flat, programs, block, 4, 1)()  # checks its own sum first; a second call reads again


def test_a_reader_that_skips_a_block_fails_the_check(device, monkeypatch):
    dtype = torch.float16 if device == "cpu" else torch.bfloat16
    flat = (torch.rand(64 * 9, device=device) + 0.5).to(dtype)  # all positive: a skipped block shows
    real = probe._read_blocks

    class SkipsLastBlock:  # launches the real kernel over one block fewer
        def __getitem__(self, grid):
            launch = real[grid]
            return lambda x, out, n_blocks, **kw: launch(x, out, n_blocks - 1, **kw)

    monkeypatch.setattr(probe, "_read_blocks", SkipsLastBlock())
    with pytest.raises(AssertionError, match="read kernel sums"):
        probe.read_sum_checked(flat, 2, 64, 4, 1)

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


def test_a_length_that_leaves_a_partial_tile_is_refused(device):
    flat = torch.randn(64 * 9 + 5, device=device)  # five elements no whole tile covers
    with pytest.raises(ValueError, match="not a multiple of 64"):
        probe.read_sum_checked(flat, 2, 64, 4, 1)


def _small_paged_inputs(device):
    from omnitune.kernels import paged_decode_attention as pda

    dtype = torch.float16 if device == "cpu" else torch.bfloat16
    # 100 keys over pages of 16: the last page is partial, and its tail (like the spare blocks)
    # holds +inf, so a reader that strays past a context sums to inf.
    problem = pda.PagedDecodeProblem(b=2, h=4, hkv=2, lq=1, ctx=100, d=32, block_size=16)
    return pda.SPEC.make_inputs(problem, dtype, device, seed=3)


@pytest.mark.parametrize("heads, splits, block_n", [(1, 1, 32), (1, 3, 16), (1, 8, 64), (2, 3, 16), (2, 1, 32)])
def test_the_paged_reader_reads_every_context_row_once(device, heads, splits, block_n):
    x = _small_paged_inputs(device)
    x.context_lens[1] = 77  # sequences of different lengths
    probe.paged_read_checked(x, heads, splits, block_n, 4, 2)()  # checks its own sum first; a second call reads again


def test_a_paged_reader_that_stops_short_fails_the_check(device, monkeypatch):
    x = _small_paged_inputs(device)
    x.key_cache.abs_()  # all finite values positive: the rows left out show in the sum
    x.value_cache.abs_()
    real = probe._read_pages

    class StopsShort:  # launches the real kernel with every context 16 keys shorter
        def __getitem__(self, grid):
            launch = real[grid]
            return lambda kc, vc, tables, lengths, *args, **kw: launch(kc, vc, tables, lengths - 16, *args, **kw)

    monkeypatch.setattr(probe, "_read_pages", StopsShort())
    with pytest.raises(AssertionError, match="paged reader sums"):
        probe.paged_read_checked(x, 2, 2, 16, 4, 2)


def test_a_variant_output_is_saved_first_then_checked_bit_for_bit(tmp_path):
    out = torch.randn(2, 28, 1, 128).to(torch.bfloat16)
    path = tmp_path / "outputs" / "b2_32768.pt"
    assert probe.same_output_as_before(out, path) is None and path.exists()
    assert probe.same_output_as_before(out.clone(), path) is True
    nudged = out.clone()
    nudged[1, 3, 0, 7] += 1  # one element of 7,168 off
    assert probe.same_output_as_before(nudged, path) is False

"""CUDA-event timing: host latency stays out of the figure (GPU only); the order of interleaving
is covered in test_finalists."""

from __future__ import annotations

import time

import pytest
import torch


@pytest.mark.gpu
def test_a_slow_host_does_not_inflate_the_device_time():
    from omnitune.profile.timing import time_cuda, time_interleaved

    x = torch.randn(1 << 20, device="cuda")

    def slow_host_fast_kernel():
        time.sleep(0.002)  # 2 ms of host work before a ~5 µs kernel, as a loaded CPU would do
        x.add_(1.0)

    timing = time_cuda(slow_host_fast_kernel, warmup=3, repetitions=10)
    assert timing.median_ms < 0.5, timing  # without the cushion: ≥ 2 ms
    samples = time_interleaved([slow_host_fast_kernel, lambda: x.mul_(1.0)], rounds=5)
    assert max(max(s) for s in samples) < 0.5, samples


def test_the_l2_flusher_reads_by_default_and_refuses_an_unknown_mode(monkeypatch):
    from omnitune.profile import timing

    monkeypatch.setattr(timing, "_FLUSH_BYTES", 4096)  # a small buffer: the CPU stands in for the GPU
    reader = timing.L2Flusher(device="cpu")
    assert reader.mode == "read"
    reader.buffer[3] = 7
    reader()
    assert int(reader.buffer[3]) == 7  # a read flush leaves the buffer (and so the L2) clean
    writer = timing.L2Flusher(device="cpu", mode="write")
    writer()
    assert int(torch.count_nonzero(writer.buffer)) == 0  # the old way writes every line
    with pytest.raises(ValueError, match="flush mode 'bogus'"):
        timing.L2Flusher(device="cpu", mode="bogus")

"""Compile and load a launch's kernels without running them: the launch is captured into a CUDA
graph that is thrown away.

Triton compiles (or loads from its disk cache) on a kernel's first launch with a new
specialisation, and a launch under capture takes the same path up to the point where the kernel
would be queued, where the capture records it instead. So a process can pay for compiling and
loading while another process times kernels on the same GPU, and put nothing on the GPU beside
them: a lane loads each config before it takes the GPU lock (omnitune.measure.runner), and a
precompile worker compiles each config it is handed (omnitune.measure.precompile).

Capture is relaxed (other threads may use the GPU meanwhile). A launch that cannot be captured
(a host sync inside it) raises from `load`; its kernels are compiled by then when the compiler
ran before the failing call. A capture that cannot even be ended leaves its stream capturing:
the loader then turns itself off, and its owner launches for real from then on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


class CaptureLoader:
    """Loads launches by capturing them on a side stream of its own (made on first use)."""

    def __init__(self):
        self.usable = True
        self._stream: torch.cuda.Stream | None = None

    def load(self, launch: Callable[[], Any], *, before_end: Callable[[], None] | None = None) -> None:
        """Capture `launch()` into a graph and drop it. `before_end` runs before the capture ends
        (an end that fails still leaves the kernels compiled: what to keep of them is kept)."""
        if self._stream is None:
            self._stream = torch.cuda.Stream()
        graph = torch.cuda.CUDAGraph()
        # A capture takes the device's random generator into capture mode, and only an end that
        # succeeds takes it out again: after a launch that broke the capture (a host sync inside
        # it), every random draw on the GPU in this process failed ("Offset increment outside
        # graph capture"). Its state before the capture is put back then.
        generator = torch.cuda.default_generators[torch.cuda.current_device()]
        before = generator.clone_state()
        try:
            with torch.cuda.stream(self._stream):
                graph.capture_begin(capture_error_mode="relaxed")
                try:
                    launch()
                finally:
                    if before_end is not None:
                        before_end()
                    graph.capture_end()
        except Exception:
            if _capturing(self._stream):
                self.usable = False
            generator.graphsafe_set_state(before)
            raise


def _capturing(stream: torch.cuda.Stream) -> bool:
    try:
        with torch.cuda.stream(stream):
            return torch.cuda.is_current_stream_capturing()
    except Exception:  # noqa: BLE001 — a stream that cannot even be asked is not used again
        return True

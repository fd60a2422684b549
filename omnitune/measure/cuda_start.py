"""A lane's CUDA context, made in the background while the lane still starts.

A process makes its CUDA context (and loads cuBLAS, with its handle) on its first GPU call, and
opens NVML for the trials' telemetry on its first timing. In a lane both came under the GPU lock
(omnitune.measure.gpu_lock), with the first problem: the lanes made their contexts one after
another, each holding the lock while the GPU sat idle — in round 19's whole-model searches the
lanes held the lock 95% of the 5 s after the go, the GPU busy 14% of it. Made before the go
(round 19 parts A and B), the contexts delayed the lanes' readiness instead. Here a thread makes
them beside the lane's last imports and its wait for the go, and the lane waits for the thread
(`wait`) once it has the go, before its first problem.

Nothing here runs a kernel: an allocation makes the context, cuBLAS's handle is made without one,
and NVML only reads, so the GPU that another lane may be timing on is left alone. An optimisation
only: whatever fails is logged, and the lane's first GPU call makes what is missing, as before.
"""

from __future__ import annotations

import logging
import threading
import time

log = logging.getLogger(__name__)


class CudaStart:
    """A thread making this process's CUDA context; `began`/`ended` in time.monotonic()."""

    def __init__(self) -> None:
        self.began: float | None = None
        self.ended: float | None = None
        self.error: str | None = None
        self._thread = threading.Thread(target=self._run, name="omnitune-cuda-start", daemon=True)

    def start(self) -> CudaStart:
        self._thread.start()
        return self

    def _run(self) -> None:
        self.began = time.monotonic()
        try:
            import torch  # waits for the main thread's import of torch, if that is under way

            torch.empty(1, device="cuda")  # an allocation: the primary context, no kernel
            torch.cuda.current_blas_handle()  # cuBLAS loaded and its handle made, no kernel
            from omnitune.profile import telemetry

            telemetry.available()  # NVML opened for the trials' telemetry, not on a lane's first timing
        except Exception as exc:  # noqa: BLE001 — the lane's first GPU call makes it, as before
            from omnitune.errors import one_line

            self.error = one_line(exc)
            log.debug("the CUDA context was not made ahead: %s", self.error)
        finally:
            self.ended = time.monotonic()

    def wait(self, timeout_s: float = 120.0) -> None:
        """Until the context is made (or failed, or `timeout_s` passed: the lane goes on and its
        first GPU call waits for the driver instead)."""
        self._thread.join(timeout_s)

    def as_stats(self) -> dict:
        return {"cuda_start_began": self.began, "cuda_start_ended": self.ended, "cuda_start_error": self.error}


def start_cuda_context() -> CudaStart:
    """Start making this process's CUDA context in a thread (CudaStart)."""
    return CudaStart().start()

"""Where compile workers come from: a fork server that has imported torch, Triton and the kernels once.

Kept apart from omnitune.measure.precompile (which compiles on those workers) and free of torch:
asking how workers start, how many there are, or starting their server costs no import of torch.
A lane starts the server just after its own import of torch; started before it (round 21 part A),
the lanes were ready ~2 s later (omnitune.cli.search_cmd).
"""

from __future__ import annotations

import multiprocessing
import os

from omnitune.registry import BUILTIN_KERNELS

# Leave a core for the measuring process and one for the system.
_RESERVED_CORES = 2

# What a compile worker imports before its first config: torch, Triton, and the kernel modules with
# what they import (not torch._dynamo: tests/test_dispatch_import.py). A whole-model search starts 27
# workers at once (3 lanes × 9), and on the H200's host their start kept its 16 cores 91–100% busy
# for 20 s before the GPU's first work (round 16). Nine workers' first configs took 59.6 s of CPU
# spawned and 16.4 s forked from this preload (benchmarks/compile_worker_start.py, round 17). None of
# these imports may initialize CUDA, which a forked process could then not use (a test holds it).
WORKER_PRELOAD = ("torch", "triton", "omnitune.measure.precompile", "omnitune.registry", *BUILTIN_KERNELS.values())


def default_workers() -> int:
    """Compile processes when the user names no number: the CPU cores less two."""
    return max(1, min(32, (os.cpu_count() or 2) - _RESERVED_CORES))


def worker_start_method() -> multiprocessing.context.BaseContext:
    """How compile workers start: forked from a fork server that has imported WORKER_PRELOAD once
    (each worker then starts with them, and makes its own CUDA context), or, where there is no fork
    server, as fresh interpreters ("spawn"). Never forked from a measuring process: it holds a CUDA
    context, which a child cannot use. What the preloaded modules read on import (TRITON_INTERPRET)
    is as it was when the fork server started, and omnitune sets that before it imports any kernel."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(WORKER_PRELOAD))
    return context


def start_worker_server() -> None:
    """Start the fork server that compile workers come from (worker_start_method) now, rather than
    when the first problem makes its pool: it imports WORKER_PRELOAD while this process still
    starts. Quick here (the server is spawned, not waited for); nothing where workers are spawned."""
    context = worker_start_method()
    if context.get_start_method() == "forkserver":
        from multiprocessing import forkserver

        forkserver.ensure_running()

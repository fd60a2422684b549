"""`omnitune search` in lanes (omnitune.search.lanes): how many, the arguments each lane's own
`omnitune search` gets, and the session that starts them and relays what they print."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING

from rich.markup import escape

from omnitune.cli.common import console, write_output_file
from omnitune.errors import OmnituneError
from omnitune.search.lanes import (
    SESSION_PID_ENV,
    LaneProcesses,
    LaneSession,
    LanesResult,
    lane_command,
)

if TYPE_CHECKING:
    from omnitune.measure.cuda_start import CudaStart

# Lanes a search of several problems runs by default on a GPU. On the H200's host a trial's host
# work (choosing, storing) took about as long as its measuring (~40 ms each, round 13), so two
# lanes barely cover it; and a lane waits for compiles, not only for the GPU: from an empty Triton
# cache the Qwen2.5-Omni-7B preset took 150 s in three lanes and 136 s in four, in one session
# (round 18, search_wall_h200_round18_B_lanes{3,4}.json).
DEFAULT_LANES = 4


def lanes_to_run(requested: int | None, problems: int, *, interpret: bool, isolate: bool, gpus: list[int] | None,
                 in_lane: bool) -> int:
    """How many lanes a search of `problems` runs: never more than it has problems."""
    if in_lane:
        return 1
    if requested is None:
        requested = 1 if interpret or isolate or gpus else DEFAULT_LANES
    if requested > 1 and gpus:
        raise OmnituneError("--lanes share one GPU; --gpus measures one study on several: give one of them")
    return max(1, min(requested, problems))


def lanes_to_start(requested: int | None, *, shapes: int, model: str | None, dtype: str | None, interpret: bool,
                   isolate: bool, gpus: str | None) -> int:
    """How many lanes to start before the search has checked its arguments (0: none), so that
    their start overlaps its own: a search that will run in lanes unless its arguments say
    otherwise. lanes_to_run decides afterwards, and lanes it does not need are told to exit."""
    if gpus is not None or isolate:
        return 0
    count = requested if requested is not None else (1 if interpret else DEFAULT_LANES)
    dtypes = max(1, len([name for name in (dtype or "").split(",") if name.strip()]))
    if count <= 1 or (model is None and shapes * dtypes <= 1):
        return 0
    return count


def lane_workers(workers: int, lanes: int) -> int:
    """Compile processes each lane gets out of `workers` (0: none): twice its even share, up to all
    of them. In round 15's whole-model search, lanes of an even share (4 of 14) waited for compiles
    while the host's cores were 47% busy: a lane on a kernel that compiles slowly (attention, ~1.5 s
    of CPU a config) needs more processes than one on a kernel that compiles fast, and they seldom
    all compile at once (in_lane_order). The workers run at a lower priority than the lanes
    (omnitune.measure.precompile.COMPILE_NICENESS), so that a busy host slows compiling, not
    measuring."""
    if not workers:
        return 0
    return max(1, min(workers, 2 * workers // lanes))


def in_lane_order(targets: list, index: int) -> list:
    """The session's kernels in the order lane `index` takes them: each lane starts on another
    kernel (lane 1 on the second, ...) and goes round. Lanes that all started on the first kernel
    compiled the same kind of kernel at the same time — attention's configs compile in ~1.5 s of
    CPU each — and left the GPU idle while they did; started apart, a lane compiling overlaps one
    measuring. Each problem is still searched once: by the first lane to claim it."""
    if not targets:
        return targets
    turn = index % len(targets)
    return targets[turn:] + targets[:turn]


# FLOPs that take as long as moving one byte on the H200 (~790 TFLOP/s of bf16 over ~4.8 TB/s):
# how problems_in_lane_order weighs a compute-bound problem against a bandwidth-bound one. Only
# the order of one kernel's problems depends on it.
RIDGE_FLOPS_PER_BYTE = 165


def problems_in_lane_order(target, index: int):
    """`target` (a kernel, its dtype and its problems) with its problems in the order lane `index`
    takes them, by the kernel's roofline time: longest first in even lanes, shortest first in odd
    ones. A long problem keeps the GPU busy (its timing is long); a short one keeps the host busy
    (choosing and storing take as long as its timing). The preset's own order ended a whole-model
    search on its largest problems, one lane alone on the GPU for its last ~10 s (round 18); every
    lane longest first kept the GPU saturated early and ended with four short problems, the GPU
    59-78% busy for the last 25 s (round 19, part A). Lanes that meet in the middle search a long
    and a short problem side by side throughout and end on middling ones."""
    def work(problem) -> float:
        return max(target.spec.flops(problem) / RIDGE_FLOPS_PER_BYTE, target.spec.bytes_moved(problem, target.dtype))

    ordered = sorted(target.problems, key=work, reverse=index % 2 == 0)
    return dataclasses.replace(target, problems=ordered)


def lane_argv(*, kernel: str | None, shape: list[str], model: str | None, kernels: str | None, dtype: str | None,
              trials: int, sampler: str, seed: int, db: str, storage: str | None, isolate: bool,
              trial_timeout: float, precompile: int | None, interpret: bool, tries: list[str] = ()) -> list[str]:
    """The arguments of a lane's own `omnitune search`: this search's, with the session's
    problems. What the session decides once it has checked them (its deadline, each lane's share
    of the compile processes, the finalists and profiling that can run here) reaches the lanes
    with the go (LaneProcesses.go)."""
    from omnitune.cli._app import debugging

    argv = ["--debug"] if debugging() else []
    argv += ["search"] + ([kernel] if kernel is not None else [])
    for one in shape:
        argv += ["--shape", one]
    if model is not None:
        argv += ["--model", model]
    if kernels is not None:
        argv += ["--kernels", kernels]
    if dtype is not None:
        argv += ["--dtype", dtype]
    argv += ["--trials", str(trials), "--sampler", sampler, "--seed", str(seed), "--db", db]
    if precompile is not None:
        argv += ["--precompile", str(precompile)]
    if storage is not None:
        argv += ["--storage", storage]
    if isolate:
        argv += ["--isolate", "--trial-timeout", repr(trial_timeout)]
    if interpret:
        argv.append("--interpret")
    for one in tries:
        argv += ["--try", one]
    return argv


def start_lanes(argv: list[str], lanes: int) -> LaneProcesses:
    """Start `lanes` processes of this session's search (`argv`: lane_argv's), each with its index,
    in a session folder of their own. They start while this process checks its arguments, and wait
    for search_in_lanes to let them go before they touch the database."""
    import tempfile

    from omnitune.measure.gpu_lock import GPU_LOCK_ENV

    folder = tempfile.mkdtemp(prefix="omnitune-lanes-")
    env = dict(os.environ, **{GPU_LOCK_ENV: str(LaneSession(folder, 0).gpu_lock_path),
                              SESSION_PID_ENV: str(os.getpid())})
    commands = [lane_command() + argv + ["--lane-session", folder, "--lane-index", str(i)] for i in range(lanes)]

    def echo(index: int, line: str) -> None:  # the console takes its own lock: relays may call at once
        console.print(f"[dim]{index}│[/] {escape(line)}", soft_wrap=True, highlight=False)

    return LaneProcesses(commands, folder, env=env, echo=echo)


def call_off(started: LaneProcesses) -> None:
    """End lanes started for a session that will not run them (a mistake in its arguments, one
    problem only, Ctrl-C while it started): they exit, and what they printed is dropped."""
    import shutil

    started.cancel()
    shutil.rmtree(started.folder, ignore_errors=True)


def search_in_lanes(started: LaneProcesses, lanes: int, settings: dict, *, db: str, storage: str | None,
                    lane_stats: str | None = None) -> int:
    """Let `lanes` of the lanes `started` search with `settings` (LaneSession.wait_for_go; any
    further lane exits), relaying what each prints, then say how long the session took, how long
    the lanes held the GPU, and what for. `lane_stats`: a file to write each lane's accounting to
    (JSON). Returns the session's exit code (130: interrupted)."""
    import json
    import shutil

    from omnitune.store import default_storage_url, open_db, open_optuna_storage

    try:
        # Made once here, so that the lanes do not race to create the database's tables; the
        # storage first, so that one that cannot be opened leaves no new, empty database behind.
        open_optuna_storage(storage or default_storage_url(db))
        open_db(db)
    except BaseException:
        call_off(started)
        raise
    console.print(f"searching in {lanes} lanes sharing the GPU (--lanes); each problem's lines carry its lane",
                  soft_wrap=True)
    try:
        started.go({**settings, "lanes": lanes})
        result = started.wait()
    finally:
        shutil.rmtree(started.folder, ignore_errors=True)
    console.print(lanes_summary(result, lanes), soft_wrap=True)
    if lane_stats is not None:
        stats = json.dumps({"lanes": lanes, "wall_s": result.wall_s, "stats": result.stats})
        write_output_file(Path(lane_stats), stats, "--lane-stats")
    return result.returncode


def lanes_summary(result: LanesResult, lanes: int) -> str:
    """How long the session took, how long a lane held the GPU, and what the lanes held it for."""
    held, wall = result.gpu_held_s, max(result.wall_s, 1e-9)
    line = f"{lanes} lanes: {result.wall_s:.1f} s in all; a lane held the GPU {held:.1f} s of it ({held / wall:.0%})"
    phases = {phase: seconds for phase, seconds in result.held_by_phase.items() if seconds >= 0.05}
    if phases:
        other = held - sum(result.held_by_phase.values())
        parts = [f"{phase} {seconds:.1f} s" for phase, seconds in phases.items()]
        if other >= 0.05:
            parts.append(f"the rest {other:.1f} s")
        line += ": " + ", ".join(parts)
    return line


def leave_lane_stats(lane: LaneSession, cuda_start: CudaStart | None = None) -> None:
    """What the parent reports of this lane: how long it held and waited for the GPU, what its
    first holdings were spent on, and when it was ready, went, and had its CUDA context."""
    from omnitune.measure.gpu_lock import gpu_lock_from_env

    lock = gpu_lock_from_env()
    lane.write_stats({"lane": lane.index, "gpu_lock_held_s": lock.held_s, "gpu_lock_waited_s": lock.waited_s,
                      "gpu_lock_acquisitions": lock.acquisitions, "gpu_lock_phase_s": dict(lock.phase_s),
                      "gpu_lock_holdings": [[round(a, 6), round(b, 6)] for a, b in lock.holdings],
                      "gpu_lock_first_phases": lock.first_phases,
                      "ready_at": lane.ready_at, "go_at": lane.go_at,
                      **(cuda_start.as_stats() if cuda_start is not None else {})})

"""`omnitune search` in lanes (omnitune.search.lanes): how many, the arguments each lane's own
`omnitune search` gets, and the session that starts them and relays what they print."""

from __future__ import annotations

import os

from rich.markup import escape

from omnitune.cli.common import console
from omnitune.errors import OmnituneError
from omnitune.search.lanes import LaneSession

# Lanes a search of several problems runs by default on a GPU: on the H200's host a trial's host
# work (choosing, storing) took about as long as its measuring (~40 ms each, round 13), so two
# lanes barely cover it and a third covers the trials whose measuring is short.
DEFAULT_LANES = 3


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


def lane_argv(*, kernel: str | None, shape: list[str], model: str | None, kernels: str | None, dtype: str | None,
              trials: int, timeout: float | None, sampler: str, seed: int, db: str, storage: str | None,
              finalists: int, profile_top: int, isolate: bool, trial_timeout: float, precompile: int,
              interpret: bool) -> list[str]:
    """The arguments of a lane's own `omnitune search`: this search's, with the session's
    problems and its share of the compile processes."""
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
    argv += ["--trials", str(trials), "--sampler", sampler, "--seed", str(seed), "--db", db,
             "--finalists", str(finalists), "--profile-top", str(profile_top), "--precompile", str(precompile)]
    if timeout is not None:
        argv += ["--timeout", repr(timeout)]
    if storage is not None:
        argv += ["--storage", storage]
    if isolate:
        argv += ["--isolate", "--trial-timeout", repr(trial_timeout)]
    if interpret:
        argv.append("--interpret")
    return argv


def search_in_lanes(argv: list[str], lanes: int, *, db: str, storage: str | None) -> int:
    """Run the search as `lanes` lane processes sharing this GPU (omnitune.search.lanes), relaying
    what each prints, then say how long the session took and how long the lanes held the GPU.
    Returns the session's exit code (130: interrupted)."""
    import tempfile

    from omnitune.measure.gpu_lock import GPU_LOCK_ENV
    from omnitune.search.lanes import lane_command, run_lanes
    from omnitune.store import default_storage_url, open_db, open_optuna_storage

    # Made once here, so that the lanes do not race to create the database's tables.
    open_db(db)
    open_optuna_storage(storage or default_storage_url(db))
    with tempfile.TemporaryDirectory(prefix="omnitune-lanes-") as folder:
        env = dict(os.environ, **{GPU_LOCK_ENV: str(LaneSession(folder, 0).gpu_lock_path)})
        commands = [lane_command() + argv + ["--lane-session", folder, "--lane-index", str(i)] for i in range(lanes)]
        console.print(f"searching in {lanes} lanes sharing the GPU (--lanes); each problem's lines carry its lane",
                      soft_wrap=True)
        def echo(index: int, line: str) -> None:  # the console takes its own lock: relays may call at once
            console.print(f"[dim]{index}│[/] {escape(line)}", soft_wrap=True, highlight=False)

        result = run_lanes(commands, folder, env=env, echo=echo)
    held, wall = result.gpu_held_s, max(result.wall_s, 1e-9)
    console.print(f"{lanes} lanes: {result.wall_s:.1f} s in all; a lane held the GPU {held:.1f} s of it "
                  f"({held / wall:.0%})", soft_wrap=True)
    return result.returncode


def leave_lane_stats(lane: LaneSession) -> None:
    """What the parent reports of this lane: how long it held and waited for the GPU."""
    from omnitune.measure.gpu_lock import gpu_lock_from_env

    lock = gpu_lock_from_env()
    lane.write_stats({"lane": lane.index, "gpu_lock_held_s": lock.held_s, "gpu_lock_waited_s": lock.waited_s,
                      "gpu_lock_acquisitions": lock.acquisitions})

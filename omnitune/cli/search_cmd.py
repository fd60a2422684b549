"""`omnitune search`: find the fastest correct launch config of a kernel, one Optuna study per
shape, with a live view of the search and a one-line summary per shape (omnitune.cli.live)."""

from __future__ import annotations

import dataclasses
import threading
import time
from contextlib import nullcontext
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

import typer
from rich.live import Live
from rich.markup import escape

from omnitune.cli import preflight
from omnitune.cli._app import app
from omnitune.cli.common import (
    DB_DEFAULT_HELP,
    SHAPE_HELP,
    console,
    db_path,
    err_console,
    interpret_option,
    load_spec,
    parse_problems,
    parse_tries,
    preset_kernel_names,
    require_named,
    search_dtype,
    search_dtype_names,
    search_dtype_option,
    seconds_option,
    try_option,
)
from omnitune.cli.live import LiveView, ProgressLines, finalist_lines, search_title, summary_line
from omnitune.cli.profile_top import profile_best, profile_top_possible
from omnitune.cli.search_lanes import (call_off, in_lane_order, lane_argv, lane_workers, lanes_to_run, lanes_to_start,
                                      leave_lane_stats, problems_in_lane_order, search_in_lanes, start_lanes)
from omnitune.errors import DeviceError, OmnituneError
from omnitune.search.finalists import DEFAULT_FINALISTS, DEFAULT_ROUNDS, NOISY_CV

if TYPE_CHECKING:
    import torch

    from omnitune.search.lanes import LaneSession
    from omnitune.search.prepare_next import ProblemsAhead
    from omnitune.spec import KernelSpec

RESUME_HINT = "rerun the same command to resume: finished trials are kept and not measured again"


# Below this many known configs, starting the compile processes costs about what it saves.


@app.command()
def search(
    kernel: str = typer.Argument(
        None, help="Kernel name (see `omnitune kernels`) or a module/file defining SPEC. With --model: "
        "search only this kernel (same as --kernels KERNEL).", show_default=False,
    ),
    shape: list[str] = typer.Option(
        [], "--shape", "-s",
        help="Problem to tune for, as name=value pairs, e.g. b=1,h=28,hkv=4,l=8192,d=128,causal=1; " + SHAPE_HELP
        + " Repeatable: one study per shape (and dtype). Give --shape or --model, not both.",
    ),
    model: str = typer.Option(
        None, "--model",
        help="Search every problem a model preset's traffic gives each kernel (see `omnitune plan --model`), "
        "instead of --shape, e.g. qwen2.5-omni-7b. Several presets, comma-separated, are searched in one "
        "session, each problem once.", show_default=False,
    ),
    kernels: str = typer.Option(
        None, "--kernels", metavar="K1,K2",
        help="With --model: the kernels to search, comma-separated (with --shape, name the KERNEL instead). "
        "\\[default: every kernel of the preset]",
        show_default=False,
    ),
    dtype: str = search_dtype_option(" Several, comma-separated (e.g. bf16,fp16): every problem is searched in "
                                     "each, one study per dtype."),
    trials: int = typer.Option(
        50, "--trials", "-n", min=1,
        help="Configs to measure per study (one shape in one dtype), in total: a rerun resumes and counts the "
        "configs already measured. Configs the constraints reject are not counted. When the kernel has no more "
        "valid configs than this, all of them are measured.",
    ),
    timeout: float = seconds_option(
        None, "--timeout", minimum=0.001,
        help="Start no new trial after this many seconds of the whole session (every shape, kernel and dtype "
        "together); rerun to continue. \\[default: no limit]",
    ),
    sampler: str = typer.Option(
        "tpe", "--sampler",
        help="tpe (Bayesian, learns which regions are fast), random, grid (valid configs in order), "
        "or cmaes (needs the cmaes package). The default config is always measured first.",
    ),
    # max: numpy's RandomState, which Optuna's samplers seed, takes only 0..2**32-1.
    seed: int = typer.Option(0, "--seed", min=0, max=2**32 - 1,
                             help="Seed of the sampler, for a reproducible search."),
    db: str = typer.Option(
        None, "--db", help="Results database the trials and winners are stored in (created if missing; see "
        "omnitune report)." + DB_DEFAULT_HELP, show_default=False,
    ),
    storage: str = typer.Option(
        None, "--storage",
        help="Optuna storage holding the studies: journal:///path (a journal file, shared by the processes "
        "of one host), sqlite:///path (three slashes: a path relative to the current folder; four, as in "
        "journal:////tmp/studies.log, an absolute one), or postgresql://host/omnitune to share them between "
        "hosts; not the --db file itself. "
        "\\[default: the journal <db stem>.optuna.log beside --db; <db stem>.optuna.db if that SQLite "
        "file is already there]",
        show_default=False,
    ),
    finalists: int = typer.Option(
        DEFAULT_FINALISTS, "--finalists", min=0,
        help=f"Before declaring a winner, re-time the K fastest configs (and the default) against each other, "
        f"interleaved over {DEFAULT_ROUNDS} rounds; the best re-timed median wins, and a CV over "
        f"{NOISY_CV:.0%} is flagged noisy. 0: no re-timing. Skipped under --interpret. In lanes, an op whose "
        "timed call syncs the host (kv_compress) is re-timed by the session once every lane has ended.",
    ),
    profile_top: int = typer.Option(
        0, "--profile-top", min=0,
        help="After the search, profile the K best configs with Nsight Compute (ncu) and store their "
        "counters (see omnitune report). Needs ncu and a GPU; without them the search still succeeds.",
    ),
    isolate: bool = typer.Option(
        False, "--isolate",
        help="Measure every candidate in a persistent worker process: a config that crashes it (illegal "
        "memory access, segfault, abort) or hangs past --trial-timeout is recorded as crashed or timeout, "
        "the worker is replaced, and the search goes on. Without it, candidates run in this process. "
        "With it, --lanes defaults to 1.",
    ),
    trial_timeout: float = seconds_option(
        120.0, "--trial-timeout", minimum=0.1,
        help="With --isolate or --gpus: seconds one trial may take (compile, check and timing) before its worker "
        "is killed; ignored otherwise.",
    ),
    gpus: str = typer.Option(
        None, "--gpus",
        help="Measure on several GPUs at once, e.g. 0,1: one isolated worker per GPU (implies --isolate), all "
        "sharing one study trial by trial. Not with --lanes above 1. With --interpret the numbers only name "
        "CPU workers.",
        show_default=False,
    ),
    precompile: int = typer.Option(
        None, "--precompile", min=0,
        help="Compile the search's next configs in this many processes while the GPU measures the current "
        "one: the driver keeps as many proposals queued as there are processes (TPE with its constant liar). "
        "They run at a lower priority than the search. With lanes, each lane gets twice its even share "
        "of them (up to all). 0: off. "
        "\\[default: the CPU cores less two (1 to 32) on a GPU; off with --interpret]",
        show_default=False,
    ),
    lanes: int = typer.Option(
        None, "--lanes", min=1,
        help="Search this many problems at once in processes of their own (lanes) that share the GPU: each "
        "problem is searched by one lane, and only one lane at a time runs anything on the GPU, so timings "
        "stay as exact as with one, while the others choose, store or prepare their next problem; each lane's "
        "lines start with its number. Never more lanes than problems; not with --gpus. "
        "\\[default: 4 on a GPU with several problems to search; 1 with --interpret, --isolate or --gpus]",
        show_default=False,
    ),
    tries: list[str] = try_option(),
    lane_session: str = typer.Option(None, "--lane-session", hidden=True),
    lane_stats: str = typer.Option(None, "--lane-stats", hidden=True,
                                   help="With lanes: write each lane's GPU-lock accounting to this JSON file."),
    lane_index: int = typer.Option(0, "--lane-index", hidden=True),
    interpret: bool = interpret_option(" The dtype is fp16 unless given (bf16 is refused); finalists are not "
                                       "re-timed and --profile-top does not run."),
) -> None:
    """Search a kernel's launch configs for the fastest one that matches the reference.

    Every candidate is checked against the reference before it is timed: a wrong config never wins.
    Configs that break a constraint are rejected without touching the GPU.
    The fastest few are then re-timed against each other (--finalists) before one is declared the winner.
    Results go to the results database (--db; see `omnitune report`), the Optuna studies to --storage.
    Ctrl-C keeps every finished trial; rerunning the same command resumes.

    Give a KERNEL and one or more --shape, or a --model preset: omnitune search attention --shape
    b=1,h=28,hkv=4,lq=1,lk=4096,d=128 --trials 60, or omnitune search --model qwen2.5-omni-7b.
    """
    db_path(db)  # an empty --db is refused before lanes start or anything is checked at length
    # So is an empty --storage: taken as not given, the studies went to the journal beside --db,
    # not to the storage the user meant to share (an unset variable in a worker script).
    require_named(storage, "--storage", "the Optuna storage (e.g. --storage journal:///studies.log), or leave "
                  "--storage out for the journal beside --db")
    deadline = None if timeout is None else time.monotonic() + timeout
    in_lane = lane_session is not None
    if in_lane and _precompile_workers(precompile, interpret):
        # torch first, then the server. Started before this lane imported torch (round 21 part A),
        # the server's imports and the CUDA thread's import of torch slowed the lane's own: the lanes
        # were ready ~2 s later, and their first GPU work and the GPU's busy share no better.
        import torch  # noqa: F401

        from omnitune.measure.worker_server import start_worker_server

        start_worker_server()  # its imports overlap this lane's; its first compile waits for none
    # A lane's CUDA context is made beside its imports and its wait for the go, not under the GPU
    # lock with its first problem (omnitune.measure.cuda_start).
    cuda_start = None
    if in_lane and not interpret:
        from omnitune.measure.cuda_start import start_cuda_context

        cuda_start = start_cuda_context()
    # Lanes start now, before this process imports torch and checks the arguments: each takes ~10 s
    # to import torch and Triton and load the kernels, and they wait for the go before they touch the
    # database.
    early = lanes_to_start(lanes, shapes=len(shape), model=model, dtype=dtype, interpret=interpret,
                           isolate=isolate, gpus=gpus) if not in_lane else 0
    started = _start_lanes(kernel, shape, model, kernels, dtype, trials, sampler, seed, db, storage, isolate,
                           trial_timeout, precompile, interpret, early, tries) if early else None
    try:
        targets = _targets(kernel, shape, model, kernels, dtype, interpret, quiet=in_lane)
        try_values = parse_tries(tries, [target.spec for target in targets])
        gpu_list = parse_gpus(gpus, interpret) if gpus is not None else None
        lanes = lanes_to_run(lanes, sum(len(t.problems) for t in targets), interpret=interpret, isolate=isolate,
                             gpus=gpu_list, in_lane=in_lane)
        # Imports Optuna: not at module level, so that `omnitune --help` stays quick.
        from omnitune.search.driver import make_sampler, parse_sampler

        sampler_name = parse_sampler(sampler)
        make_sampler(sampler_name, seed)  # a sampler that cannot run fails now, before anything is written
        import torch

        if not interpret and not torch.cuda.is_available():
            raise DeviceError(
                "no CUDA GPU here; search measures on a GPU — run it on one, or add --interpret to check "
                "configs on the CPU (timings not representative)"
            )
        if not in_lane:  # a lane is told what its session decided (with the go)
            if finalists and interpret:
                console.print("finalists not re-timed under --interpret (the interpreter's times mean nothing); "
                              "--finalists applies on a GPU", soft_wrap=True)
                finalists = 0
            profile_top = profile_top_possible(profile_top, interpret)
        precompile_workers = _precompile_workers(precompile, interpret)
        if lanes > 1 and started is None:
            started = _start_lanes(kernel, shape, model, kernels, dtype, trials, sampler, seed, db, storage, isolate,
                                   trial_timeout, precompile, interpret, lanes, tries)
    except BaseException:
        if started is not None:
            call_off(started)
        raise
    if lanes > 1:
        settings = {"deadline": deadline, "precompile": lane_workers(precompile_workers, lanes),
                    "finalists": finalists, "profile_top": profile_top}
        returncode = search_in_lanes(started, lanes, settings, db=str(db_path(db)), storage=storage,
                                     lane_stats=lane_stats)
        if returncode == 130:
            err_console.print(_interrupted_line(None))
        if returncode:
            raise typer.Exit(returncode)
        retime_after_lanes(targets, finalists=finalists, trials=trials, deadline=deadline, sampler_name=sampler_name,
                           seed=seed, db=db, storage=storage, interpret=interpret,
                           isolate_timeout_s=trial_timeout if isolate else None, try_values=try_values)
        return
    if started is not None:  # one problem after all: searched here
        call_off(started)
    lane = None
    if in_lane:
        from omnitune.search.lanes import LaneSession

        lane = LaneSession(lane_session, lane_index)
        settings = lane.wait_for_go()
        if cuda_start is not None:  # also when called off: the thread is not left mid-way at exit
            cuda_start.wait()
        if settings is None or lane.index >= settings.get("lanes", lane.index + 1):
            return  # called off, or more lanes were started than the session has problems for
        deadline = settings.get("deadline", deadline)
        precompile_workers = settings.get("precompile", precompile_workers)
        finalists = settings.get("finalists", finalists)
        profile_top = settings.get("profile_top", profile_top)
        try:
            lane.take_interrupts()
        except KeyboardInterrupt:
            raise typer.Exit(130) from None
        targets = [problems_in_lane_order(target, lane.index) for target in in_lane_order(targets, lane.index)]
    from omnitune.measure.gpu_lock import shared_with_compile_workers

    sharing = workers_share_the_gpu_lock(precompile_workers, interpret=interpret, gpus=gpu_list)
    with shared_with_compile_workers() if sharing else nullcontext():
        _search_targets(targets, trials=trials, deadline=deadline, sampler_name=sampler_name, seed=seed, db=db,
                        storage=storage, interpret=interpret, finalists=finalists, profile_top=profile_top,
                        isolate_timeout_s=trial_timeout if isolate or gpu_list else None, gpu_list=gpu_list,
                        precompile_workers=precompile_workers, lane=lane, try_values=try_values,
                        cuda_start=cuda_start)


def deferred_retime_targets(targets: list, finalists: int) -> list:
    """The targets whose finalists a session in lanes re-times itself once every lane has ended:
    those of an op whose timed call syncs the host (KernelSpec.syncs_host), when there are
    finalists to re-time. In a lane they would be re-timed while the other lanes compile and
    launch, on a busy host whose work their times include (finalists_in_lane)."""
    return [t for t in targets if t.spec.syncs_host] if finalists else []


def retime_after_lanes(targets: list, *, finalists: int, trials: int, deadline: float | None, sampler_name,
                       seed: int, db: str | None, storage: str | None, interpret: bool,
                       isolate_timeout_s: float | None, try_values: tuple[dict, ...]) -> None:
    """After every lane has ended: re-time here the finalists the lanes left to this session
    (deferred_retime_targets), by searching those problems again in this process, without compile
    workers. The lanes have ended, their workers with them: the host is quiet now."""
    retimed = deferred_retime_targets(targets, finalists)
    if not retimed:
        return
    problems = sum(len(t.problems) for t in retimed)
    names = ", ".join(sorted({t.spec.name for t in retimed}))
    console.print(f"re-timing the finalists of {problems} {names} problem(s) here, now that the lanes have ended: "
                  "the timed call includes host work, which the other lanes' compiles and launches would have "
                  "stretched", soft_wrap=True)
    _search_targets(retimed, trials=trials, deadline=deadline, sampler_name=sampler_name, seed=seed, db=db,
                    storage=storage, interpret=interpret, finalists=finalists, profile_top=0,
                    isolate_timeout_s=isolate_timeout_s, gpu_list=None, precompile_workers=0, lane=None,
                    try_values=try_values, cuda_start=None, retiming_only=True)


def finalists_in_lane(spec: KernelSpec, finalists: int, lane: LaneSession | None) -> int:
    """How many finalists this process re-times for `spec`: none in a lane when the spec's timed
    call syncs the host, its session re-timing them after the lanes (deferred_retime_targets)."""
    return 0 if lane is not None and spec.syncs_host else finalists


def workers_share_the_gpu_lock(precompile_workers: int, *, interpret: bool, gpus: list[int] | None) -> bool:
    """Whether this search's compile workers take a GPU lock with it, as lanes' do, so that a
    launch they cannot capture never runs beside a timing (gpu_lock.shared_with_compile_workers):
    with workers, on a GPU. Not with --gpus: one lock would hold every GPU's measurements to one
    at a time."""
    return precompile_workers > 0 and not interpret and gpus is None


def _search_targets(targets: list, *, trials: int, deadline: float | None, sampler_name, seed: int, db: str | None,
                    storage: str | None, interpret: bool, finalists: int, profile_top: int,
                    isolate_timeout_s: float | None, gpu_list: list[int] | None, precompile_workers: int,
                    lane: LaneSession | None, try_values: tuple[dict, ...], cuda_start,
                    retiming_only: bool = False) -> None:
    """Search every target's problems in this process, one after another (`retiming_only`: their
    trials are all measured, and the search is run again for its finalists)."""
    # With --precompile, each problem's first configs compile while the one before it is measured,
    # across kernels too: the session knows every problem in the order they are searched.
    ahead = None
    if precompile_workers:
        from omnitune.search.prepare_next import ProblemsAhead

        ahead = ProblemsAhead([(t.spec, p, t.dtype) for t in targets for p in t.problems],
                              workers=precompile_workers, trials=trials, claim=lane.claim if lane else None,
                              tries=try_values)
    try:
        for target in targets:
            # The timeout covers every kernel together; a kernel reached after it still says so.
            remaining_s = None if deadline is None else max(deadline - time.monotonic(), 1e-9)
            search_problems(target.spec, target.problems, target.dtype, trials=trials, timeout_s=remaining_s,
                        sampler=sampler_name.value, seed=seed, db=db, storage=storage, interpret=interpret,
                        finalists=finalists, profile_top=profile_top, kernel_arg=target.kernel_arg,
                        isolate_timeout_s=isolate_timeout_s, gpus=gpu_list,
                        precompile_workers=precompile_workers, ahead=ahead, lane=lane, tries=try_values,
                        retiming_only=retiming_only)
    except KeyboardInterrupt:
        err_console.print(_interrupted_line(lane))
        raise typer.Exit(130) from None
    finally:  # inside the lock's lifetime: the workers end before its file goes
        if ahead is not None:
            ahead.close()
        if precompile_workers:  # every problem's pool shared these processes (omnitune.measure.ahead)
            from omnitune.measure.ahead import close_shared_workers

            close_shared_workers()
        if lane is not None:
            leave_lane_stats(lane, cuda_start)


def _start_lanes(kernel: str | None, shape: list[str], model: str | None, kernels: str | None, dtype: str | None,
                 trials: int, sampler: str, seed: int, db: str | None, storage: str | None, isolate: bool,
                 trial_timeout: float, precompile: int | None, interpret: bool, lanes: int, tries: list[str]):
    """Start `lanes` lanes of this search (search_lanes.start_lanes), each with this search's arguments."""
    argv = lane_argv(kernel=kernel, shape=shape, model=model, kernels=kernels, dtype=dtype, trials=trials,
                     sampler=sampler, seed=seed, db=str(db_path(db)), storage=storage, isolate=isolate,
                     trial_timeout=trial_timeout, precompile=precompile, interpret=interpret, tries=tries)
    return start_lanes(argv, lanes)


@dataclass(frozen=True)
class _SearchTarget:
    """One kernel to search, and the problems to search it on."""

    kernel_arg: str
    spec: KernelSpec
    dtype: torch.dtype
    problems: list


def _targets(kernel: str | None, shapes: list[str], model: str | None, kernels: str | None,
             dtype: str | None, interpret: bool, quiet: bool = False) -> list[_SearchTarget]:
    """What to search: the kernel's --shape problems, or every problem of a model preset. `quiet`:
    say nothing of kernels skipped (a lane, whose session says it)."""
    from omnitune.presets import get_presets, models_problems, parse_kernels

    if shapes and model:
        raise OmnituneError("give --shape (with a KERNEL) or --model (a model preset), not both")
    if not shapes and not model:
        raise OmnituneError(
            "give at least one --shape (with a KERNEL) or a --model preset, e.g. omnitune search attention "
            "--shape b=1,h=28,hkv=4,lq=1,lk=4096,d=128 or omnitune search --model qwen2.5-omni-7b"
        )
    if shapes:
        if kernel is None:
            raise OmnituneError("--shape needs a KERNEL, e.g. omnitune search attention --shape ...")
        if kernels is not None:
            raise OmnituneError("--kernels goes with --model; with --shape name the KERNEL")
        spec = load_spec(kernel, interpret)
        problems = parse_problems(spec, shapes)
        return [_SearchTarget(kernel, spec, search_dtype(spec, name, interpret), problems)
                for name in search_dtype_names(dtype)]
    presets = get_presets(model)
    if kernel is not None and kernels is not None:
        raise OmnituneError("name the kernels either as KERNEL or with --kernels, not both")
    names = ", ".join(p.name for p in presets)
    who = presets[0].description if len(presets) == 1 else names
    dtype_names = search_dtype_names(dtype)
    searched = []  # (kernel, spec, problems): built once, whatever the number of dtypes
    for name in parse_kernels(kernel) if kernel is not None else preset_kernel_names(kernels):
        spec = load_spec(name, interpret)  # before the presets build problems: --interpret must apply first
        problems = [p.problem for p in models_problems(presets, name, spec.problem_key)]
        if not problems:
            if not quiet:
                console.print(f"{name}: {who} never runs it; skipped", soft_wrap=True)
            continue
        searched.append((name, spec, problems))
    if not searched:
        raise OmnituneError(f"nothing to search: {names} sends none of the kernels asked for any problem")
    return [_SearchTarget(name, spec, search_dtype(spec, dtype_name, interpret), problems)
            for dtype_name in dtype_names for name, spec, problems in searched]


def parse_gpus(text: str, interpret: bool) -> list[int]:
    """--gpus 0,1,3 as GPU indices; an OmnituneError naming what is wrong."""
    import torch

    try:
        gpus = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise OmnituneError(f"--gpus takes GPU indices separated by commas, e.g. 0,1; got {text!r}") from None
    if not gpus or any(g < 0 for g in gpus):
        raise OmnituneError(f"--gpus takes GPU indices separated by commas, e.g. 0,1; got {text!r}")
    if len(set(gpus)) != len(gpus):
        raise OmnituneError(f"--gpus names a GPU twice: {text!r}")
    if not interpret and torch.cuda.is_available():
        count = torch.cuda.device_count()
        missing = [g for g in gpus if g >= count]
        if missing:
            raise DeviceError(f"--gpus {text}: this machine has {count} GPU(s), numbered 0 to {count - 1}")
    return gpus


def _interrupted_line(lane: LaneSession | None) -> str:
    """What an interrupted search says; a lane leaves the resume hint to the session it is part of."""
    return "interrupted" if lane is not None else f"interrupted; {RESUME_HINT}"


def _precompile_workers(requested: int | None, interpret: bool) -> int:
    """Processes for --precompile: none under the interpreter (nothing to compile)."""
    if interpret:
        return 0
    if requested is None:
        from omnitune.measure.worker_server import default_workers

        return default_workers()
    return requested


def search_problems(
    spec: KernelSpec, problems: list, dtype: torch.dtype, *, trials: int, timeout_s: float | None,
    sampler: str, seed: int, db: str | None, storage: str | None, interpret: bool, finalists: int = 0,
    profile_top: int = 0, kernel_arg: str = "", isolate_timeout_s: float | None = None,
    gpus: list[int] | None = None, heartbeat_interval_s: int | None = None, precompile_workers: int = 0,
    observers: tuple | None = None, ahead: ProblemsAhead | None = None, lane: LaneSession | None = None,
    tries: tuple[dict, ...] = (), retiming_only: bool = False,
) -> None:
    """Search each of `problems` in turn with a live view, then print its summary: the session that
    `omnitune search` runs per kernel and `omnitune worker` runs on a shared storage. `observers`:
    picklable observer factories (None: SearchOptions' default, NVML; none under the interpreter,
    where there is no GPU to watch). `ahead`: the session's look-ahead over its problems, which
    opens each problem's precompile pool (omnitune.search.prepare_next); with precompile_workers
    and none given, one over `problems`. `tries`: configs measured right after the default (--try).
    `retiming_only`: every problem's trials are measured, and it is searched again for its
    finalists (the session after its lanes): its progress line says so.
    `lane`: this process is one of the session's lanes (omnitune.search.lanes), and searches only
    the problems it claims first."""
    # Imported here, after load_spec: --interpret must take effect before any kernel is imported.
    import optuna

    from omnitune.measure.gpu_lock import gpu_lock_from_env
    from omnitune.measure.runner import Runner
    from omnitune.profile.device import current_device_facts
    from omnitune.search.driver import SearchInterrupted, SearchOptions, StopReason, run_search
    from omnitune.spec import DeviceLimits, dtype_name
    from omnitune.store import (SearchRunRecord, check_storage_url, default_storage_url, open_db,
                                open_optuna_storage, record_device, record_search_run, utc_now)

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # the live view reports every trial
    path = db_path(db)
    # Before the database is opened: a search that cannot run must leave no empty one behind.
    preflight.require_storage_apart(storage, path)
    preflight.require_storage_folder_meant(storage)
    if storage is not None:  # a file Optuna must not open (no file, another results database) is refused now
        check_storage_url(storage)
    for problem in problems:
        preflight.require_fits_in_memory(spec, problem, dtype, interpret)
    storage_url = storage or default_storage_url(path)
    if not path.exists():
        # A new database is made only once the storage opens (run_search opens it again): one that
        # cannot (a bad URL, a server not there, an unreadable journal) would otherwise leave an
        # empty database behind. An existing database is left as it was either way. Whether the
        # database could be made is said first, about --db, not as a journal beside it that cannot.
        preflight.require_writable_file(path, "--db")
        open_optuna_storage(storage_url, heartbeat_interval_s=heartbeat_interval_s)
    database = open_db(path)
    device = current_device_facts(interpret)
    record_device(database, device)
    limits = DeviceLimits() if interpret else DeviceLimits.of_current_device()
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    # The same search for every problem: only the time left changes.
    own_finalists = finalists_in_lane(spec, finalists, lane)
    retimed_by_session = own_finalists < finalists
    options = SearchOptions(device=device, trials=trials, storage_url=storage_url, sampler=sampler, seed=seed,
                            limits=limits, finalists=own_finalists,
                            heartbeat_interval_s=heartbeat_interval_s,
                            tries=tries)
    if interpret or observers is not None:  # no GPU to watch under the interpreter
        options = dataclasses.replace(options, observers=() if interpret else tuple(observers))

    own_ahead = None  # a look-ahead over these problems, when the session gave none
    if ahead is None and precompile_workers:
        from omnitune.search.prepare_next import ProblemsAhead

        ahead = own_ahead = ProblemsAhead([(spec, p, dtype) for p in problems], workers=precompile_workers,
                                          trials=trials, tries=tries)
    with own_ahead or nullcontext():
        for problem in problems:
            if lane is not None and not lane.claim((spec.name, spec.problem_key(problem), dtype_name(dtype))):
                continue  # another lane searches it
            remaining_s = None if deadline is None else deadline - time.monotonic()
            if remaining_s is not None and remaining_s <= 0:
                title = escape(search_title(spec, problem, dtype))
                console.print(f"{title}: not started, the timeout has passed; rerun to continue", soft_wrap=True)
                continue

            runners = []
            runners_lock = threading.Lock()

            def make_runner(problem=problem, gpu=None):
                if isolate_timeout_s is None:
                    with preflight.allocation_errors(spec, problem):
                        runner = Runner(spec, problem, dtype, interpret=interpret, observers=options.make_observers(),
                                        limits=limits)
                else:
                    from omnitune.measure.worker import IsolatedRunner

                    # The worker loads the kernel by the name the user gave, so files and modules work too.
                    runner = IsolatedRunner(kernel_arg or spec.name, problem, dtype, interpret=interpret, limits=limits,
                                            observer_factories=options.observers,
                                            timeout_s=isolate_timeout_s, gpu=gpu)
                with runners_lock:  # with --gpus, each slot's thread builds its runner
                    runners.append(runner)
                return runner

            factories = [make_runner] if not gpus else [partial(make_runner, gpu=gpu) for gpu in gpus]

            # --precompile: a pool for this problem, handed the next proposals while one is measured;
            # opened ahead, with its first configs compiling, while the problem before it was measured.
            pool, warm_start, prepare_next = nullcontext(), options.warm_start, None
            if ahead is not None:
                pool, prepared_warm_start = ahead.take(spec, problem, dtype)
                if prepared_warm_start is not None:
                    warm_start = prepared_warm_start
                prepare_next = partial(ahead.prepare_after, spec, problem, dtype, limits=limits, device_key=device.key,
                                       deadline=deadline, catalogue=path)

            # On a terminal a live view redrawn in place; elsewhere (a log, a pipe) the live view would
            # show nothing until the summary, so one line per measured trial instead.
            if console.is_terminal:
                view = LiveView(spec, problem, dtype, trials, sampler, interpret)
                showing, report_progress = Live(view, console=console, transient=True, refresh_per_second=4), view.update
            else:
                lines = ProgressLines(spec, problem, dtype, trials, sampler, retiming=retiming_only)
                showing, report_progress = nullcontext(), lines.update
            # The GPU time of this problem, and its wait behind other lanes: the in-process runner's
            # lock says (an isolated worker's is in its own process: not known here).
            gpu_lock = gpu_lock_from_env()
            held_before, waited_before = gpu_lock.held_s, gpu_lock.waited_s
            cpu_before = time.process_time()
            try:
                with pool as compiling, showing:
                    outcome = run_search(
                        spec, problem, dtype, dataclasses.replace(options, timeout_s=remaining_s, warm_start=warm_start),
                        runner_factories=factories, db=database, progress=report_progress, compile_ahead=compiling,
                        on_trials_claimed=prepare_next,
                    )
            except SearchInterrupted as stop:
                _close(runners)
                console.print(summary_line(spec, problem, dtype, stop.outcome, interpret), soft_wrap=True)
                err_console.print(_interrupted_line(lane))
                raise typer.Exit(130) from None
            _close(runners)
            compile_report = pool.report() if ahead is not None else None
            in_process = isolate_timeout_s is None
            lock_wait_s = gpu_lock.waited_s - waited_before if in_process else None
            # search_runs.lock_wait_s is the wait behind other lanes (omnitune plan takes it off the
            # wall); alone, the wait behind its own compile workers is part of the search's time.
            lanes_wait_s = lock_wait_s if lane is not None or lock_wait_s is None else 0.0
            record_search_run(database, SearchRunRecord(
                outcome.study_name, device.key, device.name, utc_now(), outcome.stop_reason.value, outcome.measured_now,
                outcome.wall_s, outcome.setup_s, outcome.retime_s,
                gpu_s=gpu_lock.held_s - held_before if in_process else None, lock_wait_s=lanes_wait_s,
                cpu_s=time.process_time() - cpu_before if in_process else None,
                compile_cpu_s=compile_report.cpu_s if compile_report is not None else None))
            if compile_report is not None:
                console.print(f"{escape(search_title(spec, problem, dtype))}: {compile_report.summary()}",
                              soft_wrap=True)
            console.print(summary_line(spec, problem, dtype, outcome, interpret), soft_wrap=True)
            for line in finalist_lines(outcome, spec.default_config(problem, dtype)):
                console.print(line, soft_wrap=True)
            if retimed_by_session:
                console.print("  finalists left to the session, to re-time once every lane has ended (this op's timed "
                              "call syncs the host, which the other lanes keep busy)", soft_wrap=True)
            if phases := outcome.phase_line():
                if lock_wait_s and lock_wait_s >= 0.05:
                    who, behind = (("lane", "other lanes") if lane is not None
                                   else ("search", "its compile workers' launches"))
                    phases += f"; the {who} waited {lock_wait_s:.1f} s of that for the GPU, behind {behind}"
                console.print(f"  {phases}", soft_wrap=True)
            if outcome.stop_reason is StopReason.CONTEXT_LOST:
                err_console.print(
                    "[red]error:[/] a config crashed the GPU (illegal memory access), and this process can no "
                    f"longer use it; it is recorded as crashed — {RESUME_HINT}"
                )
                raise typer.Exit(1)
            if profile_top:
                with gpu_lock:  # Nsight Compute replays the kernels: GPU work, one lane at a time
                    profile_best(spec, kernel_arg or spec.name, problem, dtype, outcome.ranking[:profile_top],
                                 database=database, device_key=device.key)


def _close(runners: list) -> None:
    """Stop isolated workers; an in-process Runner has nothing to close."""
    for runner in runners:
        close = getattr(runner, "close", None)
        if close is not None:
            close()

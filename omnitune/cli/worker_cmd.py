"""`omnitune worker`: join (or create) a shared study in an Optuna RDB storage and measure its
configs here, beside other workers on other hosts; see docs/distributed.md."""

from __future__ import annotations

import os

import typer

from omnitune.cli._app import app
from omnitune.cli.common import (
    DB_DEFAULT_HELP,
    SHAPE_HELP,
    db_path,
    interpret_option,
    search_dtype_option,
    seconds_option,
    try_option,
)
from omnitune.errors import DeviceError, OmnituneError

# Seconds between a running trial's heartbeats; a trial silent for four of them is failed and
# retried by the next worker that asks (omnitune.store.HEARTBEATS_BEFORE_STALE).
DEFAULT_HEARTBEAT_S = 10


@app.command()
def worker(
    kernel: str = typer.Argument(..., help="Kernel name (see `omnitune kernels`) or a module/file defining SPEC."),
    storage: str = typer.Option(
        ..., "--storage",
        help="The shared Optuna storage: a postgresql:// URL, as in the example above (psycopg 3: pip install "
        "'omnitune\\[postgres]'), or sqlite:///path for workers on one host; not the --db file itself.",
    ),
    shape: list[str] = typer.Option(
        ..., "--shape", "-s",
        help="Problem to tune for, as name=value pairs, e.g. b=1,h=28,hkv=4,l=4096,d=128; " + SHAPE_HELP
        + " Repeatable: one study per shape, searched one after another.",
    ),
    dtype: str = search_dtype_option(" One dtype per worker."),
    trials: int = typer.Option(
        50, "--trials", "-n", min=1,
        help="The study's total budget, shared by every worker: a worker stops once the measured and running "
        "trials of the study reach it. Give every worker the same number.",
    ),
    sampler: str = typer.Option("tpe", "--sampler", help="tpe, random, grid or cmaes, as for omnitune search."),
    # max: numpy's RandomState, which Optuna's samplers seed, takes only 0..2**32-1.
    seed: int = typer.Option(
        None, "--seed", min=0, max=2**32 - 1,
        help="Seed of the sampler. \\[default: a different one per worker, so that workers propose "
        "different configs]", show_default=False,
    ),
    gpu: int = typer.Option(None, "--gpu", min=0, help="Measure on this GPU of the host. \\[default: GPU 0]",
                            show_default=False),
    trial_timeout: float = seconds_option(
        120.0, "--trial-timeout", minimum=0.1,
        help="Seconds one trial may take (compile, check and timing) before the measuring process is killed; "
        "ignored with --no-isolate.",
    ),
    isolate: bool = typer.Option(
        True, "--isolate/--no-isolate",
        help="Measure in a worker subprocess that a crashing or hanging config cannot take down (the default); "
        "--no-isolate measures in this process: quicker to start, for configs known to be safe.",
    ),
    heartbeat: int = typer.Option(
        DEFAULT_HEARTBEAT_S, "--heartbeat", min=1,
        help="Seconds between heartbeats of the running trial; a worker silent for 4 of them is taken as dead: "
        "its trial is failed and retried once.",
    ),
    db: str = typer.Option(
        None, "--db", help="Local results database that also gets this worker's rows (created if missing)."
        + DB_DEFAULT_HELP, show_default=False,
    ),
    tries: list[str] = try_option(),
    interpret: bool = interpret_option(" The dtype is fp16 unless given (bf16 is refused)."),
) -> None:
    """Measure configs of a study shared by workers on several hosts.

    Every worker joins the study of KERNEL × shape × dtype × device in the storage (the first one
    creates it) and measures configs in an isolated process (unless --no-isolate) until the study
    holds --trials measured configs: no config is measured twice, and a worker that dies loses only
    its trial in flight. Start it again, with the same arguments, to go on after Ctrl-C.

    The finalists are not re-timed by workers: afterwards run omnitune search with the same
    arguments and --storage on one GPU to re-time them and fill the local database (or
    omnitune report --storage URL to read the results as they are).

    Example, on each host: omnitune worker attention --storage postgresql://user:password@host:5432/omnitune
    --shape b=1,h=28,hkv=4,l=8192,d=128,causal=1 --trials 200
    """
    from omnitune.cli.common import load_spec, parse_problems, parse_tries, search_dtype
    from omnitune.cli.search_cmd import search_problems
    from omnitune.search.driver import make_sampler, parse_sampler

    import torch

    if not storage.strip():
        raise OmnituneError("--storage needs a URL, e.g. postgresql://user:password@host:5432/omnitune")
    db_path(db)  # an empty --db is refused before the kernel is loaded
    spec = load_spec(kernel, interpret)
    problems = parse_problems(spec, shape)
    try_values = parse_tries(tries, [spec])
    torch_dtype = search_dtype(spec, dtype, interpret)
    sampler_name = parse_sampler(sampler)
    seed = seed if seed is not None else int.from_bytes(os.urandom(4), "little")
    make_sampler(sampler_name, seed)
    if not interpret and not torch.cuda.is_available():
        raise DeviceError("no CUDA GPU here; a worker measures on a GPU — or add --interpret to check configs on the CPU")
    if gpu is not None and not interpret and gpu >= torch.cuda.device_count():
        raise DeviceError(f"--gpu {gpu}: this machine has {torch.cuda.device_count()} GPU(s)")
    if not isolate and gpu is not None and not interpret:
        torch.cuda.set_device(gpu)
    try:
        search_problems(spec, problems, torch_dtype, trials=trials, timeout_s=None, sampler=sampler_name.value,
                    seed=seed, db=db, storage=storage, interpret=interpret, finalists=0, kernel_arg=kernel,
                    isolate_timeout_s=trial_timeout if isolate else None,
                    gpus=[gpu if gpu is not None else 0] if isolate else None,
                    heartbeat_interval_s=heartbeat, tries=try_values)
    except KeyboardInterrupt:
        typer.secho("interrupted; start the worker again to go on", err=True)
        raise typer.Exit(130) from None

"""Held-out evaluation of the tuned tables (issue 14): on realistic problems that no table holds
(benchmarks/coverage_set.py), how close does what omnitune.runtime picks come to the best that a
search for that very problem finds, and to the best PyTorch path?

Per problem, on the GPU, in one process (benchmarks/coverage_eval.py):
1. the runtime's pick from the tables, and which rung answered (exact, nearest, predictor, default);
2. the kernel's default config;
3. the spec's PyTorch baselines, each checked against the reference;
4. the problem's own optimum: a search of --trials configs through the real driver, warm-started
   from the pick and the nearest tables' winners, its finalists re-timed as `omnitune search` does
   (with --tuned-from, the optimum an earlier run's search found, when it judged the problem);
5. the pick, the default, the tuned best and every correct baseline timed against each other,
   interleaved, in one run: pick ÷ tuned, default ÷ tuned and best PyTorch ÷ tuned are ratios of
   those medians (1.0 where two roles are the same config).

The results JSON (--out) is rewritten whole, atomically, after every problem: the settings, each
run's command, device and versions, a row per problem (a problem that fails is a row with its
error) and a summary per kernel (benchmarks/coverage_report.py). The whole set takes hours of GPU
time: run it in chunks, each resuming the file (--resume skips the problems already in it):

    python benchmarks/coverage.py --out benchmarks/results/coverage_h200.json --resume \
        --limit 4 --time-budget 420 --work-dir /tmp/coverage
    python benchmarks/coverage.py --report benchmarks/results/coverage_h200.json [--plot PATH]
    python benchmarks/coverage.py --interpret --problems MODULE:NAME --trials 3 --out x.json   # CPU

--problems names a mapping {kernel: [(problem, dtype name), ...]} like coverage_set.HELD_OUT
(MODULE may be a path to a .py file). --tables DIR is read before the shipped tables, as
`omnitune verify --tables` reads its folders; the JSON lists the folders in effect.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import importlib
import importlib.util
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the harness's helpers and the held-out set, when imported from elsewhere
import coverage_report  # noqa: E402  (imports no kernel: --interpret must come first)
from omnitune.durations import human_duration  # noqa: E402  (nor does this)
from omnitune.errors import one_line  # imports nothing either

DEFAULT_PROBLEMS = "coverage_set:HELD_OUT"
DEFAULT_TRIALS = 40
INTERPRETER_ROUNDS = 3  # the interpreter's times mean nothing: enough rounds to run the code
# Under --interpret no GPU is named: the tables judged are the H200's, which the shipped ones are.
INTERPRETER_TABLES_DEVICE = "NVIDIA H200"
EXIT_GPU_LOST = 3
# Settings a resumed file must share with the run that resumes it: rows measured otherwise would
# not belong in one summary.
SHARED_SETTINGS = ("problems", "trials", "rounds", "finalists", "interpret", "tables", "tables_device", "seed",
                   "tuned_from")


@dataclass(frozen=True)
class Item:
    """One problem to judge, where it stands in the problem list, and its row's key."""

    position: int
    kernel: str
    problem: Any
    dtype_name: str
    key: str


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.report is not None:
        return report(args.report, args.plot)
    if args.out is None:
        raise SystemExit("give --out RESULTS.json (or --report RESULTS.json)")
    argv = sys.argv[1:] if argv is None else list(argv)
    return run(args, "python benchmarks/coverage.py " + shlex.join(argv))


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="results JSON, rewritten after every problem")
    parser.add_argument("--resume", action="store_true", help="continue --out: skip the problems already in it")
    parser.add_argument("--retry-errors", action="store_true", help="with --resume: judge failed problems again")
    parser.add_argument("--kernel", action="append", default=None, help="judge only this kernel (repeatable)")
    parser.add_argument("--offset", type=int, default=0, help="skip the first N selected problems")
    parser.add_argument("--limit", type=int, default=None,
                        help="judge at most N problems in this run (counted after --offset and --resume's skips)")
    parser.add_argument("--time-budget", type=float, default=None,
                        help="start no new problem after this many seconds (for time-limited chunks)")
    parser.add_argument("--trials", type=int, default=DEFAULT_TRIALS, help="configs each search measures")
    parser.add_argument("--rounds", type=int, default=None,
                        help="rounds of the final interleaved timing (default: the finalists' 30)")
    parser.add_argument("--tables", type=Path, default=None,
                        help="a folder of tables read before the shipped tuned_configs (default: the shipped ones)")
    parser.add_argument("--device-name", default=None,
                        help=f"the GPU whose tables are looked up (default: this GPU; {INTERPRETER_TABLES_DEVICE!r} "
                             "under --interpret)")
    parser.add_argument("--work-dir", type=Path, default=None,
                        help="keep the searches' studies and trials here (coverage.db): an interrupted search "
                             "resumes (default: an in-memory study per problem)")
    parser.add_argument("--precompile", type=int, default=None,
                        help="compile-ahead processes of each search (default: as omnitune search; "
                             "0 under --interpret)")
    parser.add_argument("--tuned-from", type=Path, default=None,
                        help="an earlier results file: each problem it judged keeps the tuned optimum its search "
                             "found (re-checked and re-timed here, not searched again), so that changed tables are "
                             "judged in seconds a problem; problems it lacks are searched")
    parser.add_argument("--problems", default=DEFAULT_PROBLEMS, help="MODULE:NAME of the problem mapping to judge")
    parser.add_argument("--seed", type=int, default=0, help="the searches' sampler seed")
    parser.add_argument("--interpret", action="store_true", help="CPU, Triton's interpreter: tiny problems only")
    parser.add_argument("--report", type=Path, default=None, help="print the Markdown tables of a results JSON")
    parser.add_argument("--plot", type=Path, default=None,
                        help="with --report: the plot's PNG (default: beside the results, .png)")
    args = parser.parse_args(argv)
    if args.trials < 1 or args.offset < 0 or (args.limit is not None and args.limit < 0):
        parser.error("--trials must be at least 1, --offset and --limit at least 0")
    if args.rounds is not None and args.rounds < 2:
        parser.error("--rounds must be at least 2: one sample has no spread")
    if args.retry_errors and not args.resume:
        parser.error("--retry-errors goes with --resume")
    return args


# --- the run ------------------------------------------------------------------------------------


def run(args: argparse.Namespace, command: str) -> int:
    if args.interpret:
        from omnitune.cli._app import enable_interpreter

        enable_interpreter()  # before any kernel module is imported, the problem list's included
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # a line per problem says what matters
    items = select(load_problems(args.problems), args.kernel)
    settings = run_settings(args)
    setup = make_setup(args, settings)
    doc = open_results(args.out, settings, args.resume)
    done = {(r["kernel"], r["key"]) for r in doc["rows"] if not (args.retry_errors and r["status"] == "error")}
    window = items[args.offset:]
    todo = [i for i in window if (i.kernel, i.key) not in done][:args.limit]
    skipped = sum(1 for i in window if (i.kernel, i.key) in done)
    print(f"{len(items)} problems selected; {skipped} already in {args.out}; judging {len(todo)}", flush=True)
    from omnitune.measure.gpu_lock import shared_with_compile_workers

    # As `omnitune search` alone: the compile workers' real launches (what they cannot capture) and
    # input draws wait for this process's timings, under a lock its runners take too.
    sharing = setup.precompile_workers and not args.interpret
    with shared_with_compile_workers() if sharing else contextlib.nullcontext():
        try:
            judged = judge_all(todo, doc, setup, args, command)
        except KeyboardInterrupt:  # the search's own interrupt included: every finished problem is stored
            print(f"interrupted; the problems judged so far are in {args.out}: rerun with --resume", flush=True)
            return 130
        finally:
            if setup.precompile_workers:  # every problem's compile pool shared these processes
                from omnitune.measure.ahead import close_shared_workers

                close_shared_workers()
    if judged is not None:
        return judged
    print(coverage_report.summary_sentence(doc["summary"]["all"]) if doc["rows"] else "no rows", flush=True)
    return 0


def judge_all(todo: Sequence[Item], doc: dict, setup, args: argparse.Namespace, command: str) -> int | None:
    """Judge each problem in turn, storing its row as soon as it is done; an exit code when the run
    must stop early (the GPU lost), else None."""
    started, durations = time.monotonic(), []
    ahead = look_ahead(todo, setup)
    if ahead is not None:
        setup = dataclasses.replace(setup, ahead=ahead)
    with tables_in_effect(args.tables), ahead or contextlib.nullcontext():
        doc["runs"].append(run_facts(command, setup))
        for place, item in enumerate(todo, 1):
            if args.time_budget is not None and time.monotonic() - started >= args.time_budget:
                print(f"time budget of {args.time_budget:.0f} s spent: {len(todo) - place + 1} problems left for "
                      "the next run (--resume)", flush=True)
                break
            print(f"[{place}/{len(todo)}] {item.kernel} {item.key}: searching {setup.trials} configs", flush=True)
            row = judge(item, setup, run_index=len(doc["runs"]) - 1)
            durations.append(row["wall_s"])
            store_row(doc, row, args.out)
            print(progress_line(place, len(todo), row, eta_s(durations, len(todo) - place)), flush=True)
            if row.get("gpu_lost"):
                print("the GPU is unusable in this process: run the command again to go on (--resume skips this "
                      "problem; --retry-errors with the same --work-dir searches it again past the config that "
                      "crashed)", flush=True)
                return EXIT_GPU_LOST
        store_row(doc, None, args.out)
    return None


def look_ahead(todo: Sequence[Item], setup):
    """A look-ahead over the problems to judge, in order, when the searches compile ahead
    (omnitune.search.prepare_next); None without compile-ahead workers, or when a problem's kernel
    or dtype cannot be read here (its row will say why; the others then start cold)."""
    if not setup.precompile_workers:
        return None
    from omnitune.registry import get_spec
    from omnitune.search.prepare_next import ProblemsAhead

    try:
        order = [(get_spec(i.kernel), i.problem, problem_dtype(i.dtype_name, setup.interpret)) for i in todo]
    except Exception:  # noqa: BLE001 — judging reports it, problem by problem
        return None
    return ProblemsAhead(order, workers=setup.precompile_workers, trials=setup.trials)


def judge(item: Item, setup, run_index: int) -> dict:
    """One problem's row: evaluated, or the error that stopped it (with what was found before)."""
    import torch

    from coverage_eval import GpuLost, evaluate
    from omnitune.registry import get_spec

    row = {"key": item.key, "position": item.position, "kernel": item.kernel, "dtype": item.dtype_name,
           "problem_key": item.key.partition("|")[2], "run": run_index, "status": "error", "error": None}
    began = time.perf_counter()
    try:
        spec = get_spec(item.kernel)
        row["problem"] = spec.problem_dict(item.problem)
        row["kernel_source_hash"] = spec.source_hash()
        evaluate(row, spec, item.problem, problem_dtype(item.dtype_name, setup.interpret), setup)
        row["status"] = "ok"
    except GpuLost as exc:
        row.update(error=f"GPU lost: {exc}", gpu_lost=True)
    except Exception as exc:  # noqa: BLE001 — a problem that fails is a row, never the end of the run
        row["error"] = one_line(exc)
        if not setup.interpret and not gpu_usable():
            row["gpu_lost"] = True
    finally:
        row["wall_s"] = time.perf_counter() - began
        row["measured_at"] = utc_now()
        gc.collect()  # the problem's inputs and reference, before the next problem allocates its own
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return row


def problem_dtype(name: str, interpret: bool):
    from omnitune.spec import parse_dtype

    dtype = parse_dtype(name)
    if interpret and name == "bf16":
        raise ValueError("bf16 does not run under Triton's interpreter; judge it on a GPU")
    return dtype


def gpu_usable() -> bool:
    import torch

    try:
        torch.cuda.synchronize()
        return torch.ones(1, device="cuda").sum().item() == 1.0
    except Exception:  # noqa: BLE001 — any failure here means the context is gone
        return False


def make_setup(args: argparse.Namespace, settings: Mapping):
    import torch

    from coverage_eval import Setup
    from omnitune.profile.device import current_device_facts
    from omnitune.spec import DeviceLimits

    if not args.interpret and not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU here: run it on one, or add --interpret (CPU, tiny problems)")
    device = current_device_facts(args.interpret)
    storage_url, db = None, None
    if args.work_dir is not None:
        from omnitune.store import default_storage_url, open_db, record_device

        path = args.work_dir / "coverage.db"
        db, storage_url = open_db(path), default_storage_url(path)
        record_device(db, device)
    return Setup(
        device=device, tables_device=settings["tables_device"],
        limits=DeviceLimits() if args.interpret else DeviceLimits.of_current_device(), trials=args.trials,
        rounds=settings["rounds"], interpret=args.interpret, storage_url=storage_url, db=db,
        precompile_workers=precompile_workers(args), finalists=settings["finalists"], seed=args.seed,
        tuned_from=earlier_optima(args.tuned_from) if args.tuned_from is not None else None,
    )


def earlier_optima(path: Path) -> dict[tuple[str, str], dict]:
    """(kernel, row key) → {"config", "measured_at", "source", "kernel_source_hash"}: the tuned
    optimum of each problem an earlier results file judged without an error."""
    try:
        doc = json.loads(path.read_text())
        rows = doc["rows"]
        optima = {(r["kernel"], r["key"]): {"config": dict(r["configs"]["tuned"]), "measured_at": r.get("measured_at"),
                                            "source": str(path), "kernel_source_hash": r.get("kernel_source_hash")}
                  for r in rows if r.get("status") == "ok"}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise SystemExit(f"--tuned-from {path}: not a coverage results file ({one_line(exc)})") from None
    if not optima:
        raise SystemExit(f"--tuned-from {path}: it holds no judged problem")
    return optima


def precompile_workers(args: argparse.Namespace) -> int:
    if args.interpret:
        return 0
    if args.precompile is not None:
        return args.precompile
    from omnitune.measure.worker_server import default_workers

    return default_workers()


def run_settings(args: argparse.Namespace) -> dict:
    from omnitune.search.finalists import DEFAULT_FINALISTS, DEFAULT_ROUNDS

    return {
        "problems": args.problems, "trials": args.trials,
        "rounds": args.rounds or (INTERPRETER_ROUNDS if args.interpret else DEFAULT_ROUNDS),
        "finalists": 0 if args.interpret else DEFAULT_FINALISTS, "interpret": args.interpret,
        "tables": str(args.tables.resolve()) if args.tables is not None else "shipped",
        "tables_device": tables_device(args), "seed": args.seed,
        "tuned_from": str(args.tuned_from) if args.tuned_from is not None else None,
    }


def tables_device(args: argparse.Namespace) -> str | None:
    if args.device_name:
        return args.device_name
    if args.interpret:
        return INTERPRETER_TABLES_DEVICE
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else None


@contextmanager
def tables_in_effect(folder: Path | None) -> Iterator[None]:
    """$OMNITUNE_CONFIG_DIR set to `folder` (before any folder it held) for the run, the runtime's
    caches cleared on the way in and out."""
    import omnitune.runtime as runtime

    old = os.environ.get(runtime.CONFIG_DIR_ENV)
    if folder is not None:
        os.environ[runtime.CONFIG_DIR_ENV] = os.pathsep.join([str(folder.resolve()), *([old] if old else [])])
    runtime.clear_cache()
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(runtime.CONFIG_DIR_ENV, None)
        else:
            os.environ[runtime.CONFIG_DIR_ENV] = old
        runtime.clear_cache()


def run_facts(command: str, setup) -> dict:
    import omnitune.runtime as runtime
    from omnitune.profile.device import software_versions

    return {"command": command, "started_at": utc_now(), "device": setup.device.as_dict(),
            "software": software_versions(), "git_commit": git_commit(),
            "config_dirs": [str(d) for d in runtime.config_dirs() if d.is_dir()]}


def git_commit() -> str | None:
    try:
        found = subprocess.run(["git", "rev-parse", "HEAD"], cwd=HERE, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return found.stdout.strip() or None


# --- the problems -------------------------------------------------------------------------------


def load_problems(text: str) -> Mapping[str, Sequence]:
    """The mapping {kernel: [(problem, dtype name), ...]} that MODULE:NAME names."""
    module_name, sep, name = text.partition(":")
    if not sep or not module_name or not name:
        raise SystemExit(f"--problems takes MODULE:NAME, e.g. {DEFAULT_PROBLEMS}; got {text!r}")
    if module_name.endswith(".py"):
        spec = importlib.util.spec_from_file_location(Path(module_name).stem, module_name)
        if spec is None or spec.loader is None:
            raise SystemExit(f"--problems: cannot load {module_name}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(module_name)
    problems = getattr(module, name, None)
    if not isinstance(problems, Mapping):
        raise SystemExit(f"--problems {text}: not a mapping of kernel names to (problem, dtype) lists")
    return problems


def select(problems: Mapping[str, Sequence], kernels: Sequence[str] | None) -> list[Item]:
    """The problems of the chosen kernels, in the mapping's order, each with its row key."""
    from omnitune.registry import get_spec

    unknown = sorted(set(kernels or ()) - set(problems))
    if unknown:
        raise SystemExit(f"--kernel {', '.join(unknown)}: the problem list has {', '.join(problems)}")
    items: list[Item] = []
    for kernel, listed in problems.items():
        if kernels and kernel not in kernels:
            continue
        spec = get_spec(kernel)
        for problem, dtype_name in listed:
            items.append(Item(len(items), kernel, problem, dtype_name, f"{dtype_name}|{spec.problem_key(problem)}"))
    return items


# --- the results file ---------------------------------------------------------------------------


def open_results(path: Path, settings: Mapping, resume: bool) -> dict:
    """A new results document, or with --resume the one at `path` if its settings are this run's."""
    if not path.exists():
        return {"schema": "omnitune.coverage/1", "settings": dict(settings), "runs": [], "rows": []}
    if not resume:
        raise SystemExit(f"{path} exists: add --resume to continue it, or choose another --out")
    doc = json.loads(path.read_text())
    before = doc["settings"]
    differ = {k: (before.get(k), settings[k]) for k in SHARED_SETTINGS if before.get(k) != settings[k]}
    if differ:
        shown = "; ".join(f"{k}: {old!r} there, {new!r} now" for k, (old, new) in differ.items())
        raise SystemExit(f"{path} was measured with other settings ({shown}); choose another --out")
    return doc


def store_row(doc: dict, row: dict | None, path: Path) -> None:
    """Put `row` in the document (in place of an older row of the same problem), refresh the
    summary and the latest run's facts at the top, and write the whole file atomically."""
    from omnitune.table_files import write_atomic

    if row is not None:
        others = [r for r in doc["rows"] if (r["kernel"], r["key"]) != (row["kernel"], row["key"])]
        doc["rows"] = sorted([*others, row], key=lambda r: r["position"])
    if doc["runs"]:
        latest = doc["runs"][-1]
        doc.update(command=latest["command"], device=latest["device"], software=latest["software"],
                   config_dirs=latest["config_dirs"])
    doc["summary"] = coverage_report.summarize(doc["rows"])
    doc["updated_at"] = utc_now()
    write_atomic(path, json.dumps(doc, indent=1, sort_keys=False) + "\n")


# --- progress and the report --------------------------------------------------------------------


def progress_line(place: int, total: int, row: Mapping, eta: float) -> str:
    head = f"[{place}/{total}] {row['kernel']} {row['key']}"
    took = f"in {human_duration(row['wall_s'])}; ETA {human_duration(eta)}"
    if row["status"] != "ok":
        return f"{head}: failed ({row['error']}) {took}"
    ratios = row["ratios"]
    pytorch = (f", {row['best_pytorch']} {ratios['best_pytorch_over_tuned']:.3f}×" if row["best_pytorch"] else "")
    pick = ratios["pick_over_tuned"]
    return (f"{head}: {row['rung']}, pick {pick:.3f}× tuned (default {fmt(ratios['default_over_tuned'])}×"
            f"{pytorch}) {took}" if pick is not None else f"{head}: {row['rung']}, the pick failed its check {took}")


def eta_s(durations: Sequence[float], left: int) -> float:
    return sum(durations) / len(durations) * left if durations else 0.0


def fmt(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def report(path: Path, plot: Path | None) -> int:
    """Print a results file's Markdown tables and write its plot (no GPU needed)."""
    doc = json.loads(path.read_text())
    print(coverage_report.markdown(doc))
    print(coverage_report.plot_or_note(doc, plot or path.with_suffix(".png")))
    return 0


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


if __name__ == "__main__":
    sys.exit(main())

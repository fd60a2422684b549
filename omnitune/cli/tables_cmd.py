"""`omnitune report`, `omnitune export` and `omnitune lookup`: from the results database to the
shipped tables, and from the tables to the config a call would get."""

from __future__ import annotations

import enum
import importlib.util
import json
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from omnitune.cli import preflight
from omnitune.cli._app import app
from omnitune.cli.common import (DB_DEFAULT_HELP, SHAPE_HELP, console, db_path, json_number, load_spec,
                                  parse_dtype_option, parse_problems, require_named)
from omnitune.errors import OmnituneError, StoreError

if TYPE_CHECKING:
    from omnitune.export import ExportedFile

_DB_HELP = "Results database to read (see omnitune search)." + DB_DEFAULT_HELP
_STORAGE_HELP = ("First bring --db up to date from this Optuna storage (e.g. the postgresql:// URL that omnitune "
                 "worker processes share): the rows --db holds of its studies are replaced by what the storage "
                 "holds. Not the --db file itself.")


def _import_storage(path: Path, storage: str | None) -> None:
    """--storage: rebuild the catalogue rows of the storage's studies in the database at `path`."""
    if storage is None:
        return
    preflight.require_storage_apart(storage, path)
    preflight.require_storage_to_read(storage)
    from omnitune.store import open_db, open_optuna_storage, rebuild_catalogue

    # The storage opened before the database: one that cannot be opened leaves no empty database
    # behind. A storage lacking trials the database has rows of is refused (rebuild_catalogue).
    opened = open_optuna_storage(storage)
    rows = rebuild_catalogue(open_db(path), storage, opened)
    typer.echo(f"{rows} trials read from the Optuna storage into {path}", err=True)


class ReportFormat(str, enum.Enum):
    TABLE = "table"
    CSV = "csv"
    MD = "md"
    JSON = "json"


def _nothing_measured(path: Path) -> str:
    return f"no results in {path}; run omnitune search KERNEL --shape ... to measure some"


def _has_results(trials, path: Path, kernel: str | None) -> bool:
    """Whether there is anything to show. False for a database with no trials at all; an error
    (listing the kernels it does have) when only the kernel asked for is absent."""
    if not trials.empty:
        return True
    if kernel is None:
        return False
    from omnitune.report import load_trials

    present = sorted(set(load_trials(path)["kernel"]))
    if present:
        raise OmnituneError(f"no results for kernel {kernel!r} in {path}; it has results for {', '.join(present)}")
    return False


@app.command()
def report(
    db: str = typer.Option(None, "--db", help=_DB_HELP),
    storage: str = typer.Option(None, "--storage", metavar="URL", help=_STORAGE_HELP, show_default=False),
    kernel: str = typer.Option(None, "--kernel", help="Only this kernel's results.", show_default=False),
    output_format: ReportFormat = typer.Option(
        ReportFormat.TABLE, "--format", case_sensitive=False,
        help="table (for people) or md, csv, json (for documents and scripts), on stdout; csv and json put "
        "notes on stderr, and print the header or \\[] for an empty database.",
    ),
    plot_text: str = typer.Option(
        None, "--plot", metavar="DIR", show_default=False,
        help="Also write PNG figures per kernel to DIR (created if missing, files of the same name replaced): "
        "search convergence, launch-parameter importance, and the best results on the device's roofline "
        "(that one needs omnitune calibrate). Needs matplotlib: pip install 'omnitune\\[plot]'.",
    ),
) -> None:
    """Show the best config found per kernel × problem × dtype × device.

    Median time and p20–p80 spread (the re-timed median and its CV where the finalists were re-timed),
    TFLOP/s and TB/s with their fraction of the device's measured roofline and which bounds the
    kernel, the default config's time, the speedup.

    Also how many trials ran and which failed, by status; and the ncu profiles stored for each key.

    Only reads --db (with --storage, updates it first)."""
    from omnitune import report as rpt

    path = db_path(db)
    require_named(plot_text, "--plot", "the folder of the figures (e.g. --plot figures)")
    plot = Path(plot_text) if plot_text is not None else None
    if plot is not None:  # before the report is printed: a bad folder is one line, not a report and then one
        if importlib.util.find_spec("matplotlib") is None:
            raise OmnituneError("--plot needs matplotlib: pip install 'omnitune[plot]' (or matplotlib)")
        preflight.require_writable_folder(plot, "--plot")
    _import_storage(path, storage)
    trials = rpt.load_trials(path, kernel)
    # Piped formats keep stdout to the data: notes and the figures' paths go to stderr.
    piped = output_format in (ReportFormat.CSV, ReportFormat.JSON)
    if not _has_results(trials, path, kernel):
        if piped:  # still data: a reader of the JSON or CSV gets an empty list, not prose
            empty = rpt.summarize(trials)
            typer.echo((rpt.render_csv if output_format is ReportFormat.CSV else rpt.render_json)(empty), nl=False)
        typer.echo(_nothing_measured(path), err=piped)
        return
    calibrations = rpt.load_calibrations(path)
    stored_profiles = rpt.load_profiles(path, kernel)
    summary = rpt.summarize(trials, calibrations, stored_profiles)
    profiles = rpt.profiles_for(summary, stored_profiles)
    note = rpt.calibration_note(summary, calibrations)
    notes = (note,) if note else ()
    if output_format is ReportFormat.TABLE:
        # Not cropped: a problem key wider than the terminal stays one line, to be copied whole.
        console.print(rpt.render_table(summary, title=f"omnitune results in {path}", profiles=profiles, notes=notes),
                      crop=False)
    elif output_format is ReportFormat.MD:
        typer.echo(rpt.render_markdown(summary, profiles=profiles, notes=notes), nl=False)
    else:
        render = rpt.render_csv if output_format is ReportFormat.CSV else rpt.render_json
        typer.echo(render(summary), nl=False)
        for line in notes:
            typer.echo(line, err=True)
    if plot is not None:
        try:
            figures = rpt.write_figures(trials, summary, calibrations, plot, problem_defaults=_problem_defaults)
        except OSError as exc:
            # Which figure: a folder may hold its name (os.replace names the temporary file first).
            name = exc.filename2 or exc.filename
            where = f" ({name})" if name else ""
            raise OmnituneError(f"cannot write the figures to {plot}: {exc.strerror or exc}{where}") from None
        for written in figures.paths:
            typer.echo(f"wrote {written}", err=piped)
        for line in figures.notes:
            typer.echo(line, err=piped)


def _problem_defaults(kernel: str) -> dict[str, str]:
    """A kernel's problem fields that have defaults, as the problem key writes them; {} when its
    spec cannot be loaded here (a user's kernel module that is not importable)."""
    from omnitune.report import problem_defaults_of

    try:
        from omnitune.registry import get_spec

        spec = get_spec(kernel)
    except (OmnituneError, ImportError):
        return {}
    return problem_defaults_of(spec.problem_type)


@app.command()
def export(
    db: str = typer.Option(None, "--db", help=_DB_HELP),
    storage: str = typer.Option(None, "--storage", metavar="URL", help=_STORAGE_HELP, show_default=False),
    out_text: str = typer.Option(
        "tuned_configs", "--out", metavar="FOLDER",
        help="Folder of the tables: <out>/<kernel>/<device_key>.json, relative to the current folder. The "
        "runtime reads it when it is listed in $OMNITUNE_CONFIG_DIR (or is the tuned_configs/ of omnitune's own "
        "checkout).",
    ),
    kernel: str = typer.Option(None, "--kernel", help="Only this kernel's tables.", show_default=False),
    predictor: bool = typer.Option(
        True, "--predictor/--no-predictor",
        help="Fit the predictor block (configs for shapes no entry is near, predicted from every stored trial). "
             "--no-predictor writes the tables without one and removes a file's existing block: then the kernel's "
             "untuned answer serves those shapes. Judge which serves better with benchmarks/coverage.py.",
    ),
) -> None:
    """Write the best measured configs as JSON tables for omnitune.runtime.

    One file per kernel × device: <out>/<kernel>/<device_key>.json.

    Merges into a file already there: the database's entries replace those of the same key, and
    entries for keys this database lacks are kept. One measured on other kernel source than the
    file's kernel_source_hash keeps its own (omnitune verify then fails that entry, not the file's
    others), said in one note per file.

    One line per file: wrote, or unchanged (a rerun with nothing new rewrites nothing)."""
    from omnitune.export import export_tables
    from omnitune.report import load_trials

    path = db_path(db)
    require_named(out_text, "--out", "the folder of the tables (e.g. --out tuned_configs)")
    out = Path(out_text)
    preflight.require_writable_folder(out, "--out")
    _import_storage(path, storage)
    trials = load_trials(path, kernel)
    if not _has_results(trials, path, kernel):
        typer.echo(_nothing_measured(path))
        return
    try:
        written = export_tables(path, out, kernel, predictor=predictor)
    except OSError as exc:  # a kernel's folder or file under --out that cannot be written
        where = f" ({exc.filename})" if exc.filename else ""
        raise StoreError(f"cannot write the tables under --out {out}: {exc.strerror or exc}{where}") from None
    if not written:
        # Trials that ran ok whose rows make no entry (changed by hand, or corrupt) were named in
        # the warning above: "no trial ran ok" would contradict it.
        why = ("the best trial of each of its problems cannot make a table entry (see the warning)"
               if (trials["status"] == "ok").any() else "no trial there ran ok")
        typer.echo(f"nothing to export from {path}: {why}")
        return
    for f in written:
        verb = "wrote" if f.changed else "unchanged"
        kept = f", {f.kept} kept from the file" if f.kept else ""
        typer.echo(f"{verb} {f.path}: {f.entries} entries ({f.from_db} from the database{kept})")
        if f.kept_on_other_source or f.from_db_on_other_source:
            typer.echo(f"  note: {_other_source_note(f)}", err=True)
        if not f.representative:
            typer.echo(f"  note: {f.path} holds interpreter results: correctness only, not for shipping", err=True)
    _say_if_unread(out)


def _say_if_unread(out: Path) -> None:
    """A note when the runtime would not read `out`: the default ./tuned_configs is read only in
    omnitune's own checkout, so tables exported elsewhere went unused without a word."""
    from omnitune.runtime import config_dirs

    where = out.resolve()
    if all(d.resolve() != where for d in config_dirs()):
        typer.echo(f"note: the runtime does not read {out} yet; serve with OMNITUNE_CONFIG_DIR={where} "
                   "(omnitune lookup then answers from it)", err=True)


def _other_source_note(f: ExportedFile) -> str:
    """One line: how many entries of an exported file are good for other kernel source than its
    header says, and what becomes of them (they are kept, and verify fails them until fixed)."""
    parts = []
    if f.kept_on_other_source:
        parts.append(f"{f.kept_on_other_source} entries kept from the file")
    if f.from_db_on_other_source:
        parts.append(f"{f.from_db_on_other_source} from the database")
    shown = ", ".join(str(h) for h in f.other_source_hashes[:3]) + (", …" if len(f.other_source_hashes) > 3 else "")
    return (f"{f.path}: {' and '.join(parts)} were measured on other kernel source ({shown}) than the file's "
            f"{f.source_hash}; each keeps its own kernel_source_hash, and `omnitune verify` fails them until "
            "`omnitune verify --fix` on that GPU revalidates them or a search re-tunes them")


@app.command()
def lookup(
    kernel: str = typer.Argument(..., help="Kernel name (see `omnitune kernels`) or a module/file defining SPEC."),
    shape: str = typer.Option(
        ..., "--shape", "-s",
        help="The problem of the call, as name=value pairs, e.g. b=1,h=28,hkv=4,lq=1,lk=4096,d=128; " + SHAPE_HELP,
    ),
    dtype: str = typer.Option("bf16", "--dtype", help="fp16, bf16 or fp32."),
    device: str = typer.Option(
        None, "--device", show_default=False,
        help="The GPU whose tables to read, as torch names it, e.g. 'NVIDIA H200'. \\[default: this machine's GPU; "
        "without one, no table is read and the default config answers]",
    ),
    as_json: bool = typer.Option(
        False, "--json", help="One JSON object on stdout instead of the lines: for scripts (e.g. a serving "
        "engine's CI checking which of its shapes are tuned)."
    ),
) -> None:
    """Show the config omnitune.runtime would choose for a call, which rung answered, and why.

    Rungs, in the order the runtime tries them: exact (this shape was tuned), nearest (a tuned shape
    close enough under the kernel's MatchPolicy), predictor (none close enough: predicted from the
    trials of the nearest tuned shapes, kept in the table's predictor block), default (nothing fits).

    The tables are those the runtime reads: $OMNITUNE_CONFIG_DIR, then the shipped tuned_configs/.
    """
    from omnitune.spec import dtype_name

    spec = load_spec(kernel)
    problem = parse_problems(spec, [shape])[0]
    torch_dtype = parse_dtype_option(spec, dtype)
    device_name = device
    if device_name is not None and not device_name.strip():
        raise OmnituneError("--device needs a GPU's name, e.g. --device 'NVIDIA H200'")
    if device_name is not None:
        from omnitune.cli.plan_coverage import note_a_device_without_tables

        note_a_device_without_tables(device_name)
    if device_name is None:
        import torch

        if torch.cuda.is_available():
            device_name = torch.cuda.get_device_name()
    found = _explain(spec, problem, torch_dtype, device_name)
    answer = found.lookup
    from omnitune.runtime import Rung
    from omnitune.runtime._format import search_command

    tune = (search_command(spec.name, spec.problem_key(problem), dtype_name(torch_dtype))
            if answer.rung is not Rung.EXACT and device_name else None)
    if as_json:
        typer.echo(json.dumps({
            "kernel": spec.name, "problem_key": spec.problem_key(problem), "dtype": dtype_name(torch_dtype),
            "device": device_name, "config": answer.config.as_dict(), "rung": answer.rung.value, "why": found.why,
            "matched_key": answer.matched_key, "distance": json_number(answer.distance),
            "neighbours": list(found.neighbours), "closest": found.closest,
            "file": str(answer.source) if answer.source is not None else None,
            "expected_ratio": json_number(found.expected_ratio), "to_tune": tune,
        }, sort_keys=True, allow_nan=False))
        return
    # Plain lines, never wrapped: the --config JSON and the keys are meant to be copied.
    typer.echo(f"{spec.name} {spec.problem_key(problem)} {dtype_name(torch_dtype)} on {device_name or 'no GPU'}")
    typer.echo(f"config: {answer.config.label()}")
    typer.echo(f"  as --config: {json.dumps(answer.config.as_dict(), sort_keys=True)}")
    why = found.why + ("" if device_name else "; pass --device NAME to read a GPU's table")
    typer.echo(f"rung: {answer.rung.value} — {why}")
    if answer.rung in (Rung.EXACT, Rung.NEAREST):
        typer.echo(f"entry: {answer.matched_key} (distance {answer.distance:.2f})")
    elif answer.rung is Rung.PREDICTOR:
        typer.echo(f"predicted from: {', '.join(answer.neighbours)} (the nearest at distance {answer.distance:.2f})")
    elif found.closest is not None:
        typer.echo(f"closest tuned: {found.closest}")
    if answer.source is not None:
        typer.echo(f"file: {answer.source}")
    if found.expected_ratio is not None and answer.rung in (Rung.NEAREST, Rung.DEFAULT):
        typer.echo(f"expected: {found.expected_ratio:.2f}× the best on the nearest tuned shapes "
                   f"({', '.join(found.neighbours)}), by the table's predictor")
    if tune is not None:
        typer.echo(f"to tune it: {tune}")


def _explain(spec, problem, dtype, device_name):
    """What omnitune.runtime answers, and why. The runtime promises never to raise over a table (a
    bad one is skipped with a warning); should a hostile table get past it anyway, this command
    still says so in one line rather than a traceback."""
    import omnitune.runtime as runtime

    try:
        return runtime.explain(spec.name, problem, dtype, device_name)
    except OmnituneError:
        raise
    except Exception as exc:  # noqa: BLE001 — see above: whatever a table can make the runtime raise
        if _debug():
            raise
        folders = ", ".join(str(d / spec.name) for d in runtime.config_dirs())
        raise StoreError(f"a tuned table of {spec.name} could not be read ({type(exc).__name__}: {exc}); "
                         f"move the bad one aside (the tables are under {folders}) or export it again") from None


def _debug() -> bool:
    from omnitune.cli._app import _state

    return _state["debug"]

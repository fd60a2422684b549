"""`omnitune verify`: check the tuned tables on the machine that will serve them, and gate on it."""

from __future__ import annotations

import math
import os
from pathlib import Path

import typer
from rich.console import Console

from omnitune.cli import preflight
from omnitune.cli._app import app
from omnitune.cli.common import (
    console,
    err_console,
    interpret_option,
    load_spec,
    report_path,
    require_named,
    write_output_file,
)
from omnitune.errors import DeviceError, OmnituneError

LOG_WIDTH = 160
# The longest --soak: a week, far beyond a release gate's soak (the docs' is 5 minutes), with the
# report keeping one record per minute (a telemetry window). Beyond it the number is a slip: 1e308
# minutes overflowed to infinite seconds, a soak that never ended and whose report was never written.
MAX_SOAK_MINUTES = 7 * 24 * 60


@app.command()
def verify(
    tables: list[str] = typer.Option(
        None, "--tables", metavar="DIR",
        help="Folder of tables, <DIR>/<kernel>/<device_key>.json. Repeatable. \\[default: the folders "
        "omnitune.runtime reads: $OMNITUNE_CONFIG_DIR, then the shipped tuned_configs/]", show_default=False,
    ),
    model: str = typer.Option(
        None, "--model", help="A model preset, e.g. qwen2.5-omni-7b (see `omnitune plan`): its largest shapes for "
        "the memory check, its traffic for the soak. Several, comma-separated, as search takes them: the tables "
        "are checked once, the memory and soak parts run for each preset in turn (--soak MINUTES each), each "
        "of their checks named by its preset. Without it, those parts are skipped.", show_default=False,
    ),
    kernels: str = typer.Option(
        None, "--kernels", metavar="K1,K2", help="Only these kernels, comma-separated: built-in names, or a module or "
        ".py file that defines SPEC (a kernel of your own, whose tables are then checked too). \\[default: every "
        "table found]", show_default=False,
    ),
    soak: float = typer.Option(
        None, "--soak", metavar="MINUTES", help="Also soak: MINUTES (a positive number, fractions allowed, at most "
        f"{MAX_SOAK_MINUTES}: a week) of the preset's mixed calls through the public ops (needs --model and a GPU). "
        "\\[default: no soak]",
        show_default=False,
    ),
    json_text: str = typer.Option(None, "--json", metavar="FILE", help="Also write the report as JSON to FILE "
                                  "(an earlier report there is replaced; any other file, or one under --tables, is "
                                  "refused; its format: docs/cli.md).", show_default=False),
    fix: bool = typer.Option(False, "--fix", help="Rewrite the checked tables in place: replace every entry "
                             "slower than its fallback by the fallback, and revalidate a table tuned on older kernel "
                             "source (on its own GPU, entries right and not slower than their fallback are re-stamped "
                             "for today's source), rewriting the table as omnitune export does. A same-chip GPU's "
                             "table served here is never rewritten: its entries slower here go, replaced, into this "
                             "GPU's own table beside it."),
    interpret: bool = interpret_option(" Compatibility and numerics only (small problems derived from the "
                                       "entries; bf16 ones run in fp16); the GPU parts are skipped. An entry the "
                                       "interpreter cannot run (attention's Gluon kernel) is reported not checkable, "
                                       "and passes."),
) -> None:
    """Check the tuned tables on this machine: compatibility, numerics, speed, memory, soak.

    compat: each table's device, driver, versions and kernel source hash against this machine.

    numerics: each entry's config on fresh seeded inputs against the reference.

    speed (GPU): each entry re-timed interleaved against its fallback and PyTorch; --fix replaces a slower one,
    and revalidates a table whose kernel source changed when its entries pass.

    memory (GPU, --model): each kernel at the preset's largest shape (each preset's, given several).

    soak (GPU, --model, --soak): mixed production calls, CUDA graphs for decode steps, sampled checks (each
    preset's in turn, given several).

    Prints a table of every check and the verdict; progress goes to stderr.

    Exit code: 0 when nothing failed (warnings, skipped parts and entries not checkable here pass), 1 when something
    did, 2 for a usage error.

    Example: omnitune verify --model qwen2.5-omni-7b --soak 5 --json verify.json"""
    import torch

    # Not finite too: a float option takes 'nan' (no soak at all, said nowhere) and 'inf' (a soak
    # that never ends, so the report is never written); nor longer than MAX_SOAK_MINUTES.
    if soak is not None and not (math.isfinite(soak) and 0 < soak <= MAX_SOAK_MINUTES):
        raise OmnituneError(f"--soak {soak:g}: give a positive number of minutes, at most {MAX_SOAK_MINUTES} "
                            "(a week)")
    if soak is not None and model is None:
        raise OmnituneError("--soak needs --model NAME: the soak's traffic comes from a preset (see omnitune plan)")
    from omnitune.presets import get_presets

    # an unknown preset is a usage error, before anything runs
    presets = tuple(p.name for p in get_presets(model)) if model is not None else ()
    if interpret:
        from omnitune.cli._app import enable_interpreter

        enable_interpreter()
    elif not torch.cuda.is_available():
        raise DeviceError("no CUDA GPU here; verify needs one (or --interpret for compatibility and numerics on the CPU)")
    names = [k.strip() for k in (kernels or "").split(",") if k.strip()]
    if kernels is not None and not names:
        # Not every table: --kernels '' (an unset variable in a script) would otherwise check them all.
        raise OmnituneError(f"--kernels {kernels!r} names no kernel; give kernels comma-separated (e.g. --kernels "
                            "attention), or leave --kernels out to check every table found")
    specs = {}
    for name in names:
        spec = load_spec(name, interpret)
        specs[spec.name] = spec
    folders = _folders(tables)
    # found out now, not after minutes of checking
    json_out = report_path(json_text)
    if json_out is not None:
        from omnitune.verify.verdict import REPORT_KEYS

        preflight.require_report_file(json_out, "--json", report_keys=REPORT_KEYS, what="verify report",
                                      not_under=folders)
    if fix:
        for folder in folders:
            preflight.require_writable_folder(folder, "--tables")

    from omnitune.verify.pipeline import VerifyOptions, run_verify
    from omnitune.verify.verdict import render_table

    options = VerifyOptions(tables=tuple(folders), models=presets, kernels=tuple(specs) if specs else None,
                            soak_minutes=soak, fix=fix, interpret=interpret)
    report = run_verify(options, specs, progress=lambda line: err_console.print(line, style="dim"))
    # Piped into a log (a CI job, a GPU host's run), Rich's 80 columns would fold every entry key.
    wide = console.is_terminal or os.environ.get("COLUMNS")
    (console if wide else Console(highlight=False, width=LOG_WIDTH)).print(render_table(report))
    if json_out is not None:
        write_output_file(json_out, report.to_json(), "--json")  # whole or not at all: the old report survives
        console.print(f"wrote {json_out}")
    raise typer.Exit(report.exit_code)


def _folders(tables: list[str] | None) -> list[Path]:
    if tables:
        for text in tables:  # empty, as a Path it was the current folder ("no tables under .")
            require_named(text, "--tables", "a folder of tables (e.g. --tables tuned_configs)")
        missing = [t for t in tables if not Path(t).is_dir()]
        if missing:
            what = "is a file; give the folder of the tables" if Path(missing[0]).exists() else "no such folder"
            raise OmnituneError(f"--tables {missing[0]}: {what}")
        return [Path(t) for t in tables]
    from omnitune.runtime import config_dirs

    return [d for d in config_dirs() if d.is_dir()]

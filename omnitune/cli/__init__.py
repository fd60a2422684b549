"""The `omnitune` command line. Each command group lives in its own module; this one builds the
app, and translates OmnituneError into one line on stderr and exit code 2 (a traceback only
with --debug)."""

from __future__ import annotations

import os
import sys

import click
import typer
from typer.core import TyperGroup

from omnitune.errors import OmnituneError

_state = {"debug": False}


class _OmnituneGroup(TyperGroup):
    """Translates OmnituneError into one red line and exit code 2, for every command."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except OmnituneError as exc:
            if _state["debug"]:
                raise
            typer.secho(f"error: {exc}", err=True, fg=typer.colors.RED)
            raise typer.Exit(2) from None


app = typer.Typer(
    cls=_OmnituneGroup,
    name="omnitune",
    help="Autotune and profile Triton kernels for multimodal LLM inference.\n\n"
    "search → report → export on the target GPU; omnitune.runtime serves the exported tables.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)


@app.callback()
def _root(
    debug: bool = typer.Option(False, "--debug", help="Show full tracebacks instead of one-line errors."),
) -> None:
    _state["debug"] = debug


def enable_interpreter() -> None:
    """Run Triton kernels on the CPU through Triton's interpreter. Must happen before any kernel
    module is imported: @triton.jit reads TRITON_INTERPRET when it decorates."""
    os.environ["TRITON_INTERPRET"] = "1"
    loaded = [m for m in sys.modules if m.startswith("omnitune.kernels.")]
    if loaded and not _interpreted(sys.modules[loaded[0]]):
        raise OmnituneError("kernels were imported before --interpret took effect; set TRITON_INTERPRET=1")


def _interpreted(module) -> bool:
    from triton.runtime.interpreter import InterpretedFunction

    return any(isinstance(v, InterpretedFunction) for v in vars(module).values())


# Command modules register themselves on `app` when imported.
from omnitune.cli import bench_cmd, info_cmd  # noqa: E402,F401
from omnitune.cli import tables_cmd  # noqa: E402,F401
from omnitune.cli import profile_cmd  # noqa: E402,F401
from omnitune.cli import search_cmd  # noqa: E402,F401
from omnitune.cli import plan_cmd  # noqa: E402,F401
from omnitune.cli import worker_cmd  # noqa: E402,F401


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        typer.secho("interrupted", err=True)
        sys.exit(130)

"""The `omnitune` command line. Each command group lives in its own module and registers itself
on the app (omnitune.cli._app) when imported; this package imports them all."""

from __future__ import annotations

import sys

import typer

# Command modules register themselves on `app` when imported.
from omnitune.cli import (  # noqa: F401
    bench_cmd,
    info_cmd,
    plan_cmd,
    profile_cmd,
    search_cmd,
    tables_cmd,
    verify_cmd,
    worker_cmd,
)
from omnitune.cli._app import app, enable_interpreter

__all__ = ["app", "enable_interpreter", "main"]


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        typer.secho("interrupted", err=True)
        sys.exit(130)

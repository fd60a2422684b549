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
    except Exception as exc:
        if not _interrupted(exc):
            raise
        # Ctrl-C inside an import (numpy, torch: the first second of every command) leaves the
        # module half made, and the next use of it fails with AttributeError or RecursionError
        # while the interrupt is handled: still the user's Ctrl-C, not a crash.
        typer.secho("interrupted", err=True)
        sys.exit(130)


def _interrupted(exc: BaseException) -> bool:
    """Whether a KeyboardInterrupt is among the exceptions `exc` was raised in handling."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, KeyboardInterrupt):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False

"""The `omnitune` command line. Each command group lives in its own module and registers itself
on the app (omnitune.cli._app) when imported; this package imports them all."""

from __future__ import annotations

import os
import sys
from contextlib import suppress

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
    except OSError as exc:
        if not _failed_writing_output(exc):
            raise
        # stdout on a full disk (>/dev/full), a closed or revoked terminal: the command's own files
        # are written through their own checks; what failed is the output it printed.
        with suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second failure at exit
        with suppress(OSError, ValueError):
            typer.secho(f"error: cannot write the output: {exc.strerror or exc}", err=True)
        sys.exit(1)
    except Exception as exc:
        if not _interrupted(exc):
            raise
        # Ctrl-C inside an import (numpy, torch: the first second of every command) leaves the
        # module half made, and the next use of it fails with AttributeError or RecursionError
        # while the interrupt is handled: still the user's Ctrl-C, not a crash.
        typer.secho("interrupted", err=True)
        sys.exit(130)


def _failed_writing_output(exc: OSError) -> bool:
    """Whether `exc` was raised writing to stdout or stderr: the innermost frame wrote to one of
    them (Rich's console writes self.file, click's echo its `file`)."""
    tb = exc.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    local = tb.tb_frame.f_locals
    streams = {id(s) for s in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__) if s is not None}
    writers = (local.get("file"), getattr(local.get("self"), "file", None))
    return any(w is not None and id(w) in streams for w in writers)


def _interrupted(exc: BaseException) -> bool:
    """Whether a KeyboardInterrupt is among the exceptions `exc` was raised in handling."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, KeyboardInterrupt):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False

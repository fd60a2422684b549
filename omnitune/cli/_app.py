"""The `omnitune` app that every command module registers on: it translates OmnituneError and the
parser's usage errors (an unknown option, a value of the wrong type) into one line on stderr and
exit code 2 (a traceback only with --debug). A module of its own, so that the command modules
import it and the package imports them, never the other way round."""

from __future__ import annotations

import inspect
import os
import sys

import click
import typer
from typer.core import TyperGroup

from omnitune.errors import OmnituneError

_state = {"debug": False}

# The parser's exceptions: typer >= 0.20 parses with its own copy of click, older ones with click.
_click = getattr(typer.core, "_click", click)
_UsageError = _click.exceptions.UsageError
_NoArgsIsHelpError = getattr(_click.exceptions, "NoArgsIsHelpError", ())


def _one_line(message: str) -> typer.Exit:
    typer.secho(f"error: {' '.join(message.split())}", err=True, fg=typer.colors.RED)
    return typer.Exit(2)


def _usage_line(exc: Exception) -> typer.Exit:
    """A usage error (parsed by click) as one line that says where the options are listed; the
    help that a command with no arguments shows is not an error and is left to click."""
    if isinstance(exc, _NoArgsIsHelpError) or _state["debug"]:
        raise exc
    where = exc.ctx.command_path if getattr(exc, "ctx", None) is not None else "omnitune"
    return _one_line(f"{exc.format_message().rstrip('.')}; see {where} --help")


def _plain_flags(params) -> None:
    """No type shown for a flag in --help: typer's <bool> reads as if the flag took a value."""
    for param in params:
        if getattr(param, "is_flag", False):
            param.metavar = ""


def _flowed(help_text: str | None) -> str | None:
    """A command's help with each paragraph as one line, for rich to wrap at the terminal's width:
    typer keeps the line breaks of every paragraph after the first, so a docstring wrapped at the
    source's width showed ragged at any other. A paragraph that starts with \\b keeps its breaks."""
    if not help_text:
        return help_text
    paragraphs = inspect.cleandoc(help_text).split("\n\n")
    return "\n\n".join(p if p.startswith("\b") else " ".join(p.split("\n")) for p in paragraphs)


def _refuse_repeated_options(command, ctx, args: list[str]) -> None:
    """OmnituneError when an option that takes one value is given twice: the parser keeps the last
    without a word, so `lookup --shape A --shape B` answered for B alone. Options that take several
    (--shape of search) and --help are left to the parser."""
    by_name = {}
    for param in command.get_params(ctx):
        if getattr(param, "param_type_name", None) == "option" and not param.is_eager:
            for opt in (*param.opts, *param.secondary_opts):
                by_name[opt] = param
    given: dict[str, str] = {}
    tokens = iter(args)
    for token in tokens:
        if token == "--":  # the rest are arguments, whatever they look like
            return
        if not token.startswith("-") or token == "-":
            continue
        if token.startswith("--"):
            name, attached = token.partition("=")[0], "=" in token
        else:  # -s VALUE or -sVALUE
            name, attached = token[:2], len(token) > 2
        param = by_name.get(name)
        if param is None:  # an unknown option or a negative number: the parser's to judge
            continue
        if not param.is_flag and not attached:
            for _ in range(max(param.nargs, 1)):  # its value, whatever it looks like
                next(tokens, None)
        if param.multiple or param.count:
            continue
        if param.name in given:
            earlier = given[param.name]
            also = "" if earlier == name else f" (first as {earlier})"
            raise OmnituneError(f"{name} is given twice{also}; {ctx.info_name} {command.name} takes it once "
                                f"(see {ctx.info_name} {command.name} --help)")
        given[param.name] = name


class _OmnituneGroup(TyperGroup):
    """Translates OmnituneError and usage errors into one red line and exit code 2, for every
    command."""

    def parse_args(self, ctx, args):
        _state["debug"] = False  # until the root callback reads --debug: not left from an earlier run
        try:
            return super().parse_args(ctx, args)
        except _UsageError as exc:
            raise _usage_line(exc) from None

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except _UsageError as exc:
            raise _usage_line(exc) from None
        except OmnituneError as exc:
            if _state["debug"]:
                raise
            raise _one_line(str(exc)) from None

    def resolve_command(self, ctx, args):
        name, command, rest = super().resolve_command(ctx, args)
        if command is not None:
            _refuse_repeated_options(command, ctx, rest)
        return name, command, rest

    def get_params(self, ctx):
        params = super().get_params(ctx)
        _plain_flags(params)
        return params

    def get_command(self, ctx, cmd_name):
        command = super().get_command(ctx, cmd_name)
        if command is not None:
            _plain_flags(command.get_params(ctx))
            command.help = _flowed(command.help)
        return command


app = typer.Typer(
    cls=_OmnituneGroup,
    name="omnitune",
    help="Autotune and profile Triton kernels for multimodal LLM inference.\n\n"
    "search → report → export on the target GPU; omnitune.runtime serves the exported tables. "
    "Each command has its own --help.\n\n"
    "The results database is --db, else $OMNITUNE_DB, else ./omnitune.db; the runtime (and lookup, "
    "verify) reads the tables in $OMNITUNE_CONFIG_DIR before the shipped tuned_configs/.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)


@app.callback()
def _root(
    debug: bool = typer.Option(False, "--debug", help="Show full tracebacks instead of one-line errors. Goes before "
                               "the command: omnitune --debug search ..."),
) -> None:
    _state["debug"] = debug


def debugging() -> bool:
    """Whether --debug was given (a command that starts other omnitune processes passes it on)."""
    return _state["debug"]


def enable_interpreter() -> None:
    """Run Triton kernels on the CPU through Triton's interpreter. Must happen before any kernel
    module is imported: @triton.jit reads TRITON_INTERPRET when it decorates."""
    os.environ["TRITON_INTERPRET"] = "1"
    loaded = [module for name, module in list(sys.modules.items()) if name.startswith("omnitune.kernels.")]
    if any(_compiled(module) for module in loaded if module is not None):
        raise OmnituneError("kernels were imported before --interpret took effect; set TRITON_INTERPRET=1")


def _compiled(module) -> bool:
    """Whether a kernel module holds a Triton kernel compiled for the GPU. Judged by its kernels,
    not by the module: some (omnitune.kernels._dispatch) hold none, interpreted or not. Gluon
    kernels (omnitune.kernels.attention_gluon) do not count: the interpreter never runs them, and
    the op sends their calls to the Triton kernel off an sm_90 GPU, so importing them early leaves
    every interpreted run as it would be."""
    from triton.runtime.jit import JITFunction

    return any(isinstance(v, JITFunction) and not type(v).__module__.startswith("triton.experimental.gluon")
               for v in vars(module).values())

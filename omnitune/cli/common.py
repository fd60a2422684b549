"""Pieces every command shares: the console, option types, and turning --shape/--dtype/--config
text into typed values."""

from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console

from omnitune.errors import (
    ConfigError,
    DeviceError,
    OmnituneError,
    ShapeError,
    UnknownKernelError,
    one_line,
)

if TYPE_CHECKING:
    import torch

    from omnitune.spec import Config, KernelSpec

# Rich takes $COLUMNS as the width of every console, help included: 0 printed nothing at all (a
# bench's result lost, verify's verdict unsaid) and 10^15 ran out of memory laying out a table.
# A width outside this range is dropped, and the terminal's own width (or 80) used.
USABLE_COLUMNS = range(10, 10_001)


def drop_unusable_columns(environ=os.environ) -> None:
    text = environ.get("COLUMNS")
    if text is not None and not (text.strip().isdecimal() and text.strip().isascii()
                                 and int(text) in USABLE_COLUMNS):
        del environ["COLUMNS"]


drop_unusable_columns()
console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)

DEFAULT_DB = "omnitune.db"

# Help text that several commands share, so that one option reads the same everywhere.
DB_DEFAULT_HELP = " \\[default: $OMNITUNE_DB, else ./omnitune.db]"
SHAPE_HELP = ("`omnitune kernels` lists each kernel's fields with an example (the problem key any command prints is "
              "itself a valid --shape).")


def json_number(value: float | None) -> float | None:
    """A number for a command's --json output: JSON has no infinity or NaN, so those are null."""
    return value if value is not None and math.isfinite(value) else None


def require_named(text: str | None, option: str, example: str) -> None:
    """An OmnituneError for an option given empty (or blank): Path("") is the current folder, so
    an unset shell variable would spill files into it or quietly mean the default; `example`
    completes "name ... (e.g. <option> <example>)"."""
    if text is not None and not text.strip():
        raise OmnituneError(f"{option} is empty; name {example}")


def report_path(text: str | None) -> Path | None:
    """--json FILE as a path; None when not given. Given empty, refused (require_named): as a
    Path it was the current folder, "--json . is a folder"."""
    if text is None:
        return None
    require_named(text, "--json", "the report's file (e.g. --json report.json)")
    return Path(text)


def db_path(db: str | None) -> Path:
    """--db, else OMNITUNE_DB, else ./omnitune.db. An empty --db is refused rather than taken as
    not given: the results would go to ./omnitune.db, where the user did not ask."""
    require_named(db, "--db", "the results database (e.g. --db omnitune.db)")
    from_env = os.environ.get("OMNITUNE_DB")
    if db is None and from_env and not from_env.strip():
        raise OmnituneError("OMNITUNE_DB is blank; set it to the results database's path, or unset it")
    return Path(db or from_env or DEFAULT_DB)


def preset_kernel_names(text: str | None) -> tuple[str, ...]:
    """--kernels of the preset commands (search --model, plan) as the kernels it names
    (presets.parse_kernels; None: every kernel of the presets). Text that names none (',') is
    refused, as --dtype ',' is, rather than searching or planning nothing; so is empty text,
    which parse_kernels takes as every kernel."""
    from omnitune.presets import parse_kernels

    names = parse_kernels(text)
    if text is not None and (not text.strip() or not names):
        raise OmnituneError(f"--kernels {text!r} names no kernel; give kernels comma-separated (e.g. --kernels "
                            "attention), or leave --kernels out for every kernel of the preset")
    return names


def seconds_option(default: float | None, name: str, *, minimum: float, help: str, **kwargs):
    """A float option in seconds of at least `minimum`: nan and inf are refused as not finite
    numbers (a plain float range said only that nan should be >= the minimum, and took inf)."""
    def parse(text) -> float:
        try:
            value = float(text)
        except ValueError:
            raise typer.BadParameter(f"{text!r} is not a number of seconds") from None
        if not math.isfinite(value):
            raise typer.BadParameter(f"{text} is not a finite number; give seconds, at least {minimum:g}")
        if value < minimum:
            raise typer.BadParameter(f"{text} is less than {minimum:g} s")
        return value

    return typer.Option(default, name, parser=parse, metavar="SECONDS",
                        help=f"{help} \\[x>={minimum:g}]", **kwargs)


def _is_special_file(path: Path) -> bool:
    """Whether `path` (through symlinks) exists and is neither a plain file nor a folder."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def write_output_file(path: Path, text: str, option: str) -> None:
    """Write a file the user named (bench's and verify's --json, search's --lane-stats) whole or
    not at all: through a temporary file beside it, os.replace'd over it
    (omnitune.table_files.write_atomic), so that a failed write (a full disk, a killed process)
    leaves the previous file as it was rather than truncated. A symlink is written through, to the
    file it names, as a plain write would. A device or a FIFO (/dev/null, /dev/stdout, a named pipe)
    is written into: replacing it would put a plain file where the device was. OSError becomes a
    one-line OmnituneError."""
    from omnitune.table_files import write_atomic

    try:
        if _is_special_file(path):
            with open(path, "w", encoding="utf-8") as out:
                out.write(text)
        else:
            write_atomic(path.resolve(), text)
    except OSError as exc:
        raise OmnituneError(f"cannot write {option} {path}: {exc.strerror or exc}") from None


def load_spec(kernel: str, interpret: bool = False) -> KernelSpec:
    if interpret:
        from omnitune.cli._app import enable_interpreter

        enable_interpreter()
    from omnitune.registry import BUILTIN_KERNELS, get_spec

    if kernel in BUILTIN_KERNELS:  # ours: a failure to import one is a bug, its traceback wanted
        return get_spec(kernel)
    try:
        return get_spec(kernel)
    except OmnituneError:
        raise
    except (Exception, SystemExit) as exc:  # whatever the user's module raises while it is imported
        # A kernel file or module of the user's own that cannot be imported (a syntax error, an
        # exception at import, a missing dependency) is the user's to fix: one line naming it.
        # SystemExit too: a module that calls sys.exit() at import (a script's `if` gone wrong)
        # would otherwise end the CLI with its code and no word. (Not KeyboardInterrupt: Ctrl-C
        # is the user's own, not their module's failure.)
        # Chained, so that --debug still shows where in their module it failed.
        raise UnknownKernelError(f"cannot import kernel {kernel!r}: {one_line(exc)}; "
                                 "run with --debug to see the traceback") from exc


def parse_problems(spec: KernelSpec, shapes: list[str], **overrides) -> list:
    """Each --shape, with flag overrides (e.g. causal=True) laid over it."""
    if not shapes:
        raise OmnituneError(
            f"give at least one --shape, e.g. --shape {spec.problem_key(spec.example_problem)}"
        )
    problems = []
    for text in shapes:
        try:
            problem = spec.parse_shape(text)
            changes = {k: v for k, v in overrides.items() if v is not None}
            if changes:
                values = spec.problem_dict(problem) | changes
                problem = spec.problem_from_mapping(values)
        except OverflowError:  # inf, 1e999, or a dimension too large for a float
            raise ShapeError(f"--shape {text}: a dimension is not a finite integer of sensible size") from None
        problems.append(problem)
    return problems


def parse_dtype_option(spec: KernelSpec, name: str) -> torch.dtype:
    from omnitune.spec import dtype_name, parse_dtype

    dtype = parse_dtype(name.strip())  # ' fp16' as plan and search take it
    if dtype not in spec.dtypes:
        raise OmnituneError(
            f"{spec.name} does not support {name}; use one of {', '.join(dtype_name(d) for d in spec.dtypes)}"
        )
    return dtype


def parse_config_option(spec: KernelSpec, text: str, problem, dtype: torch.dtype) -> Config:
    """--config as JSON text or a path to a JSON file; missing keys take the default's values."""
    values = _config_values(_config_text(text))
    try:
        return spec.complete_config(values, problem, dtype)
    except OverflowError:  # an integer too large for a float: no choice is that large
        raise ConfigError(f"--config {text}: a value is too large for any {spec.name} parameter") from None


_CONFIG_EXAMPLE = """'{"BLOCK_M": 64}'"""


def _config_text(text: str, option: str = "--config") -> str:
    """The JSON of a config option: the text itself if it is JSON, else the file it names."""
    if text.lstrip().startswith(("{", "[")):
        return text
    require_named(text, option, f"a JSON object such as {_CONFIG_EXAMPLE} or a JSON file")
    if text.strip() == "null":  # JSON, not a file's name: say what a config must be
        raise ConfigError(f"{option} null: a config must be a JSON object such as {_CONFIG_EXAMPLE}")
    path = Path(text)
    if path.is_dir():
        raise ConfigError(f"{option} {text} is a folder; give a JSON object such as {_CONFIG_EXAMPLE} or a JSON file")
    if not path.exists():
        raise ConfigError(f"{option} {text}: no such file; give a JSON object such as {_CONFIG_EXAMPLE} "
                          "or the path of a JSON file")
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {option} {text}: {getattr(exc, 'strerror', None) or exc}") from None


def _config_values(raw: str, option: str = "--config") -> dict:
    """The JSON object of a config, each value a single finite number, a boolean or a string."""
    def reject_constant(name: str):
        raise ConfigError(f"{option} holds {name}; launch parameters are finite numbers")

    def once_each(pairs):  # {"BLOCK_T": 2, "BLOCK_T": 4} took the last, unsaid
        seen = {}
        for key, value in pairs:
            if key in seen:
                raise ConfigError(f"{option} names {key} twice; give each parameter once")
            seen[key] = value
        return seen

    try:
        values = json.loads(raw, parse_constant=reject_constant, object_pairs_hook=once_each)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{option} is not valid JSON ({exc.msg} at position {exc.pos})") from None
    except (ValueError, RecursionError) as exc:  # an integer of thousands of digits, absurd nesting
        raise ConfigError(f"{option} is not usable JSON ({type(exc).__name__}: {exc})") from None
    if not isinstance(values, dict):
        raise ConfigError(f"{option} must be a JSON object such as {_CONFIG_EXAMPLE}, got a JSON {type(values).__name__}")
    for key, value in values.items():
        if isinstance(value, float) and not math.isfinite(value):  # 1e999 parses as inf
            raise ConfigError(f"{option} {key}={value!r}: launch parameters are finite numbers")
        if not isinstance(value, (bool, int, float, str)):
            raise ConfigError(f"{option} {key}={json.dumps(value)}: a parameter takes a single value")
    return values


def search_dtype(spec: KernelSpec, name: str | None, interpret: bool) -> torch.dtype:
    """--dtype of a search (search, worker): bf16 on a GPU and fp16 (else fp32) under the
    interpreter when not given; bf16 refused under the interpreter, which computes it wrongly."""
    import torch

    if name is None:
        if not interpret:
            return parse_dtype_option(spec, "bf16")
        return next((d for d in (torch.float16, torch.float32) if d in spec.dtypes), spec.dtypes[0])
    dtype = parse_dtype_option(spec, name)
    if interpret and dtype is torch.bfloat16:
        raise DeviceError("the interpreter computes bf16 wrongly; use --dtype fp16 or fp32 with --interpret")
    return dtype


def search_dtype_names(text: str | None) -> list[str | None]:
    """A search's --dtype as the names it lists, comma-separated, each once ([None]: not given, the
    default applies); OmnituneError when it lists none."""
    if text is None:
        return [None]
    names = list(dict.fromkeys(n.strip().lower() for n in text.split(",") if n.strip()))
    if not names:
        raise OmnituneError(f"--dtype {text!r} names no dtype; use fp16, bf16 or fp32 (several comma-separated)")
    return names


def search_dtype_option(help_extra: str = "") -> str:
    """--dtype of the commands that search (search, worker): bf16 on a GPU, fp16 under the
    interpreter (which computes bf16 wrongly)."""
    return typer.Option(
        None, "--dtype", help="fp16, bf16 or fp32." + help_extra + " \\[default: bf16; fp16 with --interpret, "
        "which refuses bf16]",
        show_default=False,
    )


def try_option() -> list[str]:
    """--try of search and worker: configs measured right after the default."""
    return typer.Option(
        [], "--try",
        help="A config to measure right after the default, as JSON (or a JSON file); missing keys take each "
        "problem's default values, e.g. --try '{\"BLOCK_N\": 16, \"num_warps\": 1}'. Repeatable: measured in "
        "the order given, before the kernel's known-good configs and the sampler's. Each counts against "
        "--trials; one that breaks a constraint for a problem is rejected there without touching the GPU.",
        show_default=False,
    )


def parse_tries(texts: list[str], specs: list[KernelSpec]) -> tuple[dict, ...]:
    """The --try configs (JSON text or a JSON file each), partial ones, read once and checked
    against every kernel searched: a name or value one of them does not take is one line, before
    anything is written. What a config leaves out is filled per problem later."""
    tries = []
    for text in texts:
        values = _config_values(_config_text(text, "--try"), "--try")
        for spec in specs:
            try:
                spec.coerce_config(values, partial_ok=True)
            except OverflowError:  # an integer too large for a float: no choice is that large
                raise ConfigError(f"--try {text}: a value is too large for any {spec.name} parameter") from None
        tries.append(values)
    return tuple(tries)


def interpret_option(help_extra: str = "") -> bool:
    return typer.Option(
        False, "--interpret",
        help="Run kernels on the CPU through Triton's interpreter: correctness only, "
        "timings not representative." + help_extra,
    )

"""Pieces every command shares: the console, option types, and turning --shape/--dtype/--config
text into typed values."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import typer
from rich.console import Console

from omnitune.errors import ConfigError, OmnituneError
from omnitune.spec import Config, KernelSpec, parse_dtype

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)

DEFAULT_DB = "omnitune.db"


def db_path(db: str | None) -> Path:
    """--db, else OMNITUNE_DB, else ./omnitune.db."""
    return Path(db or os.environ.get("OMNITUNE_DB") or DEFAULT_DB)


def load_spec(kernel: str, interpret: bool = False) -> KernelSpec:
    if interpret:
        from omnitune.cli import enable_interpreter

        enable_interpreter()
    from omnitune.registry import get_spec

    return get_spec(kernel)


def parse_problems(spec: KernelSpec, shapes: list[str], **overrides) -> list:
    """Each --shape, with flag overrides (e.g. causal=True) laid over it."""
    if not shapes:
        raise OmnituneError(
            f"give at least one --shape, e.g. --shape {spec.problem_key(spec.example_problem)}"
        )
    problems = []
    for text in shapes:
        problem = spec.parse_shape(text)
        changes = {k: v for k, v in overrides.items() if v is not None}
        if changes:
            values = spec.problem_dict(problem) | changes
            problem = spec.problem_from_mapping(values)
        problems.append(problem)
    return problems


def parse_dtype_option(spec: KernelSpec, name: str) -> torch.dtype:
    dtype = parse_dtype(name)
    if dtype not in spec.dtypes:
        from omnitune.spec import dtype_name

        raise OmnituneError(
            f"{spec.name} does not support {name}; use one of {', '.join(dtype_name(d) for d in spec.dtypes)}"
        )
    return dtype


def parse_config_option(spec: KernelSpec, text: str, problem, dtype: torch.dtype) -> Config:
    """--config as JSON text or a path to a JSON file; missing keys take the default's values."""
    raw = text
    if not text.lstrip().startswith("{") and Path(text).is_file():
        raw = Path(text).read_text()
    try:
        values = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--config is not valid JSON ({exc.msg} at position {exc.pos})") from None
    return spec.complete_config(values, problem, dtype)


def search_dtype_option() -> str:
    """--dtype of the commands that search (search, worker): bf16 on a GPU, fp16 under the
    interpreter (which computes bf16 wrongly)."""
    return typer.Option(
        None, "--dtype", help="fp16, bf16 or fp32. \\[default: bf16; fp16 with --interpret]", show_default=False,
    )


def interpret_option(help_extra: str = "") -> bool:
    return typer.Option(
        False, "--interpret",
        help="Run kernels on the CPU through Triton's interpreter: correctness only, "
        "timings not representative." + help_extra,
    )

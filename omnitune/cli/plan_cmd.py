"""`omnitune plan`: what `omnitune search --model` would do, before any GPU time is spent — the
problems of a model preset per kernel, each one's config space after pruning, the trials that
will run, an estimated time, and the tables `omnitune export` would then write. With --coverage,
how the tables already cover the preset instead, and what to tune next (plan_coverage.py)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import typer
from rich.markup import escape

from omnitune.cli._app import app
from omnitune.cli.common import DB_DEFAULT_HELP, console, db_path, preset_kernel_names
from omnitune.cli.plan_rates import ASSUMED, SECONDS_PER_TRIAL, SETUP_S_PER_PROBLEM, Rates, measured_rates
from omnitune.cli.search_lanes import DEFAULT_LANES
from omnitune.durations import human_duration

if TYPE_CHECKING:
    import torch

__all__ = ["SECONDS_PER_TRIAL", "SETUP_S_PER_PROBLEM", "PlannedProblem", "plan", "plan_kernel"]


@dataclass(frozen=True)
class PlannedProblem:
    """One problem of a plan: its key, what traffic it stands for, and its budget."""

    problem_key: str
    role: str
    valid_configs: int
    trials: int
    rates: Rates = ASSUMED

    @property
    def estimate_s(self) -> float:
        return self.rates.estimate_s(self.trials)


def plan_kernel(kernel: str, problems, dtype: torch.dtype, trials: int, rates: Rates = ASSUMED) -> list[PlannedProblem]:
    """The plan for one kernel's preset problems: valid configs after the constraints (checked
    against H100/H200 limits, as without a GPU) and min(valid, trials) trials each."""
    from omnitune.registry import get_spec

    spec = get_spec(kernel)
    planned = []
    for p in problems:
        valid = len(spec.valid_configs(p.problem, dtype))
        planned.append(PlannedProblem(spec.problem_key(p.problem), p.role, valid, min(valid, trials), rates))
    return planned


@app.command()
def plan(
    model: str = typer.Option(..., "--model", help="One model preset, e.g. qwen2.5-omni-7b (an unknown name lists "
                              "them; unlike search, not several)."),
    kernels: str = typer.Option(
        None, "--kernels", metavar="K1,K2", help="Only these kernels, comma-separated. "
        "\\[default: every kernel of the preset]", show_default=False,
    ),
    trials: int = typer.Option(50, "--trials", "-n", min=1, help="Configs to measure per problem, as search's "
                               "--trials (a problem with fewer valid configs gets that many)."),
    dtype: str = typer.Option("bf16", "--dtype", help="fp16, bf16 or fp32 (the valid configs depend on it); one "
                              "dtype, unlike search."),
    db: str = typer.Option(
        None, "--db", help="Results database whose past searches give the time per trial and per problem; only "
        f"read. Without such searches, {SECONDS_PER_TRIAL:g} s per trial and {SETUP_S_PER_PROBLEM:g} s per problem "
        "are assumed." + DB_DEFAULT_HELP, show_default=False,
    ),
    coverage: bool = typer.Option(
        False, "--coverage", help="Instead: look each problem up in the tables the runtime reads (for --device) "
        "and list those to tune next, largest gap first — answered by the default, then predicted, then lent "
        "a nearest entry, farthest first — each with its omnitune search command.",
    ),
    device: str = typer.Option(
        None, "--device", help="With --coverage: the GPU whose tables to read, as torch names it, e.g. 'NVIDIA H200' "
        "(or as the table files are named, NVIDIA_H200). Required without a GPU. \\[default: this machine's GPU]",
        show_default=False,
    ),
    top: int = typer.Option(
        None, "--top", min=1, help="With --coverage: list only the N largest gaps. \\[default: every gap]",
        show_default=False,
    ),
    as_json: bool = typer.Option(
        False, "--json", help="With --coverage: one JSON object on stdout instead (every problem, largest gap "
        "first, with its rung, why, the search that would tune it and that search's estimate), for scripts.",
    ),
) -> None:
    """Show what `omnitune search --model` would search, how long it should take, and which tables
    `omnitune export` would write. Touches no GPU and writes nothing.

    With --coverage: which rung of the runtime's chain (exact, nearest, predictor, default) answers
    each of the preset's problems from the tables, why, and the searches that would close the
    largest gaps first.

    Example: omnitune plan --model qwen2.5-omni-7b --coverage --device 'NVIDIA H200' --top 10"""
    import torch
    from omnitune.errors import OmnituneError
    from omnitune.presets import get_preset, preset_problems
    from omnitune.profile.device import device_key
    from omnitune.runtime._format import table_path
    from omnitune.spec import dtype_name, parse_dtype

    preset = get_preset(model)
    names = preset_kernel_names(kernels)
    torch_dtype = parse_dtype(dtype)
    if not coverage and (device is not None or top is not None or as_json):
        raise OmnituneError("--device, --top and --json go with --coverage: "
                            "omnitune plan --model NAME --coverage --device NAME")
    problems_of = {name: preset_problems(preset, name) for name in names}
    if not any(problems_of.values()):  # as search refuses it: an empty plan (or coverage) reads as nothing to do
        raise OmnituneError(f"nothing to plan: {preset.name} sends none of the kernels asked for any problem")
    key = device_key(torch.cuda.get_device_name()) if torch.cuda.is_available() else "<device_key>"
    if coverage:
        from omnitune.cli.plan_coverage import coverage_device, coverage_json, print_coverage

        device_name = coverage_device(device)
        rates = measured_rates(db_path(db), device_key(device_name))
        budgets = {(name, p.problem_key): p for name in names
                   for p in plan_kernel(name, problems_of[name], torch_dtype, trials, rates)}
        if as_json:
            typer.echo(coverage_json(preset, names, torch_dtype, device_name, budgets, top))
        else:
            print_coverage(preset, names, torch_dtype, device_name, budgets, top)
        return
    # This GPU's history; without one, the device the database has measured most.
    rates = measured_rates(db_path(db), key if torch.cuda.is_available() else None)
    console.print(
        f"[bold]{escape(preset.description)}[/]: hidden {preset.hidden}, {preset.heads} heads / "
        f"{preset.kv_heads} kv heads × {preset.head_dim}, {preset.layers} layers; image tokens "
        f"448²: {preset.image_tokens_448}, 512²: {preset.image_tokens_512}"
        + (f"; {preset.audio_tokens_per_s:g} audio tokens/s" if preset.audio_tokens_per_s else ""),
        soft_wrap=True,
    )
    total_s = 0.0
    problems_planned = 0
    files = []
    for name in names:
        problems = problems_of[name]
        if not problems:
            console.print(f"\n[bold]{name}[/]: not used by this model", soft_wrap=True)
            continue
        planned = plan_kernel(name, problems, torch_dtype, trials, rates)
        problems_planned += len(planned)
        kernel_s = sum(p.estimate_s for p in planned)
        total_s += kernel_s
        files.append(str(table_path("tuned_configs", name, key)))
        console.print(f"\n[bold]{name}[/] ({dtype_name(torch_dtype)}): {len(planned)} problems, "
                      f"{sum(p.trials for p in planned)} trials, ~{human_duration(kernel_s)}", soft_wrap=True)
        for p in planned:
            console.print(f"  {escape(p.problem_key)}  [dim]{escape(p.role)}[/]", soft_wrap=True)
            console.print(f"      {p.valid_configs} valid configs, {p.trials} trials, ~{human_duration(p.estimate_s)}",
                          soft_wrap=True)
    console.print(f"\ntotal ~{human_duration(total_s)}: {escape(rates.source)}", soft_wrap=True)
    lanes = min(DEFAULT_LANES, problems_planned)
    cores = os.cpu_count()
    in_lanes_s = rates.in_lanes_s(total_s, lanes, cores) if lanes > 1 else None
    if in_lanes_s is not None:
        cpu = (f" and kept {rates.cores_busy:.1f} CPU cores busy (this host has {cores})"
               if rates.cores_busy is not None and cores else "")
        console.print(f"in {lanes} lanes (`omnitune search`'s default on a GPU) ~{human_duration(in_lanes_s)}: those "
                      f"searches held the GPU {rates.gpu_share:.0%} of their own time{cpu}", soft_wrap=True)
    if files:
        console.print("then `omnitune export` writes: " + ", ".join(files)
                      + ("" if torch.cuda.is_available() else "  (<device_key>: the GPU's name, e.g. NVIDIA_H200)"),
                      soft_wrap=True)



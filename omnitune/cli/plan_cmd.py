"""`omnitune plan`: what `omnitune search --model` would do, before any GPU time is spent — the
problems of one or more model presets per kernel (in one or more dtypes), each one's config space after pruning, the trials that
will run, an estimated time, and the tables `omnitune export` would then write. With --coverage,
how the tables already cover the preset instead, and what to tune next (plan_coverage.py)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import typer
from rich.markup import escape

from omnitune.cli._app import app
from omnitune.cli.common import (
    DB_DEFAULT_HELP,
    console,
    db_path,
    preset_kernel_names,
    search_dtype_names,
)
from omnitune.cli.plan_rates import (
    ASSUMED,
    SECONDS_PER_TRIAL,
    SETUP_S_PER_PROBLEM,
    Rates,
    measured_rates,
)
from omnitune.cli.search_lanes import DEFAULT_LANES
from omnitune.durations import human_duration

if TYPE_CHECKING:
    import torch

    from omnitune.presets import ModelPreset, PresetProblem

__all__ = ["SECONDS_PER_TRIAL", "SETUP_S_PER_PROBLEM", "PlannedProblem", "plan", "plan_dtypes", "plan_kernel"]


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
    model: str = typer.Option(
        ..., "--model", help="A model preset, e.g. qwen2.5-omni-7b (an unknown name lists them). Several, "
        "comma-separated, are planned as `omnitune search --model` searches them, in one session: a problem two "
        "presets share is planned, and listed, once, with the presets that send it. With --coverage, each "
        "preset's coverage in turn.",
    ),
    kernels: str = typer.Option(
        None, "--kernels", metavar="K1,K2", help="Only these kernels, comma-separated. "
        "\\[default: every kernel of the preset]", show_default=False,
    ),
    trials: int = typer.Option(50, "--trials", "-n", min=1, help="Configs to measure per problem, as search's "
                               "--trials (a problem with fewer valid configs gets that many)."),
    dtype: str = typer.Option("bf16", "--dtype", help="fp16, bf16 or fp32 (the valid configs depend on it). "
                              "Several, comma-separated (e.g. bf16,fp16): every problem is planned in each, "
                              "one search per dtype, as search does."),
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
        "first, with its rung, why, the search that would tune it and that search's estimate), for scripts; "
        "with several presets or dtypes, a JSON list of such objects, one per preset and dtype.",
    ),
) -> None:
    """Show what `omnitune search --model` would search, how long it should take, and which tables
    `omnitune export` would write. Touches no GPU and writes nothing.

    With --coverage: which rung of the runtime's chain (exact, nearest, predictor, default) answers
    each of the preset's problems from the tables, why, and the searches that would close the
    largest gaps first.

    Example: omnitune plan --model qwen2.5-omni-7b --coverage --device 'NVIDIA H200' --top 10"""
    from omnitune.errors import OmnituneError
    from omnitune.presets import get_presets

    presets = get_presets(model)
    names = preset_kernel_names(kernels)
    dtypes = plan_dtypes(dtype)
    if not coverage and (device is not None or top is not None or as_json):
        raise OmnituneError("--device, --top and --json go with --coverage: "
                            "omnitune plan --model NAME --coverage --device NAME")
    problems_of = {name: _problems_sent(presets, name) for name in names}
    if not any(problems_of.values()):  # as search refuses it: an empty plan (or coverage) reads as nothing to do
        raise OmnituneError(f"nothing to plan: {', '.join(p.name for p in presets)} sends none of the kernels "
                            "asked for any problem")
    if coverage:
        _coverage(presets, names, dtypes, problems_of, trials=trials, db=db, device=device, top=top,
                  as_json=as_json)
    else:
        _print_plan(presets, names, dtypes, problems_of, trials=trials, db=db)


def plan_dtypes(text: str) -> list[torch.dtype]:
    """--dtype as the dtypes it names, comma-separated as search takes them (an unknown or empty
    one is the same one line as there), each once: 'bf16,bfloat16' plans bf16 once."""
    from omnitune.spec import parse_dtype

    return list(dict.fromkeys(parse_dtype(name) for name in search_dtype_names(text)))


@dataclass(frozen=True)
class _SentProblem:
    """A preset problem of the plan, and every preset that sends it (the first's role is shown)."""

    problem: PresetProblem
    presets: tuple[str, ...]


def _problems_sent(presets: tuple[ModelPreset, ...], kernel: str) -> list[_SentProblem]:
    """The problems `kernel` sees under any of `presets`, each once, as search --model takes them
    (presets.models_problems), each with the presets that send it."""
    from omnitune.presets import models_problems, preset_problems
    from omnitune.registry import get_spec

    key = get_spec(kernel).problem_key
    senders: dict[str, list[str]] = {}
    for preset in presets:
        for one in preset_problems(preset, kernel):
            senders.setdefault(key(one.problem), []).append(preset.name)
    return [_SentProblem(one, tuple(senders[key(one.problem)]))
            for one in models_problems(presets, kernel, key)]


def _coverage(presets, names, dtypes, problems_of, *, trials: int, db: str | None, device: str | None,
              top: int | None, as_json: bool) -> None:
    """--coverage: each preset's coverage in each dtype, in the order named; the budget of the
    search each proposal names comes from the plan of the presets' problems in that dtype."""
    from omnitune.cli.plan_coverage import (
        coverage_device,
        coverage_json,
        print_coverage,
    )
    from omnitune.profile.device import device_key

    device_name = coverage_device(device)
    rates = measured_rates(db_path(db), device_key(device_name))
    budgets = {dtype: _budgets(names, problems_of, dtype, trials, rates) for dtype in dtypes}
    if as_json:
        typer.echo(coverage_json(presets, names, dtypes, device_name, budgets, top))
        return
    for place, (preset, dtype) in enumerate((p, d) for p in presets for d in dtypes):
        if place:
            console.print()
        print_coverage(preset, names, dtype, device_name, budgets[dtype], top)


def _budgets(names, problems_of, dtype: torch.dtype, trials: int, rates: Rates) -> dict[tuple[str, str], PlannedProblem]:
    """The plan's PlannedProblem per (kernel, problem key): the search a coverage proposal names."""
    return {(name, p.problem_key): p for name in names
            for p in plan_kernel(name, [sent.problem for sent in problems_of[name]], dtype, trials, rates)}


def _print_plan(presets, names, dtypes, problems_of, *, trials: int, db: str | None) -> None:
    """The plan: each kernel's problems in each dtype, their budgets, the total and the tables."""
    import torch

    from omnitune.profile.device import device_key
    from omnitune.runtime._format import table_path

    on_gpu = torch.cuda.is_available()
    key = device_key(torch.cuda.get_device_name()) if on_gpu else "<device_key>"
    # This GPU's history; without one, the device the database has measured most.
    rates = measured_rates(db_path(db), key if on_gpu else None)
    for preset in presets:
        _print_preset(preset)
    if len(presets) > 1 or len(dtypes) > 1:
        _print_session(presets, dtypes)
    several = len(presets) > 1
    total_s = 0.0
    problems_planned = 0
    files = []
    for name in names:
        sent = problems_of[name]
        if not sent:
            console.print(f"\n[bold]{name}[/]: not used by {'these models' if several else 'this model'}",
                          soft_wrap=True)
            continue
        files.append(str(table_path("tuned_configs", name, key)))
        for dtype in dtypes:
            planned = plan_kernel(name, [s.problem for s in sent], dtype, trials, rates)
            problems_planned += len(planned)
            total_s += _print_kernel(name, dtype, planned, [s.presets for s in sent] if several else None)
    console.print(f"\ntotal ~{human_duration(total_s)}: {escape(rates.source)}", soft_wrap=True)
    _print_lanes(rates, total_s, problems_planned)
    if files:
        console.print("then `omnitune export` writes: " + ", ".join(files)
                      + ("" if on_gpu else "  (<device_key>: the GPU's name, e.g. NVIDIA_H200)"), soft_wrap=True)


def _print_preset(preset: ModelPreset) -> None:
    console.print(
        f"[bold]{escape(preset.description)}[/]: hidden {preset.hidden}, {preset.heads} heads / "
        f"{preset.kv_heads} kv heads × {preset.head_dim}, {preset.layers} layers; image tokens "
        f"448²: {preset.image_tokens_448}, 512²: {preset.image_tokens_512}"
        + (f"; {preset.audio_tokens_per_s:g} audio tokens/s" if preset.audio_tokens_per_s else ""),
        soft_wrap=True,
    )


def _print_session(presets, dtypes) -> None:
    """What a plan of several presets or dtypes adds up, said once: the search it stands for."""
    from omnitune.spec import dtype_name

    models = ",".join(p.name for p in presets)
    dtype_names = [dtype_name(d) for d in dtypes]
    how = []
    if len(presets) > 1:
        how.append("a problem several presets send is planned once, listed with the presets that send it")
    if len(dtypes) > 1:
        how.append(f"each problem in {' and '.join(dtype_names)}, one search each")
    console.print(f"\nplanned as one session of `omnitune search --model {models} --dtype {','.join(dtype_names)}`: "
                  + "; ".join(how), soft_wrap=True)


def _print_kernel(name: str, dtype: torch.dtype, planned: list[PlannedProblem],
                  senders: list[tuple[str, ...]] | None) -> float:
    """One kernel's problems in one dtype; `senders`: each problem's presets, where several were
    planned. Returns the kernel's estimated seconds."""
    from omnitune.spec import dtype_name

    kernel_s = sum(p.estimate_s for p in planned)
    console.print(f"\n[bold]{name}[/] ({dtype_name(dtype)}): {len(planned)} problems, "
                  f"{sum(p.trials for p in planned)} trials, ~{human_duration(kernel_s)}", soft_wrap=True)
    for place, p in enumerate(planned):
        sent_by = f"  from {', '.join(senders[place])}" if senders else ""
        console.print(f"  {escape(p.problem_key)}  [dim]{escape(p.role)}[/]{escape(sent_by)}", soft_wrap=True)
        console.print(f"      {p.valid_configs} valid configs, {p.trials} trials, ~{human_duration(p.estimate_s)}",
                      soft_wrap=True)
    return kernel_s


def _print_lanes(rates: Rates, total_s: float, problems_planned: int) -> None:
    """How long the default lanes take, where the database says how long the searches held the GPU."""
    lanes = min(DEFAULT_LANES, problems_planned)
    cores = os.cpu_count()
    in_lanes_s = rates.in_lanes_s(total_s, lanes, cores) if lanes > 1 else None
    if in_lanes_s is None:
        return
    cpu = (f" and kept {rates.cores_busy:.1f} CPU cores busy (this host has {cores})"
           if rates.cores_busy is not None and cores else "")
    console.print(f"in {lanes} lanes (`omnitune search`'s default on a GPU) ~{human_duration(in_lanes_s)}: those "
                  f"searches held the GPU {rates.gpu_share:.0%} of their own time{cpu}", soft_wrap=True)

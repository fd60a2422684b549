"""`omnitune bench`: our kernel beside the baselines, verified and timed in one run."""

from __future__ import annotations

import math

import typer
from rich.markup import escape
from rich.table import Table

from omnitune.cli import preflight
from omnitune.cli._app import app
from omnitune.cli.common import (
    SHAPE_HELP,
    console,
    interpret_option,
    load_spec,
    parse_config_option,
    parse_problems,
    report_path,
    search_dtype,
    write_output_file,
)
from omnitune.errors import DeviceError, OmnituneError
from omnitune.plain_json import plain_json_text


def _fmt(x: float, spec: str) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


# Keys every --json report of bench has: an existing file without them is not replaced.
BENCH_REPORT_KEYS = frozenset({"device", "source_hash", "results"})


@app.command()
def bench(
    kernel: str = typer.Argument(..., help="Kernel name (see `omnitune kernels`) or a module/file defining SPEC."),
    shape: list[str] = typer.Option(
        ..., "--shape", "-s",
        help="Problem to bench, as name=value pairs, e.g. b=8,h=28,hkv=4,lq=512,lk=4096,d=128; " + SHAPE_HELP
        + " Repeatable: one table per shape.",
    ),
    causal: bool = typer.Option(
        None, "--causal/--no-causal", show_default=False,
        help="Override the causal flag of every --shape. Only for kernels whose shapes have one (attention); "
        "refused for the others. \\[default: each shape's own]",
    ),
    dtype: str = typer.Option(None, "--dtype", show_default=False,
                              help="fp16, bf16 or fp32. \\[default: bf16; fp16 with --interpret, which refuses bf16]"),
    config: list[str] = typer.Option(
        [], "--config", "-c",
        help="Launch config to bench, as JSON (or a JSON file), e.g. --config '{\"BLOCK_M\": 64}'; missing keys take "
        "the default config's values. Repeatable: each is a row. Without it: the config omnitune.runtime would "
        "choose (see omnitune lookup), if a table answers, and the default.", show_default=False,
    ),
    baselines: bool = typer.Option(True, "--baselines/--no-baselines",
                                   help="Also verify and time the spec's PyTorch baselines (e.g. every SDPA backend). "
                                   "Not under --interpret."),
    energy: bool = typer.Option(
        True, "--energy/--no-energy",
        help="Also measure the energy each row draws per call (mJ, and mean W): NVML's energy counter over ≥0.5 s "
        "of back-to-back calls (L2 warm). About 1 s per row. Not under --interpret.",
    ),
    json_text: str = typer.Option(None, "--json", metavar="FILE", show_default=False,
                                  help="Also write every row, with the device's facts and the kernel's source hash, "
                                  "to FILE as JSON (an earlier report there is replaced; any other file, a results "
                                  "database say, is refused; checked before the bench runs)."),
    interpret: bool = interpret_option(" Only our configs' correctness is checked: no times, baselines or energy; "
                                       "fp16 or fp32 only."),
) -> None:
    """Verify our kernel against the reference and time it beside PyTorch's baselines.

    Per --shape, one table: a row per config (without --config, the tuned one and the default) and per
    baseline, each checked against the reference (rel err) and timed (median ms of up to 50 calls, L2
    flushed, with p20–p80), with its TFLOP/s, TB/s and how much slower it is than our fastest row. Nothing
    is written to the results database. Needs a GPU, or --interpret for the correctness check alone.

    Example: omnitune bench attention --shape b=1,h=28,hkv=4,l=8192,d=128,causal=1"""
    import torch

    from omnitune.spec import dtype_name

    spec = load_spec(kernel, interpret)
    has_causal = "causal" in {f.name for f in spec.problem_fields()}
    if causal is not None and not has_causal:  # not ignored: the bench would run other problems than asked
        flag = "--causal" if causal else "--no-causal"
        raise OmnituneError(f"{flag}: {spec.name} has no causal flag; give it only for kernels whose shapes "
                            "have one (e.g. attention)")
    if not interpret and not torch.cuda.is_available():
        raise DeviceError("no CUDA GPU here; bench needs one (or --interpret to check correctness on the CPU)")
    # As a search takes it: bf16 unless given, fp16 under the interpreter (which refuses bf16).
    torch_dtype = search_dtype(spec, dtype, interpret)
    dtype = dtype_name(torch_dtype)
    overrides = {"causal": causal} if causal is not None else {}
    problems = parse_problems(spec, shape, **overrides)
    # Checked before the bench runs, not found out after it.
    json_out = report_path(json_text)
    if json_out is not None:
        preflight.require_report_file(json_out, "--json", report_keys=BENCH_REPORT_KEYS, what="bench report")
    for problem in problems:
        preflight.require_fits_in_memory(spec, problem, torch_dtype, interpret)

    from omnitune.profile.bench import run_bench, speedups
    from omnitune.profile.device import current_device_facts

    facts = current_device_facts(interpret)
    records = []
    for problem in problems:
        configs = {}
        for i, text in enumerate(config):
            configs[f"config{i + 1}" if len(config) > 1 else "config"] = parse_config_option(spec, text, problem, torch_dtype)
        _reject_violations(spec, problem, torch_dtype, configs, interpret)
        if not configs:
            configs = _tuned_and_default(spec, problem, torch_dtype, facts.name if facts else None)
        with preflight.allocation_errors(spec, problem):
            rows = run_bench(spec, problem, torch_dtype, configs, interpret=interpret, baselines=baselines,
                             energy=energy and not interpret)
        _print_rows(spec, problem, dtype, rows, interpret)
        records.append({
            "kernel": spec.name, "problem": spec.problem_dict(problem), "problem_key": spec.problem_key(problem),
            "dtype": dtype, "flops": spec.flops(problem), "bytes": spec.bytes_moved(problem, torch_dtype),
            "rows": [r.as_record() for r in rows], "speedups": speedups(rows),
        })
    if json_out is not None:
        payload = {"device": facts.as_dict() if facts else None, "source_hash": spec.source_hash(), "results": records}
        # Checked before the bench (preflight); a failure here is what changed while it ran.
        # Plain JSON (a NaN is null): the rows' throughputs are NaN where a problem moves no bytes.
        write_output_file(json_out, plain_json_text(payload), "--json")
        console.print(f"wrote {json_out}")


def _reject_violations(spec, problem, dtype, configs, interpret):
    from omnitune.spec import DeviceLimits

    limits = DeviceLimits() if interpret else DeviceLimits.of_current_device()
    for cfg in configs.values():
        spec.require_valid(problem, cfg, dtype, limits)


def _tuned_and_default(spec, problem, dtype, device_name):
    configs = {"default": spec.default_config(problem, dtype)}
    try:
        from omnitune.runtime import lookup
    except ImportError:
        return configs
    found = lookup(spec.name, problem, dtype=dtype, device_name=device_name)
    if found.rung != "default":
        if found.config == configs["default"]:
            return {f"default = tuned/{found.rung}": found.config}
        configs = {f"tuned/{found.rung}": found.config, **configs}
    return configs


def _energy_cells(energy: dict | None) -> list[str]:
    """mJ per call and mean watts; the reason instead where there is no figure."""
    if not energy:
        return ["—", "—"]
    if "energy_per_call_mj" not in energy:
        return [energy.get("energy", "—"), "—"]
    if energy.get("host_paced"):
        # The GPU idled between launches: a per-call figure would charge it to the kernel.
        return ["host-paced", _fmt(energy["power_w_mean"], ".0f")]
    return [_fmt(energy["energy_per_call_mj"], ".3f"), _fmt(energy["power_w_mean"], ".0f")]


def _print_rows(spec, problem, dtype, rows, interpret):
    title = f"[bold]{spec.name}[/] {spec.problem_key(problem)} {dtype}"
    if interpret:
        title += "  [yellow](interpreter: correctness only)[/]"
    table = Table(title=title, title_justify="left")
    show_energy = any(r.energy for r in rows)
    columns = ["", "status", "ms (p20–p80)", "TFLOP/s", "TB/s", "rel err"] + (["mJ/call", "W"] if show_energy else [])
    for col in columns:
        table.add_column(col, justify="right" if col not in ("", "status") else "left")
    ours = [r for r in rows if r.kind == "omnitune" and r.status == "ok"]
    best = min(ours, key=lambda r: r.time_ms) if ours else None
    if best is not None and not interpret:
        table.add_column(f"{best.name} speedup", justify="right")
    for r in rows:
        if r.status != "ok" or interpret:
            ms = "—"  # the interpreter's wall time says nothing about a GPU
        else:
            ms = f"{_fmt(r.time_ms, '.4f')} ({_fmt(r.p20_ms, '.4f')}–{_fmt(r.p80_ms, '.4f')})"
        cells = [escape(r.name), r.status if r.status != "ok" else "[green]ok[/]", ms,
                 _fmt(r.tflops, ".1f"), _fmt(r.tbps, ".2f"), _fmt(r.rel_error, ".2e")]
        if show_energy:
            cells += _energy_cells(r.energy)
        if best is not None and not interpret:
            cells.append(f"{r.time_ms / best.time_ms:.2f}x" if r.status == "ok" and r is not best else "")
        table.add_row(*cells)
    console.print(table)
    for r in rows:
        if r.detail and r.status != "ok":
            console.print(f"  {escape(r.name)}: {escape(r.detail)}", style="dim")

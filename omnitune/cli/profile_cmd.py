"""`omnitune calibrate` and `omnitune profile`: this GPU's ceilings, and one config's hardware
counters through Nsight Compute."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import typer
from rich.markup import escape
from rich.table import Table

from omnitune.cli import preflight
from omnitune.cli._app import app
from omnitune.cli.common import (DB_DEFAULT_HELP, SHAPE_HELP, console, db_path, load_spec, parse_config_option,
                                  parse_dtype_option, parse_problems)
from omnitune.errors import ConfigError, DeviceError

if TYPE_CHECKING:
    import torch

    from omnitune.spec import Config, KernelSpec

_CALIBRATE_DB_HELP = ("Results database the ceilings are stored in (created if missing); a rerun replaces this GPU's "
                      "previous ones." + DB_DEFAULT_HELP)
_PROFILE_DB_HELP = ("Results database the profile is added to (created if missing; see omnitune report), and where "
                    "--config tuned looks when no table answers." + DB_DEFAULT_HELP)
_UNITS = {"copy_tbps": "TB/s", "matmul_bf16_tflops": "TFLOP/s", "matmul_fp16_tflops": "TFLOP/s",
          "matmul_tf32_tflops": "TFLOP/s"}


def _require_gpu(what: str) -> None:
    import torch

    if not torch.cuda.is_available():
        raise DeviceError(f"no CUDA GPU here; {what} needs one")


@app.command("calibrate")
def calibrate_cmd(db: str = typer.Option(None, "--db", help=_CALIBRATE_DB_HELP, show_default=False)) -> None:
    """Measure and store this GPU's ceilings: copy bandwidth, bf16/fp16/tf32 matmul rates.

    They are the roofs that achieved TB/s and TFLOP/s are read against in omnitune report (and the
    roofline of its --plot). Takes about 10 s, on a GPU."""
    _require_gpu("calibration")
    preflight.require_writable_file(db_path(db), "--db")  # before the measuring, not after it
    from omnitune.profile.calibrate import calibrate
    from omnitune.profile.device import current_device_facts
    from omnitune.store import open_db, record_calibration, record_device

    with console.status("measuring copy bandwidth and matmul rates…"):
        calibration = calibrate()
    database = open_db(db_path(db))
    facts = current_device_facts()
    if facts is not None:
        record_device(database, facts)
    table = Table(title=f"[bold]{escape(calibration.device_key)}[/] ceilings", title_justify="left")
    for column, justify in (("metric", "left"), ("value", "right"), ("unit", "left"),
                            ("median ms", "right"), ("p20–p80 ms", "right"), ("reps", "right")):
        table.add_column(column, justify=justify)
    for metric, value, detail in calibration.as_rows():
        record_calibration(database, calibration.device_key, metric, value, detail)
        spread = f"{detail.get('p20_ms', 0):.3f}–{detail.get('p80_ms', 0):.3f}"
        table.add_row(metric, f"{value:.2f}", _UNITS.get(metric, ""), f"{detail.get('median_ms', 0):.3f}",
                      spread, str(detail.get("repetitions", "")))
    console.print(table)
    console.print(f"stored in {db_path(db)}")


def _best_in_db(database: Any, spec: KernelSpec, problem: Any, dtype: torch.dtype, device: str) -> Config | None:
    """The best config the results database holds for this key (its `best` view: the finalists'
    latest re-timing where there is one, as in report and export), or None."""
    from omnitune.spec import dtype_name

    if "best" not in database.view_names():
        return None
    rows = list(database.query(
        "SELECT config_json FROM best WHERE kernel = ? AND problem_key = ? AND dtype = ? AND device_key = ?",
        [spec.name, spec.problem_key(problem), dtype_name(dtype), device],
    ))
    if not rows:
        return None
    try:
        values = json.loads(rows[0]["config_json"])
    except (TypeError, ValueError) as exc:  # a cell changed by hand, or corrupt: not a traceback
        raise ConfigError(
            f"the best {spec.name} config in the results database for {spec.problem_key(problem)} "
            f"{dtype_name(dtype)} is not readable JSON ({exc}); use --config default or --config JSON"
        ) from None
    return spec.coerce_config(values)


def _tuned_from_runtime(spec: KernelSpec, problem: Any, dtype: torch.dtype, device_name: str) -> Config | None:
    """What omnitune.runtime would pick in production, if a tuned table answers (exact, nearest or
    predicted: any rung but the default)."""
    try:
        from omnitune.runtime import Rung, lookup
    except ImportError:
        return None
    answer = lookup(spec.name, problem, dtype, device_name)
    return answer.config if answer.rung is not Rung.DEFAULT else None


def resolve_config(
    spec: KernelSpec, problem: Any, dtype: torch.dtype, choice: str, database: Any, device_name: str
) -> tuple[Config, str]:
    """The config to profile and which kind it is ('tuned' | 'default' | 'custom').

    tuned: what omnitune.runtime picks from the exported tables (any rung but the default), else the
    fastest config the results database holds for this exact key; default: the spec's default;
    anything else: JSON text or a JSON file, laid over the default."""
    from omnitune.profile.device import device_key
    from omnitune.spec import dtype_name

    if choice == "default":
        return spec.default_config(problem, dtype), "default"
    if choice == "tuned":
        config = _tuned_from_runtime(spec, problem, dtype, device_name)
        if config is None:
            config = _best_in_db(database, spec, problem, dtype, device_key(device_name))
        if config is None:
            raise ConfigError(
                f"no tuned {spec.name} config for {spec.problem_key(problem)} {dtype_name(dtype)} on "
                f"{device_name}; run `omnitune search` first, or use --config default or --config JSON"
            )
        return config, "tuned"
    return parse_config_option(spec, choice, problem, dtype), "custom"


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}"


@app.command("profile")
def profile_cmd(
    kernel: str = typer.Argument(..., help="Kernel name (see `omnitune kernels`) or a module/file defining SPEC."),
    shape: str = typer.Option(
        ..., "--shape", "-s",
        help="Problem to profile, as name=value pairs, e.g. b=8,h=28,hkv=4,lq=512,lk=4096,d=128; " + SHAPE_HELP,
    ),
    dtype: str = typer.Option("bf16", "--dtype", help="fp16, bf16 or fp32."),
    config: str = typer.Option("tuned", "--config", "-c",
                               help="tuned (the config omnitune.runtime would choose from the tables, see omnitune "
                               "lookup; when only the default would answer, the database's best for this exact "
                               "shape), default, or a config as JSON (or a JSON file) whose missing keys take the "
                               "default config's values."),
    db: str = typer.Option(None, "--db", help=_PROFILE_DB_HELP, show_default=False),
    launches: int = typer.Option(3, "--launches", min=1,
                                 help="Kernel calls to profile; their counters are averaged."),
) -> None:
    """Profile one config with Nsight Compute: cache hit rates, DRAM throughput, occupancy.

    Also the kernel's duration. Needs a GPU, and ncu on PATH, allowed to read the performance
    counters. The profile is stored in --db, beside those of earlier runs, for omnitune report."""
    import torch

    from omnitune.spec import dtype_name

    spec = load_spec(kernel)
    torch_dtype = parse_dtype_option(spec, dtype)
    problem = parse_problems(spec, [shape])[0]
    _require_gpu("profiling")
    preflight.require_fits_in_memory(spec, problem, torch_dtype, interpret=False)
    from omnitune.profile.device import device_key
    from omnitune.profile.ncu import NcuError, ncu_available, profile_config, profile_record
    from omnitune.store import open_db, record_profile

    if not ncu_available():
        raise NcuError("Nsight Compute (ncu) is not installed here: put ncu on PATH (it ships with the CUDA toolkit)")
    database = open_db(db_path(db))
    device_name = torch.cuda.get_device_name()
    chosen, which = resolve_config(spec, problem, torch_dtype, config, database, device_name)
    spec.require_valid(problem, chosen, torch_dtype)

    with console.status(f"profiling {spec.name} under ncu…"):
        profile = profile_config(kernel, spec, problem, torch_dtype, chosen, launches)

    key = device_key(device_name)
    record_profile(database, profile_record(profile, spec=spec, problem=problem, dtype=torch_dtype,
                                            device_key=key, config=chosen, which=which))
    table = Table(title=f"[bold]{escape(spec.name)}[/] {escape(spec.problem_key(problem))} {dtype_name(torch_dtype)} "
                  f"on {escape(device_name)}", title_justify="left")
    for column in ("config", "which", "kernel", "launches", "duration µs", "L1 hit %", "L2 hit %",
                   "DRAM % of peak", "occupancy %"):
        table.add_column(column, justify="left" if column in ("config", "which", "kernel") else "right")
    table.add_row(escape(chosen.label()), which, escape(profile.kernel_name), str(profile.launches),
                  "—" if profile.duration_us is None else f"{profile.duration_us:.1f}",
                  _pct(profile.l1_hit_pct), _pct(profile.l2_hit_pct), _pct(profile.dram_pct_of_peak),
                  _pct(profile.achieved_occupancy_pct))
    console.print(table)
    console.print(f"stored in {db_path(db)}")

"""`omnitune kernels` and `omnitune devices`: what this installation knows about."""

from __future__ import annotations

import typer
from rich.table import Table

from omnitune.cli._app import app
from omnitune.cli.common import console


@app.command()
def kernels() -> None:
    """List every built-in kernel: its tunable parameters and their choices, constraints, dtypes,
    and an example --shape."""
    from omnitune.registry import all_specs
    from omnitune.spec import dtype_name

    for spec in all_specs():
        table = Table(title=f"[bold]{spec.name}[/] — {spec.description}", title_justify="left")
        table.add_column("parameter")
        table.add_column("choices")
        table.add_column("meaning")
        for p in spec.params:
            table.add_row(p.name, ", ".join(str(int(c) if isinstance(c, bool) else c) for c in p.choices), p.help)
        console.print(table)
        console.print(
            f"  space: {spec.space_size()} configs; constraints: "
            + ", ".join(c.name for c in spec.constraints)
        )
        console.print(f"  dtypes: {', '.join(dtype_name(d) for d in spec.dtypes)}")
        # soft_wrap: a key longer than the terminal stays one line that can be copied back, not
        # moved whole onto the next one (docs/cli.md: keys are never wrapped or folded).
        console.print(f"  shape: --shape {spec.problem_key(spec.example_problem)}\n", soft_wrap=True)


@app.command()
def devices() -> None:
    """Show the CUDA GPU here: name, compute capability, SMs, memory, L2, driver, versions.

    Without a visible CUDA GPU it says so, with the library versions, and exits with code 1."""
    from omnitune.profile.device import current_device_facts, software_versions

    facts = current_device_facts()
    if facts is None:
        versions = ", ".join(f"{k} {v}" for k, v in software_versions().items())
        # One line on stderr, unwrapped: a script reading stdout gets nothing where it expects the GPU.
        typer.echo(f"No CUDA GPU is visible here ({versions}).", err=True)
        raise typer.Exit(1)
    table = Table(show_header=False, title=f"[bold]{facts.name}[/]", title_justify="left")
    for key, value in facts.as_dict().items():
        table.add_row(key, str(value))
    console.print(table)

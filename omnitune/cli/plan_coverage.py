"""`omnitune plan --coverage`: how the tables a GPU serves cover a model preset's problems, and the
searches that would close the largest gaps first (omnitune.predict.coverage ranks them)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.markup import escape

from omnitune.cli.common import console, json_number
from omnitune.errors import OmnituneError
from omnitune.presets import ModelPreset
from omnitune.runtime import Rung

if TYPE_CHECKING:
    import torch

_RUNGS = (Rung.EXACT, Rung.NEAREST, Rung.PREDICTOR, Rung.DEFAULT)


def coverage_device(device: str | None) -> str:
    """--device, else this machine's GPU; a one-line error naming the GPUs that have tables."""
    import torch

    if device is not None:
        if not device.strip():
            raise OmnituneError("--device needs a GPU's name, e.g. --device 'NVIDIA H200'")
        note_a_device_without_tables(device)
        return device
    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    found = _table_devices()
    have = (f"; the tables here are for {', '.join(found)} (--device takes these file names too)" if found
            else "; no tables were found either")
    raise OmnituneError(f"--coverage reads the tables of a GPU and there is no CUDA GPU here: pass --device NAME "
                        f"(e.g. --device 'NVIDIA H200'){have}")


def note_a_device_without_tables(device: str) -> None:
    """One note on stderr where --device names a GPU that no table here is for, its own or a
    same-chip twin's: every answer is then the default, and a misspelt name ('NVIDIA H20') read
    as "nothing is tuned" with only the runtime's per-kernel warnings to tell. The GPUs that have
    tables are named; the command goes on (what a GPU without tables should tune is a question)."""
    from omnitune.cli.common import err_console
    from omnitune.trial import device_key, same_chip_keys

    found = _table_devices()
    key = device_key(device)
    if not found or key in found or any(twin in found for twin in same_chip_keys(key)):
        return
    err_console.print(f"note: no table here is for {escape(device)!r} (its file name would be {key}.json); "
                      f"the tables here are for {', '.join(found)}", soft_wrap=True)


def print_coverage(preset: ModelPreset, kernels: tuple[str, ...], dtype: torch.dtype, device_name: str,
                   budgets: Mapping[tuple[str, str], Any], top: int | None) -> None:
    """Print the coverage; `budgets` holds, per (kernel, problem key), the plan's PlannedProblem
    (its trials and estimate_s) for the search each proposal names."""
    from omnitune.predict import coverage
    from omnitune.spec import dtype_name

    rows = coverage(preset, kernels, dtype, device_name)
    counts = Counter(r.rung for r in rows)
    console.print(f"[bold]coverage of {escape(preset.name)}[/] ({escape(preset.description)}) in {dtype_name(dtype)} "
                  f"on {escape(device_name)}: {len(rows)} problems — "
                  + ", ".join(f"{counts[r]} {r.value}" for r in _RUNGS), soft_wrap=True)
    if not rows:  # one of several presets, that sends none of the kernels asked any problem
        console.print(f"{escape(preset.name)} sends none of these kernels any problem: nothing to tune", soft_wrap=True)
        return
    lent = Counter(r.tuned_on for r in rows if r.tuned_on is not None)
    for twin, count in lent.items():
        console.print(f"{count} answered from {escape(twin)}'s tables, a GPU of the same chip: to tune them on this "
                      f"GPU, omnitune search --model {escape(preset.name)} --dtype {dtype_name(dtype)}", soft_wrap=True)
    gaps = [r for r in rows if r.rung is not Rung.EXACT]
    if not gaps:
        here = " on this GPU" if not lent else ""
        console.print(f"every problem is tuned exactly{here}: nothing to tune next", soft_wrap=True)
        return
    shown = gaps[:top] if top else gaps
    console.print(f"\ntune next, largest gap first ({len(shown)} of {len(gaps)}):", soft_wrap=True)
    for place, row in enumerate(shown, 1):
        console.print(f"{place:3}. {row.kernel} {escape(row.problem_key)}  [dim]{escape(row.role)}[/]", soft_wrap=True)
        console.print(f"     {row.rung.value} — {escape(row.why)}", soft_wrap=True)
        if row.matched_key is not None:
            what = {Rung.NEAREST: "lent by", Rung.PREDICTOR: "nearest tuned"}.get(row.rung, "closest tuned")
            distance = f" (distance {row.distance:.2f})" if row.distance is not None else ""
            console.print(f"     {what}: {escape(row.matched_key)}{distance}", soft_wrap=True)
        if row.expected_ratio is not None:
            console.print(f"     expected {row.expected_ratio:.2f}× the best, by the table's predictor", soft_wrap=True)
        budget = budgets.get((row.kernel, row.problem_key))
        cost = f"  [dim](~{_minutes(budget.estimate_s)} for {budget.trials} trials)[/]" if budget else ""
        console.print(f"     {escape(row.command)}{cost}", soft_wrap=True)
    tuned = Counter(r.kernel for r in rows if r.rung is Rung.EXACT)
    if tuned:
        console.print(f"\ntuned exactly (no gap): {sum(tuned.values())} — "
                      + ", ".join(f"{k} {n}" for k, n in tuned.items()), soft_wrap=True)


def coverage_json(presets: Sequence[ModelPreset], kernels: tuple[str, ...], dtypes: Sequence[torch.dtype],
                  device_name: str, budgets: Mapping[torch.dtype, Mapping[tuple[str, str], Any]],
                  top: int | None) -> str:
    """The coverage of each preset in each dtype as JSON: one preset in one dtype is one object
    (coverage_record), as it always was; several are a list of those objects, presets in the order
    named and each one's dtypes in turn, every object naming its own model and dtype. `budgets`
    holds, per dtype, print_coverage's budgets."""
    records = [coverage_record(preset, kernels, dtype, device_name, budgets[dtype], top)
               for preset in presets for dtype in dtypes]
    return json.dumps(records[0] if len(records) == 1 else records, allow_nan=False)


def coverage_record(preset: ModelPreset, kernels: tuple[str, ...], dtype: torch.dtype, device_name: str,
                    budgets: Mapping[tuple[str, str], Any], top: int | None) -> dict:
    """The coverage as one JSON object: the counts per rung, then every problem largest gap first
    (with --top, the N largest gaps and no exact ones), each with the search that tunes it."""
    from omnitune.predict import coverage
    from omnitune.spec import dtype_name

    rows = coverage(preset, kernels, dtype, device_name)
    counts = Counter(r.rung for r in rows)
    listed = [r for r in rows if r.rung is not Rung.EXACT][:top] if top else rows

    def problem(row) -> dict:
        budget = budgets.get((row.kernel, row.problem_key))
        return {"kernel": row.kernel, "problem_key": row.problem_key, "role": row.role, "rung": row.rung.value,
                "why": row.why, "matched_key": row.matched_key, "distance": json_number(row.distance),
                "expected_ratio": json_number(row.expected_ratio),
                "search": None if row.rung is Rung.EXACT else row.command, "tuned_on": row.tuned_on,
                "trials": budget.trials if budget else None,
                "estimate_s": json_number(budget.estimate_s) if budget else None}

    return {"model": preset.name, "dtype": dtype_name(dtype), "device": device_name,
            "problems": len(rows), "rungs": {r.value: counts[r] for r in _RUNGS},
            "listed": [problem(r) for r in listed]}


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def _table_devices() -> list[str]:
    """The GPU names of the tables in the runtime's config folders (from their files' names)."""
    from omnitune.runtime import config_dirs

    names = set()
    for folder in config_dirs():
        names.update(path.stem for path in Path(folder).glob("*/*.json"))
    return sorted(names)

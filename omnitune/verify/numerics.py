"""Part 2, numerics: each entry's config on fresh seeded inputs against the spec's reference,
within the spec's tolerance for the dtype, the relative error reported.

The check is the search's own (omnitune.measure.runner.Runner.check: a NaN-poisoned output, one
launch, the spec's compare), on inputs drawn with another seed than the search's 0, so that a
config is not judged on the very numbers it was chosen on. On a GPU the entry's own problem and
dtype run; with --interpret a small problem derived from it (omnitune.verify.shrink), fp16 for
bf16. A config that breaks one of the kernel's constraints on this GPU fails before launching.
With --interpret, a config the interpreter cannot run (the spec's interpret_refusal: attention's
Gluon kernel) is not checkable there: reported so, its constraints still checked, nothing launched.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from omnitune.errors import one_line
from omnitune.measure.runner import MeasureSettings, Runner
from omnitune.trial import classify_exception
from omnitune.trial import TrialStatus
from omnitune.spec import DeviceLimits, KernelSpec, dtype_name
from omnitune.verify.shrink import interpret_dtype, small_problem
from omnitune.verify.tables import Entry, TableFile
from omnitune.verify.verdict import Check, Status

PART = "numerics"
# Not the search's seed (0): fresh inputs.
VERIFY_SEED = 1
NOT_CHECKABLE_UNDER_INTERPRETER = "not checkable under the interpreter"


@dataclass
class NumericsOutcome:
    check: Check
    runner: Runner | None
    """Holds the inputs and reference, for the speed part; None when the check could not run."""
    context_lost: bool = False
    """The launch crashed the CUDA context: nothing else can run on this GPU in this process."""


def run_shape(spec: KernelSpec, entry: Entry, interpret: bool) -> tuple[Any, torch.dtype]:
    """The problem and dtype the entry is checked with here."""
    if not interpret:
        return entry.problem, entry.dtype
    dtype = interpret_dtype(spec, entry.dtype)
    return small_problem(spec, entry.problem, entry.config, dtype), dtype


def check_entry(table: TableFile, entry: Entry, *, interpret: bool, limits: DeviceLimits,
                seed: int = VERIFY_SEED) -> NumericsOutcome:
    spec = table.spec
    why = spec.interpret_refusal(entry.config) if interpret and spec.interpret_refusal is not None else None
    # A config the interpreter cannot run is judged on its own problem: its constraints, nothing
    # launched (a config that breaks one fails on the GPU too).
    problem, dtype = (entry.problem, entry.dtype) if why else run_shape(spec, entry, interpret)
    derived = problem != entry.problem or dtype != entry.dtype
    details: dict[str, Any] = {
        "table": str(table.path), "key": entry.key, "config": entry.config.as_dict(),
        "problem": spec.problem_key(problem), "dtype": dtype_name(dtype), "derived": derived,
        "device": "cpu (interpreter)" if interpret else "cuda", "recorded_rel_error": entry.raw.get("rel_error"),
    }
    if why:
        details["not_checkable"] = why
    else:
        details.update(seed=seed, tolerance=spec.tolerance.get(dtype))
    broken = spec.violations(problem, entry.config, dtype, limits)
    if broken:
        name, reason = broken[0]
        return NumericsOutcome(_check(table, entry, Status.FAIL, f"config breaks constraint {name} here: {reason}",
                                      details), None)
    if why:
        return NumericsOutcome(_check(table, entry, Status.NOT_CHECKABLE, f"{NOT_CHECKABLE_UNDER_INTERPRETER}: {why}",
                                      details), None)
    try:
        runner = Runner(spec, problem, dtype, interpret=interpret, settings=MeasureSettings(seed=seed),
                        limits=limits)
        status, err, detail = runner.check(entry.config)
    except Exception as exc:  # noqa: BLE001 — inputs or reference failing here is this entry's failure
        return NumericsOutcome(_check(table, entry, Status.FAIL, f"could not run: {one_line(exc)}",
                                      details), None, lost_context(exc))
    details["rel_error"] = err
    details["status"] = status.value
    if status is TrialStatus.OK:
        where = f" on {spec.problem_key(problem)} {dtype_name(dtype)}" if derived else ""
        summary = f"rel error {err:.2e} ≤ {runner.tolerance:g}{where}"
        return NumericsOutcome(_check(table, entry, Status.PASS, summary, details), runner)
    if status is TrialStatus.MISMATCH:
        summary = f"wrong result: {detail}"
    else:
        summary = f"{status.value}: {detail}"
    return NumericsOutcome(_check(table, entry, Status.FAIL, summary, details), None, runner.context_lost)


def _check(table: TableFile, entry: Entry, status: Status, summary: str, details: dict) -> Check:
    return Check(PART, entry.key, status, summary, table.kernel, details)


def lost_context(exc: BaseException) -> bool:
    """Whether an exception means the CUDA context is gone (an illegal address, a launch
    failure), as the search classifies it: every later launch in this process would fail too."""
    return classify_exception(exc)[0] is TrialStatus.CRASHED

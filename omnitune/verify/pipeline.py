"""One `omnitune verify` run: the parts in order, each check into one Report.

compat (every table) → numerics (every entry of a table for this GPU) → speed (every entry that
passed numerics; --fix rewrites the slow ones, and revalidates a table whose kernel source changed
when its entries pass: the table's compat check is then rewritten to say what was re-stamped) →
memory (the preset's largest shapes) → soak.
A part that cannot run says why in a skipped check. A launch that loses the CUDA context stops
every later GPU check (each then fails as not run), since nothing can run in this process after.
The public ops the memory and soak parts call read their configs from the tables being verified:
OMNITUNE_CONFIG_DIR points at them for the duration.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from omnitune.errors import OmnituneError, one_line
from omnitune.measure.ahead import close_shared_workers
from omnitune.measure.gpu_lock import shared_with_compile_workers
from omnitune.spec import DeviceLimits, KernelSpec
from omnitune.verify import ahead, compat, memory, numerics, revalidate, speed
from omnitune.verify.revalidate import EntryResult
from omnitune.verify.tables import TableFile, find_tables
from omnitune.verify.verdict import Check, Report, Status, skipped

# The presets describe bf16 serving: the memory and soak parts run in it.
PRESET_DTYPE = torch.bfloat16


@dataclass(frozen=True)
class VerifyOptions:
    tables: tuple[Path, ...]
    models: tuple[str, ...] = ()
    """Presets whose largest shapes (memory) and traffic (soak) the GPU parts use, each in turn."""
    kernels: tuple[str, ...] | None = None
    """Spec names to check (None: every kernel with a table, and the preset's)."""
    soak_minutes: float | None = None
    fix: bool = False
    interpret: bool = False
    seed: int = numerics.VERIFY_SEED

    def as_record(self) -> dict[str, Any]:
        # "model": the presets comma-joined (None without one), the key reports have always had
        return {"tables": [str(t) for t in self.tables], "model": ",".join(self.models) or None,
                "kernels": list(self.kernels) if self.kernels is not None else None,
                "soak_minutes": self.soak_minutes, "fix": self.fix, "interpret": self.interpret, "seed": self.seed}


@dataclass
class _State:
    report: Report
    progress: Callable[[str], None]
    lost: str | None = None
    """Why the CUDA context is gone, once it is."""
    compat_at: dict[str, int] = field(default_factory=dict)
    """Table path → where its compat check lies in the report (--fix rewrites it)."""
    twins: set[str] = field(default_factory=set)
    """Paths of the tables the runtime here serves as a same-chip GPU's (compat.served_twins)."""
    entry_compat_at: dict[str, dict[str, int]] = field(default_factory=dict)
    """Table path → entry key → where the compat check of an entry with a stale hash of its own lies."""


def current_machine(interpret: bool) -> dict[str, Any]:
    """This machine's facts, as the tables record theirs; the interpreter's pseudo-device with
    --interpret (no GPU to compare with)."""
    from omnitune.profile.device import current_device_facts

    facts = current_device_facts(interpret)
    if facts is None:
        raise OmnituneError("no CUDA GPU here; verify needs one (or --interpret for compatibility and numerics on the CPU)")
    return {**facts.as_dict(), "key": facts.key, "interpret": interpret}


def run_verify(options: VerifyOptions, specs: dict[str, KernelSpec] | None = None, *,
               machine: dict[str, Any] | None = None, timer: speed.Timer | None = None,
               progress: Callable[[str], None] | None = None, compile_ahead: bool | None = None) -> Report:
    """Run every part; `specs` are the kernels loaded by the caller (user kernel files), `machine`
    and `timer` stand in for this machine's facts and its GPU timer (tests). compile_ahead: hand
    each table's configs to compile workers first (omnitune.verify.ahead); None: on a GPU."""
    specs = specs or {}
    machine = machine or current_machine(options.interpret)
    timer = timer if timer is not None else speed.default_timer(options.interpret)
    state = _State(Report(machine, options.as_record(), _now()), progress or (lambda _message: None))
    if compile_ahead is None:
        compile_ahead = not options.interpret and torch.cuda.is_available()
    tables = find_tables(options.tables, options.kernels, specs)
    if not tables and not options.models:
        where = ", ".join(str(t) for t in options.tables) or "(no folder)"
        only = f" for {', '.join(options.kernels)}" if options.kernels else ""
        raise OmnituneError(f"no tables{only} under {where}; give --tables DIR, or --model NAME to check a preset")

    state.progress(f"compat: {len(tables)} tables")
    state.twins = compat.served_twins(tables, machine)
    for table in tables:
        start = len(state.report.checks)
        table_checks = compat.check_table(table, machine, twin=str(table.path) in state.twins)
        state.compat_at[str(table.path)] = start
        state.entry_compat_at[str(table.path)] = {c.subject: start + i for i, c in enumerate(table_checks)
                                                  if i > 0 and "revalidation" in c.details}
        state.report.add(table_checks)
    # The compile workers launch for real what they cannot capture (kv_compress) and draw inputs on
    # the GPU: under a lock shared with the checks' runners, as a search's workers do.
    with shared_with_compile_workers() if compile_ahead and not options.interpret else nullcontext():
        try:
            _entries(tables, options, timer, state, machine, compile_ahead)
        finally:
            if compile_ahead:
                close_shared_workers()  # the workers every table's EntriesAhead shared; before the lock goes
    for part in (compat.PART, numerics.PART, speed.PART):
        if not any(c.part == part for c in state.report.checks):
            state.report.add(skipped(part, "no table entries to check"))
    gpu = not options.interpret and torch.cuda.is_available()
    with _tables_for_runtime(options.tables):
        for model in options.models or (None,):
            start = len(state.report.checks)
            _memory(options, model, gpu, state)
            _soak(options, model, gpu, state)
            if len(options.models) > 1:  # two presets' checks of one kernel would otherwise read alike
                state.report.checks[start:] = [_named_by(model, c) for c in state.report.checks[start:]]
    state.report.finished_at = _now()
    return state.report


def _named_by(model: str, check: Check) -> Check:
    """A preset's memory or soak check, its subject prefixed by the preset and its details naming it."""
    return dataclasses.replace(check, subject=f"{model}: {check.subject}", details={**check.details, "model": model})


def _entries(tables: Sequence[TableFile], options: VerifyOptions, timer, state: _State, machine,
             compile_ahead: bool) -> None:
    limits = DeviceLimits() if options.interpret else DeviceLimits.of_current_device()
    if timer is None:
        state.report.add(skipped(speed.PART, "no GPU"))
    for table in tables:
        if table.problem is not None or table.spec is None:
            continue  # compat failed it as unusable
        twin = str(table.path) in state.twins
        elsewhere = compat.other_gpu(table, machine, twin=twin)
        if elsewhere is not None:
            reason = f"the table is for {elsewhere}"
            state.report.add([skipped(numerics.PART, reason, subject=table.label, kernel=table.kernel),
                              skipped(speed.PART, reason, subject=table.label, kernel=table.kernel)])
            continue
        workers = None
        if compile_ahead and state.lost is None:
            try:
                workers = ahead.EntriesAhead(table, limits, interpret=options.interpret)
            except Exception as exc:  # noqa: BLE001 — only an optimisation: the checks compile what they launch
                state.progress(f"compiling ahead: not started ({one_line(exc)}); each config compiles as it is checked")
            else:
                state.progress(f"compiling ahead: {workers.configs} configs of {table.label} in {workers.workers} "
                               "worker processes")
        state.progress(f"numerics{'' if timer is None else ' and speed'}: {table.label}, {len(table.entries)} entries")
        try:
            replacements, speed_checks, results = _table_entries(table, options, timer, state, limits, workers)
        finally:
            if workers is not None:
                state.progress(f"{table.label}: {workers.close().summary()}")
        if options.fix and twin:
            speed_checks = _fix_into_own_table(table, replacements, speed_checks, state, machine)
        elif options.fix:
            speed_checks = _apply_fixes(table, replacements, results, speed_checks, state, timed=timer is not None)
        state.report.add(speed_checks)


def _table_entries(table: TableFile, options: VerifyOptions, timer, state: _State, limits: DeviceLimits,
                   workers: ahead.EntriesAhead | None) -> tuple[list, list[Check], list[EntryResult]]:
    """Numerics, then speed, entry by entry (each entry's configs compiled by `workers` first,
    where they are given); the numerics checks go into the report. Returns the speed part's
    replacements and checks, and every entry's result."""
    replacements = []
    speed_checks: list[Check] = []
    results: list[EntryResult] = []
    quiet = False  # the compile workers are done with every entry's configs
    for entry in table.entries:
        if workers is not None and state.lost is None:
            workers.ready(entry)
        if state.lost is not None:
            lost = Check(numerics.PART, entry.key, Status.FAIL, f"not run: {state.lost}", table.kernel)
            state.report.add(lost)
            results.append(EntryResult(entry.key, entry.raw.get("config"), lost, None))
            continue
        outcome = numerics.check_entry(table, entry, interpret=options.interpret, limits=limits, seed=options.seed)
        state.report.add(outcome.check)
        if outcome.context_lost:
            state.lost = f"the CUDA context was lost checking {table.kernel} {entry.key}"
        speed_check = None
        if timer is not None and outcome.runner is not None:
            if workers is not None and not quiet:
                # Timed while the workers compile, ops that wait on the host in their call
                # (kv_compress reads lengths back) slowed by a busy CPU: on an H100 its first
                # five entries timed at a CV of 0.24–0.64, the eight after the compiles 0.02–0.09.
                state.progress(f"{table.label}: timing waits for the compile workers to finish (a quiet host)")
                workers.finish()
                quiet = True
            try:
                result = speed.check_speed(table, entry, outcome.runner, timer, baselines=not options.interpret)
            except Exception as exc:  # noqa: BLE001 — a timing failure is this entry's
                result = speed.SpeedOutcome(Check(speed.PART, entry.key, Status.FAIL,
                                                  f"could not be timed: {type(exc).__name__}: {exc}", table.kernel),
                                            context_lost=numerics.lost_context(exc))
            if result.context_lost:
                state.lost = f"the CUDA context was lost timing {table.kernel} {entry.key}"
            speed_check = result.check
            speed_checks.append(result.check)
            if result.replacement is not None:
                replacements.append(result.replacement)
        outcome.runner = None  # the inputs go before the next entry's
        results.append(EntryResult(entry.key, entry.raw.get("config"), outcome.check, speed_check))
    return replacements, speed_checks, results


def _apply_fixes(table: TableFile, replacements, results: list[EntryResult], checks: list[Check], state: _State, *,
                 timed: bool) -> list[Check]:
    """Write the table's fixes (replacements, revalidation) and say so in its checks."""
    from omnitune.verify.fix import apply_fixes

    at = state.compat_at.get(str(table.path))
    table_check = state.report.checks[at] if at is not None else None
    revalidation = table_check.details.get("revalidation") if table_check is not None else None
    # A table compat says cannot be revalidated (another chip, no GPU to compare) keeps its check as
    # is; so does such an entry with a stale hash of its own.
    revalidating = revalidation is not None and revalidation["possible"]
    entry_at = {key: i for key, i in state.entry_compat_at.get(str(table.path), {}).items()
                if state.report.checks[i].details["revalidation"]["possible"]}
    plan = None
    if (revalidating or entry_at) and timed:
        plan = revalidate.plan(table, revalidation if revalidating else None, results, {r.key for r in replacements},
                               {key: state.report.checks[i].details["revalidation"] for key, i in entry_at.items()})
    outcome = apply_fixes(table, replacements, revalidation=plan)
    fixed = set(outcome.replaced)
    if fixed:
        state.progress(f"--fix: {len(fixed)} entries of {table.label} replaced by their fallback")
    records = outcome.restamp.records if outcome.restamp is not None else {}
    why_not = revalidate.NO_SPEED if not timed else "the table file could not be read again before writing"
    if revalidating:
        state.report.checks[at] = revalidate.compat_after(table_check, outcome.restamp, sorted(fixed), why_not)
        state.progress(f"--fix: {table.label}: {state.report.checks[at].summary}")
    refused = plan.refused if plan is not None else {}
    for i in entry_at.values():
        state.report.checks[i] = revalidate.entry_compat_after(state.report.checks[i], outcome.restamp, sorted(fixed),
                                                               refused, why_not)
    # A replaced entry no longer fails: the table now holds its fallback (rewritten, to be committed).
    return [
        Check(c.part, c.subject, Status.WARN, f"replaced by {'a faster backend' if c.details.get('slower_than_backend') else 'its fallback'} in {table.path} (--fix); was {c.summary}",
              c.kernel, {**c.details, "fixed": True})
        if c.subject in fixed else revalidate.speed_after(c, records[c.subject]) if c.subject in records else c
        for c in checks
    ]


def _fix_into_own_table(table: TableFile, replacements, checks: list[Check], state: _State, machine) -> list[Check]:
    """--fix on a same-chip GPU's table served here: that table is not rewritten; its entries slower
    here go, replaced by their fallback, into this GPU's own table beside it (omnitune.verify.fix)."""
    from omnitune.verify.fix import apply_to_own_table

    kept = f"--fix: {table.label} is a same-chip GPU's table, served here: not rewritten"
    try:
        path, written = apply_to_own_table(table, replacements, machine)
    except (OmnituneError, OSError) as exc:
        why = str(exc) if isinstance(exc, OmnituneError) else one_line(exc)
        state.progress(f"{kept}; {_entries_said(len(replacements))} slower here not written into this GPU's own "
                       f"table: {why}")
        return checks
    if not written:
        state.progress(f"{kept}; nothing to write into this GPU's own table")
        return checks
    state.progress(f"{kept}; {_entries_said(len(written))} slower here written, each replaced by its fallback, into "
                   f"this GPU's own table {path}, which the runtime reads first")
    return [
        Check(c.part, c.subject, Status.WARN, f"replaced in this GPU's own table {path} (--fix; {table.path.name} "
              f"is not rewritten); was {c.summary}", c.kernel, {**c.details, "fixed": True, "fixed_in": str(path)})
        if c.subject in written else c
        for c in checks
    ]


def _entries_said(count: int) -> str:
    return f"{count} {'entry' if count == 1 else 'entries'}"


def _preset_kernels(options: VerifyOptions) -> list[str]:
    from omnitune.presets import KERNELS

    return [k for k in KERNELS if options.kernels is None or k in options.kernels]


def _memory(options: VerifyOptions, model: str | None, gpu: bool, state: _State) -> None:
    if not gpu:
        state.report.add(skipped(memory.PART, "no GPU"))
        return
    if model is None:
        state.report.add(skipped(memory.PART, "needs --model: the largest shapes come from a preset"))
        return
    from omnitune.presets import get_preset, preset_problems

    preset = get_preset(model)
    kernels = [k for k in _preset_kernels(options) if preset_problems(preset, k)]
    if not kernels:
        state.report.add(skipped(memory.PART, f"{model} has no traffic for the kernels named"))
    for kernel in kernels:
        problems = preset_problems(preset, kernel)
        if state.lost is not None:
            state.report.add(Check(memory.PART, kernel, Status.FAIL, f"not run: {state.lost}", kernel))
            continue
        state.progress(f"memory: {kernel} ({model})")
        check = memory.check_memory(memory.largest(problems), PRESET_DTYPE, seed=options.seed)
        state.report.add(check)
        if check.details.get("context_lost"):
            state.lost = f"the CUDA context was lost at {kernel}'s largest shape"


def _soak(options: VerifyOptions, model: str | None, gpu: bool, state: _State) -> None:
    if not options.soak_minutes:
        state.report.add(skipped("soak", "no --soak MINUTES given"))
        return
    if not gpu:
        state.report.add(skipped("soak", "no GPU"))
        return
    if state.lost is not None:
        state.report.add(Check("soak", "all", Status.FAIL, f"not run: {state.lost}"))
        return
    from omnitune.presets import get_preset, preset_problems
    from omnitune.verify import traffic
    from omnitune.verify.soak import run_soak

    preset = get_preset(model)
    problems = [p for kernel in _preset_kernels(options) for p in preset_problems(preset, kernel)]
    if not problems:
        state.report.add(skipped("soak", f"{model} has no traffic for the kernels named"))
        return
    calls, shares = [], []
    for p, share in zip(problems, traffic.weights(problems)):
        try:
            calls.append(traffic.build(p, PRESET_DTYPE, "cuda", options.seed))
            shares.append(share)
        except Exception as exc:  # noqa: BLE001 — its inputs could not be made: that op fails
            state.report.add(Check("soak", f"{p.role}", Status.FAIL, f"inputs failed: {type(exc).__name__}: {exc}",
                                   p.kernel))
    state.progress(f"soak: {model}'s {len(calls)} ops for {options.soak_minutes:g} min")
    state.report.add(run_soak(calls, shares, options.soak_minutes, seed=options.seed))


@contextmanager
def _tables_for_runtime(dirs: Sequence[Path]):
    """OMNITUNE_CONFIG_DIR set to the verified folders (before any others), the runtime's caches
    cleared on the way in and out."""
    from omnitune import runtime
    from omnitune.runtime import CONFIG_DIR_ENV

    old = os.environ.get(CONFIG_DIR_ENV)
    joined = os.pathsep.join([str(Path(d).resolve()) for d in dirs] + ([old] if old else []))
    os.environ[CONFIG_DIR_ENV] = joined
    runtime.clear_cache()
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(CONFIG_DIR_ENV, None)
        else:
            os.environ[CONFIG_DIR_ENV] = old
        runtime.clear_cache()


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")

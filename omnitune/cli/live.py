"""What a person sees of a search: on a terminal a live view that Rich redraws in place; elsewhere
(a log, a pipe) one line per measured trial; then a one-line summary per problem and the
re-timed finalists."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from rich.markup import escape
from rich.progress_bar import ProgressBar
from rich.table import Table

from omnitune.cli.common import console

if TYPE_CHECKING:
    import torch

    from omnitune.search.driver import SearchOutcome, SearchProgress
    from omnitune.spec import Config, KernelSpec
    from omnitune.trial import TrialResult


def search_title(spec: KernelSpec, problem, dtype: torch.dtype) -> str:
    from omnitune.spec import dtype_name

    return f"{spec.name} {spec.problem_key(problem)} {dtype_name(dtype)}"


def _ms(value: float) -> str:
    return f"{value:.4g} ms"


def _time_and_rate(result: TrialResult) -> str:
    """'0.512 ms, 312.4 TFLOP/s'; the rate is left out where there is none (the interpreter)."""
    return _ms(result.time_ms) + (f", {result.tflops:.1f} TFLOP/s" if result.tflops > 0 else "")


def _failures_text(failures) -> str:
    """'mismatch 2, compile_error 1 · 6 pruned': the failed trials, then apart from them the
    configs the constraints pruned, which were never measured (so are not trials)."""
    from omnitune.trial import TrialStatus

    pruned = failures.get(TrialStatus.PRUNED, 0) if failures else 0
    failed = {status: count for status, count in (failures or {}).items() if status is not TrialStatus.PRUNED}
    text = ", ".join(f"{status.value} {count}" for status, count in sorted(failed.items(), key=lambda kv: -kv[1]))
    return (text or "none") + (f" · {pruned} pruned" if pruned else "")


def _speedup_text(best: TrialResult | None, default: TrialResult | None) -> str:
    if best is None or default is None:
        return ""
    if not default.status.failed and best.time_ms > 0:
        return f"{default.time_ms / best.time_ms:.2f}× the default ({_ms(default.time_ms)})"
    return f"the default failed ({default.status.value})"


def summary_line(spec: KernelSpec, problem, dtype: torch.dtype, outcome: SearchOutcome, interpret: bool) -> str:
    from omnitune.search.driver import StopReason

    title = escape(search_title(spec, problem, dtype))
    if outcome.best is None:
        head = "nothing measured yet" if outcome.measured_total == 0 else "no config worked"
    else:
        best = outcome.best
        head = f"best {_time_and_rate(best)} ({escape(best.config.label())})"
        speedup = _speedup_text(best, outcome.default)
        if speedup:
            head += f", {speedup}"
    notes = {
        StopReason.EXHAUSTED: "; every valid config measured",
        StopReason.TIMEOUT: "; stopped at the timeout, rerun to continue",
        StopReason.INTERRUPTED: "; interrupted",
        StopReason.CONTEXT_LOST: "; stopped: GPU context lost",
    }
    tail = (
        f"{outcome.measured_total} measured ({outcome.measured_now} new), failures: "
        f"{_failures_text(outcome.failures)}; {outcome.wall_s:.1f} s{notes.get(outcome.stop_reason, '')}"
    )
    marker = " [yellow](interpreter: timings not representative)[/]" if interpret else ""
    return f"[bold]{title}[/]: {head}; {tail}{marker}"


def finalist_lines(outcome: SearchOutcome, default: Config) -> list[str]:
    """Below the summary: the re-timed finalists, fastest first, or why they were not re-timed."""
    from omnitune.search.driver import RetimeStatus

    if outcome.retime_status is RetimeStatus.FAILED:
        return [f"  finalists not re-timed ({escape(outcome.retime_detail)}); the search's times stand"]
    if not outcome.finalists:
        return []
    rounds = outcome.finalists[0].rounds
    how = ("as re-timed by an earlier run (the finalists are unchanged)"
           if outcome.retime_status is RetimeStatus.REUSED
           else f"re-timed against each other, interleaved, {rounds} rounds")
    lines = [f"  finalists {how}; the best median wins:"]
    for timing in outcome.finalists:
        cv = f"CV {timing.cv:.1%}" + (" noisy" if timing.noisy else "")
        cv = f"{cv:<14}"  # padded before the colour, so that the configs line up
        cv = f"[yellow]{cv}[/]" if timing.noisy else cv
        mark = " (default)" if timing.config == default else ""
        lines.append(f"    {_ms(timing.median_ms):>10}  {cv}  {escape(timing.config.label())}{mark}")
    return lines


class ProgressLines:
    """The search's progress as lines, for an output that is not a terminal: one line as the
    search starts, then one per measured trial (pruned configs cost no time and get none), each
    saying who chose its config (default, given by --try, known-good, warm-start, the sampler)."""

    def __init__(self, spec: KernelSpec, problem, dtype: torch.dtype, budget: int, sampler: str, *,
                 retiming: bool = False):
        self.title = search_title(spec, problem, dtype)
        self.budget = budget
        self.shown = -1
        self.lock = threading.Lock()  # with --gpus, every slot's thread reports
        # retiming: a search whose trials are all measured, run again for its finalists (the
        # session after its lanes, search_cmd.retime_after_lanes)
        first = (f"re-timing the finalists of {escape(self.title)}" if retiming
                 else f"searching {escape(self.title)}: up to {budget} trials, {sampler}")
        console.print(first, soft_wrap=True)

    def update(self, progress: SearchProgress) -> None:
        from omnitune.trial import TrialStatus

        with self.lock:
            if progress.result.status is TrialStatus.PRUNED or progress.measured_total == self.shown:
                return
            self.shown = progress.measured_total
            result = progress.result
            status = result.status.value + (f" {_ms(result.time_ms)}" if not result.status.failed else "")
            best = f"best {_ms(progress.best.time_ms)}" if progress.best is not None else "nothing ok yet"
            console.print(f"  trial {progress.measured_total}/{self.budget}: {escape(result.config.label())} "
                          f"({escape(progress.chosen_by)}) → {status}; {best}; {progress.elapsed_s:.1f} s",
                          soft_wrap=True)


class LiveView:
    """The live view of one search: a renderable that Rich's Live redraws a few times a second,
    fed by the driver's progress reports."""

    def __init__(self, spec: KernelSpec, problem, dtype: torch.dtype, budget: int, sampler: str, interpret: bool):
        self.title = search_title(spec, problem, dtype)
        self.budget = budget
        self.sampler = sampler
        self.interpret = interpret
        self.started = time.monotonic()
        self.last: SearchProgress | None = None

    def update(self, progress: SearchProgress) -> None:
        self.last = progress

    def __rich__(self) -> Table:
        p = self.last
        done = p.measured_total if p else 0
        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="bold")
        grid.add_column()
        grid.add_row("search", f"{escape(self.title)}  ·  {self.sampler}")
        bar = Table.grid(padding=(0, 2))
        bar.add_row(
            ProgressBar(total=self.budget, completed=min(done, self.budget), width=30),
            f"{done}/{self.budget}  ·  {time.monotonic() - self.started:.1f} s",
        )
        grid.add_row("trials", bar)
        if p is not None and p.best is not None:
            best = _time_and_rate(p.best)
            speedup = _speedup_text(p.best, p.default)
            grid.add_row("best", best + (f"  ·  {speedup}" if speedup else ""))
        else:
            grid.add_row("best", "—")
        if self.interpret:
            grid.add_row("", "[yellow]interpreter: timings not representative[/]")
        if p is not None:
            status = p.result.status.value + (f" {_ms(p.result.time_ms)}" if not p.result.status.failed else "")
            grid.add_row("last", f"{escape(p.result.config.label())} ({escape(p.chosen_by)}) → {status}")
        grid.add_row("failures", _failures_text(p.failures) if p else "none")
        grid.add_row("GPU", "n/a (interpreter)" if self.interpret else _gpu_clock_and_temperature())
        return grid


def _gpu_clock_and_temperature() -> str:
    try:
        from omnitune.profile.telemetry import read_clock_and_temperature

        clock_mhz, temperature_c = read_clock_and_temperature()
    except Exception:  # noqa: BLE001 — NVML absent or failing: the view goes on without it
        return "n/a"
    if clock_mhz is None and temperature_c is None:
        return "n/a"
    clock = f"SM {clock_mhz} MHz" if clock_mhz is not None else "SM n/a"
    temperature = f"{temperature_c} °C" if temperature_c is not None else "n/a °C"
    return f"{clock}, {temperature}"

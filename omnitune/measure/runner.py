"""Measure one candidate config of one kernel on one problem: the only place the search touches
the GPU.

Order, for every candidate: constraints (no GPU time) → launch on a fresh, NaN-poisoned output →
compare with the reference → only then time it. A config that is wrong can therefore never win.
Failures that a candidate can legitimately cause (compile errors, resources, launch errors, a
mismatch) become a TrialStatus; a user mistake (OmnituneError) or a broken reference propagates.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from omnitune.errors import OmnituneError
from omnitune.measure.capture_load import CaptureLoader
from omnitune.measure.gpu_lock import NO_GPU_LOCK, gpu_lock_from_env
from omnitune.profile.compiled import CompileWatch, compiled_facts
from omnitune.profile.timing import L2Flusher, tbps, tflops, time_cuda, time_interleaved
from omnitune.trial import OBSERVERS_KEY, TrialResult, TrialStatus, classify_exception, observer_name
from omnitune.spec import Config, DeviceLimits, KernelSpec

log = logging.getLogger(__name__)

# What the runner tells its GPU lock it held it for (GpuLock.spent): where a lane's GPU time goes.
PHASE_INPUTS = "inputs"
PHASE_REFERENCE = "reference"
PHASE_CHECK = "checking"
PHASE_WARMUP = "warm-up"
PHASE_TIMING = "timing"
PHASE_TELEMETRY = "telemetry"
PHASE_RETIMING = "re-timing"


class Observer(Protocol):
    """Something that watches the GPU while a candidate is timed (e.g. NVML telemetry). What
    stop() returns lands in the trial's extra under extra["observers"][name], so that two
    observers' keys cannot collide (omnitune.trial.observer_facts reads it back)."""

    name: str

    def start(self) -> None: ...

    def stop(self, calls: int) -> dict[str, Any]: ...


@dataclass(frozen=True)
class MeasureSettings:
    warmup: int = 3
    repetitions: int = 50
    max_seconds: float = 1.0
    seed: int = 0


class Runner:
    """Holds the inputs and reference of one problem and measures configs against them.

    `gpu_lock` (omnitune.measure.gpu_lock; default: the lane's lock when this process was started
    as a lane, else none) is held for every piece of GPU work — the reference, each config's
    check and timing, the finalists' re-timing — and for nothing else: several lanes then share one
    GPU without timing each other's kernels. The inputs are drawn under it too: on the GPU
    (omnitune.kernels._host.seeded_rand), milliseconds even for the largest decode caches."""

    def __init__(
        self,
        spec: KernelSpec,
        problem: Any,
        dtype: torch.dtype,
        *,
        interpret: bool = False,
        settings: MeasureSettings = MeasureSettings(),
        observers: Sequence[Observer] = (),
        limits: DeviceLimits | None = None,
        gpu_lock=None,
    ):
        self.spec = spec
        self.problem = problem
        self.dtype = dtype
        self.interpret = interpret
        self.settings = settings
        self.observers = list(observers)
        self.device = "cpu" if interpret else "cuda"
        if not interpret and not torch.cuda.is_available():
            raise OmnituneError("no CUDA GPU here; measuring needs one (or --interpret for correctness only)")
        if interpret and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
            # Without it every config would "fail to launch" on CPU tensors: say why once instead.
            raise OmnituneError("interpret=True runs kernels under Triton's interpreter: set TRITON_INTERPRET=1 "
                                "before any kernel module is imported (the CLI's --interpret does)")
        self.limits = limits or (DeviceLimits() if interpret else DeviceLimits.of_current_device())
        self.tolerance = spec.tolerance[dtype]
        self.gpu_lock = gpu_lock if gpu_lock is not None else gpu_lock_from_env()
        # A lane loads each config's kernels before it takes the lock (_load_without_running).
        self._loads_ahead = not interpret and self.gpu_lock is not NO_GPU_LOCK
        self._capture = CaptureLoader()
        self._loaded_facts: dict[Config, dict[str, Any]] = {}  # what loading ahead compiled, for the check
        with self.gpu_lock:
            began = time.perf_counter()
            self.inputs = spec.make_inputs(problem, dtype, self.device, settings.seed)
            if not interpret:
                torch.cuda.synchronize()
            self.gpu_lock.spent(PHASE_INPUTS, time.perf_counter() - began)
            began = time.perf_counter()
            self.reference = spec.reference(self.inputs)
            self._capture_out = spec.new_output(self.inputs) if self._loads_ahead else None
            if not interpret:
                torch.cuda.synchronize()  # the reference's kernels end before the lock goes
            self.gpu_lock.spent(PHASE_REFERENCE, time.perf_counter() - began)
        self._flusher: L2Flusher | None = None
        self.context_lost = False
        self.last_compiled: dict[str, Any] = {}
        self.flops = spec.flops(problem)
        self.bytes_moved = spec.bytes_moved(problem, dtype)

    def check(self, config: Config) -> tuple[TrialStatus, float, str]:
        """Run once on a poisoned output and compare: (status, relative error, detail).

        The kernels compiled by this first launch are kept in self.last_compiled: registers,
        spills and shared memory come from Triton's metadata at no device cost."""
        if self.spec.restore_inputs is not None:
            self.spec.restore_inputs(self.inputs)
        out = self.spec.new_output(self.inputs)
        self.last_compiled = {}
        try:
            with CompileWatch(self._kernel_module) as watch:
                try:
                    # A launcher writes into `out`, or returns the tensor that holds its result
                    # (an implementation that makes its own output, as SDPA does).
                    result = self.spec.launch(self.inputs, out, config)
                    if isinstance(result, torch.Tensor):
                        out = result
                finally:
                    # A lane compiled the kernels when it loaded them ahead: their facts are kept there.
                    self.last_compiled = self._compiled_extra(watch) or self._loaded_facts.pop(config, {})
            if not self.interpret:
                torch.cuda.synchronize()
        except OmnituneError:
            raise
        except Exception as exc:  # noqa: BLE001 — any candidate failure becomes a status
            status, detail = classify_exception(exc)
            if status is TrialStatus.CRASHED:
                self.context_lost = True
            return status, math.nan, detail
        err = self.spec.compare(out, self.reference)
        if not err <= self.tolerance:  # NaN-safe
            return TrialStatus.MISMATCH, err, f"relative error {err:.3g} > tolerance {self.tolerance:g}"
        return TrialStatus.OK, err, ""

    @property
    def _kernel_module(self):
        module = sys.modules.get(self.spec.module)
        return [module] if module is not None else []

    @staticmethod
    def _compiled_extra(watch: CompileWatch) -> dict[str, Any]:
        facts = [compiled_facts(k).as_extra() for k in watch.new_kernels()]
        if not facts:
            return {}
        # One kernel per launch for most specs; a multi-kernel launch keeps all of them.
        return facts[0] if len(facts) == 1 else {"compiled": facts}

    def measure(self, config: Config) -> TrialResult:
        violations = self.spec.violations(self.problem, config, self.dtype, self.limits)
        if violations:
            name, reason = violations[0]
            return TrialResult(config, TrialStatus.PRUNED, detail=f"{name}: {reason}",
                               representative=not self.interpret)
        self._load_without_running(config)
        with self.gpu_lock:
            return self._check_and_time(config)

    def _load_without_running(self, config: Config) -> None:
        """In a lane, compile `config`'s kernels (or load them from Triton's cache) before taking the
        GPU lock, so that the lock is held while the GPU works and not while this host loads or
        compiles (omnitune.measure.capture_load: nothing is put on the GPU). Whatever goes wrong
        (a launch that cannot be captured, a config that does not compile) is left to the check,
        which meets it again under the lock; a capture that cannot be ended turns this off."""
        if not self._loads_ahead:
            return
        try:
            with CompileWatch(self._kernel_module) as watch:
                def keep_facts() -> None:
                    # Only what this load compiled: loading a config again (compiled by then) must
                    # not wipe the facts its first load kept for the check.
                    if facts := self._compiled_extra(watch):
                        self._loaded_facts[config] = facts

                self._capture.load(lambda: self.spec.launch(self.inputs, self._capture_out, config),
                                   before_end=keep_facts)
        except Exception as exc:  # noqa: BLE001 — the check under the lock reports what a config does wrong
            log.debug("loading %s ahead: %s: %s", config, type(exc).__name__, exc)
            if not self._capture.usable:
                log.warning("configs are loaded under the GPU lock from now on: a capture did not end (%s)", exc)
                self._loads_ahead = False

    def _check_and_time(self, config: Config) -> TrialResult:
        wall_start = time.perf_counter()
        status, err, detail = self.check(config)
        self.gpu_lock.spent(PHASE_CHECK, time.perf_counter() - wall_start)
        compiled = dict(self.last_compiled)
        if status is not TrialStatus.OK:
            return TrialResult(config, status, rel_error=err, detail=detail, representative=not self.interpret,
                               extra=compiled)
        if self.interpret:
            # The interpreter's wall time says nothing about a GPU; it is kept only so that the
            # pipeline has a number to carry, and every consumer sees representative=False.
            wall_ms = (time.perf_counter() - wall_start) * 1e3
            return TrialResult(config, TrialStatus.OK, time_ms=wall_ms, p20_ms=wall_ms, p80_ms=wall_ms,
                               rel_error=err, representative=False, extra=compiled)
        out = self.spec.new_output(self.inputs)
        if self._flusher is None:
            self._flusher = L2Flusher()
        observing = time.perf_counter()
        for obs in self.observers:
            obs.start()
        timing = None
        timing_began = time.perf_counter()
        self.gpu_lock.spent(PHASE_TELEMETRY, timing_began - observing)
        try:
            timing = time_cuda(
                lambda: self.spec.launch(self.inputs, out, config),
                warmup=self.settings.warmup,
                repetitions=self.settings.repetitions,
                max_seconds=self.settings.max_seconds,
                flusher=self._flusher,
            )
        except OmnituneError:
            raise
        except Exception as exc:  # noqa: BLE001
            status, detail = classify_exception(exc)
            if status is TrialStatus.CRASHED:
                self.context_lost = True
            return TrialResult(config, status, rel_error=err, detail=detail, extra=compiled)
        finally:
            timing_ended = time.perf_counter()
            warmup_s = timing.warmup_s if timing else 0.0
            self.gpu_lock.spent(PHASE_WARMUP, warmup_s)
            self.gpu_lock.spent(PHASE_TIMING, timing_ended - timing_began - warmup_s)
            extra: dict[str, Any] = dict(compiled)
            for obs in self.observers:
                # warm-up calls run inside the observed window too
                calls = (timing.repetitions + self.settings.warmup) if timing else 0
                extra.setdefault(OBSERVERS_KEY, {})[observer_name(obs)] = obs.stop(calls)
            self.gpu_lock.spent(PHASE_TELEMETRY, time.perf_counter() - timing_ended)
        extra["repetitions"] = timing.repetitions
        return TrialResult(
            config,
            TrialStatus.OK,
            time_ms=timing.median_ms,
            p20_ms=timing.p20_ms,
            p80_ms=timing.p80_ms,
            rel_error=err,
            tflops=tflops(self.flops, timing.median_ms),
            tbps=tbps(self.bytes_moved, timing.median_ms),
            extra=extra,
        )

    def time_interleaved(self, configs: Sequence[Config], rounds: int) -> list[list[float]]:
        """Per config, one time in ms per round, the configs timed round-robin against each other
        (omnitune.profile.timing.time_interleaved). For configs already measured ok: nothing is
        checked again. Needs a GPU; under the interpreter there is nothing worth timing."""
        if self.interpret:
            raise OmnituneError("interleaved timing needs a GPU; the interpreter's times mean nothing")
        with self.gpu_lock:  # the outputs are poisoned, the flush buffer filled: GPU work too
            began = time.perf_counter()
            try:
                return self._time_interleaved(configs, rounds)
            finally:
                self.gpu_lock.spent(PHASE_RETIMING, time.perf_counter() - began)

    def _time_interleaved(self, configs: Sequence[Config], rounds: int) -> list[list[float]]:
        if self._flusher is None:
            self._flusher = L2Flusher()
        launches = []
        for config in configs:
            out = self.spec.new_output(self.inputs)
            launches.append(lambda config=config, out=out: self.spec.launch(self.inputs, out, config))
        # Each config gets the kernel-time budget it had in the search.
        return time_interleaved(launches, rounds=rounds, warmup=self.settings.warmup,
                                max_seconds=self.settings.max_seconds * len(launches), flusher=self._flusher)

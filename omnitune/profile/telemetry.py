"""GPU telemetry through NVML while a candidate is timed: clocks, power, temperature,
utilization, clock-event (throttle) reasons and energy per call.

`NvmlSampler` is an Observer for omnitune.measure.runner.Runner: start() opens a window on the
GPU's recorder thread, which samples every ~10 ms while a window is open; stop(calls) closes it
and returns one flat dict with unit-named keys,
which the runner stores in the trial's extra facts. A trial measured while the GPU was thermally
or power throttled is flagged (throttled_thermal / throttled_power), so that a report can tell a
slow config from a hot GPU.

NVML is absent on CPU machines and in some containers: every entry point here degrades to
{"telemetry": "not available"} (or None) and never raises.
"""

from __future__ import annotations

import collections
import enum
import importlib
import logging
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

log = logging.getLogger(__name__)

NOT_AVAILABLE: dict[str, Any] = {"telemetry": "not available"}

# NVML enum values (nvml.h, stable across driver versions); used directly so that this module
# reads the same whichever pynvml release is installed.
_NVML_CLOCK_SM = 1
_NVML_CLOCK_MEM = 2
_NVML_TEMPERATURE_GPU = 0

DEFAULT_INTERVAL_S = 0.010


class ClockEventReason(enum.IntFlag):
    """NVML's clocks-event reasons (formerly "throttle reasons"), bit for bit as nvml.h."""

    GPU_IDLE = 0x1
    APPLICATIONS_CLOCKS_SETTING = 0x2
    SW_POWER_CAP = 0x4
    HW_SLOWDOWN = 0x8
    SYNC_BOOST = 0x10
    SW_THERMAL_SLOWDOWN = 0x20
    HW_THERMAL_SLOWDOWN = 0x40
    HW_POWER_BRAKE_SLOWDOWN = 0x80
    DISPLAY_CLOCK_SETTING = 0x100


# An idle GPU and clocks pinned by the application are states, not slowdowns: never reported.
_BENIGN = ClockEventReason.GPU_IDLE | ClockEventReason.APPLICATIONS_CLOCKS_SETTING
THERMAL_REASONS = ClockEventReason.SW_THERMAL_SLOWDOWN | ClockEventReason.HW_THERMAL_SLOWDOWN
POWER_REASONS = ClockEventReason.SW_POWER_CAP | ClockEventReason.HW_POWER_BRAKE_SLOWDOWN


def reason_names(mask: int) -> list[str]:
    """Names of the non-benign clock-event reasons set in an NVML bit mask, lowest bit first."""
    return [r.name.lower() for r in ClockEventReason if mask & r and not r & _BENIGN]


@dataclass(frozen=True)
class Sample:
    """One NVML reading; a field NVML could not give on this GPU is None."""

    sm_clock_mhz: int | None = None
    mem_clock_mhz: int | None = None
    power_w: float | None = None
    temperature_c: int | None = None
    utilization_pct: int | None = None
    clock_event_reasons: int | None = None


class _NvmlDevice:
    """An initialised NVML and the handle of one GPU."""

    def __init__(self, nvml: Any, handle: Any):
        self.nvml = nvml
        self.handle = handle

    def _read(self, getter: Callable[[], Any]) -> Any:
        try:
            return getter()
        except Exception:  # noqa: BLE001 — NVMLError_NotSupported and friends: a field we lack
            return None

    def sample(self) -> Sample:
        n, h = self.nvml, self.handle
        power_mw = self._read(lambda: n.nvmlDeviceGetPowerUsage(h))
        utilization = self._read(lambda: n.nvmlDeviceGetUtilizationRates(h))
        return Sample(
            sm_clock_mhz=self._read(lambda: n.nvmlDeviceGetClockInfo(h, _NVML_CLOCK_SM)),
            mem_clock_mhz=self._read(lambda: n.nvmlDeviceGetClockInfo(h, _NVML_CLOCK_MEM)),
            power_w=power_mw / 1000.0 if power_mw is not None else None,
            temperature_c=self._read(lambda: n.nvmlDeviceGetTemperature(h, _NVML_TEMPERATURE_GPU)),
            utilization_pct=getattr(utilization, "gpu", None),
            clock_event_reasons=self._read(self._clock_event_reasons),
        )

    def sm_clock_and_temperature(self) -> tuple[int | None, int | None]:
        n, h = self.nvml, self.handle
        return (self._read(lambda: n.nvmlDeviceGetClockInfo(h, _NVML_CLOCK_SM)),
                self._read(lambda: n.nvmlDeviceGetTemperature(h, _NVML_TEMPERATURE_GPU)))

    def _clock_event_reasons(self) -> int:
        # Renamed from "throttle reasons" in NVML 12.2; older pynvml releases have only the old name.
        getter = getattr(self.nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            self.nvml, "nvmlDeviceGetCurrentClocksThrottleReasons"
        )
        return int(getter(self.handle))

    def energy_mj(self) -> int | None:
        """NVML's total-energy counter (mJ since the driver loaded); None where unsupported."""
        return self._read(lambda: int(self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle)))


_opened: dict[int | None, _NvmlDevice | None] = {}
_open_lock = threading.Lock()


def _current_cuda_pci_bus_id() -> str | None:
    """The PCI bus id of torch's current CUDA device, which names the same GPU to NVML even when
    CUDA_VISIBLE_DEVICES reorders the devices."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        p = torch.cuda.get_device_properties(torch.cuda.current_device())
        return f"{p.pci_domain_id:08x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0"
    except Exception:  # noqa: BLE001 — fall back to NVML index 0
        return None


def _open(device_index: int | None) -> _NvmlDevice | None:
    """NVML and a handle for the GPU (device_index as NVML numbers it; None: torch's current
    CUDA device, else GPU 0), opened once per process; None when NVML or the GPU is absent."""
    with _open_lock:
        if device_index in _opened:
            return _opened[device_index]
        device = None
        try:
            nvml = importlib.import_module("pynvml")
            nvml.nvmlInit()
            handle = None
            bus_id = _current_cuda_pci_bus_id() if device_index is None else None
            if bus_id is not None:
                try:
                    handle = nvml.nvmlDeviceGetHandleByPciBusId(bus_id)
                except Exception:  # noqa: BLE001
                    handle = None
            if handle is None:
                index = device_index or 0
                if int(nvml.nvmlDeviceGetCount()) <= index:
                    raise LookupError(f"NVML sees no GPU {index}")
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
            device = _NvmlDevice(nvml, handle)
        except Exception as exc:  # noqa: BLE001 — no library, no driver, no GPU: all "not available"
            log.debug("NVML telemetry not available: %s", exc)
        _opened[device_index] = device
        return device


def available(device_index: int | None = None) -> bool:
    """Whether NVML and a GPU are there to sample."""
    return _open(device_index) is not None


def read_clock_and_temperature(device_index: int | None = None) -> tuple[int | None, int | None]:
    """(SM clock in MHz, temperature in °C) now, for a live display; (None, None) without NVML."""
    device = _open(device_index)
    if device is None:
        return None, None
    return device.sm_clock_and_temperature()


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def summarize(samples: Sequence[Sample], energy_j: float | None, calls: int) -> dict[str, Any]:
    """The flat, unit-named dict a trial stores, from the samples of one timed window."""

    def present(name: str) -> list:
        return [getattr(s, name) for s in samples if getattr(s, name) is not None]

    if energy_j is not None and energy_j <= 0:
        # The counter refreshes every few tens of ms: a shorter window reads no change at all,
        # which is "not measured", not "free".
        energy_j = None
    seen = 0
    for mask in present("clock_event_reasons"):
        seen |= mask
    powers = present("power_w")
    temperatures = present("temperature_c")
    return {
        "sm_clock_mhz_median": _median(present("sm_clock_mhz")),
        "mem_clock_mhz_median": _median(present("mem_clock_mhz")),
        "power_w_median": _median(powers),
        "power_w_max": max(powers) if powers else None,
        "temperature_c_max": max(temperatures) if temperatures else None,
        "utilization_pct_median": _median(present("utilization_pct")),
        "energy_j": energy_j,
        "energy_per_call_j": energy_j / calls if energy_j is not None and calls > 0 else None,
        "throttle_reasons": reason_names(seen),
        "throttled_thermal": bool(seen & THERMAL_REASONS),
        "throttled_power": bool(seen & POWER_REASONS),
        "samples": len(samples),
    }


class _Recorder:
    """Reads one GPU in a background thread of its own while any window is open (NvmlSampler):
    every `interval_s`, a Sample and the total-energy counter, each kept with the time it began.
    One per GPU and process, started on first use, so that opening and closing a window calls no
    NVML at all: a thread per window, with readings at both ends and a join, cost ~11 ms per trial
    on the H200's host, and the two energy reads alone still ~10 ms, all of it while the search
    held the GPU (round 18)."""

    def __init__(self, device: _NvmlDevice, interval_s: float):
        self.device = device
        self.interval_s = interval_s
        self.readings: collections.deque[Reading] = collections.deque(maxlen=KEPT_READINGS)
        self.windows = 0
        self.changed = threading.Condition()
        threading.Thread(target=self._run, name="omnitune-nvml", daemon=True).start()

    def open(self) -> float:
        """Open a window; the time it opened (the recorder reads at once)."""
        with self.changed:
            since = time.monotonic()
            self.windows += 1
            self.changed.notify_all()
        return since

    def close(self, since: float) -> tuple[list[Reading], float]:
        """The readings that began in the window opened at `since` (one taken now if none did),
        and when it closed."""
        until = time.monotonic()
        with self.changed:
            self.windows -= 1
            found = [reading for reading in self.readings if since <= reading.at <= until]
        return found or [self._read()], until

    def _read(self) -> Reading:
        at = time.monotonic()
        try:
            return Reading(at, self.device.sample(), self.device.energy_mj())
        except Exception as exc:  # noqa: BLE001 — telemetry must never break a measurement
            log.warning("NVML sampling failed: %s", exc)
            return Reading(at, Sample(), None)

    def _run(self) -> None:
        while True:
            with self.changed:
                while not self.windows:
                    self.changed.wait()
            reading = self._read()
            with self.changed:
                self.readings.append(reading)
                self.changed.wait(self.interval_s)


@dataclass(frozen=True)
class Reading:
    """One reading of a recorder: when it began, the Sample, and the total-energy counter (mJ)."""

    at: float
    sample: Sample
    energy_mj: int | None


def window_energy_j(readings: Sequence[Reading], since: float, until: float) -> float | None:
    """The energy of the window [since, until] from its readings: the counter's rise between the
    first and the last that read it, scaled from their span to the whole window (the last reading
    comes up to one interval before the window closes). None when they span less than half the
    window, or the counter did not move (it refreshes every few tens of ms on Hopper)."""
    counted = [r for r in readings if r.energy_mj is not None]
    if len(counted) < 2:
        return None
    first, last = counted[0], counted[-1]
    span = last.at - first.at
    if span <= 0 or span < 0.5 * (until - since) or last.energy_mj <= first.energy_mj:
        return None
    return (last.energy_mj - first.energy_mj) / 1000.0 * (until - since) / span


# Readings a recorder keeps: at DEFAULT_INTERVAL_S, the last 100 s of open windows.
KEPT_READINGS = 10_000
_recorders: dict[tuple[int, float], _Recorder] = {}


def _recorder(device: _NvmlDevice, interval_s: float) -> _Recorder:
    """The recorder of `device` sampling every `interval_s`, started on first use."""
    with _open_lock:
        key = (id(device), interval_s)
        if key not in _recorders or _recorders[key].device is not device:
            _recorders[key] = _Recorder(device, interval_s)
        return _recorders[key]


@dataclass
class NvmlSampler:
    """Samples one GPU through NVML while a candidate runs (the runner's Observer protocol).

    start() and stop() open and close a window on the GPU's recorder (_Recorder), which reads
    clocks, power, temperature, utilization, clock-event reasons and the total-energy counter
    every `interval_s` while a window is open; they call no NVML themselves. Energy comes from the
    counter's readings (window_energy_j): on Hopper it ticks at ~1 mJ but refreshes only every few
    tens of ms, so energy_per_call_j is meaningful for windows of 100 ms or more (the runner's
    default timing window is ~1 s). `bracket_energy`: read the counter at start() and stop()
    instead, which counts the window exactly, at the cost of two NVML calls there (~10 ms on the
    H200's host): for a measurement of energy itself (omnitune.profile.energy), not a search's
    trials."""

    name: ClassVar[str] = "nvml"  # its facts land in a trial's extra["observers"]["nvml"]
    device_index: int | None = None
    interval_s: float = DEFAULT_INTERVAL_S
    bracket_energy: bool = False
    _recorder: _Recorder | None = field(default=None, init=False, repr=False)
    _opened_at: float = field(default=0.0, init=False, repr=False)
    _energy_start_mj: int | None = field(default=None, init=False, repr=False)

    def available(self) -> bool:
        return _open(self.device_index) is not None

    def start(self) -> None:
        """Open a window on the GPU's recorder (a no-op without NVML)."""
        device = _open(self.device_index)
        if device is None:
            self._recorder = None
            return
        self._recorder = _recorder(device, self.interval_s)
        self._energy_start_mj = device.energy_mj() if self.bracket_energy else None
        self._opened_at = self._recorder.open()

    def stop(self, calls: int) -> dict[str, Any]:
        """Close the window; the summary of its readings, energy divided over `calls` launches."""
        recorder, self._recorder = self._recorder, None
        if recorder is None:
            return dict(NOT_AVAILABLE)
        try:
            if self.bracket_energy:
                end_mj = recorder.device.energy_mj()
                readings, _ = recorder.close(self._opened_at)
                start_mj = self._energy_start_mj
                energy_j = (end_mj - start_mj) / 1000.0 if end_mj is not None and start_mj is not None else None
            else:
                readings, until = recorder.close(self._opened_at)
                energy_j = window_energy_j(readings, self._opened_at, until)
            return summarize([r.sample for r in readings], energy_j, calls)
        except Exception as exc:  # noqa: BLE001
            log.warning("NVML sampling failed: %s", exc)
            return dict(NOT_AVAILABLE)

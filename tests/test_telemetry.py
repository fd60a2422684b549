"""NVML telemetry: degrading without NVML, and the figures derived from scripted NVML readings
(a fake pynvml module injected into sys.modules)."""

from __future__ import annotations

import sys
import time
import types

import pytest

from omnitune.profile import telemetry
from omnitune.profile.telemetry import ClockEventReason, NvmlSampler

NEVER_S = 3600.0  # a sampling interval no test waits for: only start() and stop() read NVML


class NVMLError(Exception):
    pass


def _script(values):
    """A getter that returns the values in turn, then repeats the last one."""
    remaining = list(values)

    def next_value(*_args):
        value = remaining.pop(0) if len(remaining) > 1 else remaining[0]
        if isinstance(value, Exception):
            raise value
        return value

    return next_value


def fake_pynvml(*, sm_mhz=(1980,), mem_mhz=(3201,), power_mw=(650_000,), temp_c=(60,), util_pct=(99,),
                reasons=(0,), energy_mj=(1_000_000,), devices=1, init_error=None):
    nvml = types.ModuleType("pynvml")
    nvml.NVMLError = NVMLError
    clocks = {telemetry._NVML_CLOCK_SM: _script(sm_mhz), telemetry._NVML_CLOCK_MEM: _script(mem_mhz)}
    util = _script(util_pct)

    def nvmlInit():
        if init_error is not None:
            raise init_error

    nvml.nvmlInit = nvmlInit
    nvml.nvmlDeviceGetCount = lambda: devices
    nvml.nvmlDeviceGetHandleByIndex = lambda index: f"gpu{index}"
    nvml.nvmlDeviceGetClockInfo = lambda handle, kind: clocks[kind]()
    nvml.nvmlDeviceGetPowerUsage = _script(power_mw)
    nvml.nvmlDeviceGetTemperature = _script(temp_c)
    nvml.nvmlDeviceGetUtilizationRates = lambda handle: types.SimpleNamespace(gpu=util(), memory=40)
    nvml.nvmlDeviceGetCurrentClocksEventReasons = _script(reasons)
    nvml.nvmlDeviceGetTotalEnergyConsumption = _script(energy_mj)
    return nvml


@pytest.fixture(autouse=True)
def fresh_nvml():
    """Each test opens NVML anew (the module keeps one handle per process)."""
    telemetry._opened.clear()
    yield
    telemetry._opened.clear()


def _install(monkeypatch, nvml):
    monkeypatch.setitem(sys.modules, "pynvml", nvml)


def _window(sampler, calls, readings=2, timeout_s=10.0):
    """Open a window, wait until the GPU's recorder has taken `readings` readings in it, close it."""
    sampler.start()
    since = sampler._opened_at
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if sum(1 for reading in list(sampler._recorder.readings) if reading.at >= since) >= readings:
            break
        time.sleep(0.001)
    return sampler.stop(calls)


def test_without_the_library_everything_degrades(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` now raises ImportError
    assert telemetry.available() is False
    sampler = NvmlSampler()
    assert sampler.available() is False
    sampler.start()
    assert sampler.stop(10) == {"telemetry": "not available"}
    assert telemetry.read_clock_and_temperature() == (None, None)


@pytest.mark.parametrize("nvml", [
    fake_pynvml(init_error=NVMLError("Driver Not Loaded")),
    fake_pynvml(devices=0),
], ids=["init-fails", "no-device"])
def test_without_a_driver_or_gpu_everything_degrades(monkeypatch, nvml):
    _install(monkeypatch, nvml)
    assert telemetry.available() is False
    sampler = NvmlSampler(interval_s=NEVER_S)
    sampler.start()
    assert sampler.stop(5) == {"telemetry": "not available"}
    assert telemetry.read_clock_and_temperature() == (None, None)


def test_derived_figures_from_the_readings_of_a_window(monkeypatch):
    _install(monkeypatch, fake_pynvml(
        sm_mhz=(1980, 1755), mem_mhz=(3201, 3201), power_mw=(612_000, 689_500), temp_c=(61, 67),
        util_pct=(97, 100),
        reasons=(ClockEventReason.GPU_IDLE, ClockEventReason.SW_POWER_CAP | ClockEventReason.SW_THERMAL_SLOWDOWN),
        energy_mj=(1_000_000, 1_036_000),
    ))
    result = _window(NvmlSampler(interval_s=0.001, bracket_energy=True), calls=12)
    assert result["samples"] >= 2
    assert 1755 <= result["sm_clock_mhz_median"] <= 1980
    assert result["mem_clock_mhz_median"] == 3201
    assert result["power_w_max"] == pytest.approx(689.5)
    assert result["temperature_c_max"] == 67
    assert 97 <= result["utilization_pct_median"] <= 100
    assert result["energy_j"] == pytest.approx(36.0)  # 36 000 mJ between start and stop
    assert result["energy_per_call_j"] == pytest.approx(3.0)
    assert result["throttle_reasons"] == ["sw_power_cap", "sw_thermal_slowdown"]  # gpu_idle is no slowdown
    assert result["throttled_thermal"] is True
    assert result["throttled_power"] is True


def test_a_window_reads_nothing_on_the_callers_thread(monkeypatch):
    import threading

    nvml = fake_pynvml()
    readers: list[str] = []
    power, energy = nvml.nvmlDeviceGetPowerUsage, nvml.nvmlDeviceGetTotalEnergyConsumption
    nvml.nvmlDeviceGetPowerUsage = lambda handle: (readers.append(threading.current_thread().name), power(handle))[1]
    nvml.nvmlDeviceGetTotalEnergyConsumption = lambda handle: (readers.append(threading.current_thread().name),
                                                               energy(handle))[1]
    _install(monkeypatch, nvml)
    caller = threading.current_thread().name
    for _ in range(5):  # the recorder's first reading in each window comes at once
        assert _window(NvmlSampler(interval_s=NEVER_S), calls=1, readings=1)["samples"] >= 1
    assert readers and caller not in readers  # every reading taken by the recorder, none while the caller held the GPU
    # A window closed before the recorder read anything takes one reading itself: never a summary of nothing.
    sampler = NvmlSampler(interval_s=NEVER_S)
    sampler.start()
    sampler._opened_at = time.monotonic() + 60  # as if it had just opened, before any reading
    assert sampler.stop(1)["samples"] == 1


@pytest.mark.parametrize("mask, thermal, power", [
    (ClockEventReason.GPU_IDLE | ClockEventReason.APPLICATIONS_CLOCKS_SETTING, False, False),
    (ClockEventReason.HW_THERMAL_SLOWDOWN, True, False),
    (ClockEventReason.SW_THERMAL_SLOWDOWN, True, False),
    (ClockEventReason.HW_POWER_BRAKE_SLOWDOWN, False, True),
    (ClockEventReason.SW_POWER_CAP, False, True),
    (ClockEventReason.SYNC_BOOST, False, False),
])
def test_throttle_flags_follow_the_nvml_bits(monkeypatch, mask, thermal, power):
    _install(monkeypatch, fake_pynvml(reasons=(0, int(mask))))
    result = _window(NvmlSampler(interval_s=0.001), calls=1)
    assert result["throttled_thermal"] is thermal
    assert result["throttled_power"] is power
    benign = ClockEventReason.GPU_IDLE | ClockEventReason.APPLICATIONS_CLOCKS_SETTING
    assert ("gpu_idle" in result["throttle_reasons"]) is False
    assert bool(result["throttle_reasons"]) == bool(mask & ~benign)


def test_background_thread_keeps_sampling(monkeypatch):
    _install(monkeypatch, fake_pynvml(sm_mhz=(1500, 1600, 1700, 1980)))
    sampler = NvmlSampler(interval_s=0.002)
    sampler.start()
    time.sleep(0.1)
    result = sampler.stop(100)
    assert result["samples"] > 2
    assert result["sm_clock_mhz_median"] == 1980  # the scripted ramp ends at 1980 and stays there


def test_unsupported_fields_become_none(monkeypatch):
    _install(monkeypatch, fake_pynvml(power_mw=(NVMLError("Not Supported"),),
                                      energy_mj=(NVMLError("Not Supported"),)))
    sampler = NvmlSampler(interval_s=NEVER_S)
    sampler.start()
    result = sampler.stop(4)
    assert result["power_w_median"] is None and result["power_w_max"] is None
    assert result["energy_j"] is None and result["energy_per_call_j"] is None
    assert result["sm_clock_mhz_median"] == 1980


def test_zero_calls_give_no_energy_per_call(monkeypatch):
    _install(monkeypatch, fake_pynvml(energy_mj=(10, 20)))
    result = _window(NvmlSampler(interval_s=NEVER_S, bracket_energy=True), calls=0, readings=1)
    assert result["energy_j"] == pytest.approx(0.01)
    assert result["energy_per_call_j"] is None


def test_a_windows_energy_is_the_counters_rise_scaled_from_its_readings_to_the_window():
    from omnitune.profile.telemetry import Reading, Sample, window_energy_j

    def read(at, mj):
        return Reading(at, Sample(), mj)

    # Readings from 0.0 to 0.9 s of a 1 s window: 900 mJ over 0.9 s, so 1 J over the window.
    assert window_energy_j([read(0.0, 1000), read(0.5, None), read(0.9, 1900)], 0.0, 1.0) == pytest.approx(1.0)
    assert window_energy_j([read(0.0, 1000), read(0.3, 1300)], 0.0, 1.0) is None  # spans under half the window
    assert window_energy_j([read(0.0, 1000), read(0.9, 1000)], 0.0, 1.0) is None  # the counter did not refresh
    assert window_energy_j([read(0.0, 1000)], 0.0, 1.0) is None
    assert window_energy_j([read(0.0, None), read(0.9, None)], 0.0, 1.0) is None  # no counter on this GPU


def test_stop_without_start_is_harmless(monkeypatch):
    _install(monkeypatch, fake_pynvml())
    assert NvmlSampler().stop(3) == {"telemetry": "not available"}


def test_live_clock_and_temperature(monkeypatch):
    _install(monkeypatch, fake_pynvml(sm_mhz=(1830,), temp_c=(54,)))
    assert telemetry.available() is True
    assert telemetry.read_clock_and_temperature() == (1830, 54)


def test_reason_names_skip_benign_bits():
    mask = ClockEventReason.GPU_IDLE | ClockEventReason.HW_SLOWDOWN | ClockEventReason.HW_POWER_BRAKE_SLOWDOWN
    assert telemetry.reason_names(int(mask)) == ["hw_slowdown", "hw_power_brake_slowdown"]
    assert telemetry.reason_names(0) == []


@pytest.mark.gpu
def test_real_nvml_on_the_device():
    import torch

    sampler = NvmlSampler()
    if not sampler.available():
        pytest.skip("NVML not available on this GPU machine")
    a = torch.randn(4096, 4096, device="cuda")
    sampler.start()
    for _ in range(50):
        a @ a
    torch.cuda.synchronize()
    result = sampler.stop(50)
    assert result["samples"] >= 2
    assert result["sm_clock_mhz_median"] > 0
    assert result["power_w_max"] > 0


# --- energy per call (omnitune.profile.energy) ----------------------------------------------

def test_energy_per_call_divides_the_counter_over_back_to_back_calls(monkeypatch):
    from omnitune.profile.energy import energy_per_call

    _install(monkeypatch, fake_pynvml(energy_mj=(5_000, 5_000 + 2_000)))  # 2 J over the window
    calls = []
    result = energy_per_call(lambda: calls.append(1), min_window_s=0.01, synchronize=lambda: None)
    window_calls = result["calls"]
    assert window_calls >= 10 and len(calls) > window_calls  # the probe ran first
    assert result["energy_per_call_mj"] == pytest.approx(2_000 / window_calls)
    assert result["power_w_mean"] == pytest.approx(2.0 / result["window_s"])
    assert "host_paced" not in result  # no timed figure to compare with


def test_a_window_paced_by_the_host_is_marked(monkeypatch):
    from omnitune.profile.energy import energy_per_call

    def slow_launch():  # the host needs ~1 ms per call; the device time says 1 µs
        time.sleep(0.001)

    _install(monkeypatch, fake_pynvml(energy_mj=(5_000, 6_000)))
    paced = energy_per_call(slow_launch, min_window_s=0.02, synchronize=lambda: None, timed_ms=0.001)
    assert paced["host_paced"] is True
    telemetry._opened.clear()
    _install(monkeypatch, fake_pynvml(energy_mj=(5_000, 6_000)))
    kept_up = energy_per_call(slow_launch, min_window_s=0.02, synchronize=lambda: None, timed_ms=5.0)
    assert kept_up["host_paced"] is False


def test_energy_without_nvml_or_without_a_counter_change(monkeypatch):
    from omnitune.profile.energy import energy_per_call

    monkeypatch.setitem(sys.modules, "pynvml", None)
    assert energy_per_call(lambda: None, min_window_s=0.001, synchronize=lambda: None) == {"energy": "not available"}
    telemetry._opened.clear()
    _install(monkeypatch, fake_pynvml(energy_mj=(7_000, 7_000)))
    result = energy_per_call(lambda: None, min_window_s=0.001, synchronize=lambda: None)
    assert result["energy"] == "not measured" and result["calls"] >= 10

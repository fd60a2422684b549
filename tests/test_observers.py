"""Observers passed in through SearchOptions, and their facts namespaced in a trial's extra."""

from __future__ import annotations

import json
import pickle

from omnitune.profile.telemetry import NvmlSampler
from omnitune.search.options import SearchOptions
from omnitune.profile.device import current_device_facts
from omnitune.trial import observer_facts, observer_name

NVML = {"power_w_median": 412.0, "throttled_thermal": False, "sm_clock_mhz_median": 1980}


def _device():
    return current_device_facts(True)  # the interpreter's facts: no GPU needed


def test_search_options_default_to_nvml_as_picklable_factories():
    options = SearchOptions(device=_device(), trials=1)
    assert options.observers == (NvmlSampler,)
    assert pickle.loads(pickle.dumps(options.observers)) == (NvmlSampler,)  # isolated workers build their own
    made = options.make_observers()
    assert [observer_name(o) for o in made] == ["nvml"]
    assert made[0] is not options.make_observers()[0]  # fresh instances per runner
    assert SearchOptions(device=_device(), trials=1, observers=[]).observers == ()


def test_observer_facts_read_the_namespaced_shape():
    extra = json.loads(json.dumps({"num_regs": 96, "observers": {"nvml": NVML, "other": {"x": 1}}}))
    assert observer_facts(extra, "nvml") == NVML
    assert observer_facts(extra, "other") == {"x": 1}
    assert observer_facts(extra, "missing") == {}


def test_observer_facts_read_rows_stored_before_the_namespace():
    old = {"num_regs": 96, "repetitions": 50, **NVML}
    assert observer_facts(old, "nvml") == NVML  # the compiled-kernel facts are not NVML's
    assert observer_facts({"telemetry": "not available"}, "nvml") == {"telemetry": "not available"}
    assert observer_facts(None, "nvml") == {} and observer_facts({}, "nvml") == {}


def test_observer_name_falls_back_to_the_class():
    class Watcher:
        def start(self): ...

        def stop(self, calls): return {}

    assert observer_name(Watcher()) == "watcher"

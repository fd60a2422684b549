"""The leaf types every layer shares: what one measured config produced (TrialStatus,
TrialResult), how an exception raised by a candidate becomes its status (classify_exception),
and the device results are filed under (DeviceFacts, device_key).

They sit at the bottom of the package so that dependencies run one way: the measuring side
(omnitune.measure), the search, the catalogue (omnitune.store) and profiling all import them,
and this module imports only the standard library and omnitune.spec.
"""

from __future__ import annotations

import enum
import math
import re
from dataclasses import asdict, dataclass, field

from omnitune.errors import ONE_LINE_LIMIT, first_line
from omnitune.spec import Config


class TrialStatus(str, enum.Enum):
    OK = "ok"
    PRUNED = "pruned"                  # a constraint rejected it before compiling
    COMPILE_ERROR = "compile_error"
    OUT_OF_RESOURCES = "out_of_resources"
    LAUNCH_ERROR = "launch_error"
    MISMATCH = "mismatch"              # ran, but disagreed with the reference
    TIMEOUT = "timeout"
    CRASHED = "crashed"                # took its worker process down

    def __str__(self) -> str:
        return self.value

    @property
    def failed(self) -> bool:
        return self is not TrialStatus.OK


@dataclass(frozen=True)
class TrialResult:
    config: Config
    status: TrialStatus
    time_ms: float = math.inf          # median
    p20_ms: float = math.inf
    p80_ms: float = math.inf
    rel_error: float = math.nan
    tflops: float = 0.0
    tbps: float = 0.0
    detail: str = ""                   # constraint name and reason, or the error's first line
    representative: bool = True        # False under the interpreter: times mean nothing
    extra: dict = field(default_factory=dict)  # telemetry, compiled-kernel facts, ...

    def as_record(self) -> dict:
        d = asdict(self)
        d["config"] = self.config.as_dict()
        d["status"] = self.status.value
        return d


# Where a trial's extra holds what each observer saw: extra["observers"][<observer name>].
OBSERVERS_KEY = "observers"
# Rows stored before observers were namespaced hold NVML's facts at the top level of extra:
# the keys NvmlSampler wrote then, so that those rows still read back as the "nvml" observer's.
_TOP_LEVEL_BEFORE = {
    "nvml": frozenset({
        "telemetry", "samples", "sm_clock_mhz_median", "mem_clock_mhz_median", "power_w_median",
        "power_w_max", "temperature_c_max", "utilization_pct_median", "throttle_reasons",
        "throttled_thermal", "throttled_power", "energy_j", "energy_per_call_j",
    }),
}


def observer_name(observer: object) -> str:
    """The name an observer's facts are filed under: its `name`, else its class's name."""
    return str(getattr(observer, "name", None) or type(observer).__name__.lower())


def observer_facts(extra: object, name: str) -> dict:
    """What observer `name` recorded in a trial's extra (a dict read from extra_json): the
    namespaced entry, or for an older row the top-level keys that observer wrote then; {}
    when it recorded nothing."""
    if not isinstance(extra, dict):
        return {}
    spaced = extra.get(OBSERVERS_KEY)
    if isinstance(spaced, dict) and isinstance(spaced.get(name), dict):
        return dict(spaced[name])
    legacy = _TOP_LEVEL_BEFORE.get(name, frozenset())
    return {k: v for k, v in extra.items() if k in legacy}


def classify_exception(exc: BaseException) -> tuple[TrialStatus, str]:
    """Map an exception raised by compiling or launching a candidate to a trial status, and
    the one line (at most 300 characters) that a trial's detail keeps of it."""
    name = type(exc).__name__
    text = f"{name}: {first_line(exc) or name}"[:ONE_LINE_LIMIT]
    lowered = str(exc).lower()
    if name == "OutOfResources" or "out of resource" in lowered:
        return TrialStatus.OUT_OF_RESOURCES, text
    if "illegal memory access" in lowered or "unspecified launch failure" in lowered or "illegal instruction" in lowered:
        return TrialStatus.CRASHED, text
    module = type(exc).__module__ or ""
    if name in ("CompilationError", "CompileTimeAssertionFailure") or "compiler" in module or any(
        s in lowered for s in ("passmanager", "mlir", "ptxas", "compil")
    ):
        return TrialStatus.COMPILE_ERROR, text
    return TrialStatus.LAUNCH_ERROR, text


@dataclass(frozen=True)
class DeviceFacts:
    """The GPU a measurement ran on (omnitune.profile.device.current_device_facts reads them)."""

    name: str
    compute_capability: str
    multiprocessors: int
    memory_gib: float
    l2_cache_mib: float
    shared_memory_per_block_kib: float
    driver: str
    cuda: str
    torch: str
    triton: str
    omnitune: str
    python: str

    @property
    def key(self) -> str:
        return device_key(self.name)

    def as_dict(self) -> dict:
        return asdict(self)


# The device name used when measuring under Triton's interpreter: results are correctness-only
# and are filed apart from any real GPU's.
INTERPRETER_DEVICE = "triton-interpreter"


def device_key(name: str) -> str:
    """'NVIDIA H200' → 'NVIDIA_H200': the file and database key of a device."""
    return re.sub(r"[^A-Za-z0-9]+", "_", name).strip("_") or "unknown"


# GPUs made of the same chip with the same multiprocessors, shared memory and registers, so that a
# config valid on one is valid on the other and tuned on one is the best untuned guess for the
# other: the H100 SXM and the H200 are both GH100 with 132 SMs enabled (the H200 has more and
# faster memory). Keys as device_key gives them; a PCIe H100 (114 SMs) is not one of them.
_SAME_CHIP = (("NVIDIA_H200", "NVIDIA_H100_80GB_HBM3"),)


def same_chip_keys(key: str) -> tuple[str, ...]:
    """The device keys of the other GPUs made of the same chip as `key`'s (none for most)."""
    return tuple(other for group in _SAME_CHIP if key in group for other in group if other != key)

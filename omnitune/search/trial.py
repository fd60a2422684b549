"""What one measured candidate config produced."""

from __future__ import annotations

import enum
import math
from dataclasses import asdict, dataclass, field

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

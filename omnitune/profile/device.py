"""Reading the facts of the GPU a measurement runs on (the types are omnitune.trial's)."""

from __future__ import annotations

import platform

import torch

import omnitune
# The device identity is a leaf type (omnitune.trial); re-exported where it has always been read.
from omnitune.trial import INTERPRETER_DEVICE, DeviceFacts, device_key, same_chip_keys

__all__ = [
    "INTERPRETER_DEVICE", "DeviceFacts", "current_device_facts", "device_key", "same_chip_keys", "software_versions",
]


def software_versions() -> dict[str, str]:
    import triton

    return {
        "torch": torch.__version__,
        "triton": triton.__version__,
        "omnitune": omnitune.__version__,
        "python": platform.python_version(),
    }


def _driver_version() -> str:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            v = pynvml.nvmlSystemGetDriverVersion()
            return v.decode() if isinstance(v, bytes) else str(v)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # NVML missing or no driver: a fact we simply do not have
        return "not available"


def current_device_facts(interpret: bool = False) -> DeviceFacts | None:
    """Facts of the current CUDA device; the interpreter's pseudo-device when interpret=True;
    None when there is no CUDA GPU."""
    sw = software_versions()
    if interpret:
        return DeviceFacts(
            name=INTERPRETER_DEVICE, compute_capability="n/a", multiprocessors=0, memory_gib=0.0,
            l2_cache_mib=0.0, shared_memory_per_block_kib=0.0, driver="n/a", cuda="n/a", **sw,
        )
    if not torch.cuda.is_available():
        return None
    idx = torch.cuda.current_device()
    p = torch.cuda.get_device_properties(idx)
    return DeviceFacts(
        name=p.name,
        compute_capability=f"{p.major}.{p.minor}",
        multiprocessors=p.multi_processor_count,
        memory_gib=round(p.total_memory / 2**30, 1),
        l2_cache_mib=round(getattr(p, "L2_cache_size", 0) / 2**20, 1),
        shared_memory_per_block_kib=round(getattr(p, "shared_memory_per_block_optin", 0) / 1024, 1),
        driver=_driver_version(),
        cuda=str(torch.version.cuda),
        **sw,
    )

"""Which kernels exist. Adding one of ours = its module plus one line in BUILTIN_KERNELS.

A user's own kernel is named on the command line as a module path (`mypkg.mykernel`) or a file
(`./my_kernel.py`); it must define `SPEC`, a KernelSpec. Kernel modules are imported lazily so
that importing the registry costs nothing and TRITON_INTERPRET can still be set first.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

from omnitune.errors import UnknownKernelError
from omnitune.spec import KernelSpec

BUILTIN_KERNELS: dict[str, str] = {
    "attention": "omnitune.kernels.attention",
    "cross_attention_layer": "omnitune.kernels.cross_attention_layer",
    "kv_cache_write": "omnitune.kernels.kv_cache_write",
    "kv_compress": "omnitune.kernels.kv_compress",
    "paged_decode_attention": "omnitune.kernels.paged_decode_attention",
}

# Module name under which a kernel given as a .py file is imported: <prefix><file stem>.
USER_FILE_MODULE_PREFIX = "omnitune_user_kernel_"

_loaded: dict[str, KernelSpec] = {}


def kernel_names() -> list[str]:
    return sorted(BUILTIN_KERNELS)


def get_spec(name: str) -> KernelSpec:
    """The spec of a built-in kernel by name, or of a user module/file that defines SPEC."""
    if name in _loaded:
        return _loaded[name]
    if name in BUILTIN_KERNELS:
        spec = _spec_of(importlib.import_module(BUILTIN_KERNELS[name]), name)
    elif name.endswith(".py") or "/" in name:
        spec = _spec_of(_import_file(Path(name)), name)
    elif "." in name:
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            raise UnknownKernelError(f"cannot import kernel module {name!r}: {exc}") from None
        spec = _spec_of(module, name)
    else:
        raise UnknownKernelError(
            f"unknown kernel {name!r}; choose one of {', '.join(kernel_names())}, "
            "or name a module or .py file that defines SPEC"
        )
    _loaded[name] = spec
    _loaded.setdefault(spec.name, spec)
    return spec


def all_specs() -> list[KernelSpec]:
    return [get_spec(n) for n in kernel_names()]


def _import_file(path: Path):
    if not path.is_file():
        raise UnknownKernelError(f"kernel file {str(path)!r} does not exist")
    mod_name = f"{USER_FILE_MODULE_PREFIX}{path.stem}"
    spec = importlib.util.spec_from_file_location(mod_name, path)
    if spec is None or spec.loader is None:
        raise UnknownKernelError(f"cannot import kernel file {str(path)!r}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    spec.loader.exec_module(module)
    return module


def _spec_of(module, name: str) -> KernelSpec:
    spec = getattr(module, "SPEC", None)
    if not isinstance(spec, KernelSpec):
        raise UnknownKernelError(f"kernel module {name!r} defines no SPEC (a omnitune.spec.KernelSpec)")
    return spec

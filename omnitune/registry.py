"""Which kernels exist. Adding one of ours = its module plus one line in BUILTIN_KERNELS.

A user's own kernel is named on the command line as a module path (`mypkg.mykernel`) or a file
(`./my_kernel.py`); it must define `SPEC`, a KernelSpec. Once loaded it is also known by its
spec's name for the rest of the process; a user module that calls `register(SPEC)` is known by
that name as soon as it is imported (so its own public function can ask omnitune.runtime for
`SPEC.name`). A user kernel may not take a built-in's name: results, tables and lookups are
keyed by the name, so it would shadow the built-in. Kernel modules are imported lazily so that
importing the registry costs nothing and TRITON_INTERPRET can still be set first.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from omnitune.errors import KernelNameError, UnknownKernelError

if TYPE_CHECKING:  # imported where it is used: the registry's names cost no import of torch
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
    """The spec of a built-in kernel by name, of a user module/file that defines SPEC, or of a
    user kernel already loaded or registered under its spec's name."""
    if name in _loaded:
        return _loaded[name]
    if name in BUILTIN_KERNELS:
        spec = _spec_of(importlib.import_module(BUILTIN_KERNELS[name]), name)
    elif name.endswith(".py") or "/" in name:
        path = Path(name)
        resolved = str(path.resolve())
        # The same file named another way (relative, absolute) is the same kernel: one import.
        spec = _loaded.get(resolved) or register(_spec_of(_import_file(path), name), source=name)
        _loaded[resolved] = spec
    elif "." in name:
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            raise UnknownKernelError(f"cannot import kernel module {name!r}: {exc}") from None
        spec = register(_spec_of(module, name), source=name)
    else:
        raise UnknownKernelError(
            f"unknown kernel {name!r}; choose one of {', '.join(kernel_names())}, "
            "or name a module or .py file that defines SPEC"
        )
    _loaded[name] = spec
    _loaded.setdefault(spec.name, spec)
    return spec


def register(spec: KernelSpec, *, source: str | None = None) -> KernelSpec:
    """Make a user's kernel known by its name in this process: get_spec(spec.name), and so
    omnitune.runtime.get_config(spec.name, ...), find it from then on. Returns the spec, so a
    kernel module can end with `SPEC = register(KernelSpec(...))`.

    KernelNameError when the name is a built-in kernel's (a built-in's own spec, whose module is
    the built-in module, is accepted), or is already taken by a spec of another module. The same
    module registering again (imported a second time) replaces its earlier spec."""
    from omnitune.spec import KernelSpec

    if not isinstance(spec, KernelSpec):
        raise UnknownKernelError(f"register() takes a omnitune.spec.KernelSpec, got {type(spec).__name__}")
    where = source or spec.module or "a user module"
    builtin = BUILTIN_KERNELS.get(spec.name)
    if builtin is not None:
        if spec.module == builtin:
            return spec
        raise KernelNameError(
            f"kernel {where!r} names its SPEC {spec.name!r}, the name of a built-in kernel; "
            f"give it another name (KernelSpec(name=...)): built-in names are {', '.join(kernel_names())}"
        )
    taken = _loaded.get(spec.name)
    if taken is not None and taken is not spec and taken.module != spec.module:
        raise KernelNameError(
            f"kernel {where!r} names its SPEC {spec.name!r}, already the name of the kernel in "
            f"{taken.module or 'another module'!r}; give one of them another name (KernelSpec(name=...))"
        )
    _loaded[spec.name] = spec
    return spec


def all_specs() -> list[KernelSpec]:
    return [get_spec(n) for n in kernel_names()]


def _import_file(path: Path):
    if path.is_dir():  # "does not exist" would be wrong: something is there, just not a file
        raise UnknownKernelError(f"kernel file {str(path)!r} is a folder, not a kernel file")
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
    from omnitune.spec import KernelSpec

    if not isinstance(spec, KernelSpec):
        raise UnknownKernelError(f"kernel module {name!r} defines no SPEC (a omnitune.spec.KernelSpec)")
    return spec

"""Facts about a compiled Triton kernel, at no device cost: registers and spills per thread,
shared memory, warps and pipeline stages.

They explain a timing without a profiler: a config that spills registers or whose shared memory
allows one block per SM is slow for a reason a report can name (triton 3.6 compiling the attention
kernel for sm_90, BLOCK_M=128, D=128: 255 registers and no spill at 8 warps, but 1216 bytes of
spilled stack per thread at 4 warps).

Where the facts live in triton 3.6:
- `kernel[grid](...)` returns the CompiledKernel it launched. Its `metadata` (a namedtuple read
  from the <name>.json beside the binary in Triton's cache) holds `shared` (bytes), `num_warps`,
  `num_stages`, `name`; its `n_regs` and `n_spills` attributes are set only when the binary is
  loaded on the GPU (the first launch): n_regs is CU_FUNC_ATTRIBUTE_NUM_REGS, n_spills is
  CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES / 4 — local memory per thread, in 32-bit words.
- Every compiled specialization also sits in its JITFunction's cache:
  `jit_fn.device_caches[device][0]` maps a specialization key to its CompiledKernel.

How the runner can obtain them without knowing the kernel: either a kernel's `launch` returns
what `kernel[grid](...)` returned (then `compiled_facts(returned)`), or the runner wraps its first
(checking) launch of a config in `CompileWatch(spec_module)` and reads `watch.new_kernels()` —
kernels compiled during that launch. A config compiled earlier in the process (a cache hit) shows
no new kernel; the first launch of each config in a fresh worker always compiles. Under Triton's
interpreter nothing is compiled and both ways give nothing.
"""

from __future__ import annotations

import types
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class CompiledFacts:
    """What the compiler decided for one kernel specialization; None where it was not known
    (registers and spills before the binary was loaded on a GPU)."""

    kernel_name: str | None
    registers_per_thread: int | None
    spill_words_per_thread: int | None
    shared_memory_bytes: int | None
    num_warps: int | None
    num_stages: int | None

    @property
    def spills(self) -> bool | None:
        return None if self.spill_words_per_thread is None else self.spill_words_per_thread > 0

    def as_extra(self) -> dict[str, Any]:
        """Flat, unit-named keys for a trial's extra facts."""
        return {f"compiled_{k}": v for k, v in asdict(self).items()}


def _int_or_none(value: Any) -> int | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _as_mapping(obj: Any) -> Mapping[str, Any]:
    if obj is None:
        return {}
    if isinstance(obj, Mapping):
        return obj
    if hasattr(obj, "_asdict"):  # the namedtuple CompiledKernel.metadata is
        return obj._asdict()
    return vars(obj) if hasattr(obj, "__dict__") else {}


def compiled_facts(kernel: Any) -> CompiledFacts:
    """Facts of a Triton CompiledKernel (what `kernel[grid](...)` returns), or of a plain mapping
    shaped like one: its metadata keys (`shared`, `num_warps`, `num_stages`, `name`) at the top
    level or under "metadata", with `n_regs` and `n_spills` beside them. Missing fields → None."""
    if isinstance(kernel, Mapping):
        outer: Mapping[str, Any] = kernel
        metadata = _as_mapping(kernel.get("metadata", kernel))
    else:
        outer = {k: getattr(kernel, k, None) for k in ("n_regs", "n_spills", "name")}
        metadata = _as_mapping(getattr(kernel, "metadata", None))

    def field(name: str) -> Any:
        return outer.get(name) if outer.get(name) is not None else metadata.get(name)

    name = field("name")
    return CompiledFacts(
        kernel_name=str(name) if name is not None else None,
        registers_per_thread=_int_or_none(field("n_regs")),
        spill_words_per_thread=_int_or_none(field("n_spills")),
        shared_memory_bytes=_int_or_none(field("shared")),
        num_warps=_int_or_none(field("num_warps")),
        num_stages=_int_or_none(field("num_stages")),
    )


def _defined_here(value: Any, module: types.ModuleType) -> bool:
    """Whether value is a Triton function (compiled or interpreted) whose Python source is in
    module, not one it imported."""
    fn = getattr(value, "fn", None)
    return (
        callable(fn)
        and getattr(fn, "__module__", None) == module.__name__
        and (hasattr(value, "device_caches") or type(value).__name__ == "InterpretedFunction")
    )


def jit_functions(module: types.ModuleType) -> list[Any]:
    """The @triton.jit functions a kernel module defines, with their compile caches; none under
    the interpreter, which compiles nothing."""
    return [v for v in vars(module).values() if _defined_here(v, module) and hasattr(v, "device_caches")]


def kernel_names(module: types.ModuleType) -> list[str]:
    """Names the GPU knows the module's kernels by (Triton names a kernel after its function):
    what Nsight Compute's -k filter matches. A jit function another one of the module calls is a
    helper, inlined into its caller, never a kernel of its own. Read from the Python functions,
    so it works under the interpreter too."""
    functions = {v.fn.__name__: v.fn for v in vars(module).values() if _defined_here(v, module)}
    # The globals each function's body names: a helper's call is one of them.
    called = {name for fn in functions.values() for name in getattr(getattr(fn, "__code__", None), "co_names", ())}
    return sorted(name for name in functions if name not in called)


def cached_kernels(jit_fn: Any) -> list[Any]:
    """Every CompiledKernel in a JITFunction's device caches, all devices."""
    kernels = []
    for cache_entry in getattr(jit_fn, "device_caches", {}).values():
        kernel_cache = cache_entry[0]
        for kernel in kernel_cache.values():
            if hasattr(kernel, "result"):  # an async compile's future
                kernel = kernel.result()
            kernels.append(kernel)
    return kernels


class CompileWatch:
    """Finds the kernels compiled while a block ran:

        with CompileWatch(module) as watch:
            spec.launch(inputs, out, config)
        facts = [compiled_facts(k) for k in watch.new_kernels()]
    """

    def __init__(self, modules: types.ModuleType | Iterable[types.ModuleType]):
        mods = [modules] if isinstance(modules, types.ModuleType) else list(modules)
        self._jit_fns = [fn for m in mods for fn in jit_functions(m)]
        self._before: set[int] = set()

    def __enter__(self) -> CompileWatch:
        self._before = {id(k) for fn in self._jit_fns for k in cached_kernels(fn)}
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def new_kernels(self) -> list[Any]:
        return [k for fn in self._jit_fns for k in cached_kernels(fn) if id(k) not in self._before]

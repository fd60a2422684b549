"""Launch a compiled Triton kernel with less host work than the JIT's own launch path.

`kernel[grid](*args, **constexprs)` rebinds and re-specialises every argument, rebuilds the
kernel cache key (stringifying the options) and walks hooks on every call; measured on the H200
(benchmarks/launch_overhead_probe.py) that is most of a public op's host time. A serving engine
calls the same kernel with arguments of the same kinds millions of times, so a launcher here
launches once through the JIT (which compiles, or loads from the cache, and returns the compiled
kernel), remembers the compiled kernel under a key of its own, and from then on calls the
kernel's C launcher directly.

Correctness rests on the key: it must change whenever Triton's specialisation of the arguments
would. Triton 3.x specialises a tensor on its dtype and on whether its address is 16-byte
aligned, an int on whether it is 1, whether it is divisible by 16 and on its width (i32 / i64 /
u64), a tensor descriptor on its dtype and block shape; floats, None and constexprs as values.
The key holds the current device (Triton keeps a cache per device: a binary is loaded in one
device's context), each tensor's dtype and alignment, every other argument's exact value (finer
than Triton's classes, and free to compute) and the constexprs and launch options as given, so it
is at least as fine as Triton's own — two calls with one key get the same binary. A new shape is a
new key: its first call takes the JIT's path (a prefill of a new length pays that once). Anything else (an argument of
another kind, a launch hook such as a profiler's, a Triton without this launcher interface, the
interpreter) takes the JIT's path.

Two costs inside Triton's launcher are avoidable too. Its C launcher asks each tensor argument
for `data_ptr()` (a Python call from C) and then the driver whether that pointer is device memory
(`cuPointerGetAttribute`, one driver call per tensor, per launch); an int argument takes neither.
The launch key already reads each tensor's address, so the direct path passes the addresses as
ints: the ops have checked every tensor's device on the host before they launch. And its Python
wrapper (CudaLauncher.__call__) only allocates the kernel's global and profiling scratch, which
most kernels do not use: for those the direct path calls the C function itself.

`bind(constexprs, objects)` fixes the constexprs and launch options once, for a caller whose
config and shapes are fixed (a launch plan): the bound launcher's key is then only the per-call
part — each tensor's dtype and address mod 16, every plain argument's value — and it keeps the
constexpr values in the order the C launcher takes them, so a call hashes no dict of options.
"""

from __future__ import annotations

import functools
import operator
import threading
from typing import Any

import torch

# Compiled kernels kept per launcher before it starts over (each entry: one specialisation).
_ENTRIES = 1024
_reduce, _or = functools.reduce, operator.or_


_PLAIN = (int, float, bool, type(None))


def _arg_key(value: Any) -> Any:
    """One argument's part of the key. Plain values stand for themselves: an int's exact value
    is finer than Triton's int specialisation, and costs nothing to compute."""
    kind = type(value)
    if kind is torch.Tensor:
        return (value.dtype, not value.data_ptr() & 15)
    if kind in _PLAIN:
        return value
    if isinstance(value, torch.Tensor):
        return (value.dtype, not value.data_ptr() & 15)
    block_shape = getattr(value, "block_shape", None)
    base = getattr(value, "base", None)
    if block_shape is not None and isinstance(base, torch.Tensor):  # a host tensor descriptor
        return ("desc", base.dtype, not base.data_ptr() & 15, tuple(block_shape), tuple(value.shape),
                tuple(value.strides), getattr(value, "padding", None))
    raise TypeError(kind.__name__)


class DirectLauncher:
    """One @triton.jit kernel, launched through the bound launchers `bind` makes: what they share
    (the JIT function, whether the direct path applies, the order of its constexprs, a lock).
    The constexprs must follow the runtime arguments in the kernel's signature (true of every
    kernel here)."""

    def __init__(self, jit_fn):
        self.jit = jit_fn
        self._lock = threading.Lock()
        # `_direct` is decided on first use (__getattr__), not here: a launcher is made when its
        # kernel module is imported, and asking torch.cuda.is_available() then initializes the
        # CUDA driver, after which no process forked from this one can use CUDA (the compile
        # workers fork from a server that imported the kernel modules: omnitune.measure.precompile).
        names = list(getattr(jit_fn, "arg_names", ()))
        params = getattr(jit_fn, "params", ())
        self._constexpr_names = [p.name for p in params if getattr(p, "is_constexpr", False)]
        self._runtime_count = len(names) - len(self._constexpr_names)

    def __getattr__(self, name: str):
        """`_direct`, whether the direct path applies, decided on its first read and then kept as
        a plain attribute (so that reads after the first never come here)."""
        if name == "_direct":
            self._direct = _supports_direct_launch(self.jit)
            return self._direct
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def bind(self, constexprs: dict, objects: int) -> BoundLauncher:
        """This kernel with its constexprs and launch options fixed (see BoundLauncher)."""
        return BoundLauncher(self, constexprs, objects)


def _c_launch(kernel) -> tuple:
    """(callable, the arguments it takes between the stream and the kernel's own): the compiled
    kernel's C launch function where its Python wrapper would only pass None for scratch it does
    not need, else the wrapper (CudaLauncher.__call__), which allocates that scratch per call."""
    run = kernel.run
    launch = getattr(run, "launch", None)
    if (callable(launch) and getattr(run, "global_scratch_size", 1) == 0
            and getattr(run, "profile_scratch_size", 1) == 0 and getattr(run, "num_ctas", 1) == 1):
        return launch, (kernel.function, bool(run.launch_cooperative_grid), bool(run.launch_pdl), None, None,
                        kernel.packed_metadata, None, None, None)
    return run, (kernel.function, kernel.packed_metadata, None, None, None)


_Tensor = torch.Tensor
_data_ptr = torch.Tensor.data_ptr  # raises TypeError on anything but a tensor
_dtype_of = operator.attrgetter("dtype")


class BoundLauncher:
    """One kernel's launches with fixed constexprs: `bound(grid, args)`, grid three ints, args
    the runtime arguments in signature order, of which the first `objects` are tensors (or
    descriptors) and the rest plain ints and floats.

    Its compiled kernels are keyed by (each object's key, the plain arguments): a tensor's key is
    its dtype and its address mod 16 (finer than Triton's aligned-or-not), anything else's is
    _arg_key's; the constexprs and launch options are fixed, so the key is as fine as the
    module's docstring requires."""

    __slots__ = ("_launcher", "constexprs", "_objects", "_constexpr_values", "_compiled")

    def __init__(self, launcher: DirectLauncher, constexprs: dict, objects: int):
        self._launcher = launcher
        self.constexprs = dict(constexprs)
        self._objects = objects
        names = launcher._constexpr_names
        # None: the constexprs do not name every one of the kernel's, so every call takes the
        # JIT's path (which reports what is missing).
        self._constexpr_values = (tuple(self.constexprs[name] for name in names)
                                  if all(name in self.constexprs for name in names) else None)
        self._compiled: dict[tuple, tuple] = {}

    def __call__(self, grid: tuple, args: tuple, dtypes: tuple | None = None) -> None:
        """dtypes: the dtypes of the first `objects` arguments, where the caller has checked them
        already (a plan, whose tensors' dtypes are fixed): the launch then reads none of them."""
        launcher = self._launcher
        if not launcher._direct or _hooked() or self._constexpr_values is None:
            launcher.jit[grid](*args, **self.constexprs)
            return
        # The current device keys the binary too: a compiled kernel belongs to one device's
        # context, and Triton's JIT keeps one cache per device.
        device = _current_device()
        try:
            key, addresses = self._key(args, dtypes, device)
            entry = self._compiled.get(key)
        except TypeError:  # an argument kind the key does not cover: the JIT's path
            launcher.jit[grid](*args, **self.constexprs)
            return
        if entry is None:
            kernel = launcher.jit[grid](*args, **self.constexprs)
            self._remember(key, kernel, args)
            return
        launch, before_args = entry
        launch(grid[0], grid[1], grid[2], _raw_stream(device), *before_args, *addresses,
               *args[self._objects:], *self._constexpr_values)

    def _key(self, args: tuple, dtypes: tuple | None, device: int) -> tuple[tuple, list]:
        """(the compiled kernel's key on the current `device`, the objects as the C launcher takes
        them); TypeError for an argument kind the key does not cover."""
        objects = self._objects
        head, plain = args[:objects], args[objects:]
        try:
            # Every object a tensor (the common case): each address read once — its low bits
            # key the binary, and the C launcher takes it as an int (see the module's
            # docstring). One OR says whether all are 16-byte aligned; only a call with one
            # that is not keys them one by one.
            addresses = list(map(_data_ptr, head))
            misaligned = _reduce(_or, addresses, 0) & 15
            return ((device, dtypes or tuple(map(_dtype_of, head)), misaligned and tuple([p & 15 for p in addresses]),
                     plain), addresses)
        except TypeError:  # a tensor descriptor among them: it goes to the launcher as it is
            addresses = [a.data_ptr() if isinstance(a, _Tensor) else a for a in head]
            return (device, tuple([_arg_key(a) for a in head]), plain), addresses

    def c_entry(self, args: tuple, device: int) -> tuple | None:
        """(the C launch function, the arguments it takes before the kernel's own, `args`' objects
        as it takes them, the constexpr values it takes after them) for a launch of `args` on `device` that this launcher has made directly
        before; None where it has not (a first call, the interpreter, an argument the key cannot
        hold). For callers that keep a launch's C arguments themselves."""
        if not self._launcher._direct or self._constexpr_values is None:
            return None
        try:
            key, addresses = self._key(args, None, device)
        except TypeError:
            return None
        entry = self._compiled.get(key)
        return None if entry is None else (entry[0], entry[1], addresses, self._constexpr_values)

    def fixed(self, grid: tuple, args: tuple) -> FixedLaunch:
        """This launch with these very arguments, for a caller that owns every tensor among them
        (a plan's scratch and output): see FixedLaunch."""
        return FixedLaunch(self, grid, args)

    def _remember(self, key, kernel, args) -> None:
        launcher = self._launcher
        if len(args) != launcher._runtime_count or kernel is None:
            return  # arguments not as this launcher expects: keep using the JIT's path
        try:
            entry = _c_launch(kernel)
        except AttributeError:
            return
        with launcher._lock:
            bounded_put(self._compiled, key, entry, _ENTRIES)


class FixedLaunch:
    """One launch whose arguments never change — tensors the caller owns and keeps as they are,
    plain values fixed — called as `launch()`. Its first call takes the bound launcher's path
    (compiling, or finding the binary); from then on the C launcher's whole argument list is the
    one built after that first call, so a call reads nothing of its tensors (about 3 µs of host
    time a launch saved, benchmarks/host_path_cpu.py). The caller must not hand it a tensor that
    anyone else can resize or re-point: it holds them, so their memory stays allocated, but their
    addresses are read once. Where the direct path does not apply (the interpreter, a launch
    hook), every call takes the bound launcher's path."""

    __slots__ = ("_bound", "_grid", "_args", "_launch", "_tail", "_device")

    def __init__(self, bound: BoundLauncher, grid: tuple, args: tuple):
        self._bound, self._grid, self._args = bound, grid, args
        self._launch = self._tail = self._device = None

    def __call__(self) -> None:
        device = _current_device() if self._launch is not None else None
        if self._launch is None or device != self._device or _hooked():
            # (another current device than the one bound to: the bound launcher's path, as for a hook)
            self._bound(self._grid, self._args)
            if self._launch is None:
                self._bind_c_launch()
            return
        grid = self._grid
        self._launch(grid[0], grid[1], grid[2], _raw_stream(device), *self._tail)

    def _bind_c_launch(self) -> None:
        bound = self._bound
        if not bound._launcher._direct:  # the interpreter's case: no device to ask, nothing to bind
            return
        device = _current_device()
        entry = bound.c_entry(self._args, device)
        if entry is not None:
            launch, before_args, addresses, constexpr_values = entry
            self._tail = (*before_args, *addresses, *self._args[bound._objects:], *constexpr_values)
            self._launch, self._device = launch, device


_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
# torch.cuda.current_device without its lazy-init check: a direct launch has CUDA tensors, so
# CUDA is initialised by then.
_current_device = getattr(torch._C, "_cuda_getDevice", torch.cuda.current_device)


def _hooked() -> bool:
    """Whether a launch hook (a profiler's, say) is installed: then every launch takes the JIT's
    path, which calls it. Triton 3.6 keeps the hooks as HookChains, never None: empty means
    none installed. Read afresh on every call (a profiler installs its hooks at any time), but
    from the knobs object itself, not through the module."""
    runtime_knobs = _runtime_knobs or _knobs().runtime
    enter, exit_ = runtime_knobs.launch_enter_hook, runtime_knobs.launch_exit_hook
    return bool((enter is not None and getattr(enter, "calls", True))
                or (exit_ is not None and getattr(exit_, "calls", True)))


def _knobs():
    global _triton_knobs, _runtime_knobs
    if _triton_knobs is None:
        from triton import knobs

        _triton_knobs = knobs
        _runtime_knobs = knobs.runtime
    return _triton_knobs


_triton_knobs = None
_runtime_knobs = None


def _supports_direct_launch(jit_fn) -> bool:
    """A compiled (not interpreted) kernel, on CUDA, with the launcher interface this module
    calls (Triton 3.x: CompiledKernel.run / function / packed_metadata)."""
    try:
        from triton.runtime.interpreter import InterpretedFunction
    except ImportError:  # pragma: no cover
        return False
    if isinstance(jit_fn, InterpretedFunction) or not torch.cuda.is_available() or _raw_stream is None:
        return False
    return hasattr(jit_fn, "device_caches") and hasattr(jit_fn, "params")


class PlanCache:
    """Launch plans per (config, shape key), bounded: `plans.get(config, key)`, made by
    `make(config, *key)` on a miss.

    Looked up by the config's identity first, so that a call hashes no Config (the ops' config
    memo hands back the same object call after call); an identity entry holds its config, so the
    id stays that config's while the entry lives, and a hit is confirmed with `is`. A config
    equal to a known one but another object (a caller building its Config per call) finds the
    plan by value, with the kernels it has already bound."""

    def __init__(self, make, entries: int = 4096):
        self._make = make
        self._entries = entries
        self._by_id: dict[tuple, tuple] = {}
        self._by_value: dict[tuple, Any] = {}

    def get(self, config, key: tuple):
        hit = self._by_id.get((id(config), key))
        if hit is not None and hit[0] is config:
            return hit[1]
        return self._by_value_or_new(config, key)

    def _by_value_or_new(self, config, key: tuple):
        plan = self._by_value.get((config, key))
        if plan is None:
            plan = self._make(config, *key)
            bounded_put(self._by_value, (config, key), plan, self._entries)
        bounded_put(self._by_id, (id(config), key), (config, plan), self._entries)
        return plan


def bounded_put(table: dict, key, value, entries: int):
    """table[key] = value, the table emptied first when it holds `entries` already: the host
    path's caches stay bounded whatever callers pass, at the cost of rebuilding what was dropped.
    Returns value."""
    if len(table) >= entries:
        table.clear()
    table[key] = value
    return value

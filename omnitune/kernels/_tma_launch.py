"""Launch a compiled kernel that takes host TMA descriptors, keeping each descriptor's encoded
tensor map instead of building and encoding it again on every call.

For a kernel that takes host tensor descriptors, a call through the library's direct path
(omnitune/kernels/_launch.py) still does three things per launch that depend only on the views
the descriptors describe: the caller builds a TensorDescriptor object per view, the bound
launcher keys each one field by field (the slow branch of its key), and Triton's launch wrapper
(`wrap_handle_tensordesc` in its CUDA driver) walks every argument in Python and encodes each
descriptor into a CUtensorMap (`make_tensordesc_arg`: a cuTensorMapEncodeTiled call and a new
object) before it calls the C launch function. On attention's Gluon kernel, with four
descriptors, that came to 24–56 µs of host time a call on an H100, its op's 67–122 µs against
37–73 with the maps kept (benchmarks/results/prefill_gluon_h100_round46.json).

A tensor map is a function of its view alone: base address, shape, strides, block, dtype and
the compiled kernel's shared-memory layout for it (Triton's per-descriptor metadata). So
`TmaLaunch` keeps each view's expanded arguments (the map and the shape and strides that travel
beside it) per compiled kernel, under the view's position, address, shape, strides and block —
everything the map encodes — and calls the C function that Triton's wrapper wraps, with the
kept maps, directly. A map kept for an address whose tensor has since been freed is still
exactly the map a new tensor of the same view there needs: it names memory by address only, and
the launch copies it into the kernel's parameters. It holds no reference to any tensor.

The caller checks what a descriptor needs (contiguity, alignment) first, as it did before. The
first call for each compiled kernel takes the bound launcher's path (it compiles or loads the
kernel and launches), then this launcher takes Triton's wrapper apart: where it is not what this
module expects (another Triton, a kernel needing scratch memory, a descriptor without metadata,
the interpreter), every call keeps taking the bound path, as before. A launch hook (a
profiler's) also sends a call down the bound path, which calls it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch

from omnitune.kernels import _launch
from omnitune.kernels._launch import BoundLauncher, bounded_put

_MAPS = 1024  # views kept per compiled kernel before the cache starts over
_KERNELS = 256  # compiled kernels (argument kinds and plain values) kept per launcher


class _Unwrapped:
    """What a call on the direct path needs of one compiled kernel: Triton's C launch function
    itself, the arguments it takes before the kernel's own, each descriptor's metadata, the
    constexpr values it takes last, and the views' expanded arguments kept so far."""

    __slots__ = ("launch", "before_args", "metas", "constexpr_values", "maps")

    def __init__(self, launch, before_args: tuple, metas: list, constexpr_values: tuple):
        self.launch, self.before_args, self.metas, self.constexpr_values = launch, before_args, metas, constexpr_values
        self.maps: dict[tuple, tuple] = {}


def unwrap_descriptor_launch(launch, positions: tuple[int, ...]) -> tuple[Callable, list] | None:
    """(the C launch function, each descriptor's metadata) inside Triton's wrapper `launch` for a
    kernel whose tensor descriptors are its arguments at `positions` and no others; None where
    the wrapper is not the one this module knows (Triton 3.6's wrap_handle_tensordesc closure
    over `launcher`, `tensordesc_indices` and `tensordesc_meta`) or a descriptor has no metadata
    (the wrapper would then pass the base tensor on, which a kept entry must not hold)."""
    try:
        names = inspect.getclosurevars(launch).nonlocals
    except TypeError:  # a builtin: no wrapper around it
        return None
    raw, indices, metas = names.get("launcher"), names.get("tensordesc_indices"), names.get("tensordesc_meta")
    if not callable(raw) or indices != set(positions) or not isinstance(metas, list | tuple):
        return None
    if len(metas) != len(positions) or any(not isinstance(meta, dict) for meta in metas):
        return None
    return raw, list(metas)


def _expand_descriptor(descriptor, meta: dict) -> tuple:
    """The arguments Triton's wrapper passes for one descriptor: its CUtensorMap, shape, strides."""
    from triton.backends.nvidia.driver import make_tensordesc_arg

    expanded = tuple(make_tensordesc_arg(descriptor, meta))
    if any(isinstance(part, torch.Tensor) for part in expanded):
        raise TypeError("a descriptor expanded to a tensor")  # never kept: it would hold the memory
    return expanded


class TmaLaunch:
    """`launch(grid, args)`: one launch of `bound`'s kernel, whose arguments at `positions` (among
    its leading `bound` objects) are tensor descriptors, given here as views: (tensor, block), the
    block a tuple or an int as `make_descriptor(tensor, block)` takes it to build the descriptor on
    the bound path. The other objects are tensors (passed as addresses), then plain values, as the
    bound launcher takes them. A view is keyed by its tensor's address, shape and strides and its
    block: `make_descriptor` must build its descriptor from those alone."""

    def __init__(self, bound: BoundLauncher, make_descriptor: Callable, positions: tuple[int, ...]):
        # ascending, as Triton's wrapper numbers the descriptors' metadata
        self._bound, self._make, self._positions = bound, make_descriptor, tuple(sorted(positions))
        self._objects = bound._objects
        self._views = {position: index for index, position in enumerate(self._positions)}  # → its metadata's index
        # key → _Unwrapped, or None where the kernel's launch could not be taken apart
        self._kernels: dict[tuple, _Unwrapped | None] = {}

    def __call__(self, grid: tuple, args: tuple) -> None:
        if not self._bound._launcher._direct:  # the interpreter, no CUDA: the JIT's path, as the bound launcher's
            self._bound(grid, self._bound_args(args))
            return
        objects = self._objects
        device = _launch._current_device()
        # One pass over the objects in signature order. Each one's part of the compiled kernel's
        # key, as fine as the bound launcher's (omnitune/kernels/_launch.py): a view's dtype,
        # shape, strides and block (its descriptor's), another tensor's dtype and address mod 16;
        # and what the launch passes for it: a view's map key, a tensor's address.
        kinds, passed = [], []
        for i in range(objects):
            obj = args[i]
            if i in self._views:
                tensor, block = obj
                shape, strides = tensor.shape, tensor.stride()
                kinds.append((tensor.dtype, shape, strides, block))
                passed.append((i, tensor.data_ptr(), shape, strides, block))
            else:
                address = obj.data_ptr()
                kinds.append((obj.dtype, address & 15))
                passed.append(address)
        key = (device, tuple(kinds), args[objects:])
        kernel = self._kernels.get(key, False)
        if kernel is False or kernel is None or _launch._hooked():
            self._bound_path(grid, args, key, device, record=kernel is False)
            return
        maps, launch_args = kernel.maps, []
        for i in range(objects):
            view = self._views.get(i)
            if view is None:
                launch_args.append(passed[i])
                continue
            kept = maps.get(passed[i])
            if kept is None:
                kept = bounded_put(maps, passed[i], _expand_descriptor(self._make(*args[i]), kernel.metas[view]),
                                   _MAPS)
            launch_args.extend(kept)
        kernel.launch(grid[0], grid[1], grid[2], _launch._raw_stream(device), *kernel.before_args, *launch_args,
                      *args[objects:], *kernel.constexpr_values)

    def _bound_args(self, args: tuple) -> tuple:
        made = list(args)
        for i in self._positions:
            made[i] = self._make(*args[i])
        return tuple(made)

    def _bound_path(self, grid: tuple, args: tuple, key: tuple, device: int, record: bool) -> None:
        bound_args = self._bound_args(args)
        self._bound(grid, bound_args)
        if record:
            bounded_put(self._kernels, key, self._unwrap(bound_args, device), _KERNELS)

    def _unwrap(self, bound_args: tuple, device: int) -> _Unwrapped | None:
        entry = self._bound.c_entry(bound_args, device)
        if entry is None:
            return None
        launch, before_args, _, constexpr_values = entry
        found = unwrap_descriptor_launch(launch, self._positions)
        if found is None:
            return None
        raw, metas = found
        return _Unwrapped(raw, before_args, metas, constexpr_values)

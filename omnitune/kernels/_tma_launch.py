"""Launch a compiled kernel whose leading arguments are host TMA descriptors, keeping each
descriptor's encoded tensor map instead of building and encoding it again on every call.

For a kernel that takes host tensor descriptors, a call through the library's direct path
(omnitune/kernels/_launch.py) still does three things per launch that depend only on the views
the descriptors describe: the caller builds a TensorDescriptor object per view, the bound
launcher keys each one field by field (the slow branch of its key), and Triton's launch wrapper
(`wrap_handle_tensordesc` in its CUDA driver) walks every argument in Python and encodes each
descriptor into a CUtensorMap (`make_tensordesc_arg`: a cuTensorMapEncodeTiled call and a new
object) before it calls the C launch function. On attention's Gluon kernel, with four
descriptors, that made its op's host time 65–90 µs a call where the op's Triton and SDPA paths
take 27–52 (benchmarks/results/prefill_gluon_h100_round42.json, an H100).

A tensor map is a function of its view alone: base address, shape, strides, box, dtype and the
compiled kernel's shared-memory layout for it (Triton's per-descriptor metadata). So
`TmaLaunch` keeps each view's expanded arguments (the map and the shape and strides that travel
beside it) under its position, address, element count, row width and box — everything the map
encodes, given the compiled kernel — and calls the C function that Triton's wrapper wraps, with
the kept maps, directly. A map kept for an address whose tensor has since been freed is still
exactly the map a new tensor of the same view there needs: it names memory by address only, and
the launch copies it into the kernel's parameters. It holds no reference to any tensor.

The views must be contiguous tensors read as 2-D [numel / d, d] (d their last dimension), the
form attention_gluon.descriptor builds; the caller checks contiguity and alignment first (the
Gluon kernel's `refusal`). The first call for each compiled kernel takes the bound launcher's
path (it compiles or loads the kernel and launches), then this launcher takes Triton's wrapper
apart: where it is not what this module expects (another Triton, a kernel needing scratch
memory, a descriptor without metadata), every call keeps taking the bound path, as before. A
launch hook (a profiler's) also sends a call down the bound path, which calls it.
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


def unwrap_descriptor_launch(launch, descriptors: int) -> tuple[Callable, list] | None:
    """(the C launch function, each descriptor's metadata) inside Triton's wrapper `launch` for a
    kernel whose first `descriptors` arguments are its only tensor descriptors; None where the
    wrapper is not the one this module knows (Triton 3.6's wrap_handle_tensordesc closure over
    `launcher`, `tensordesc_indices` and `tensordesc_meta`) or a descriptor has no metadata (the
    wrapper would then pass the base tensor on, which a kept entry must not hold)."""
    try:
        names = inspect.getclosurevars(launch).nonlocals
    except TypeError:  # a builtin: no wrapper around it
        return None
    raw, indices, metas = names.get("launcher"), names.get("tensordesc_indices"), names.get("tensordesc_meta")
    if not callable(raw) or indices != set(range(descriptors)) or not isinstance(metas, list | tuple):
        return None
    if len(metas) != descriptors or any(not isinstance(meta, dict) for meta in metas):
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
    """`launch(grid, views, args)`: one launch of `bound`'s kernel, whose first arguments are one
    descriptor per view — `views` a tuple of (tensor, box rows), each tensor contiguous, read as
    [numel / d, d] in boxes of [box rows, d] — followed by `args`, the rest of the kernel's
    runtime arguments as the bound launcher takes them (tensors first, then plain values).
    `make_descriptor(tensor, box_rows)` builds a view's TensorDescriptor on the bound path."""

    def __init__(self, bound: BoundLauncher, make_descriptor: Callable, descriptors: int):
        self._bound, self._make, self._descriptors = bound, make_descriptor, descriptors
        self._tensors = bound._objects - descriptors  # tensors after the descriptors (passed as addresses)
        # key → _Unwrapped, or None where the kernel's launch could not be taken apart
        self._kernels: dict[tuple, _Unwrapped | None] = {}

    def __call__(self, grid: tuple, views: tuple, args: tuple) -> None:
        tensors = args[:self._tensors]
        addresses = [t.data_ptr() for t in tensors]
        device = _launch._current_device()
        # The compiled kernel's key, as fine as the bound launcher's (omnitune/kernels/_launch.py):
        # each view's dtype, box and 2-D shape (its descriptor's), every tensor's dtype and
        # address mod 16, the plain values.
        key = (device, tuple([(t.dtype, t.numel(), t.shape[-1], box) for t, box in views]),
               tuple([t.dtype for t in tensors]), tuple([a & 15 for a in addresses]), args[self._tensors:])
        kernel = self._kernels.get(key, False)
        if kernel is False or kernel is None or _launch._hooked():
            self._bound_path(grid, views, args, key, device, record=kernel is False)
            return
        launch_args = []
        maps = kernel.maps
        for position, (tensor, box) in enumerate(views):
            width = tensor.shape[-1]
            view_key = (position, tensor.data_ptr(), tensor.numel(), width, box)
            expanded = maps.get(view_key)
            if expanded is None:
                expanded = bounded_put(maps, view_key, _expand_descriptor(self._make(tensor, box),
                                                                         kernel.metas[position]), _MAPS)
            launch_args.extend(expanded)
        kernel.launch(grid[0], grid[1], grid[2], _launch._raw_stream(device), *kernel.before_args, *launch_args,
                      *addresses, *args[self._tensors:], *kernel.constexpr_values)

    def _bound_path(self, grid: tuple, views: tuple, args: tuple, key: tuple, device: int, record: bool) -> None:
        bound_args = (*(self._make(tensor, box) for tensor, box in views), *args)
        self._bound(grid, bound_args)
        if record:
            bounded_put(self._kernels, key, self._unwrap(bound_args, device), _KERNELS)

    def _unwrap(self, bound_args: tuple, device: int) -> _Unwrapped | None:
        entry = self._bound.c_entry(bound_args, device)
        if entry is None:
            return None
        launch, before_args, _, constexpr_values = entry
        found = unwrap_descriptor_launch(launch, self._descriptors)
        if found is None:
            return None
        raw, metas = found
        return _Unwrapped(raw, before_args, metas, constexpr_values)

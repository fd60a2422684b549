"""The descriptor launcher (omnitune/kernels/_tma_launch.py) on the CPU: Triton's own launch
wrapper for descriptor kernels (wrap_handle_tensordesc) around a recording C function, with the
tensor-map encoding stubbed (it needs the CUDA driver). A direct call must hand the C function
exactly what Triton's wrapper would, encode each view once, and leave every call it cannot
serve to the bound launcher."""

from __future__ import annotations

import pytest
import torch
from triton.backends.nvidia import driver
from triton.tools.tensor_descriptor import TensorDescriptor

from omnitune.kernels import _launch, _tma_launch
from omnitune.kernels import kv_cache_write as kvw

D = 16
SIGNATURE = {**{i: f"tensordesc<fp32[{8 if i in (0, 3) else 4}, {D}]>" for i in range(4)},
             4: "*fp32", 5: "i32", 6: "fp32", 7: "constexpr"}
METAS = [{"swizzle": position} for position in range(4)]
BASE_ARGS = driver._BASE_ARGS_FORMAT_LEN


def _descriptor(t: torch.Tensor, rows: int) -> TensorDescriptor:
    return TensorDescriptor(t, [t.numel() // D, D], [D, 1], [rows, D])


class _Kernel:
    """A compiled kernel as the direct path sees it: its run.launch is Triton's wrapper."""

    launch_cooperative_grid = launch_pdl = False
    num_ctas, global_scratch_size, profile_scratch_size = 1, 0, 0

    def __init__(self, launch):
        self.function = self.packed_metadata = None
        self.run = self
        self.launch = launch


class _Jit:
    def __init__(self, kernel, log):
        self._kernel, self.log = kernel, log

    def __getitem__(self, grid):
        def launch(*args, **constexprs):
            self.log.append(("jit", args))
            return self._kernel
        return launch


def _recorded_launch(monkeypatch, signature, metas, runtime_count, objects, make, positions):
    """(a TmaLaunch of a kernel whose launch wrapper is Triton's own around a recording C function,
    the log of every launch, the log of every map encoded, that wrapper)."""
    log, encoded = [], []

    def encode(desc, meta):  # what fill_tma_descriptor's result stands for: the view it encodes
        encoded.append((desc.base.data_ptr(), tuple(desc.shape)))
        return [("map", desc.base.data_ptr(), tuple(desc.block_shape), meta["swizzle"]), *desc.shape, *desc.strides]

    monkeypatch.setattr(driver, "make_tensordesc_arg", encode)
    c_function = lambda *args: log.append(("c", args[BASE_ARGS:]))  # noqa: E731
    wrapper = driver.wrap_handle_tensordesc(c_function, signature, metas)
    launcher = _launch.DirectLauncher(kvw._kv_cache_write)
    launcher.jit, launcher._direct = _Jit(_Kernel(wrapper), log), True
    launcher._runtime_count, launcher._constexpr_names = runtime_count, ["BLOCK"]
    monkeypatch.setattr(_launch, "_raw_stream", lambda device: 0)
    monkeypatch.setattr(_launch, "_current_device", lambda: 0)
    return _tma_launch.TmaLaunch(launcher.bind({"BLOCK": 3}, objects), make, positions), log, encoded, wrapper


@pytest.fixture
def rig(monkeypatch):
    """The Gluon kernel's layout: four descriptors, a tensor, then plain values."""
    return _recorded_launch(monkeypatch, SIGNATURE, METAS, 7, 5, _descriptor, (0, 1, 2, 3))


def _views(q, k, v, o):
    return ((q, 8), (k, 4), (v, 4), (o, 8))


def _args(q, k, v, o, n=7):
    return (*_views(q, k, v, o), o, n, 0.5)


def _tensors():
    return torch.randn(2, 8, D), torch.randn(32, D), torch.randn(32, D), torch.empty(2, 8, D)


def test_a_repeated_call_passes_the_c_function_what_tritons_wrapper_would(rig):
    launch, log, encoded, wrapper = rig
    q, k, v, o = _tensors()
    for _ in range(3):
        launch((1, 1, 1), _args(q, k, v, o, 7))
    assert [kind for kind, _ in log] == ["jit", "c", "c"]
    # Triton's wrapper, called with the descriptors themselves, hands its C function the same
    descriptors = [_descriptor(t, rows) for t, rows in _views(q, k, v, o)]
    wrapper(1, 1, 1, 0, *[None] * (BASE_ARGS - 4), *descriptors, o.data_ptr(), 7, 0.5, 3)
    assert log[-1][1] == log[-2][1]
    assert log[-2][1][0] == ("map", q.data_ptr(), (8, D), 0)


def test_each_view_is_encoded_once_and_again_only_where_it_changes(rig):
    launch, log, encoded, _ = rig
    q, k, v, o = _tensors()
    launch((1, 1, 1), _args(q, k, v, o, 7))  # the bound launcher's path
    launch((1, 1, 1), _args(q, k, v, o, 7))
    assert len(encoded) == 4
    launch((1, 1, 1), _args(q, k, v, o, 7))
    assert len(encoded) == 4
    o2 = torch.empty_like(o)  # a new output: only its map is new
    launch((1, 1, 1), _args(q, k, v, o2, 7))
    assert encoded[4:] == [(o2.data_ptr(), (16, D))]
    assert log[-1][1][-4] == o2.data_ptr() and log[-1][1][15] == ("map", o2.data_ptr(), (8, D), 3)


def test_a_new_shape_or_plain_value_takes_the_bound_path_first(rig):
    launch, log, _, _ = rig
    q, k, v, o = _tensors()
    launch((1, 1, 1), _args(q, k, v, o, 7))
    launch((1, 1, 1), _args(q, k, v, o, 8))  # another int
    q3, o3 = torch.randn(3, 8, D), torch.empty(3, 8, D)
    launch((1, 1, 1), _args(q3, k, v, o3, 7))  # another view shape
    launch((1, 1, 1), _args(q, k, v, o, 7))
    assert [kind for kind, _ in log] == ["jit", "jit", "jit", "c"]


def test_a_launch_hook_sends_the_call_down_the_bound_path(rig):
    from triton import knobs

    launch, log, encoded, _ = rig
    q, k, v, o = _tensors()
    launch((1, 1, 1), _args(q, k, v, o, 7))
    hook = lambda *args, **kwargs: None  # noqa: E731
    knobs.runtime.launch_enter_hook.add(hook)
    try:
        launch((1, 1, 1), _args(q, k, v, o, 7))
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    assert [kind for kind, _ in log] == ["jit", "jit"]  # the bound path under a hook: the JIT's


@pytest.mark.parametrize("wrapper", ["builtin", "other names", "no metadata", "other positions"])
def test_a_wrapper_it_does_not_know_is_never_taken_apart(wrapper):
    raw = print
    launch = {"builtin": raw,
              "other names": (lambda *args: raw(*args)),
              "no metadata": driver.wrap_handle_tensordesc(raw, SIGNATURE, None),
              "other positions": driver.wrap_handle_tensordesc(raw, {0: "i32", **{i + 1: s for i, s in
                                                                                  SIGNATURE.items()}}, METAS)}[wrapper]
    assert _tma_launch.unwrap_descriptor_launch(launch, (0, 1, 2, 3)) is None


def test_a_kernel_it_cannot_take_apart_keeps_every_call_on_the_bound_path(rig, monkeypatch):
    launch, log, encoded, _ = rig
    monkeypatch.setattr(_tma_launch, "unwrap_descriptor_launch", lambda launch, positions: None)
    q, k, v, o = _tensors()
    for _ in range(3):
        launch((1, 1, 1), _args(q, k, v, o, 7))
    # the bound launcher's own direct path, through Triton's wrapper, which encodes every call
    assert [kind for kind, _ in log] == ["jit", "c", "c"]
    assert len(encoded) == 8


def test_descriptors_among_other_tensors_keep_their_places(monkeypatch):
    # attention's Triton kernel: tensors, then K's and V's descriptors, then plain values
    signature = {0: "*fp32", 1: "tensordesc<fp32[4, 16]>", 2: "*fp32", 3: "tensordesc<fp32[4, 16]>", 4: "i32",
                 5: "constexpr"}
    make = lambda t, block: TensorDescriptor(t, list(t.shape), list(t.stride()), list(block))  # noqa: E731
    launch, log, encoded, wrapper = _recorded_launch(monkeypatch, signature, [{"swizzle": 0}, {"swizzle": 1}], 5, 4,
                                                     make, (1, 3))
    a, k, b, v = torch.randn(8), torch.randn(32, D), torch.randn(8), torch.randn(32, D)
    for _ in range(3):
        launch((1, 1, 1), (a, (k, (4, D)), b, (v, (4, D)), 5))
    assert [kind for kind, _ in log] == ["jit", "c", "c"]
    assert [address for address, _ in encoded] == [k.data_ptr(), v.data_ptr()]
    descriptors = [make(t, (4, D)) for t in (k, v)]
    wrapper(1, 1, 1, 0, *[None] * (BASE_ARGS - 4), a.data_ptr(), descriptors[0], b.data_ptr(), descriptors[1], 5, 3)
    assert log[-1][1] == log[-2][1]
    assert log[-1][1][:2] == (a.data_ptr(), ("map", k.data_ptr(), (4, D), 0))


def test_a_view_of_another_shape_at_the_same_address_gets_its_own_map(rig):
    # q[:1] starts where q does: a map kept for q must not serve it (its shape is another)
    launch, log, encoded, _ = rig
    q, k, v, o = _tensors()
    launch((1, 1, 1), _args(q, k, v, o))
    launch((1, 1, 1), _args(q, k, v, o))
    launch((1, 1, 1), _args(q[:1], k, v, o))  # a new view shape: the bound path first
    launch((1, 1, 1), _args(q[:1], k, v, o))
    assert q[:1].data_ptr() == q.data_ptr()
    # its own compiled kernel's maps, its own map among them: q[:1] as [8, D] rows, q as [16, D]
    assert encoded[:4].count((q.data_ptr(), (16, D))) == 1 and encoded[4:].count((q.data_ptr(), (8, D))) == 1
    assert log[-1][1][:3] == (("map", q.data_ptr(), (8, D), 0), 8, D)

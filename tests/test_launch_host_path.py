"""The host path's launch caches, on the CPU with the launch stubbed: which calls a bound launcher
sends to a compiled entry it already holds, which ones to the JIT, and that launch plans are
found by a config's identity and by its value."""

from __future__ import annotations

import pytest
import torch

from omnitune.errors import InputError
from omnitune.kernels import _launch
from omnitune.kernels import kv_cache_write as kvw
from omnitune.spec import Config


class _RecordingKernel:
    def __init__(self, log):
        self._log = log
        self.function = self.packed_metadata = None

    def run(self, *args):
        self._log.append(("direct", args[9:]))


class _RecordingJit:
    """Stands in for a @triton.jit function: records JIT launches, hands back a kernel whose C
    launcher records direct ones."""

    def __init__(self):
        self.log = []

    def __getitem__(self, grid):
        def launch(*args, **constexprs):
            self.log.append(("jit", args))
            return _RecordingKernel(self.log)
        return launch


def _bound(monkeypatch, objects=2):
    launcher = _launch.DirectLauncher(kvw._kv_cache_write)
    jit = _RecordingJit()
    launcher.jit, launcher._direct = jit, True
    monkeypatch.setattr(_launch, "_raw_stream", lambda device: 0)
    monkeypatch.setattr(_launch, "_current_device", lambda: 0)
    # A kernel of `objects` tensors and two ints, then two constexprs (set here: under the
    # interpreter the jit function does not list its parameters).
    launcher._runtime_count, launcher._constexpr_names = objects + 2, ["BLOCK", "num_warps"]
    constexprs = {name: 1 for name in launcher._constexpr_names}
    return launcher.bind(constexprs, objects), jit


def _kinds(jit):
    return [kind for kind, _ in jit.log]


def test_a_repeated_call_launches_directly(monkeypatch):
    bound, jit = _bound(monkeypatch)
    a, b = torch.zeros(64), torch.zeros(64)
    for _ in range(3):
        bound((1, 1, 1), (a, b, 7, 8))
    assert _kinds(jit) == ["jit", "direct", "direct"]


def test_a_new_dtype_alignment_or_int_takes_a_new_compiled_entry(monkeypatch):
    bound, jit = _bound(monkeypatch)
    a, b = torch.zeros(64), torch.zeros(64)
    bound((1, 1, 1), (a, b, 7, 8))
    bound((1, 1, 1), (a.half(), b, 7, 8))           # another dtype
    bound((1, 1, 1), (a[1:], b, 7, 8))              # 4 bytes off a 16-byte boundary
    bound((1, 1, 1), (a, b, 7, 9))                  # another int value
    bound((1, 1, 1), (a, b, 7, 8))                  # the first call's kinds again
    assert _kinds(jit) == ["jit", "jit", "jit", "jit", "direct"]


def test_an_installed_launch_hook_sends_every_call_to_the_jit(monkeypatch):
    from triton import knobs

    bound, jit = _bound(monkeypatch)
    a, b = torch.zeros(64), torch.zeros(64)
    bound((1, 1, 1), (a, b, 7, 8))
    hook = lambda *args, **kwargs: None  # noqa: E731
    knobs.runtime.launch_enter_hook.add(hook)
    try:
        bound((1, 1, 1), (a, b, 7, 8))
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    bound((1, 1, 1), (a, b, 7, 8))
    assert _kinds(jit) == ["jit", "jit", "direct"]


def test_a_hook_assigned_in_place_of_the_chain_counts_too(monkeypatch):
    from triton import knobs

    monkeypatch.setattr(knobs.runtime, "launch_exit_hook", lambda *args, **kwargs: None)
    assert _launch._hooked()


def test_an_argument_the_key_cannot_hold_takes_the_jit(monkeypatch):
    bound, jit = _bound(monkeypatch)
    a, b = torch.zeros(64), torch.zeros(64)
    for _ in range(2):
        bound((1, 1, 1), (a, object(), 7, 8))
    assert _kinds(jit) == ["jit", "jit"]


def test_missing_constexprs_keep_every_call_on_the_jit(monkeypatch):
    bound, jit = _bound(monkeypatch)
    partial = bound._launcher.bind({}, 2)
    a, b = torch.zeros(64), torch.zeros(64)
    for _ in range(2):
        partial((1, 1, 1), (a, b, 7, 8))
    assert _kinds(jit) == ["jit", "jit"]


class _CudaLauncherLike:
    """Triton's CudaLauncher as the direct path sees it: a Python wrapper (__call__) around a C
    function (launch), with the scratch sizes that decide whether the wrapper is needed."""

    launch_cooperative_grid = launch_pdl = False
    num_ctas = 1

    def __init__(self, log, global_scratch_size):
        self._log = log
        self.global_scratch_size, self.profile_scratch_size = global_scratch_size, 0

    def __call__(self, *args):
        self._log.append(("wrapper", args[9:]))

    def launch(self, *args):
        self._log.append(("c", args[13:]))


@pytest.mark.parametrize("scratch", [0, 256])
def test_the_direct_path_passes_addresses_and_skips_a_wrapper_with_nothing_to_allocate(monkeypatch, scratch):
    bound, jit = _bound(monkeypatch)
    kernel = _RecordingKernel(jit.log)
    kernel.run = _CudaLauncherLike(jit.log, scratch)
    jit.__class__ = type("_Jit", (_RecordingJit,), {"__getitem__": lambda self, grid: lambda *a, **k: kernel})
    a, b = torch.randn(64), torch.randn(64)
    bound((1, 1, 1), (a, b, 7, 8))  # the JIT's path: remembers the kernel
    bound((1, 1, 1), (a, b, 7, 8))
    kind, args = jit.log[-1]
    assert kind == ("c" if scratch == 0 else "wrapper")
    # The tensors as their addresses, the ints as they are, then the bound constexprs.
    assert args == (a.data_ptr(), b.data_ptr(), 7, 8, 1, 1)


def test_a_misaligned_tensor_is_keyed_apart_from_an_aligned_one(monkeypatch):
    bound, jit = _bound(monkeypatch)
    a, b = torch.zeros(64), torch.zeros(64)
    bound((1, 1, 1), (a, b, 7, 8))
    bound((1, 1, 1), (a, b[2:], 7, 8))   # 8 bytes off
    bound((1, 1, 1), (a, b[1:], 7, 8))   # 4 bytes off: another residue, another entry
    bound((1, 1, 1), (a, b[2:], 7, 8))
    assert _kinds(jit) == ["jit", "jit", "jit", "direct"]


def test_launch_plans_are_found_by_identity_and_by_value():
    made = []
    plans = _launch.PlanCache(lambda config, *key: made.append(key) or object())
    config = Config(BLOCK_T=1, num_warps=1)
    first = plans.get(config, (256, 4))
    assert plans.get(config, (256, 4)) is first
    assert plans.get(Config(BLOCK_T=1, num_warps=1), (256, 4)) is first  # equal, another object
    assert plans.get(config, (128, 4)) is not first
    assert plans.get(Config(BLOCK_T=2, num_warps=1), (256, 4)) is not first
    assert made == [(256, 4), (128, 4), (256, 4)]


def _stub_decode_launchers(monkeypatch):
    from omnitune.kernels import paged_decode_attention as pda

    jit = _RecordingJit()
    for launcher in (pda._SPLIT, pda._COMBINE):
        monkeypatch.setattr(launcher, "jit", jit)
        monkeypatch.setattr(launcher, "_direct", True)
        monkeypatch.setattr(launcher, "_runtime_count", None)  # no entry kept: every call logged as "jit"
    monkeypatch.setattr(_launch, "_current_device", lambda: 0)
    return jit


def test_a_decode_plan_checks_each_call_and_follows_a_changed_page_guard(monkeypatch):
    from omnitune.kernels import paged_decode_attention as pda

    jit = _stub_decode_launchers(monkeypatch)
    b, h, hkv, d, block, pages = 2, 4, 2, 32, 8, 4
    plan = pda.PagedDecodePlan(batch=b, num_heads=h, num_kv_heads=hkv, head_dim=d, block_size=block,
                               max_blocks=pages, max_context_len=block * pages, dtype=torch.float32, device="cpu")
    q = torch.zeros(b, h, 1, d)
    cache = torch.zeros(b * pages, block, hkv, d)
    tables = torch.zeros(b, pages, dtype=torch.int32)
    lens = torch.full((b,), block * pages, dtype=torch.int32)
    assert plan.run(q, cache, cache, tables, lens, check=False) is plan.out
    assert jit.log, "run launched nothing"
    with pytest.raises(InputError, match="out must be"):
        plan.run(q, cache, cache, tables, lens, out=torch.zeros(b, h, 1, d + 1), check=False)
    with pytest.raises(InputError, match="context_lens must be int32"):
        plan.run(q, cache, cache, tables, lens.long(), check=False)
    with pytest.raises(InputError, match="as planned"):
        plan.run(q[:1], cache, cache, tables, lens, check=False)
    monkeypatch.setattr(pda, "PAGE_GUARD", [1])
    plan.run(q, cache, cache, tables, lens, check=False)
    assert plan._plan.split.constexprs["PAGE_GUARD"] == 1


def test_a_decode_plan_takes_64_bit_rows_for_caches_whose_slots_lie_too_far_apart(monkeypatch):
    from omnitune.kernels import paged_decode_attention as pda

    _stub_decode_launchers(monkeypatch)
    b, h, hkv, d, block, pages = 2, 4, 2, 32, 8, 4
    plan = pda.PagedDecodePlan(batch=b, num_heads=h, num_kv_heads=hkv, head_dim=d, block_size=block,
                               max_blocks=pages, max_context_len=block * pages, dtype=torch.float32, device="cpu")
    q = torch.zeros(b, h, 1, d)
    block_major = torch.zeros(b * pages, block, hkv, d)  # slot stride hkv·d = 64
    slot_major = torch.zeros(block, b * pages, hkv, d).transpose(0, 1)  # slot stride 512
    tables = torch.zeros(b, pages, dtype=torch.int32)
    lens = torch.full((b,), block * pages, dtype=torch.int32)
    # (block − 1) × 64 = 448 fits a limit of 512; (block − 1) × 512 does not
    monkeypatch.setattr(pda, "_ROWS_32_LIMIT", 512)
    for cache, rows_32 in ((block_major, True), (slot_major, False), (block_major, True)):
        plan.run(q, cache, cache, tables, lens, check=False)
        assert plan._plan.split.constexprs["ROWS_32"] is rows_32
    # one cache past the bound is enough
    plan.run(q, block_major, slot_major, tables, lens, check=False)
    assert plan._plan.split.constexprs["ROWS_32"] is False


def test_the_row_bound_is_read_from_strides_alone():
    from omnitune.kernels import paged_decode_attention as pda

    # meta tensors: strides of caches far past 2^31 elements, no memory behind them
    def cache(slot_stride):
        return torch.empty(0, device="meta").as_strided((4, 16, 8, 128), (16 * 1024, slot_stride, 128, 1))

    fits = (2**31 - 1) // 15
    assert pda._rows_fit_32(16, cache(1024), cache(1024))
    assert pda._rows_fit_32(16, cache(fits), cache(fits))
    assert not pda._rows_fit_32(16, cache(fits + 1), cache(1024))
    assert not pda._rows_fit_32(16, cache(1024), cache(2**40))
    assert pda._rows_fit_32(1, cache(2**40), cache(2**40))  # a page of one slot has no row offset


def test_a_fixed_launch_builds_its_c_arguments_once(monkeypatch):
    bound, jit = _bound(monkeypatch)
    a, b = torch.randn(64), torch.randn(64)
    fixed = bound.fixed((1, 1, 1), (a, b, 7, 8))
    for _ in range(3):
        fixed()
    assert _kinds(jit) == ["jit", "direct", "direct"]
    assert jit.log[-1][1] == (a.data_ptr(), b.data_ptr(), 7, 8, 1, 1)
    assert fixed._tail is not None


def test_a_fixed_launch_under_a_hook_or_off_the_direct_path_takes_the_jit(monkeypatch):
    from triton import knobs

    bound, jit = _bound(monkeypatch)
    a, b = torch.randn(64), torch.randn(64)
    fixed = bound.fixed((1, 1, 1), (a, b, 7, 8))
    fixed()
    hook = lambda *args, **kwargs: None  # noqa: E731
    knobs.runtime.launch_enter_hook.add(hook)
    try:
        fixed()
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    fixed()
    assert _kinds(jit) == ["jit", "jit", "direct"]
    bound._launcher._direct = False  # the interpreter's case: nothing to bind to
    undirected = bound.fixed((1, 1, 1), (a, b, 7, 9))
    undirected()
    undirected()
    assert _kinds(jit)[-2:] == ["jit", "jit"] and undirected._tail is None


def test_dtypes_given_by_the_caller_key_the_binary(monkeypatch):
    bound, jit = _bound(monkeypatch)
    a, b = torch.zeros(64), torch.zeros(64)
    bound((1, 1, 1), (a, b, 7, 8))
    bound((1, 1, 1), (a, b, 7, 8), (torch.float32, torch.float32))  # what the tensors hold: same entry
    bound((1, 1, 1), (a, b, 7, 8), (torch.float16, torch.float32))  # another key, another entry
    assert _kinds(jit) == ["jit", "direct", "jit"]


def _record_launches(monkeypatch, module, launchers, plans: str, make_plan) -> _RecordingJit:
    """An op module's launchers — (launcher, its kernel's runtime argument count) pairs — recording
    on the CPU and keeping direct entries, its plan cache `plans` bound afresh by `make_plan`, a
    constant stream and device, its CPU tensors taken as runnable. The constexprs all come in the
    plans' dicts: under the interpreter the jit functions do not list their parameters."""
    jit = _RecordingJit()
    for launcher, runtime in launchers:
        monkeypatch.setattr(launcher, "jit", jit)
        monkeypatch.setattr(launcher, "_direct", True)
        monkeypatch.setattr(launcher, "_runtime_count", runtime)
        monkeypatch.setattr(launcher, "_constexpr_names", [])
    monkeypatch.setattr(module, plans, _launch.PlanCache(make_plan))
    monkeypatch.setattr(_launch, "_raw_stream", lambda device: 0)
    monkeypatch.setattr(_launch, "_current_device", lambda: 0)
    monkeypatch.setattr(module, "require_runnable_device", lambda t: None)
    return jit


def _recording_decode_launchers(monkeypatch, pda) -> _RecordingJit:
    """Paged decode's two launchers recording (see _record_launches)."""
    return _record_launches(monkeypatch, pda, ((pda._SPLIT, 37), (pda._COMBINE, 10)), "_launch_plans",
                            pda._launch_plan)


def _split_plan(monkeypatch, out_given=False):
    """A two-split decode plan on the CPU, its launchers recording and keeping direct entries."""
    from omnitune.kernels import paged_decode_attention as pda

    jit = _recording_decode_launchers(monkeypatch, pda)
    b, h, hkv, d, block, pages = 2, 4, 2, 32, 8, 4
    config = pda.Config(NUM_SPLITS=2, BLOCK_N=16, num_warps=4, num_stages=2, PACK_GQA=True, FUSED_REDUCE=False)
    plan = pda.PagedDecodePlan(batch=b, num_heads=h, num_kv_heads=hkv, head_dim=d, block_size=block,
                               max_blocks=pages, max_context_len=block * pages, dtype=torch.float32, device="cpu",
                               config=config)
    inputs = (torch.randn(b, h, 1, d), torch.randn(b * pages, block, hkv, d), torch.randn(b * pages, block, hkv, d),
              torch.zeros(b, pages, dtype=torch.int32), torch.full((b,), block * pages, dtype=torch.int32))
    return plan, inputs, jit


def test_a_decode_plan_launches_its_combine_with_arguments_fixed_at_planning(monkeypatch):
    plan, inputs, jit = _split_plan(monkeypatch)
    for _ in range(3):
        assert plan.run(*inputs, check=False) is plan.out
    # split, combine through the JIT first; then both direct, the combine's arguments the plan's own.
    assert _kinds(jit) == ["jit", "jit", "direct", "direct", "direct", "direct"]
    scratch = plan._scratch
    combine_args = jit.log[-1][1]
    assert combine_args[:4] == (scratch.part_m.data_ptr(), scratch.part_l.data_ptr(), scratch.part_acc.data_ptr(),
                                plan.out.data_ptr())
    own = torch.empty_like(plan.out)
    assert plan.run(*inputs, out=own, check=False) is own
    assert jit.log[-1][1][3] == own.data_ptr()  # a caller's out goes through the bound path


def test_a_decode_plan_refuses_an_output_buffer_resized_since_planning(monkeypatch):
    plan, inputs, jit = _split_plan(monkeypatch)
    plan.run(*inputs, check=False)
    plan.out.resize_(1)
    launched = len(jit.log)
    with pytest.raises(InputError, match="output buffer was resized"):
        plan.run(*inputs, check=False)
    assert len(jit.log) == launched  # nothing launched


def test_another_current_device_takes_a_binary_of_its_own(monkeypatch):
    bound, jit = _bound(monkeypatch)
    a, b = torch.randn(64), torch.randn(64)
    bound((1, 1, 1), (a, b, 7, 8))
    bound((1, 1, 1), (a, b, 7, 8))
    monkeypatch.setattr(_launch, "_current_device", lambda: 1)  # a binary of device 0 must not run here
    bound((1, 1, 1), (a, b, 7, 8))
    bound((1, 1, 1), (a, b, 7, 8))
    assert _kinds(jit) == ["jit", "direct", "jit", "direct"]


def test_a_fixed_launch_bound_on_one_device_leaves_another_to_the_bound_launcher(monkeypatch):
    bound, jit = _bound(monkeypatch)
    a, b = torch.randn(64), torch.randn(64)
    fixed = bound.fixed((1, 1, 1), (a, b, 7, 8))
    fixed()
    fixed()
    monkeypatch.setattr(_launch, "_current_device", lambda: 1)
    fixed()
    fixed()
    # device 1's calls: the bound launcher's (its JIT first, then its own entry), never device 0's binary
    assert _kinds(jit) == ["jit", "direct", "jit", "direct"]
    assert fixed._device == 0


def _steady_kv_write(monkeypatch):
    """The KV write's launcher recording on the CPU, with direct entries and a steady-path table
    of its own (under the interpreter the jit function lists no parameters: 27 runtime arguments,
    every constexpr in the plan's dict)."""
    jit = _RecordingJit()
    launcher = _launch.DirectLauncher(kvw._kv_cache_write)
    launcher.jit, launcher._direct = jit, True
    launcher._runtime_count, launcher._constexpr_names = 27, []
    monkeypatch.setattr(kvw, "_WRITE", launcher)
    monkeypatch.setattr(kvw, "_launch_plans", _launch.PlanCache(kvw._launch_plan))
    monkeypatch.setattr(kvw, "_steady", {})
    monkeypatch.setattr(_launch, "_raw_stream", lambda device: 0)
    monkeypatch.setattr(_launch, "_current_device", lambda: 0)
    monkeypatch.setattr(kvw, "require_runnable_device", lambda t: None)
    checked = []
    check_metadata = kvw._check_metadata
    monkeypatch.setattr(kvw, "_check_metadata", lambda *a: checked.append(1) or check_metadata(*a))
    return jit, checked


def _kv_write_tensors(t=8, dtype=torch.float32, fp8=False):
    from omnitune.kernels import _fp8

    key, value = torch.randn(t, 2, 32).to(dtype), torch.randn(t, 2, 32).to(dtype)
    caches = torch.zeros(2, 4, 16, 2, 32).to(_fp8.FP8 if fp8 else dtype)
    return key, value, caches[0], caches[1], torch.randperm(64)[:t]


@pytest.mark.parametrize("fp8", (False, True))
def test_a_repeated_kv_write_takes_the_steady_path_with_the_bound_paths_arguments(monkeypatch, fp8):
    jit, checked = _steady_kv_write(monkeypatch)
    key, value, kc, vc, slots = _kv_write_tensors(dtype=torch.bfloat16 if fp8 else torch.float32, fp8=fp8)
    scales = {"k_scale": torch.full((2,), 0.5), "v_scale": torch.full((2,), 0.25)} if fp8 else {}
    for _ in range(4):
        kvw.write_kv_cache(key, value, kc, vc, slots, check=False, **scales)
    # The JIT's path (which leaves the bound launcher's entry, and so the steady one), then steady:
    # checked on the first call only, every direct launch with the same C arguments.
    assert _kinds(jit) == ["jit", "direct", "direct", "direct"]
    assert len(checked) == 1 and len(kvw._steady) == 1
    assert jit.log[1][1] == jit.log[2][1] == jit.log[3][1]
    addresses = jit.log[3][1][:7]
    assert addresses[:5] == tuple(t.data_ptr() for t in (key, value, kc, vc, slots))
    if fp8:
        assert addresses[5:] == (scales["k_scale"].data_ptr(), scales["v_scale"].data_ptr())
    # new tensors of the same kinds: the steady path, with their addresses
    key2, value2 = key.clone(), value.clone()
    kvw.write_kv_cache(key2, value2, kc, vc, slots, check=False, **scales)
    assert len(checked) == 1 and jit.log[-1][1][:2] == (key2.data_ptr(), value2.data_ptr())


def test_the_steady_kv_write_leaves_anything_else_to_the_full_path(monkeypatch):
    from triton import knobs

    from omnitune import runtime

    jit, checked = _steady_kv_write(monkeypatch)
    key, value, kc, vc, slots = _kv_write_tensors()
    kvw.write_kv_cache(key, value, kc, vc, slots, check=False)
    kvw.write_kv_cache(key, value, kc, vc, slots, check=False)
    assert len(checked) == 1
    with pytest.raises(InputError, match="share one dtype"):  # another signature: checked, refused
        kvw.write_kv_cache(key, value.half(), kc, vc, slots, check=False)
    with pytest.raises(InputError, match="slot_mapping must be 1-D"):
        kvw.write_kv_cache(key, value, kc, vc, slots[:-1], check=False)
    assert len(checked) == 3
    launched = len(jit.log)
    kvw.write_kv_cache(key, value, kc, vc, slots, config={"BLOCK_T": 4}, check=False)  # a caller's config
    kvw.write_kv_cache(key, value, kc, vc, slots, check=True)  # the check mode
    assert len(checked) == 5 and len(jit.log) == launched + 2
    storage = torch.randn(8 * 2 * 32 + 1)
    misaligned = storage[1:].view(8, 2, 32)  # 4 bytes off a 16-byte boundary
    kvw.write_kv_cache(misaligned, value, kc, vc, slots, check=False)
    assert len(checked) == 6
    hook = lambda *args, **kwargs: None  # noqa: E731
    knobs.runtime.launch_enter_hook.add(hook)
    try:
        kvw.write_kv_cache(key, value, kc, vc, slots, check=False)
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    assert len(checked) == 7 and _kinds(jit)[-1] == "jit"
    runtime.clear_cache()  # tables reloaded: the config is looked up again
    kvw.write_kv_cache(key, value, kc, vc, slots, check=False)
    assert len(checked) == 8
    kvw.write_kv_cache(key, value, kc, vc, slots, check=False)
    assert len(checked) == 8  # steady again


def _steady_decode(monkeypatch, config):
    """paged_decode_attention's launchers recording on the CPU with direct entries, a steady-path
    table of its own, and the full path's lookup answering `config`."""
    from omnitune.kernels import paged_decode_attention as pda

    jit = _recording_decode_launchers(monkeypatch, pda)
    monkeypatch.setattr(pda, "_steady", {})
    monkeypatch.setattr(pda, "_scratches", {})
    monkeypatch.setattr(pda, "_config_for", lambda *args: config)
    checked = []
    check_metadata = pda._check_metadata
    monkeypatch.setattr(pda, "_check_metadata", lambda *a: checked.append(1) or check_metadata(*a))
    return pda, jit, checked


def _decode_tensors(b=2, h=4, hkv=2, d=32, block=8, pages=4):
    return (torch.randn(b, h, 1, d), torch.randn(b * pages, block, hkv, d), torch.randn(b * pages, block, hkv, d),
            torch.arange(b * pages, dtype=torch.int32).view(b, pages), torch.full((b,), block * pages - 3, dtype=torch.int32))


@pytest.mark.parametrize("splits, fused", ((1, False), (2, False), (2, True)))
def test_a_repeated_decode_call_takes_the_steady_path_with_the_full_paths_arguments(monkeypatch, splits, fused):
    config = Config(NUM_SPLITS=splits, BLOCK_N=16, num_warps=4, num_stages=2, PACK_GQA=True, FUSED_REDUCE=fused)
    pda, jit, checked = _steady_decode(monkeypatch, config)
    inputs = _decode_tensors()
    outs = [pda.paged_decode_attention(*inputs, check=False) for _ in range(4)]
    launches = 1 if splits == 1 or fused else 2  # the combine is a launch of its own
    # Through the JIT (which leaves the bound launchers' entries, and so the steady one), then
    # steady: checked on the first call only.
    assert _kinds(jit) == ["jit"] * launches + ["direct"] * 3 * launches
    assert len(checked) == 1 and len(pda._steady) == 1
    calls = [jit.log[launches * i:launches * (i + 1)] for i in range(4)]
    for call, out in zip(calls[1:], outs[1:]):
        split = call[0][1]
        assert split[:5] == tuple(t.data_ptr() for t in inputs) and split[5] == out.data_ptr()
        if launches == 2:
            assert call[1][1][3] == out.data_ptr() and call[1][1][:3] == split[6:9]  # the partials it wrote
    # the steady calls' C arguments are the full path's, the output's address apart
    first = [[a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args] for _, args in calls[0]]
    for call, out in zip(calls[1:], outs[1:]):
        for full, (_, steady) in zip(first, call):
            assert [x if x != outs[0].data_ptr() else "out" for x in full] == \
                   [x if x != out.data_ptr() else "out" for x in steady]
    assert all(out.shape == (2, 4, 1, 32) and out.dtype == torch.float32 for out in outs)
    # new tensors of the same kinds: steady, with their addresses
    q2 = inputs[0].clone()
    pda.paged_decode_attention(q2, *inputs[1:], check=False)
    assert len(checked) == 1 and jit.log[-launches][1][0] == q2.data_ptr()


def test_the_steady_decode_leaves_anything_else_to_the_full_path(monkeypatch):
    from omnitune import runtime

    config = Config(NUM_SPLITS=2, BLOCK_N=16, num_warps=4, num_stages=2, PACK_GQA=True, FUSED_REDUCE=False)
    pda, jit, checked = _steady_decode(monkeypatch, config)
    q, kc, vc, tables, lens = _decode_tensors()
    for _ in range(3):
        pda.paged_decode_attention(q, kc, vc, tables, lens, check=False)
    assert len(checked) == 1
    # a bad max_context_len is refused as before, never launched by the steady path
    for bad in (0, 33, 10**6):
        with pytest.raises(InputError, match="max_context_len"):
            pda.paged_decode_attention(q, kc, vc, tables, lens, max_context_len=bad, check=False)
    with pytest.raises(InputError):  # another signature: checked, refused
        pda.paged_decode_attention(q, kc, vc.half(), tables, lens, check=False)
    assert len(checked) == 5
    pda.paged_decode_attention(q, kc, vc, tables, lens, config=config, check=False)  # a caller's config
    pda.paged_decode_attention(q, kc, vc, tables, lens, check=True)  # the check mode
    assert len(checked) == 7
    strided = torch.stack([lens, lens], 1)[:, 0]  # a strided vector goes to the kernel as a copy
    pda.paged_decode_attention(q, kc, vc, tables, strided, check=False)
    pda.paged_decode_attention(q, kc, vc, tables, strided, check=False)
    assert len(checked) == 9
    # another stream: partials of its own, so a signature of its own
    monkeypatch.setattr(_launch, "_raw_stream", lambda device: 7)
    pda.paged_decode_attention(q, kc, vc, tables, lens, check=False)
    assert len(checked) == 10
    monkeypatch.setattr(_launch, "_raw_stream", lambda device: 0)
    pda.paged_decode_attention(q, kc, vc, tables, lens, check=False)
    assert len(checked) == 10  # stream 0's entry still holds
    pda.paged_decode_attention(q, kc, vc, tables, lens, max_context_len=30, check=False)  # same bucket: steady
    assert len(checked) == 10
    runtime.clear_cache()  # tables reloaded: the config is looked up again
    pda.paged_decode_attention(q, kc, vc, tables, lens, check=False)
    assert len(checked) == 11


def test_the_fused_layer_launches_through_its_bound_launcher(monkeypatch):
    from omnitune.kernels import cross_attention_layer as layer
    from omnitune.kernels import layers

    jit = _record_launches(monkeypatch, layer, ((layer._LAYER, 37),), "_launch_plans", layer._launch_plan)
    b, lq, lk, hidden, h, hkv, d = 2, 3, 16, 64, 4, 2, 64
    x_q, x_kv = torch.randn(b, lq, hidden), torch.randn(b, lk, hidden)
    wq, wkv, wo = torch.randn(h * d, hidden), torch.randn(2 * hkv * d, hidden), torch.randn(hidden, h * d)
    problem = layer.CrossAttentionLayerProblem(b=b, lq=lq, lk=lk, hidden=hidden, h=h, hkv=hkv, d=d)
    config = layer.fused_config(problem, torch.float32, "q").as_dict()
    assert config["FUSION"] == "q"
    for _ in range(3):
        layers.cross_attention_layer(x_q, x_kv, wq, wkv, wo, heads=h, kv_heads=hkv, config=config)
    assert _kinds(jit) == ["jit", "direct", "direct"]
    args = jit.log[-1][1]
    assert len(args) == 37 and args[0] == x_q.data_ptr() and args[1] == wq.data_ptr()
    # the plain arguments are what the JIT was given: strides, sizes, the scale
    assert args[10:] == jit.log[0][1][10:]


def test_kv_importance_launches_its_two_kernels_through_bound_launchers(monkeypatch):
    from omnitune.kernels import kv_compress as kvc

    jit = _record_launches(monkeypatch, kvc, ((kvc._STATS, 16), (kvc._SCORES, 18)), "_importance_plans",
                           kvc._importance_plan)
    q_window, k = torch.randn(2, 4, 8, 64), torch.randn(2, 2, 100, 64)
    scores = [kvc.kv_importance(q_window, k) for _ in range(3)]
    assert _kinds(jit) == ["jit", "jit"] + ["direct"] * 4
    stats_args, scores_args = jit.log[-2][1], jit.log[-1][1]
    assert stats_args[:2] == scores_args[:2] == (q_window.data_ptr(), k.data_ptr())
    assert scores_args[4] == scores[-1].data_ptr() and scores[-1].shape == (2, 2, 100)
    assert stats_args[4:] == jit.log[0][1][4:] and scores_args[5:] == jit.log[1][1][5:]  # the JIT's plain ones

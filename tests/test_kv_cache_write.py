"""The paged KV-cache write: its spec's contract, and the public function on odd cases and bad
input. Under the interpreter on the CPU (fp32 and fp16), on the GPU when there is one."""

from __future__ import annotations

import math

import pytest
import torch

from omnitune.errors import InputError
from omnitune.kernels import kv_cache_write as kvw
from omnitune.kernels.kv_cache_write import KVCacheWriteProblem, bitwise_mismatch, write_kv_cache
from omnitune.measure.runner import Runner
from omnitune.trial import TrialStatus
from omnitune.spec import Config
from conftest import INTERPRETED, assert_constraint_case, assert_registered_with_valid_defaults

SPEC = kvw.SPEC
CPU_DTYPES = (torch.float32, torch.float16)
PROBLEMS = (
    SPEC.example_problem,
    KVCacheWriteProblem(t=1, hkv=1, d=64),
    KVCacheWriteProblem(t=24, hkv=3, d=32, block_size=5),
    KVCacheWriteProblem(t=64, hkv=8, d=128),
    KVCacheWriteProblem(t=65536, hkv=8, d=128),
)


# ------------------------------------------------------------------------------------------------
# The spec's contract
# ------------------------------------------------------------------------------------------------


def test_registered_with_valid_default_configs():
    assert_registered_with_valid_defaults(SPEC, PROBLEMS)


def test_problem_parses_from_its_key_and_aliases():
    p = SPEC.example_problem
    assert SPEC.parse_shape(SPEC.problem_key(p)) == p
    assert SPEC.parse_shape("tokens=37,kv_heads=2,d=64") == p


def test_make_inputs_is_deterministic_per_seed_and_never_zero():
    p = SPEC.example_problem
    a = SPEC.make_inputs(p, torch.float16, "cpu", 3)
    b = SPEC.make_inputs(p, torch.float16, "cpu", 3)
    c = SPEC.make_inputs(p, torch.float16, "cpu", 4)
    for name in ("key", "value", "initial_caches", "slot_mapping"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
        assert not torch.equal(getattr(a, name), getattr(c, name)), name
    for t in (a.key, a.value, a.initial_caches):
        assert bool((t != 0).any()) and bool(torch.isfinite(t).all())


def test_factory_slots_are_distinct_in_range_and_some_padding():
    p = KVCacheWriteProblem(t=40, hkv=1, d=32, block_size=4)
    slots = SPEC.make_inputs(p, torch.float32, "cpu", 0).slot_mapping
    valid = slots[slots >= 0]
    assert slots.dtype == torch.int64
    assert int((slots < 0).sum()) == p.padded_tokens > 0
    assert valid.unique().numel() == valid.numel()
    assert int(valid.max()) < p.num_blocks * p.block_size


def _some_configs(problem, dtype, count=4):
    """The default and `count` other valid configs spread through the valid space."""
    valid = SPEC.valid_configs(problem, dtype)
    step = max(1, len(valid) // count)
    return [SPEC.default_config(problem, dtype)] + valid[::step][:count]


@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=str)
@pytest.mark.parametrize(
    "problem",
    [SPEC.example_problem, KVCacheWriteProblem(t=24, hkv=3, d=32, block_size=5)],
    ids=SPEC.problem_key,
)
def test_launch_matches_reference_exactly_on_poisoned_output(problem, dtype, device):
    inputs = SPEC.make_inputs(problem, dtype, device, 11)
    expected = SPEC.reference(inputs)
    written = int((inputs.slot_mapping >= 0).sum())
    for cfg in _some_configs(problem, dtype):
        out = SPEC.new_output(inputs)
        # every slot to be written starts as NaN: a skipped write cannot pass
        assert int(torch.isnan(out).sum()) == 2 * written * problem.hkv * problem.d
        SPEC.launch(inputs, out, cfg)
        assert SPEC.compare(out, expected) <= SPEC.tolerance[dtype] == 0.0, cfg.label()


def test_reference_writes_exactly_the_valid_slots():
    p = SPEC.example_problem
    inputs = SPEC.make_inputs(p, torch.float32, "cpu", 5)
    expected = SPEC.reference(inputs)
    flat = expected.view(2, -1, p.hkv, p.d)
    initial = inputs.initial_caches.view(2, -1, p.hkv, p.d)
    for tok, slot in enumerate(inputs.slot_mapping.tolist()):
        if slot >= 0:
            assert torch.equal(flat[0, slot], inputs.key[tok]) and torch.equal(flat[1, slot], inputs.value[tok])
    untouched = torch.ones(flat.shape[1], dtype=torch.bool)
    untouched[inputs.slot_mapping[inputs.slot_mapping >= 0]] = False
    assert torch.equal(flat[:, untouched], initial[:, untouched])


def test_flops_zero_bytes_positive_and_runner_reports_zero_tflops():
    for p in PROBLEMS:
        assert SPEC.flops(p) == 0.0
        assert SPEC.bytes_moved(p, torch.float16) > 0
        assert SPEC.bytes_moved(p, torch.float32) > SPEC.bytes_moved(p, torch.float16)
    runner = Runner(SPEC, KVCacheWriteProblem(t=9, hkv=2, d=32), torch.float32, interpret=INTERPRETED)
    result = runner.measure(SPEC.default_config(runner.problem, torch.float32))
    assert result.status is TrialStatus.OK and result.rel_error == 0.0
    assert result.tflops == 0.0


def test_bytes_count_written_tokens_only():
    # Padding tokens cost their slot (8 bytes) but move no keys or values.
    dense = KVCacheWriteProblem(t=7, hkv=2, d=64)        # 7 // 8 = 0 padded
    padded = KVCacheWriteProblem(t=8, hkv=2, d=64)       # 8 // 8 = 1 padded
    assert dense.padded_tokens == 0 and padded.padded_tokens == 1
    assert SPEC.bytes_moved(padded, torch.float16) == SPEC.bytes_moved(dense, torch.float16) + 8


# Each constraint, a config on a problem that it must reject.
CONSTRAINT_CASES = {
    "block_t_exceeds_tokens": (KVCacheWriteProblem(t=3, hkv=2, d=64), Config(BLOCK_T=8, BLOCK_H=2, num_warps=1)),
    "block_h_exceeds_heads": (KVCacheWriteProblem(t=64, hkv=2, d=64), Config(BLOCK_T=1, BLOCK_H=4, num_warps=1)),
    "tile_registers": (KVCacheWriteProblem(t=128, hkv=16, d=128), Config(BLOCK_T=64, BLOCK_H=16, num_warps=1)),
    "idle_threads": (KVCacheWriteProblem(t=1, hkv=1, d=64), Config(BLOCK_T=1, BLOCK_H=1, num_warps=4)),
}


@pytest.mark.parametrize("name", sorted(CONSTRAINT_CASES))
def test_constraint_rejects_what_it_should(name):
    assert_constraint_case(SPEC, CONSTRAINT_CASES, name)


def test_compare_is_bitwise():
    a = torch.randn(4, 8)
    assert bitwise_mismatch(a, a.clone()) == 0.0
    b = a.clone()
    b[1, 2] = torch.nextafter(b[1, 2], torch.tensor(math.inf))
    assert 0.0 < bitwise_mismatch(b, a) < 1e-6
    b[1, 2] = float("nan")
    assert bitwise_mismatch(b, a) == math.inf
    z, nz = torch.zeros(3), -torch.zeros(3)
    assert bitwise_mismatch(nz, z) == math.inf
    assert bitwise_mismatch(a[:2], a) == math.inf


# ------------------------------------------------------------------------------------------------
# The public function
# ------------------------------------------------------------------------------------------------


def _case(t, hkv, d, num_blocks, block_size, dtype, device, seed=0):
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(shape, generator=gen).to(device=device, dtype=dtype)

    key, value = rand(t, hkv, d), rand(t, hkv, d)
    key_cache, value_cache = rand(num_blocks, block_size, hkv, d), rand(num_blocks, block_size, hkv, d)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:t]
    return key, value, key_cache, value_cache, slots.to(device)


def _expected(key, value, key_cache, value_cache, slots):
    """Token by token, the plainest possible statement of the write."""
    kc, vc = key_cache.clone(), value_cache.clone()
    block_size = kc.shape[1]
    for tok, slot in enumerate(slots.tolist()):
        if slot >= 0:
            kc[slot // block_size, slot % block_size] = key[tok]
            vc[slot // block_size, slot % block_size] = value[tok]
    return kc, vc


@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=str)
@pytest.mark.parametrize("slot_dtype", (torch.int64, torch.int32), ids=str)
def test_write_skips_negative_slots_with_odd_block_size(dtype, slot_dtype, device):
    key, value, kc, vc, slots = _case(t=11, hkv=3, d=32, num_blocks=5, block_size=3, dtype=dtype, device=device)
    slots[[0, 4, 10]] = torch.tensor([-1, -7, -1], device=device)
    slots = slots.to(slot_dtype)
    want_k, want_v = _expected(key, value, kc, vc, slots)
    write_kv_cache(key, value, kc, vc, slots, config={"BLOCK_T": 4, "BLOCK_H": 2})
    assert bitwise_mismatch(kc, want_k) == 0.0 and bitwise_mismatch(vc, want_v) == 0.0


def test_write_from_strided_views_and_padded_head_dim(device):
    # Keys and values as views of one fused qkv projection output, head dim 80 (tile of 128).
    t, h, hkv, d = 6, 4, 2, 80
    qkv = torch.randn(t, h + 2 * hkv, d, generator=torch.Generator().manual_seed(1)).to(device)
    key, value = qkv[:, h:h + hkv], qkv[:, h + hkv:]
    assert not key.is_contiguous()
    _, _, kc, vc, slots = _case(t, hkv, d, num_blocks=4, block_size=4, dtype=torch.float32, device=device)
    want_k, want_v = _expected(key, value, kc, vc, slots)
    write_kv_cache(key, value, kc, vc, slots, config=Config(BLOCK_T=2, BLOCK_H=1, num_warps=1))
    assert bitwise_mismatch(kc, want_k) == 0.0 and bitwise_mismatch(vc, want_v) == 0.0


@pytest.mark.parametrize("check", (True, False))
def test_a_strided_slot_mapping_is_read_by_its_strides(check, device):
    # Every other slot of a longer mapping, and the production path's steady state (a second call
    # of one signature) as well as its first call.
    key, value, kc, vc, _ = _case(t=7, hkv=2, d=32, num_blocks=6, block_size=4, dtype=torch.float32, device=device)
    wide = torch.randperm(24, generator=torch.Generator().manual_seed(5))[:14].to(device)
    slots = wide[::2]
    assert slots.stride(0) == 2
    want_k, want_v = _expected(key, value, kc, vc, slots)
    for _ in range(2):
        write_kv_cache(key, value, kc, vc, slots, check=check)
        assert bitwise_mismatch(kc, want_k) == 0.0 and bitwise_mismatch(vc, want_v) == 0.0


def test_all_padding_and_empty_batch_write_nothing(device):
    key, value, kc, vc, slots = _case(t=4, hkv=1, d=32, num_blocks=2, block_size=4, dtype=torch.float32, device=device)
    before_k, before_v = kc.clone(), vc.clone()
    write_kv_cache(key, value, kc, vc, torch.full_like(slots, -1), config={"BLOCK_T": 4})
    write_kv_cache(key[:0], value[:0], kc, vc, slots[:0], config={})
    assert torch.equal(kc, before_k) and torch.equal(vc, before_v)


def test_default_lookup_through_runtime(device):
    key, value, kc, vc, slots = _case(t=5, hkv=2, d=32, num_blocks=3, block_size=4, dtype=torch.float16, device=device)
    want_k, want_v = _expected(key, value, kc, vc, slots)
    write_kv_cache(key, value, kc, vc, slots)
    assert bitwise_mismatch(kc, want_k) == 0.0 and bitwise_mismatch(vc, want_v) == 0.0


def _bad_inputs(device):
    """What is wrong → (the arguments, a fragment of the InputError's message), for inputs that must
    be refused before anything is written."""
    key, value, kc, vc, slots = _case(t=5, hkv=2, d=32, num_blocks=3, block_size=4, dtype=torch.float32, device=device)
    past_end = slots.clone()
    past_end[2] = 3 * 4
    return {
        "slot past the cache": ((key, value, kc, vc, past_end), "past the cache's 12 slots"),
        "kv heads differ from the cache": ((key[:, :1], value[:, :1], kc, vc, slots), "the cache has 2 × 32"),
        "head dim differs from the cache": ((key[..., :16], value[..., :16], kc, vc, slots), "the cache has 2 × 32"),
        "key and value shapes differ": ((key, value[:4], kc, vc, slots), "key and value shapes differ"),
        "dtype differs": ((key.half(), value.half(), kc, vc, slots), "in key/value.s dtype"),
        "float slots": ((key, value, kc, vc, slots.float()), "int64 or int32"),
        "one slot short": ((key, value, kc, vc, slots[:4]), "one slot per token"),
        "cache not 4-D": ((key, value, kc.flatten(0, 1), vc, slots), "key_cache must be 4-D"),
        "caches differ": ((key, value, kc, vc[:2], slots), "shapes differ"),
    }, (kc, vc)


@pytest.mark.parametrize("case", sorted(_bad_inputs("cpu")[0]))
def test_bad_input_raises_and_leaves_caches_untouched(case, device):
    cases, (kc, vc) = _bad_inputs(device)
    before_k, before_v = kc.clone(), vc.clone()
    args, message = cases[case]
    with pytest.raises(InputError, match=message):
        write_kv_cache(*args, config={"BLOCK_T": 1})
    assert torch.equal(kc, before_k) and torch.equal(vc, before_v)


def test_slot_error_names_the_valid_range(device):
    cases, _ = _bad_inputs(device)
    with pytest.raises(InputError, match=r"slot 12, past the cache's 12 slots .*0\.\.11"):
        write_kv_cache(*cases["slot past the cache"][0], config={})


# ------------------------------------------------------------------------------------------------
# On the GPU: real shapes, bf16 included (the interpreter gets bf16 wrong)
# ------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("shape", ["t=65536,hkv=8,d=128", "t=64,hkv=4,d=128", "t=4099,hkv=2,d=80,block_size=32"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_real_shapes_exact(shape, dtype):
    problem = SPEC.parse_shape(shape)
    runner = Runner(SPEC, problem, dtype)
    for cfg in _some_configs(problem, dtype, count=3):
        result = runner.measure(cfg)
        assert result.status is TrialStatus.OK and result.rel_error == 0.0, (cfg.label(), result.detail)
        assert result.tflops == 0.0 and result.tbps > 0.0

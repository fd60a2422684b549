"""fp8 (e4m3) KV caches: the quantizer bit for bit against PyTorch's, the KV write into fp8
caches bit for bit against the PyTorch reference, paged decode over fp8 caches against a
float64 (CPU) / float32 (GPU) reference of the dequantized cache and against the result over
the unquantized cache, per-tensor and per-kv-head scales, and every bad input as one clear
InputError.

What Triton's interpreter runs here: loads, stores and casts of float8_e4m3fn tensors, and
widening e4m3 to fp16/fp32 (exact for every finite code). Its own narrowing cast rounds wrongly
(the mantissa's carry is dropped), which is why the kernels round in fp32 arithmetic first
(omnitune/kernels/_fp8.py); that rounding is tested here against PyTorch on every code, every
tie and both neighbours of each tie. On the CPU the activations are fp16/fp32 (the interpreter
computes bf16 wrongly); the gpu-marked tests use bf16 on real shapes."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from conftest import DEVICE, capture_graph
from omnitune.errors import InputError, ShapeError
from omnitune.kernels import _fp8
from omnitune.kernels import kv_cache_write as kvw
from omnitune.kernels import paged_decode_attention as pda
from omnitune.spec import relative_error

FP8 = torch.float8_e4m3fn
DTYPES = (torch.float16, torch.float32) if DEVICE == "cpu" else (torch.bfloat16, torch.float16)
# Decode over an fp8 cache against decode over the unquantized cache, standard-normal data: e4m3
# keeps 3 mantissa bits (≤ 6.25% per value, ~2.6% rms); measured 3.7–3.9% on the
# output. The bound that fails a broken dequantization (a scale ignored or swapped: > 50%).
FP8_VS_UNQUANTIZED = 0.08


@triton.jit
def _round_kernel(X, Y, N: tl.constexpr):
    offs = tl.arange(0, N)
    tl.store(Y + offs, _fp8.round_to_e4m3(tl.load(X + offs)).to(Y.dtype.element_ty))


def test_rounding_matches_pytorch_on_every_code_tie_and_neighbour():
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(FP8).float()
    finite = codes[~codes.isnan()].sort().values
    ties = (finite[1:] + finite[:-1]) / 2
    gen = torch.Generator().manual_seed(0)
    values = torch.cat([
        finite, ties, ties.nextafter(torch.full_like(ties, 1e9)), ties.nextafter(torch.full_like(ties, -1e9)),
        torch.randn(2048, generator=gen) * 100, torch.randn(2048, generator=gen) * 1e-2,
        torch.randn(2048, generator=gen) * 1e-3,
        torch.tensor([0.0, -0.0, 448.0, 449.0, 463.9, 464.0, 465.0, 1e6, -1e6, float("inf"), float("-inf")]),
    ])
    n = triton.next_power_of_2(values.numel())
    x = torch.zeros(n)
    x[: values.numel()] = values
    x = x.to(DEVICE)
    y = torch.full((n,), 0x55, dtype=torch.uint8, device=DEVICE).view(FP8)
    _round_kernel[(1,)](x, y, N=n)
    expected = x.clamp(-_fp8.FP8_MAX, _fp8.FP8_MAX).to(FP8)
    bad = (y.view(torch.uint8) != expected.view(torch.uint8)).nonzero().flatten()
    assert bad.numel() == 0, [(x[i].item(), y[i].float().item(), expected[i].float().item()) for i in bad[:5]]


def test_kv_cache_scale_maps_the_largest_magnitude_to_448_per_tensor_or_per_head():
    x = torch.randn(50, 3, 16) * torch.tensor([1.0, 10.0, 0.1]).view(1, 3, 1)
    x[7, 1, 3] = -123.0
    assert torch.allclose(_fp8.kv_cache_scale(x), torch.tensor([123.0 / 448]))
    per_head = _fp8.kv_cache_scale(x, per_head=True)
    assert per_head.shape == (3,) and per_head.dtype == torch.float32
    assert torch.allclose(per_head, x.abs().amax(dim=(0, 2)) / 448)
    assert (_fp8.kv_cache_scale(torch.zeros(4, 2, 8)) > 0).all()  # never a zero scale
    q = _fp8.quantize(x, per_head)
    assert q.float().abs().max() <= 448
    assert relative_error(_fp8.dequantize(q, per_head, torch.float64), x.double()) < 0.04


def test_a_problem_names_its_cache_dtype_only_when_fp8_so_old_table_keys_stay_valid():
    plain = kvw.KVCacheWriteProblem(t=64, hkv=4, d=128)
    fp8 = kvw.SPEC.parse_shape("t=64,hkv=4,d=128,cache_dtype=fp8")
    assert kvw.SPEC.problem_key(plain) == "t=64,hkv=4,d=128,block_size=16"
    assert kvw.SPEC.problem_key(fp8) == "t=64,hkv=4,d=128,block_size=16,cache_dtype=fp8_e4m3"
    assert kvw.SPEC.parse_shape(kvw.SPEC.problem_key(fp8)) == fp8
    # the runtime never serves an fp8 problem from an entry tuned for another cache dtype
    assert kvw.SPEC.match.distance(plain, fp8) is None
    decode = pda.SPEC.parse_shape("b=4,h=28,hkv=4,lq=1,ctx=4096,d=128,cache_dtype=fp8_e4m3")
    assert pda.SPEC.match.distance(decode, pda.PagedDecodeProblem(4, 28, 4, 1, 4096, 128)) is None
    for bad in ("fp8_e5m2", "int8", "bf16"):
        with pytest.raises(ShapeError, match="cache_dtype"):
            pda.SPEC.parse_shape(f"b=4,h=28,hkv=4,lq=1,ctx=4096,d=128,cache_dtype={bad}")


# ------------------------------------------------------------------------------------------------
# KV write into fp8 caches
# ------------------------------------------------------------------------------------------------


def _write_case(dtype, per_head: bool, slot_dtype=torch.int64, t=45, hkv=4, d=64, block_size=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    spread = torch.tensor([1.0, 8.0, 0.05, 3.0][:hkv]).view(1, hkv, 1)
    key = (torch.randn(t, hkv, d, generator=gen) * spread).to(DEVICE, dtype)
    value = torch.randn(t, hkv, d, generator=gen).to(DEVICE, dtype)
    blocks = triton.cdiv(t, block_size) + 2
    initial = torch.randint(0, 256, (2, blocks, block_size, hkv, d), generator=gen, dtype=torch.int32)
    initial = initial.to(torch.uint8)
    initial[initial == 0x7F] = 0  # no NaN codes in the starting caches: NaN ≠ NaN in the comparison
    initial[initial == 0xFF] = 0
    initial = initial.to(DEVICE).view(FP8)
    slots = torch.randperm(blocks * block_size, generator=gen)[:t]
    slots[::7] = -1
    k_scale = _fp8.kv_cache_scale(key, per_head=per_head)
    v_scale = _fp8.kv_cache_scale(value, per_head=per_head) * 2  # values quantized at half range
    return key, value, initial, slots.to(DEVICE, slot_dtype), k_scale, v_scale


def _expected_caches(key, value, initial, slots, k_scale, v_scale):
    expected = initial.clone().view(torch.uint8)
    flat = expected.view(2, -1, *expected.shape[-2:])
    keep = slots >= 0
    flat[0, slots[keep].long()] = _fp8.quantize(key[keep], k_scale).view(torch.uint8)
    flat[1, slots[keep].long()] = _fp8.quantize(value[keep], v_scale).view(torch.uint8)
    return expected


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("per_head", [False, True])
@pytest.mark.parametrize("slot_dtype", [torch.int64, torch.int32])
def test_write_quantizes_bit_for_bit_as_pytorch_does(dtype, per_head, slot_dtype):
    key, value, initial, slots, k_scale, v_scale = _write_case(dtype, per_head, slot_dtype)
    caches = initial.clone()
    kvw.write_kv_cache(key, value, caches[0], caches[1], slots, k_scale=k_scale, v_scale=v_scale)
    expected = _expected_caches(key, value, initial, slots, k_scale, v_scale)
    assert torch.equal(caches.view(torch.uint8), expected)


@pytest.mark.parametrize("config", [dict(BLOCK_T=1, BLOCK_H=1, num_warps=1), dict(BLOCK_T=8, BLOCK_H=4, num_warps=4),
                                    dict(BLOCK_T=4, BLOCK_H=2, num_warps=2)])
def test_write_is_exact_under_every_tile_shape(config):
    key, value, initial, slots, k_scale, v_scale = _write_case(DTYPES[0], True, t=37, hkv=3, d=80, block_size=5)
    caches = initial.clone()
    kvw.write_kv_cache(key, value, caches[0], caches[1], slots, k_scale=k_scale, v_scale=v_scale, config=config)
    assert torch.equal(caches.view(torch.uint8), _expected_caches(key, value, initial, slots, k_scale, v_scale))


def test_a_slot_past_the_fp8_cache_is_skipped_in_the_production_path():
    key, value, initial, slots, k_scale, v_scale = _write_case(DTYPES[0], False)
    capacity = initial.shape[1] * initial.shape[2]
    slots[3] = capacity + 5
    caches = initial.clone()
    kvw.write_kv_cache(key, value, caches[0], caches[1], slots, k_scale=k_scale, v_scale=v_scale, check=False)
    skipped = slots.clone()
    skipped[3] = -1
    assert torch.equal(caches.view(torch.uint8), _expected_caches(key, value, initial, skipped, k_scale, v_scale))


# ------------------------------------------------------------------------------------------------
# Paged decode over fp8 caches
# ------------------------------------------------------------------------------------------------


def _decode_pair(dtype, b=3, h=8, hkv=2, lq=1, ctx=300, d=64, block_size=16, per_head=False, seed=0):
    """Inputs over an unquantized cache and the same tokens in fp8 (stored as the KV write would)."""
    problem = pda.PagedDecodeProblem(b=b, h=h, hkv=hkv, lq=lq, ctx=ctx, d=d, block_size=block_size)
    full = pda.SPEC.make_inputs(problem, dtype, DEVICE, seed)
    lens = torch.tensor([ctx, max(lq, ctx // 3), max(lq, ctx - 17)][:b] + [ctx] * max(0, b - 3), dtype=torch.int32)
    full.context_lens = lens.to(DEVICE)
    finite_k = full.key_cache.masked_fill(full.key_cache.isinf(), 0)
    finite_v = full.value_cache.masked_fill(full.value_cache.isinf(), 0)
    k_scale = _fp8.kv_cache_scale(finite_k, per_head=per_head)
    v_scale = _fp8.kv_cache_scale(finite_v, per_head=per_head)
    quantized = pda.PagedDecodeInputs(full.q, _fp8.quantize(full.key_cache, k_scale),
                                      _fp8.quantize(full.value_cache, v_scale), full.block_tables,
                                      full.context_lens, full.sm_scale, k_scale, v_scale)
    return problem, full, quantized


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("per_head", [False, True])
@pytest.mark.parametrize("config", [
    None,
    dict(NUM_SPLITS=1, BLOCK_N=32, num_warps=4, num_stages=2, PACK_GQA=True, FUSED_REDUCE=False),
    dict(NUM_SPLITS=4, BLOCK_N=16, num_warps=2, num_stages=3, PACK_GQA=False, FUSED_REDUCE=False),
    dict(NUM_SPLITS=2, BLOCK_N=64, num_warps=4, num_stages=2, PACK_GQA=True, FUSED_REDUCE=True),
])
def test_decode_over_fp8_matches_the_dequantized_reference(dtype, per_head, config):
    problem, full, quantized = _decode_pair(dtype, per_head=per_head)
    out = pda.paged_decode_attention(quantized.q, quantized.key_cache, quantized.value_cache, quantized.block_tables,
                                     quantized.context_lens, k_scale=quantized.k_scale, v_scale=quantized.v_scale,
                                     config=config)
    assert relative_error(out, pda.reference(quantized)) < pda.SPEC.tolerance[dtype]
    unquantized = pda.paged_decode_attention(full.q, full.key_cache, full.value_cache, full.block_tables,
                                             full.context_lens, config=config)
    assert relative_error(out, unquantized) < FP8_VS_UNQUANTIZED


@pytest.mark.gpu
@pytest.mark.parametrize("magnitude", [1e-7, 3e3])
def test_decode_over_fp8_holds_for_values_outside_fp16s_comfortable_range(magnitude):
    """V tiles are widened to fp16 on the way to the dot: values of 1e-7 (fp16 subnormals) or
    of 3e3 · 448 (past fp16's 65504) must still come out right, so the tiles enter the dot
    unscaled and v_scale multiplies the fp32 accumulator. bf16 activations (only they hold such
    outputs), so GPU only: the interpreter refuses bf16."""
    dtype = torch.bfloat16
    problem, full, quantized = _decode_pair(dtype, per_head=True, seed=3)
    value = quantized.value_cache  # fp8 codes, kept; only the scale that reads them changes
    v_scale = quantized.v_scale * magnitude
    scaled = pda.PagedDecodeInputs(quantized.q, quantized.key_cache, value, quantized.block_tables,
                                   quantized.context_lens, quantized.sm_scale, quantized.k_scale, v_scale)
    out = pda.paged_decode_attention(scaled.q, scaled.key_cache, value, scaled.block_tables, scaled.context_lens,
                                     k_scale=scaled.k_scale, v_scale=v_scale)
    expected = pda.reference(scaled)
    assert expected.abs().max() > magnitude * 0.1  # the output really lives at that magnitude
    assert relative_error(out, expected) < pda.SPEC.tolerance[dtype]


def test_decode_with_several_query_tokens_over_fp8_and_the_spec_factory():
    problem = pda.PagedDecodeProblem(b=2, h=4, hkv=2, lq=3, ctx=70, d=64, cache_dtype="fp8")
    dtype = DTYPES[0]
    inputs = pda.SPEC.make_inputs(problem, dtype, DEVICE, 1)
    assert inputs.key_cache.dtype == FP8 and inputs.k_scale is not None
    assert not torch.equal(inputs.k_scale, inputs.v_scale)  # a swapped scale fails the check
    out = pda.SPEC.new_output(inputs)
    pda.SPEC.launch(inputs, out, pda.SPEC.default_config(problem, dtype))
    assert relative_error(out, pda.SPEC.reference(inputs)) < pda.SPEC.tolerance[dtype]
    swapped = pda.PagedDecodeInputs(inputs.q, inputs.key_cache, inputs.value_cache, inputs.block_tables,
                                    inputs.context_lens, inputs.sm_scale, inputs.v_scale, inputs.k_scale)
    assert relative_error(out, pda.SPEC.reference(swapped)) > 10 * pda.SPEC.tolerance[dtype]


def test_the_plan_runs_fp8_caches_and_follows_new_scales():
    dtype = DTYPES[0]
    problem, full, quantized = _decode_pair(dtype, b=2)
    plan = pda.PagedDecodePlan(batch=2, num_heads=problem.h, num_kv_heads=problem.hkv, head_dim=problem.d,
                               block_size=problem.block_size, max_blocks=quantized.block_tables.shape[1],
                               max_context_len=problem.ctx, dtype=dtype, device=DEVICE, cache_dtype=FP8)
    args = (quantized.q, quantized.key_cache, quantized.value_cache, quantized.block_tables, quantized.context_lens)
    out = plan.run(*args, k_scale=quantized.k_scale, v_scale=quantized.v_scale)
    assert relative_error(out, pda.reference(quantized)) < pda.SPEC.tolerance[dtype]
    k_scale, v_scale = quantized.k_scale * 1.5, quantized.v_scale * 0.5  # scales are read on every run
    out = plan.run(*args, k_scale=k_scale, v_scale=v_scale).clone()
    rescaled = pda.PagedDecodeInputs(*args, quantized.sm_scale, k_scale, v_scale)
    assert relative_error(out, pda.reference(rescaled)) < pda.SPEC.tolerance[dtype]
    with pytest.raises(InputError, match="planned for torch.float8_e4m3fn"):
        plan.run(full.q, full.key_cache, full.value_cache, full.block_tables, full.context_lens)


# ------------------------------------------------------------------------------------------------
# Bad input: one clear InputError, caches untouched
# ------------------------------------------------------------------------------------------------


def _bad_scale_cases(hkv: int, scale: torch.Tensor, cache: torch.Tensor):
    return {
        "missing k_scale": (dict(v_scale=scale), "needs k_scale"),
        "missing both": ({}, "needs k_scale"),
        "python float": (dict(k_scale=0.5, v_scale=scale), "must be a torch.Tensor"),
        "bf16 scale": (dict(k_scale=scale.to(torch.bfloat16), v_scale=scale), "must be float32"),
        "wrong shape": (dict(k_scale=torch.ones(hkv + 1, device=DEVICE), v_scale=scale), r"has shape \[" + str(hkv + 1)),
        "2-D scale": (dict(k_scale=torch.ones(1, hkv, device=DEVICE), v_scale=scale), "has shape"),
    }


def test_bad_fp8_write_inputs_each_raise_one_clear_error_and_leave_the_caches_untouched():
    key, value, initial, slots, k_scale, v_scale = _write_case(DTYPES[0], False)
    hkv = key.shape[1]
    caches = initial.clone()
    cases = _bad_scale_cases(hkv, v_scale, caches)
    plain = initial.to(key.dtype)
    cases.update({
        "scales for a plain cache": (dict(caches=(plain[0], plain[1]), k_scale=k_scale, v_scale=v_scale),
                                     "scales belong to fp8"),
        "fp8 key cache, plain value cache": (dict(caches=(caches[0], plain[1]), k_scale=k_scale, v_scale=v_scale),
                                             "the two caches one"),
        "e5m2 cache": (dict(caches=(initial[0].view(torch.float8_e5m2), initial[1].view(torch.float8_e5m2)),
                            k_scale=k_scale, v_scale=v_scale), "float8_e5m2 caches are not supported"),
        "uint8 cache": (dict(caches=(initial[0].view(torch.uint8), initial[1].view(torch.uint8)),
                             k_scale=k_scale, v_scale=v_scale), "uint8 cache is ambiguous"),
    })
    for name, (kwargs, message) in cases.items():
        kwargs = dict(kwargs)
        key_cache, value_cache = kwargs.pop("caches", (caches[0], caches[1]))
        with pytest.raises(InputError, match=message):
            kvw.write_kv_cache(key, value, key_cache, value_cache, slots, **kwargs)
        assert torch.equal(caches.view(torch.uint8), initial.view(torch.uint8)), name


def test_bad_fp8_decode_inputs_each_raise_one_clear_error():
    problem, full, quantized = _decode_pair(DTYPES[0])
    args = (quantized.q, quantized.key_cache, quantized.value_cache, quantized.block_tables, quantized.context_lens)
    cases = _bad_scale_cases(problem.hkv, quantized.v_scale, quantized.key_cache)
    cases["scales for a plain cache"] = (dict(k_scale=quantized.k_scale, v_scale=quantized.v_scale,
                                              caches=(full.key_cache, full.value_cache)), "scales belong to fp8")
    cases["fp8 keys, plain values"] = (dict(k_scale=quantized.k_scale, v_scale=quantized.v_scale,
                                            caches=(quantized.key_cache, full.value_cache)), "share one dtype")
    cases["e5m2 cache"] = (dict(k_scale=quantized.k_scale, v_scale=quantized.v_scale,
                                caches=(quantized.key_cache.view(torch.float8_e5m2),
                                        quantized.value_cache.view(torch.float8_e5m2))), "float8_e5m2")
    for name, (kwargs, message) in cases.items():
        kwargs = dict(kwargs)
        kc, vc = kwargs.pop("caches", (args[1], args[2]))
        with pytest.raises(InputError, match=message):
            pda.paged_decode_attention(args[0], kc, vc, *args[3:], **kwargs)
    with pytest.raises(InputError, match="float8_e5m2"):
        pda.PagedDecodePlan(batch=3, num_heads=8, num_kv_heads=2, head_dim=64, block_size=16, max_blocks=19,
                            max_context_len=300, dtype=DTYPES[0], device=DEVICE, cache_dtype=torch.float8_e5m2)


# ------------------------------------------------------------------------------------------------
# The custom ops take the scales
# ------------------------------------------------------------------------------------------------


def test_the_custom_ops_take_fp8_caches_and_scales():
    key, value, initial, slots, k_scale, v_scale = _write_case(DTYPES[0], True)
    caches = initial.clone()
    torch.ops.omnitune.write_kv_cache(key, value, caches[0], caches[1], slots, "", k_scale, v_scale)
    assert torch.equal(caches.view(torch.uint8), _expected_caches(key, value, initial, slots, k_scale, v_scale))
    problem, full, quantized = _decode_pair(DTYPES[0])
    out = torch.ops.omnitune.paged_decode_attention(
        quantized.q, quantized.key_cache, quantized.value_cache, quantized.block_tables, quantized.context_lens,
        -1.0, problem.ctx, "", quantized.k_scale, quantized.v_scale)
    assert relative_error(out, pda.reference(quantized)) < pda.SPEC.tolerance[DTYPES[0]]


# opcheck's schema test compares tensors with arithmetic PyTorch does not implement for float8
# ("mul_cpu_reduced_float" not implemented for Float8_e4m3fn); the schema itself (the caches as
# mutated arguments) is the one tests/test_production_ops.py checks with every opcheck test.
FP8_OPCHECK_TESTS = ("test_faketensor", "test_aot_dispatch_dynamic", "test_autograd_registration")


def test_opcheck_passes_on_the_fp8_ops_where_it_can_run():
    key, value, initial, slots, k_scale, v_scale = _write_case(DTYPES[0], True)
    caches = initial.clone()
    torch.library.opcheck(torch.ops.omnitune.write_kv_cache.default,
                          (key, value, caches[0], caches[1], slots, "", k_scale, v_scale), test_utils=FP8_OPCHECK_TESTS)
    problem, full, quantized = _decode_pair(DTYPES[0])
    torch.library.opcheck(torch.ops.omnitune.paged_decode_attention.default,
                          (quantized.q, quantized.key_cache, quantized.value_cache, quantized.block_tables,
                           quantized.context_lens, -1.0, problem.ctx, "", quantized.k_scale, quantized.v_scale),
                          test_utils=FP8_OPCHECK_TESTS)


def test_a_function_writing_and_reading_an_fp8_cache_compiles_fullgraph():
    key, value, initial, slots, k_scale, v_scale = _write_case(DTYPES[0], False, hkv=2)
    problem, full, quantized = _decode_pair(DTYPES[0], b=2, h=4, hkv=2)
    kc, vc = quantized.key_cache.clone(), quantized.value_cache.clone()
    capacity = kc.shape[0] * kc.shape[1]
    slots = slots.clamp(max=capacity - 1)
    slots[slots >= 0] = torch.randperm(capacity)[: int((slots >= 0).sum())].to(slots)

    def step(q, key, value, slots, block_tables, lens):
        kvw.write_kv_cache(key, value, kc, vc, slots, k_scale=quantized.k_scale, v_scale=quantized.v_scale)
        return pda.paged_decode_attention(q, kc, vc, block_tables, lens, max_context_len=problem.ctx,
                                          k_scale=quantized.k_scale, v_scale=quantized.v_scale)

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    args = (quantized.q, key, value, slots, quantized.block_tables, quantized.context_lens)
    out = compiled(*args)
    after = pda.PagedDecodeInputs(quantized.q, kc, vc, quantized.block_tables, quantized.context_lens,
                                  quantized.sm_scale, quantized.k_scale, quantized.v_scale)
    assert relative_error(out, pda.reference(after)) < pda.SPEC.tolerance[DTYPES[0]]


# ------------------------------------------------------------------------------------------------
# On the GPU: bf16 on real shapes, captured in a CUDA graph, no host sync
# ------------------------------------------------------------------------------------------------


def _engine_step_inputs(b=16, h=28, hkv=4, ctx=4096, d=128, block_size=16, seed=0):
    """A decode batch over bf16 caches and the same tokens written into fp8 caches by
    write_kv_cache (per-tensor scales from the tokens), as an engine fills them."""
    problem = pda.PagedDecodeProblem(b=b, h=h, hkv=hkv, lq=1, ctx=ctx, d=d, block_size=block_size)
    full = pda.SPEC.make_inputs(problem, torch.bfloat16, "cuda", seed)
    kc = full.key_cache.masked_fill(full.key_cache.isinf(), 0)
    vc = full.value_cache.masked_fill(full.value_cache.isinf(), 0)
    k_scale, v_scale = _fp8.kv_cache_scale(kc), _fp8.kv_cache_scale(vc)
    kc8, vc8 = torch.zeros_like(kc, dtype=FP8), torch.zeros_like(vc, dtype=FP8)
    slots = torch.arange(kc.shape[0] * block_size, device="cuda")
    kvw.write_kv_cache(kc.flatten(0, 1), vc.flatten(0, 1), kc8, vc8, slots, k_scale=k_scale, v_scale=v_scale)
    return problem, full, pda.PagedDecodeInputs(full.q, kc8, vc8, full.block_tables, full.context_lens,
                                                full.sm_scale, k_scale, v_scale)


@pytest.mark.gpu
@pytest.mark.parametrize("ctx", [4096, 16384])
def test_write_then_decode_round_trip_in_bf16_on_real_shapes(ctx):
    problem, full, quantized = _engine_step_inputs(ctx=ctx, b=8)
    assert torch.equal(quantized.key_cache.view(torch.uint8),
                       _fp8.quantize(full.key_cache.masked_fill(full.key_cache.isinf(), 0),
                                     quantized.k_scale).view(torch.uint8))
    out8 = pda.paged_decode_attention(quantized.q, quantized.key_cache, quantized.value_cache, quantized.block_tables,
                                      quantized.context_lens, max_context_len=ctx, k_scale=quantized.k_scale,
                                      v_scale=quantized.v_scale, check=False)
    assert relative_error(out8, pda.reference(quantized)) < pda.SPEC.tolerance[torch.bfloat16]
    out = pda.paged_decode_attention(full.q, full.key_cache, full.value_cache, full.block_tables, full.context_lens,
                                     max_context_len=ctx, check=False)
    assert relative_error(out8, out) < FP8_VS_UNQUANTIZED


@pytest.mark.gpu
def test_fp8_write_and_decode_capture_replay_with_new_values_and_never_sync(monkeypatch):
    monkeypatch.setenv("OMNITUNE_CHECK", "0")
    problem, full, quantized = _engine_step_inputs(b=8, ctx=2048)
    kc8, vc8 = quantized.key_cache.clone(), quantized.value_cache.clone()
    plan = pda.PagedDecodePlan(batch=problem.b, num_heads=problem.h, num_kv_heads=problem.hkv, head_dim=problem.d,
                               block_size=problem.block_size, max_blocks=quantized.block_tables.shape[1],
                               max_context_len=problem.ctx, dtype=torch.bfloat16, device="cuda", cache_dtype=FP8)
    t = 64
    gen = torch.Generator().manual_seed(3)
    key = torch.randn(t, problem.hkv, problem.d, generator=gen).to("cuda", torch.bfloat16)
    value = torch.randn(t, problem.hkv, problem.d, generator=gen).to("cuda", torch.bfloat16)
    slots = torch.randperm(kc8.shape[0] * kc8.shape[1], generator=gen)[:t].to("cuda")
    lens = quantized.context_lens.clone()
    k_scale, v_scale = quantized.k_scale.clone(), quantized.v_scale.clone()

    def step():
        kvw.write_kv_cache(key, value, kc8, vc8, slots, k_scale=k_scale, v_scale=v_scale)
        return plan.run(quantized.q, kc8, vc8, quantized.block_tables, lens, k_scale=k_scale, v_scale=v_scale)

    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    graph, out = capture_graph(step)
    for _ in range(3):
        before_k, before_v = kc8.clone(), vc8.clone()
        key.copy_(torch.randn(key.shape, generator=gen).to(key))
        value.copy_(torch.randn(value.shape, generator=gen).to(value))
        lens.copy_(torch.randint(1, problem.ctx + 1, (problem.b,), generator=gen).to(torch.int32))
        k_scale.mul_(1.25)
        out.fill_(float("nan"))
        graph.replay()
        expected = before_k.view(torch.uint8).view(-1, problem.hkv, problem.d).clone()
        expected[slots] = _fp8.quantize(key, k_scale).view(torch.uint8)
        assert torch.equal(kc8.view(torch.uint8).view(-1, problem.hkv, problem.d), expected)
        expected_v = before_v.view(torch.uint8).view(-1, problem.hkv, problem.d).clone()
        expected_v[slots] = _fp8.quantize(value, v_scale).view(torch.uint8)
        assert torch.equal(vc8.view(torch.uint8).view(-1, problem.hkv, problem.d), expected_v)
        ref = pda.reference(pda.PagedDecodeInputs(quantized.q, kc8, vc8, quantized.block_tables, lens,
                                                  quantized.sm_scale, k_scale, v_scale))
        assert relative_error(out, ref) < pda.SPEC.tolerance[torch.bfloat16]


@pytest.mark.gpu
def test_fp8_write_and_decode_compile_fullgraph_with_inductor(monkeypatch):
    monkeypatch.setenv("OMNITUNE_CHECK", "0")
    problem, full, quantized = _engine_step_inputs(b=4, ctx=1024)
    kc8, vc8 = quantized.key_cache.clone(), quantized.value_cache.clone()
    key = torch.randn(16, problem.hkv, problem.d, device="cuda", dtype=torch.bfloat16)
    slots = torch.randperm(kc8.shape[0] * kc8.shape[1], device="cuda")[:16]

    def step(q, key, slots, lens):
        kvw.write_kv_cache(key, key * 0.5, kc8, vc8, slots, k_scale=quantized.k_scale, v_scale=quantized.v_scale)
        return pda.paged_decode_attention(q, kc8, vc8, quantized.block_tables, lens, max_context_len=problem.ctx,
                                          k_scale=quantized.k_scale, v_scale=quantized.v_scale)

    out = torch.compile(step, fullgraph=True)(quantized.q, key, slots, quantized.context_lens)
    ref = pda.reference(pda.PagedDecodeInputs(quantized.q, kc8, vc8, quantized.block_tables, quantized.context_lens,
                                              quantized.sm_scale, quantized.k_scale, quantized.v_scale))
    assert relative_error(out, ref) < pda.SPEC.tolerance[torch.bfloat16]

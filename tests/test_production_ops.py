"""The public ops as a serving engine calls them: torch.library registration and fake
implementations, torch.compile(fullgraph=True), bounds enforced inside the kernels when the
check mode is off (nothing outside the caches read or written, poisoned guard regions around
them), the paged-decode plan, and the config memo's bucketing and bound.

Kernels run under the interpreter on the CPU (fp32), on the GPU when there is one; the GPU-only
parts (CUDA graphs, sync debug mode, Inductor) are in test_production_ops_gpu.py."""

from __future__ import annotations

import math
import shutil

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from omnitune import runtime
from omnitune.errors import InputError
from omnitune.kernels import _dispatch
from omnitune.kernels import attention as attn
from omnitune.kernels import kv_cache_write as kvw
from omnitune.kernels import kv_compress as kvc
from omnitune.kernels import layers
from omnitune.kernels import paged_decode_attention as pda
from omnitune.spec import relative_error

OPS = ("attention", "write_kv_cache", "paged_decode_attention", "cross_attention_layer", "kv_importance")


def _rand(*shape, gen, device, dtype=torch.float32):
    return torch.randn(shape, generator=gen).to(device=device, dtype=dtype)


# ------------------------------------------------------------------------------------------------
# Registration and fake implementations
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", OPS)
def test_every_public_op_is_registered_in_the_omnitune_namespace(name):
    op = getattr(torch.ops.omnitune, name)
    assert op.default._schema.name == f"omnitune::{name}"


@pytest.mark.parametrize("name", OPS)
def test_every_op_goes_straight_to_its_function_on_every_backend(name):
    # Registered by define/impl (omnitune.kernels._library): the function on every backend, the
    # fake on Meta, and no autograd or ADInplaceOrView kernel of custom_op's, whose Python layers
    # a compiled graph would pay at every call.
    qualified = f"omnitune::{name}"
    assert torch._C._dispatch_has_kernel_for_dispatch_key(qualified, "CompositeExplicitAutograd")
    assert torch._C._dispatch_has_kernel_for_dispatch_key(qualified, "Meta")
    assert not any(torch._C._dispatch_has_kernel_for_dispatch_key(qualified, key)
                   for key in ("Autograd", "ADInplaceOrView"))


def test_the_cache_write_declares_its_in_place_mutation_and_returns_nothing():
    schema = str(torch.ops.omnitune.write_kv_cache.default._schema)
    import re

    assert re.search(r"Tensor\(\w+!\) key_cache", schema) and re.search(r"Tensor\(\w+!\) value_cache", schema)
    assert not re.search(r"Tensor\(\w+!\) (key|value|slot_mapping)\b", schema)
    assert schema.endswith("-> ()")
    for name in ("attention", "paged_decode_attention", "kv_importance"):
        assert "!" not in str(getattr(torch.ops.omnitune, name).default._schema)


def test_fake_implementations_give_shapes_and_dtypes_without_running_a_kernel():
    with FakeTensorMode():
        q = torch.empty(2, 8, 5, 64, dtype=torch.float16)
        kv = torch.empty(2, 2, 9, 64, dtype=torch.float16)
        out = torch.ops.omnitune.attention(q, kv, kv, None, True, -1.0, "")
        assert out.shape == q.shape and out.dtype == q.dtype

        cache = torch.empty(10, 16, 2, 64, dtype=torch.bfloat16)
        qd = torch.empty(3, 8, 1, 64, dtype=torch.bfloat16)
        tables = torch.empty(3, 4, dtype=torch.int32)
        lens = torch.empty(3, dtype=torch.int32)
        out = torch.ops.omnitune.paged_decode_attention(qd, cache, cache, tables, lens, -1.0, 64, "")
        assert out.shape == qd.shape and out.dtype == torch.bfloat16

        scores = torch.ops.omnitune.kv_importance(torch.empty(2, 4, 8, 32), torch.empty(2, 2, 40, 32), -1.0, "")
        assert scores.shape == (2, 2, 40) and scores.dtype == torch.float32

        x = torch.empty(2, 3, 256)
        layer_out = torch.ops.omnitune.cross_attention_layer(
            x, torch.empty(2, 7, 256), torch.empty(256, 256), torch.empty(128, 256), torch.empty(256, 256),
            None, None, None, 4, 1, None, "")
        assert layer_out.shape == x.shape


def _attention_args(device, gen):
    q = _rand(1, 4, 12, 64, gen=gen, device=device)
    k = _rand(1, 2, 20, 64, gen=gen, device=device)
    v = _rand(1, 2, 20, 64, gen=gen, device=device)
    spans = torch.tensor([[[3, 9], [12, 15]]], dtype=torch.int32, device=device)
    return q, k, v, spans


def _paged_args(device, gen, b=2, h=4, hkv=2, lq=1, d=32, block_size=8, max_blocks=4, num_blocks=10):
    q = _rand(b, h, lq, d, gen=gen, device=device)
    key_cache = _rand(num_blocks, block_size, hkv, d, gen=gen, device=device)
    value_cache = _rand(num_blocks, block_size, hkv, d, gen=gen, device=device)
    tables = torch.randperm(num_blocks, generator=gen)[: b * max_blocks].view(b, max_blocks).to(torch.int32)
    lens = torch.randint(lq, max_blocks * block_size + 1, (b,), generator=gen).to(torch.int32)
    return q, key_cache, value_cache, tables.to(device), lens.to(device)


def test_opcheck_passes_on_attention_paged_decode_and_importance(device):
    gen = torch.Generator().manual_seed(0)
    q, k, v, spans = _attention_args(device, gen)
    torch.library.opcheck(torch.ops.omnitune.attention.default, (q, k, v, spans, True, -1.0, ""))
    args = _paged_args(device, gen)
    torch.library.opcheck(torch.ops.omnitune.paged_decode_attention.default, (*args, -1.0, 32, ""))
    torch.library.opcheck(torch.ops.omnitune.kv_importance.default,
                          (_rand(1, 4, 8, 32, gen=gen, device=device), _rand(1, 2, 40, 32, gen=gen, device=device),
                           -1.0, ""))


def test_opcheck_passes_on_the_in_place_cache_write(device):
    gen = torch.Generator().manual_seed(1)
    key, value = _rand(6, 2, 32, gen=gen, device=device), _rand(6, 2, 32, gen=gen, device=device)
    kc, vc = _rand(4, 4, 2, 32, gen=gen, device=device), _rand(4, 4, 2, 32, gen=gen, device=device)
    slots = torch.tensor([3, -1, 0, 9, 15, 7], dtype=torch.int64, device=device)
    torch.library.opcheck(torch.ops.omnitune.write_kv_cache.default, (key, value, kc, vc, slots, ""))


# ------------------------------------------------------------------------------------------------
# torch.compile(fullgraph=True): Dynamo traces callers of the public functions without a break
# ------------------------------------------------------------------------------------------------


# Inductor as well as aot_eager: the backend serving engines compile with, which re-inplaces the
# cache write's functionalized mutation (on the CPU it needs a C++ compiler).
@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.skipif(
    shutil.which("g++") is None and shutil.which("clang++") is None, reason="Inductor on the CPU needs a C++ compiler"))])
def test_a_function_calling_every_op_compiles_fullgraph_and_matches_eager(device, backend):
    gen = torch.Generator().manual_seed(2)
    q, k, v, spans = _attention_args(device, gen)
    pq, kc, vc, tables, lens = _paged_args(device, gen)
    new_k, new_v = _rand(2, 2, 32, gen=gen, device=device), _rand(2, 2, 32, gen=gen, device=device)
    slots = torch.tensor([5, 17], dtype=torch.int64, device=device)
    plan = pda.PagedDecodePlan(batch=2, num_heads=4, num_kv_heads=2, head_dim=32, block_size=8, max_blocks=4,
                               max_context_len=32, dtype=torch.float32, device=device)
    x, wq, wkv, wo = (_rand(2, 3, 128, gen=gen, device=device), _rand(128, 128, gen=gen, device=device) * 0.05,
                      _rand(128, 128, gen=gen, device=device) * 0.05, _rand(128, 128, gen=gen, device=device) * 0.05)
    x_kv = _rand(2, 5, 128, gen=gen, device=device)

    def step(kc, vc):
        a = attn.attention(q, k, v, causal=True, mm_spans=spans)
        kvw.write_kv_cache(new_k, new_v, kc, vc, slots)
        d1 = pda.paged_decode_attention(pq, kc, vc, tables, lens, max_context_len=32)
        d2 = plan.run(pq, kc, vc, tables, lens)
        lay = layers.cross_attention_layer(x, x_kv, wq, wkv, wo, heads=2, kv_heads=1)
        imp = kvc.kv_importance(q, k)
        return a, d1, d2.clone(), lay, imp

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, backend=backend)
    kc_c, vc_c = kc.clone(), vc.clone()
    got = compiled(kc_c, vc_c)
    want = step(kc, vc)
    for g, w in zip(got, want):
        assert relative_error(g, w) < 1e-5
    assert torch.equal(kc_c, kc) and torch.equal(vc_c, vc)  # the in-place write happened in both


def test_attention_with_span_lists_compiles_fullgraph_and_matches_eager(device):
    """mm_spans given as lists (one list of [start, end) per sequence, as a serving engine keeps
    them) under torch.compile(fullgraph=True): the lists were turned into a tensor through a memo and
    max(..., default=0), which Dynamo cannot trace, and every such call failed to compile."""
    gen = torch.Generator().manual_seed(6)
    q = _rand(2, 4, 12, 64, gen=gen, device=device)
    k, v = _rand(2, 2, 20, 64, gen=gen, device=device), _rand(2, 2, 20, 64, gen=gen, device=device)

    def step(spans):
        return attn.attention(q, k, v, causal=True, mm_spans=spans)

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    plain_causal = step(None)
    # Queries sit at key positions 8..19 (bottom-right causal): spans there change what they see.
    for spans in ([[(10, 16)], []], [[(9, 14), (15, 19)], [(12, 18)]], [[], []], [[(11, 17)], [(13, 19), (8, 10)]]):
        out = torch.full_like(q, math.nan)
        out.copy_(compiled(spans))
        assert relative_error(out, step(spans)) < 1e-5, spans
        assert (relative_error(out, plain_causal) > 1e-3) == any(spans), spans


def test_the_traced_bucket_is_the_eager_one_for_every_length():
    import random

    rng = random.Random(3)
    lengths = [*range(1, 5000), *(rng.randrange(5000, 2**31) for _ in range(3000)), 2**31 - 1]
    assert [_dispatch.traced_bucket_up(n) for n in lengths] == [_dispatch.bucket_up(n) for n in lengths]


def test_a_compiled_decode_loop_compiles_once_a_bucket_of_its_lengths(device):
    """A decode step compiled with its longest context as an argument, called as a loop calls it
    (one token longer each step): one graph a bucket of lengths, every step right. The length was
    turned into a host int, and the bucket memoised, both of which Dynamo guarded on: a new graph
    every step, until its recompile limit sent the loop back to eager."""
    from torch._dynamo.testing import CompileCounter

    gen = torch.Generator().manual_seed(5)
    q, kc, vc, tables, _ = _paged_args(device, gen, max_blocks=6, num_blocks=14)

    def step(lens, longest):
        return pda.paged_decode_attention(q, kc, vc, tables, lens, max_context_len=longest)

    torch._dynamo.reset()
    counter = CompileCounter()
    compiled = torch.compile(step, fullgraph=True, backend=counter)
    lengths = range(17, 41)  # 24 steps over the buckets 17, 18, 20, 24, 28, 32, 40
    for longest in lengths:
        lens = torch.tensor([longest, max(longest - 9, 1)], dtype=torch.int32, device=device)
        out = torch.full_like(q, math.nan)
        out.copy_(compiled(lens, longest))
        assert relative_error(out, step(lens, longest)) < 1e-5, longest
    buckets = {_dispatch.bucket_up(n) for n in lengths}
    assert counter.frame_count <= len(buckets) + 1, (counter.frame_count, sorted(buckets))  # + the first, static


# ------------------------------------------------------------------------------------------------
# Bounds inside the kernels: with the check off, bad values are masked, never followed
# ------------------------------------------------------------------------------------------------


def _guarded(shape, guard, gen, device, fill):
    """A tensor of `shape` that is a view into a larger buffer with `guard` poisoned rows on each
    side of its first dimension, and the whole buffer (to check the guards afterwards)."""
    whole = torch.full((shape[0] + 2 * guard, *shape[1:]), fill, dtype=torch.float32, device=device)
    inner = whole[guard: guard + shape[0]]
    inner.copy_(_rand(*shape, gen=gen, device=device))
    return inner, whole


def test_unchecked_cache_write_skips_slots_past_the_cache_and_touches_no_guard(device):
    gen = torch.Generator().manual_seed(3)
    num_blocks, block_size, hkv, d, guard = 3, 4, 2, 32, 2
    kc, k_whole = _guarded((num_blocks, block_size, hkv, d), guard, gen, device, float("nan"))
    vc, v_whole = _guarded((num_blocks, block_size, hkv, d), guard, gen, device, float("nan"))
    key, value = _rand(6, hkv, d, gen=gen, device=device), _rand(6, hkv, d, gen=gen, device=device)
    capacity = num_blocks * block_size
    slots = torch.tensor([1, capacity, -3, capacity + 5, 7, 10**6], dtype=torch.int64, device=device)
    expected_k, expected_v = kc.clone(), vc.clone()
    expected_k.view(-1, hkv, d)[[1, 7]] = key[[0, 4]]
    expected_v.view(-1, hkv, d)[[1, 7]] = value[[0, 4]]
    guards_before = k_whole[:guard].clone(), k_whole[-guard:].clone()

    kvw.write_kv_cache(key, value, kc, vc, slots, check=False)

    assert torch.equal(kc, expected_k) and torch.equal(vc, expected_v)
    assert k_whole[:guard].isnan().all() and k_whole[-guard:].isnan().all()
    assert v_whole[:guard].isnan().all() and v_whole[-guard:].isnan().all()
    assert guards_before[0].isnan().all() and guards_before[1].isnan().all()


def test_check_mode_refuses_the_same_slots_with_the_caches_untouched(device):
    gen = torch.Generator().manual_seed(4)
    kc, vc = _rand(3, 4, 2, 32, gen=gen, device=device), _rand(3, 4, 2, 32, gen=gen, device=device)
    before = kc.clone()
    key = _rand(2, 2, 32, gen=gen, device=device)
    slots = torch.tensor([1, 12], dtype=torch.int64, device=device)
    with pytest.raises(InputError, match="past the cache"):
        kvw.write_kv_cache(key, key, kc, vc, slots, check=True)
    assert torch.equal(kc, before)


def _paged_reference(q, key_cache, value_cache, tables, lens, sm_scale, masked_pages=False):
    """Decode attention where out-of-range block numbers are clamped into the cache (or, with
    masked_pages, their keys masked out) and lengths clamped to [0, capacity]: what the kernels
    promise for bad values. float64."""
    b, h, lq, d = q.shape
    num_blocks, block_size, hkv, _ = key_cache.shape
    capacity = tables.shape[1] * block_size
    group = h // hkv
    out = torch.zeros((b, h, lq, d), dtype=torch.float64)
    for bi in range(b):
        ctx = min(max(int(lens[bi]), 0), capacity)
        if ctx == 0:
            continue
        pos = torch.arange(ctx)
        pages = tables[bi].cpu().to(torch.int64)[pos // block_size]
        page_ok = (pages >= 0) & (pages < num_blocks) if masked_pages else torch.ones_like(pages, dtype=torch.bool)
        safe = pages.clamp(0, num_blocks - 1)
        keys = key_cache.cpu().double()[safe, pos % block_size]      # [ctx, hkv, d]
        values = value_cache.cpu().double()[safe, pos % block_size]
        for head in range(h):
            hk = head // group
            scores = q[bi, head].cpu().double() @ keys[:, hk].T * sm_scale  # [lq, ctx]
            qpos = torch.arange(lq) + ctx - lq
            visible = (pos[None, :] <= qpos[:, None]) & page_ok[None, :]
            scores = scores.masked_fill(~visible, float("-inf"))
            probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
            out[bi, head] = probs @ values[:, hk]
    return out


@pytest.mark.parametrize("page_guard", [2, 1], ids=["clamped-pages", "masked-pages"])
@pytest.mark.parametrize("splits", [1, 4], ids=["one-split", "four-splits"])
@pytest.mark.parametrize("fused", [False, True], ids=["combine-kernel", "in-launch"])
def test_unchecked_decode_never_follows_bad_block_numbers_and_clamps_lengths(page_guard, splits, fused, device,
                                                                              monkeypatch):
    if fused and splits == 1:
        pytest.skip("one split has nothing to combine")
    monkeypatch.setattr(pda, "PAGE_GUARD", [page_guard])
    gen = torch.Generator().manual_seed(5)
    b, h, hkv, lq, d, block_size, max_blocks, num_blocks, guard = 4, 4, 2, 2, 32, 8, 3, 8, 2
    kc, k_whole = _guarded((num_blocks, block_size, hkv, d), guard, gen, device, float("nan"))
    vc, _ = _guarded((num_blocks, block_size, hkv, d), guard, gen, device, float("nan"))
    q = _rand(b, h, lq, d, gen=gen, device=device)
    tables = torch.tensor([[0, 1, 2], [3, -1, 4], [5, num_blocks, 6], [7, 10**6, -(10**6)]],
                          dtype=torch.int32, device=device)
    # lengths: normal, past the capacity (24), negative, and shorter than the queries
    lens = torch.tensor([20, 10**5, -7, 1], dtype=torch.int32, device=device)
    config = pda.SPEC.default_config(pda.PagedDecodeProblem(b=b, h=h, hkv=hkv, lq=lq, ctx=24, d=d,
                                                            block_size=block_size), torch.float32)
    config = config.replace(NUM_SPLITS=splits, FUSED_REDUCE=fused, BLOCK_N=16)
    out = pda.paged_decode_attention(q, kc, vc, tables, lens, config=config, check=False)
    want = _paged_reference(q, kc, vc, tables, lens, 1 / math.sqrt(d), masked_pages=page_guard == 1)
    assert torch.isfinite(out).all(), "a guard (NaN) was read, or a row without keys was not zeroed"
    assert relative_error(out.cpu(), want) < 1e-4
    assert k_whole[:guard].isnan().all() and k_whole[-guard:].isnan().all()


@pytest.mark.parametrize("splits", [1, 4], ids=["one-split", "four-splits"])
def test_decode_with_64_bit_row_offsets_matches_the_reference(splits, device, monkeypatch):
    """The rows inside a page in 64 bits, the path of caches whose slots lie 2^31 elements apart
    (here forced with the bound lowered), over a slot-major cache viewed block-major."""
    monkeypatch.setattr(pda, "_ROWS_32_LIMIT", 1)
    monkeypatch.setattr(pda, "_steady", {})  # no launch remembered with 32-bit rows
    fits, rows_fit_32 = [], pda._rows_fit_32
    monkeypatch.setattr(pda, "_rows_fit_32", lambda *args: fits.append(rows_fit_32(*args)) or fits[-1])
    gen = torch.Generator().manual_seed(11)
    b, h, hkv, lq, d, block_size, max_blocks, num_blocks = 3, 4, 2, 1, 32, 8, 3, 9
    kc = _rand(block_size, num_blocks, hkv, d, gen=gen, device=device).transpose(0, 1)
    vc = _rand(block_size, num_blocks, hkv, d, gen=gen, device=device).transpose(0, 1)
    q = _rand(b, h, lq, d, gen=gen, device=device)
    tables = torch.randperm(num_blocks, generator=gen)[: b * max_blocks].view(b, max_blocks)
    tables = tables.to(device=device, dtype=torch.int32)
    lens = torch.tensor([24, 13, 7], dtype=torch.int32, device=device)
    config = pda.SPEC.default_config(pda.PagedDecodeProblem(b=b, h=h, hkv=hkv, lq=lq, ctx=24, d=d,
                                                            block_size=block_size), torch.float32)
    config = config.replace(NUM_SPLITS=splits, BLOCK_N=16)
    out = pda.paged_decode_attention(q, kc, vc, tables, lens, config=config, check=False)
    assert fits == [False]
    assert relative_error(out.cpu(), _paged_reference(q, kc, vc, tables, lens, 1 / math.sqrt(d))) < 1e-4


@pytest.mark.gpu
@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float8_e4m3fn], ids=["bf16", "fp8"])
def test_a_cache_whose_slots_lie_2_31_elements_apart_is_read_where_it_is(cache_dtype):
    """A slot-major cache viewed block-major with (block_size − 1) × its slot stride past 2^31
    elements: 32-bit row offsets would wrap and read elsewhere (or fault); the op takes 64-bit ones.
    The pages read are the last ones, whose rows lie farthest out."""
    gen = torch.Generator().manual_seed(12)
    b, h, hkv, d, block_size, pages = 2, 8, 1, 128, 16, 4
    num_blocks = 2**31 // ((block_size - 1) * hkv * d) + 8
    slot_major = torch.empty(block_size, num_blocks, hkv, d, dtype=cache_dtype, device="cuda")
    kc, vc = slot_major.transpose(0, 1), torch.empty_like(slot_major).transpose(0, 1)
    assert (block_size - 1) * kc.stride(1) >= 2**31
    tables = torch.arange(num_blocks - b * pages, num_blocks, dtype=torch.int32).view(b, pages).cuda()
    used = tables.view(-1).long()
    scales = {}
    for cache, name in ((kc, "k_scale"), (vc, "v_scale")):
        values = _rand(b * pages, block_size, hkv, d, gen=gen, device="cuda")
        if cache_dtype == torch.float8_e4m3fn:
            scale = torch.tensor([0.02], device="cuda")
            scales[name] = scale
            values = (values / scale).clamp(-448, 448)
        cache.view(torch.uint8)[used] = values.to(cache_dtype).view(torch.uint8)
    q = _rand(b, h, 1, d, gen=gen, device="cuda", dtype=torch.bfloat16)
    lens = torch.tensor([pages * block_size, pages * block_size - 5], dtype=torch.int32, device="cuda")
    out = pda.paged_decode_attention(q, kc, vc, tables, lens, **scales)
    k_ref = kc[used].float() * scales.get("k_scale", 1.0)
    v_ref = vc[used].float() * scales.get("v_scale", 1.0)
    local = torch.arange(b * pages, dtype=torch.int32, device="cuda").view(b, pages)
    want = _paged_reference(q.float(), k_ref, v_ref, local, lens, 1 / math.sqrt(d))
    assert relative_error(out.float().cpu(), want) < 2e-2  # bf16 q and output


def test_check_mode_refuses_bad_lengths_and_block_numbers(device):
    gen = torch.Generator().manual_seed(6)
    q, kc, vc, tables, lens = _paged_args(device, gen)
    bad_lens = lens.clone()
    bad_lens[0] = 10**4
    with pytest.raises(InputError, match="capacity"):
        pda.paged_decode_attention(q, kc, vc, tables, bad_lens, check=True)
    bad_tables = tables.clone()
    bad_tables[1, 0] = -2
    with pytest.raises(InputError, match="not a block of the cache"):
        pda.paged_decode_attention(q, kc, vc, bad_tables, lens, check=True)
    with pytest.raises(InputError, match="exceeds max_context_len"):
        pda.paged_decode_attention(q, kc, vc, tables, lens.clamp(min=9), max_context_len=8, check=True)
    with pytest.raises(InputError, match="max_context_len"):
        pda.paged_decode_attention(q, kc, vc, tables, lens, max_context_len=10**6)


def test_unchecked_spans_past_the_keys_are_clamped_and_lists_equal_tensors(device):
    gen = torch.Generator().manual_seed(7)
    q, k, v, _ = _attention_args(device, gen)
    lk = k.shape[2]
    wild = torch.tensor([[[14, 10**6], [-5, 2]]], dtype=torch.int32, device=device)
    out = attn.attention(q, k, v, causal=True, mm_spans=wild, check=False)
    clamped = torch.tensor([[[14, lk], [-5, 2]]], dtype=torch.int32, device=device)
    want = attn.reference(attn.AttentionInputs(q, k, v, True, 1 / 8.0, clamped))
    assert relative_error(out.double().cpu(), want.cpu()) < 1e-4
    with pytest.raises(InputError, match="0 ≤ start ≤ end"):
        attn.attention(q, k, v, causal=True, mm_spans=wild, check=True)
    as_list = attn.attention(q, k, v, causal=True, mm_spans=[[(14, lk), (0, 2)]])
    as_tensor = attn.attention(q, k, v, causal=True,
                               mm_spans=torch.tensor([[[14, lk], [0, 2]]], dtype=torch.int32, device=device))
    assert torch.equal(as_list, as_tensor)


def test_span_lists_are_copied_once_and_the_cache_is_bounded(device):
    attn._span_tensors.clear()
    first = attn.span_tensor([[(1, 3)]], 1, device)
    assert attn.span_tensor([[(1, 3)]], 1, device) is first
    for i in range(attn._SPAN_TENSORS_KEPT + 5):
        attn.span_tensor([[(0, i)]], 1, device)
    assert len(attn._span_tensors) <= attn._SPAN_TENSORS_KEPT
    with pytest.raises(InputError, match="pairs of ints"):
        attn.span_tensor([[("a", 3)]], 1, device)
    with pytest.raises(InputError, match="batch has 2"):
        attn.span_tensor([[(0, 1)]], 2, device)


# ------------------------------------------------------------------------------------------------
# The paged-decode plan
# ------------------------------------------------------------------------------------------------


def test_plan_run_matches_the_function_and_follows_new_lengths(device):
    gen = torch.Generator().manual_seed(8)
    q, kc, vc, tables, lens = _paged_args(device, gen, b=3, h=4, hkv=1, lq=2, num_blocks=14)
    plan = pda.PagedDecodePlan(batch=3, num_heads=4, num_kv_heads=1, head_dim=32, block_size=8, max_blocks=4,
                               max_context_len=32, dtype=torch.float32, device=device, query_tokens=2,
                               config={"NUM_SPLITS": 2, "BLOCK_N": 16})
    for step in range(3):
        lens = torch.randint(2, 33, (3,), generator=gen).to(torch.int32).to(device)
        out = plan.run(q, kc, vc, tables, lens)
        assert out is plan.out
        want = pda.paged_decode_attention(q, kc, vc, tables, lens, config=plan.config)
        assert torch.equal(out, want), f"step {step}"
        assert relative_error(out.cpu().double(), _paged_reference(q, kc, vc, tables, lens, 1 / math.sqrt(32))) < 1e-4


def test_plan_refuses_tensors_of_other_shapes_and_impossible_plans(device):
    gen = torch.Generator().manual_seed(9)
    q, kc, vc, tables, lens = _paged_args(device, gen)
    plan = pda.PagedDecodePlan(batch=2, num_heads=4, num_kv_heads=2, head_dim=32, block_size=8, max_blocks=4,
                               max_context_len=32, dtype=torch.float32, device=device)
    with pytest.raises(InputError, match="as planned"):
        plan.run(q[:1], kc, vc, tables[:1], lens[:1])
    with pytest.raises(InputError, match="block tables"):
        plan.run(q, kc, vc, tables[:, :2], lens)
    with pytest.raises(InputError, match="capacity"):
        pda.PagedDecodePlan(batch=2, num_heads=4, num_kv_heads=2, head_dim=32, block_size=8, max_blocks=4,
                            max_context_len=33, dtype=torch.float32, device=device)
    with pytest.raises(InputError, match="multiple"):
        pda.PagedDecodePlan(batch=2, num_heads=5, num_kv_heads=2, head_dim=32, block_size=8, max_blocks=4,
                            max_context_len=32, dtype=torch.float32, device=device)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without a CUDA GPU")
def test_a_plan_for_cuda_without_a_gpu_is_one_clear_error():
    with pytest.raises(InputError, match="no CUDA GPU is visible here"):  # was torch's AssertionError
        pda.PagedDecodePlan(batch=1, num_heads=2, num_kv_heads=1, head_dim=32, block_size=8, max_blocks=2,
                            max_context_len=16, dtype=torch.float32, device="cuda")


# ------------------------------------------------------------------------------------------------
# The config memo: bucketing, its bound, invalidation
# ------------------------------------------------------------------------------------------------


def test_buckets_are_four_per_octave_and_never_below_the_length():
    assert [_dispatch.bucket_up(n) for n in (1, 16, 17, 20, 21, 1024, 1025, 1280, 1281, 4096)] == \
        [1, 16, 20, 20, 24, 1024, 1280, 1280, 1536, 4096]
    for n in range(1, 5000):
        bucket = _dispatch.bucket_up(n)
        assert n <= bucket <= max(n, 16) * 1.25 + 1
    # consecutive decode steps share one bucket for a long stretch
    assert len({_dispatch.bucket_up(n) for n in range(4097, 5120)}) == 1


def test_decode_steps_with_growing_lengths_reuse_one_memo_entry(device, monkeypatch):
    calls = []
    real = runtime.get_config

    def counting(kernel, problem, dtype=None, device_name=None):
        calls.append(problem)
        return real(kernel, problem, dtype, device_name)

    monkeypatch.setattr(runtime, "get_config", counting)
    pda._memo.clear()
    gen = torch.Generator().manual_seed(10)
    q, kc, vc, tables, lens = _paged_args(device, gen)
    for ctx in range(17, 21):
        pda.paged_decode_attention(q, kc, vc, tables, lens.clamp(max=ctx), max_context_len=ctx)
    assert len(calls) == 1 and calls[0].ctx == 20


def test_memo_is_bounded_and_forgets_after_clear_cache(monkeypatch):
    memo = _dispatch.ConfigMemo("kv_cache_write")
    monkeypatch.setattr(_dispatch, "MEMO_ENTRIES", 8)
    for t in range(1, 30):
        memo.get((t, 2, 64, 16), None, lambda t=t: kvw.KVCacheWriteProblem(t=t, hkv=2, d=64), torch.float16)
        assert len(memo._configs) <= 8
    key = (5, 2, 64, 16)
    memo.get(key, None, lambda: kvw.KVCacheWriteProblem(t=5, hkv=2, d=64), torch.float16)
    runtime.clear_cache()
    made = []
    memo.get(key, None, lambda: made.append(1) or kvw.KVCacheWriteProblem(t=5, hkv=2, d=64), torch.float16)
    assert made == [1]


def test_a_caller_mapping_config_is_validated_once_per_key(device):
    gen = torch.Generator().manual_seed(11)
    key = _rand(4, 2, 32, gen=gen, device=device)
    kc, vc = _rand(2, 4, 2, 32, gen=gen, device=device), _rand(2, 4, 2, 32, gen=gen, device=device)
    slots = torch.arange(4, dtype=torch.int64, device=device)
    from omnitune.errors import ConfigError

    with pytest.raises(ConfigError, match="BLOCK_T"):
        kvw.write_kv_cache(key, key, kc, vc, slots, config={"BLOCK_T": 3})
    with pytest.raises(ConfigError, match="block_t_exceeds_tokens"):
        kvw.write_kv_cache(key, key, kc, vc, slots, config={"BLOCK_T": 64})


# ------------------------------------------------------------------------------------------------
# The direct launcher's key: at least as fine as Triton's specialisation
# ------------------------------------------------------------------------------------------------


def test_launch_key_separates_what_triton_specialises_on():
    from omnitune.kernels._launch import _arg_key

    base = torch.zeros(64, dtype=torch.float16)
    assert _arg_key(base) == _arg_key(torch.ones(64, dtype=torch.float16))
    assert _arg_key(base) != _arg_key(torch.zeros(64, dtype=torch.bfloat16))  # dtype
    assert _arg_key(base) != _arg_key(base[1:])                                # 16-byte alignment
    assert _arg_key(base[8:]) == _arg_key(base)                                # 16 bytes on: aligned again
    for a, b in ((1, 2), (16, 17), (2 ** 31 - 16, 2 ** 31)):
        assert _arg_key(a) != _arg_key(b)
    with pytest.raises(TypeError):
        _arg_key(object())


# ------------------------------------------------------------------------------------------------
# Backend selection: the op dispatches to the backend its config names
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["sdpa", "sdpa_cudnn"])
def test_attention_dispatches_to_sdpa_when_its_config_says_so(backend, device, monkeypatch):
    gen = torch.Generator().manual_seed(12)
    q, k, v, spans = _attention_args(device, gen)
    calls = []
    real = attn.sdpa
    monkeypatch.setattr(attn, "sdpa", lambda *a: calls.append(a[-1]) or real(*a))
    out = attn.attention(q, k, v, causal=True, config={"BACKEND": backend})
    assert calls == [backend]
    want = attn.reference(attn.AttentionInputs(q, k, v, True, 1 / 8.0))
    assert relative_error(out.double().cpu(), want.cpu()) < 1e-4
    # with spans SDPA would need a dense mask: the kernel runs them
    calls.clear()
    with_spans = attn.attention(q, k, v, causal=True, mm_spans=spans, config={"BACKEND": backend})
    assert calls == []
    want = attn.reference(attn.AttentionInputs(q, k, v, True, 1 / 8.0, spans))
    assert relative_error(with_spans.double().cpu(), want.cpu()) < 1e-4


def test_an_sdpa_backend_parks_the_kernels_parameters_and_refuses_spans():
    p = attn.AttentionProblem(b=1, h=4, hkv=2, lq=64, lk=64, d=64, causal=True)
    sdpa = attn.SPEC.complete_config({"BACKEND": "sdpa"}, p, torch.float16)
    assert sdpa == attn.park_ignored(sdpa) and not attn.SPEC.violations(p, sdpa, torch.float16)
    unparked = sdpa.replace(BLOCK_M=64)
    assert [n for n, _ in attn.SPEC.violations(p, unparked, torch.float16)] == ["backend_parks_the_rest"]
    spans = attn.AttentionProblem(b=1, h=4, hkv=2, lq=64, lk=64, d=64, causal=True, spans=1, span_len=8)
    assert attn.SPEC.violations(spans, sdpa, torch.float16)
    # causal rows that see no key (Lq > Lk): SDPA serves them too, as zeros (test_attention)
    assert not attn.SPEC.violations(attn.AttentionProblem(b=1, h=4, hkv=2, lq=80, lk=64, d=64, causal=True),
                                    sdpa, torch.float16)


def test_finalists_and_verify_see_the_backends():
    assert {b["BACKEND"] for b in attn.SPEC.backends} == {"sdpa", "sdpa_cudnn"}
    for values in attn.SPEC.backends:
        assert values in attn.SPEC.known_good  # measured early by every search


def test_bf16_under_the_interpreter_is_refused_not_computed_wrongly():
    if torch.cuda.is_available():
        pytest.skip("the interpreter's case: CPU tensors")
    q = torch.randn(1, 2, 8, 64, dtype=torch.bfloat16)
    with pytest.raises(InputError, match="interpreter computes bf16 wrongly"):
        attn.attention(q, q, q)
    key = torch.randn(2, 2, 32, dtype=torch.bfloat16)
    cache = torch.zeros(2, 4, 2, 32, dtype=torch.bfloat16)
    with pytest.raises(InputError, match="interpreter computes bf16 wrongly"):
        kvw.write_kv_cache(key, key, cache, cache, torch.arange(2))


def test_an_sdpa_backend_that_refuses_a_call_falls_back_to_the_kernel_with_one_warning(device, monkeypatch, caplog):
    gen = torch.Generator().manual_seed(13)
    q, k, v, _ = _attention_args(device, gen)
    attn._sdpa_refused.clear()
    attn._refusals_logged.clear()

    def refuses(*args):
        raise RuntimeError("No available kernel. Aborting execution.")

    monkeypatch.setattr(attn, "sdpa", refuses)
    with caplog.at_level("WARNING", logger="omnitune.runtime"):
        for queries in (q, q, q[:, :, 1:]):  # one line for the reason, not one per shape it holds for
            want = attn.reference(attn.AttentionInputs(queries, k, v, True, 1 / 8.0))
            out = attn.attention(queries, k, v, causal=True, config={"BACKEND": "sdpa_cudnn"})
            assert relative_error(out.double().cpu(), want.cpu()) < 1e-4
    assert len([r for r in caplog.records if "refused" in r.getMessage()]) == 1
    assert len(attn._sdpa_refused) == 2  # each shape runs this kernel from its first refusal on


def test_a_plan_with_the_in_launch_combine_owns_its_tickets(device):
    gen = torch.Generator().manual_seed(14)
    q, kc, vc, tables, lens = _paged_args(device, gen, b=3, h=4, hkv=1, lq=2, num_blocks=14)
    plan = pda.PagedDecodePlan(batch=3, num_heads=4, num_kv_heads=1, head_dim=32, block_size=8, max_blocks=4,
                               max_context_len=32, dtype=torch.float32, device=device, query_tokens=2,
                               config={"NUM_SPLITS": 2, "BLOCK_N": 16, "FUSED_REDUCE": True})
    assert plan._scratch.tickets is not None and plan._scratch.tickets.numel() == 3  # packed: one per kv head column
    assert all(plan._scratch.tickets is not shared for shared in pda._tickets.values())
    for _ in range(2):  # the tickets reset themselves: a second run is right too
        out = plan.run(q, kc, vc, tables, lens)
        assert relative_error(out.cpu().double(), _paged_reference(q, kc, vc, tables, lens, 1 / math.sqrt(32))) < 1e-4

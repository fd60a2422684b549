"""Views whose rows, heads or head-dim elements lie 2^31 elements or more apart: the kernels' offsets
there are 32-bit, so the host takes such an input as a contiguous copy and refuses such an output
(omnitune.kernels._host.INT32_OFFSETS). On the CPU the bound is lowered so that small views cross
it and each op's decision is checked end to end against a reference; on the GPU real 2^31 views."""

from __future__ import annotations

import math

import pytest
import torch

from omnitune.errors import InputError
from omnitune.kernels import _host, layers
from omnitune.kernels import attention as attn
from omnitune.kernels import cross_attention_layer as layer_kernel
from omnitune.kernels import kv_cache_write as kvw
from omnitune.kernels import kv_compress as kvc
from omnitune.kernels import paged_decode_attention as pda
from omnitune.spec import relative_error

BOUND = 2**31


def _meta(shape, stride):
    return torch.empty(0, device="meta").as_strided(shape, stride)


def test_what_passes_32_bits_is_index_times_a_32_bit_stride_summed():
    heads_apart = 2**30 + 1024
    assert _host.offsets_pass_int32(_meta((1, 2, 3, 16), (0, 16, heads_apart, 1)), (2, 3))  # 2 × stride
    assert not _host.offsets_pass_int32(_meta((1, 2, 2, 16), (0, 16, heads_apart, 1)), (2, 3))  # 1 × stride
    assert not _host.offsets_pass_int32(_meta((1, 2, 3, 16), (0, 16, BOUND, 1)), (2, 3))  # a 64-bit stride
    # two dims each below the bound whose sum is not
    assert _host.offsets_pass_int32(_meta((2, 2), (2**30, 2**30)), (0, 1))
    assert not _host.offsets_pass_int32(_meta((2, 2), (2**30, 2**30)), (0,))
    assert not _host.offsets_pass_int32(_meta((1, 0, 5), (0, 2**31 - 1, 1)), (1, 2))  # nothing there


@pytest.fixture
def small_bound(monkeypatch):
    """A bound of 256 elements: small views cross it as real ones cross 2^31 (contiguous ones of
    four rows of 64 do not: 3 × 64 + 63 < 256)."""
    monkeypatch.setattr(_host, "INT32_OFFSETS", 256)
    monkeypatch.setattr(layer_kernel, "INT32_OFFSETS", 256)
    monkeypatch.setattr(kvw, "_steady", {})
    return 256


def _rand(*shape, gen, device, dtype=torch.float32):
    return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)


def test_a_cache_write_takes_far_apart_inputs_as_copies_and_refuses_such_caches(small_bound, device):
    gen = torch.Generator().manual_seed(1)
    t, hkv, d, block_size, num_blocks = 3, 2, 16, 4, 3
    key_major = _rand(hkv, t, 96, gen=gen, device=device)
    key = key_major[:, :, :d].transpose(0, 1)  # [t, hkv, d], heads t·96 = 288 apart: 288 + 15 ≥ 256
    value = _rand(t, hkv, d, gen=gen, device=device)
    assert _host.offsets_pass_int32(key, (1, 2)) and not _host.offsets_pass_int32(value, (1, 2))
    before = key.clone()
    key_cache = torch.full((num_blocks, block_size, hkv, d), float("nan"), device=device)
    value_cache = torch.full_like(key_cache, float("nan"))
    # fits the lowered bound: heads d apart, head-dim elements 1 apart: (hkv−1)·d + d − 1 = 31 < 256
    slots = torch.tensor([5, 0, 10], device=device)
    kvw.write_kv_cache(key, value, key_cache, value_cache, slots)
    flat_k, flat_v = key_cache.view(-1, hkv, d), value_cache.view(-1, hkv, d)
    assert torch.equal(flat_k[slots], key) and torch.equal(flat_v[slots], value)
    assert torch.equal(key, before)
    # a cache whose heads lie past the bound: written in place, so never copied — refused
    head_major = torch.zeros(hkv, num_blocks, block_size, 40, device=device)
    far_cache = head_major[..., :d].permute(1, 2, 0, 3)  # heads num_blocks·block_size·40 = 480 apart
    with pytest.raises(InputError, match="key_cache .* past the kernel's 32-bit offsets"):
        kvw.write_kv_cache(key, value, far_cache, value_cache, slots)
    assert not head_major.any()


def test_attention_takes_far_apart_q_k_v_as_copies(small_bound, device, monkeypatch):
    gen = torch.Generator().manual_seed(2)
    b, h, hkv, lq, lk, d = 1, 2, 1, 3, 4, 64  # contiguous, each fits the bound: (4 − 1)·64 + 63 < 256
    q = _rand(b, lq, h, d, gen=gen, device=device).transpose(1, 2)  # rows h·d = 128 apart: 2 × 128 + 63 ≥ 256
    k = _rand(b, lk, hkv, 96, gen=gen, device=device)[..., :d].transpose(1, 2)  # rows 96 apart
    v = _rand(b, hkv, lk, d, gen=gen, device=device)
    assert _host.offsets_pass_int32(q, (2, 3)) and _host.offsets_pass_int32(k, (2, 3))
    inputs = attn.AttentionInputs(q, k, v, True, 1 / math.sqrt(d))
    launched, launch = [], attn._launch
    monkeypatch.setattr(attn, "_launch", lambda q, k, v, *rest: (launched.append((q, k, v)), launch(q, k, v, *rest)))
    out = attn.attention(q, k, v, causal=True, config={"USE_TMA": False})
    assert relative_error(out.cpu().double(), attn.reference(inputs).cpu().double()) < 1e-4
    assert [t.is_contiguous() for t in launched[0]] == [True, True, True]  # the kernel got copies


def test_a_plan_refuses_an_out_whose_head_dim_elements_lie_far_apart(small_bound, device):
    b, h, hkv, d, block_size, max_blocks = 2, 2, 1, 32, 8, 2
    plan = pda.PagedDecodePlan(batch=b, num_heads=h, num_kv_heads=hkv, head_dim=d, block_size=block_size,
                               max_blocks=max_blocks, max_context_len=16, dtype=torch.float32, device=device)
    gen = torch.Generator().manual_seed(3)
    q = _rand(b, h, 1, d, gen=gen, device=device)
    kc, vc = (_rand(4, block_size, hkv, d, gen=gen, device=device) for _ in range(2))
    tables = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32, device=device)
    lens = torch.tensor([16, 9], dtype=torch.int32, device=device)
    spread = torch.zeros(b, h, 1, 16 * d, device=device)
    out = spread[..., ::16]  # [b, h, 1, d], head-dim elements 16 apart: 31 × 16 ≥ 256
    with pytest.raises(InputError, match="out .* past the kernel's 32-bit offsets"):
        plan.run(q, kc, vc, tables, lens, out=out)
    assert not spread.any()
    want = pda.paged_decode_attention(q, kc, vc, tables, lens, config=plan.config)
    assert relative_error(plan.run(q, kc, vc, tables, lens).cpu().double(), want.cpu().double()) < 1e-6


def test_importance_takes_a_far_apart_window_as_a_copy(small_bound, device, monkeypatch):
    gen = torch.Generator().manual_seed(4)
    b, h, hkv, n, w, d = 1, 2, 1, 32, 4, 64
    q_window = _rand(b, w, h, d, gen=gen, device=device).transpose(1, 2)  # rows 128 apart: 3 × 128 + 63 ≥ 256
    k = _rand(b, hkv, n, d, gen=gen, device=device)
    assert _host.offsets_pass_int32(q_window, (2, 3))
    launched, importance = [], kvc.importance
    monkeypatch.setattr(kvc, "importance", lambda q, *rest: (launched.append(q), importance(q, *rest))[1])
    far = kvc.kv_importance(q_window, k)
    near = kvc.kv_importance(q_window.contiguous(), k)
    assert torch.equal(far, near) and launched[0].is_contiguous()  # the kernels got a copy


def test_a_layer_too_long_for_the_fused_kernel_runs_unfused(small_bound, device, monkeypatch):
    gen = torch.Generator().manual_seed(5)
    b, lq, lk, heads, kv_heads, d = 1, 4, 6, 2, 1, 64
    hidden = heads * d  # lq × hidden = 512 ≥ 256: past the lowered bound even contiguous
    x_q, x_kv = _rand(b, lq, hidden, gen=gen, device=device), _rand(b, lk, hidden, gen=gen, device=device)
    wq = _rand(hidden, hidden, gen=gen, device=device) / 8
    wkv = _rand(2 * kv_heads * d, hidden, gen=gen, device=device) / 8
    wo = _rand(hidden, hidden, gen=gen, device=device) / 8
    monkeypatch.setattr(layers, "_broken", set())
    want = layers.cross_attention_layer(x_q, x_kv, wq, wkv, wo, heads=heads, kv_heads=kv_heads,
                                        config={"FUSION": "none"})
    got = layers.cross_attention_layer(x_q, x_kv, wq, wkv, wo, heads=heads, kv_heads=kv_heads,
                                       config={"FUSION": "q"})
    assert torch.equal(got, want) and len(layers._broken) == 1  # the unfused path, and it says so once


# --- on a GPU: views that really cross 2^31 elements --------------------------------------------------


@pytest.mark.gpu
def test_gpu_a_write_from_heads_2_31_elements_apart_lands_where_it_belongs():
    hkv, d = 3, 128
    far = 2**30 + 1024  # (hkv − 1) × far passes 2^31: a 32-bit offset would wrap 2^32 elements back
    storage = torch.zeros(2 * far + d, dtype=torch.bfloat16, device="cuda")
    key = storage.as_strided((1, hkv, d), (d, far, 1))
    key.copy_(torch.randn(1, hkv, d, device="cuda"))
    value = torch.randn(1, hkv, d, device="cuda", dtype=torch.bfloat16)
    key_cache = torch.zeros(2, 16, hkv, d, device="cuda", dtype=torch.bfloat16)
    value_cache = torch.zeros_like(key_cache)
    kvw.write_kv_cache(key, value, key_cache, value_cache, torch.tensor([17], device="cuda"))
    assert torch.equal(key_cache[1, 1], key[0]) and torch.equal(value_cache[1, 1], value[0])


@pytest.mark.gpu
def test_gpu_attention_over_query_rows_2_31_elements_apart_is_right():
    lq, d = 3, 128
    far = 2**30 + 1024
    storage = torch.zeros(2 * far + d, dtype=torch.bfloat16, device="cuda")
    q = storage.as_strided((1, 1, lq, d), (0, 0, far, 1))
    q.copy_(torch.randn(1, 1, lq, d, device="cuda") * 0.5)
    k, v = (torch.randn(1, 1, 64, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    out = attn.attention(q, k, v, causal=False, config={"USE_TMA": False})
    want = torch.nn.functional.scaled_dot_product_attention(q.float().contiguous(), k.float(), v.float())
    assert relative_error(out.float(), want) < 2e-2

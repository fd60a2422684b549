"""The public ops on a GPU as an engine runs them: captured in a CUDA graph and replayed with new
values (new context lengths for decode) against the reference, compiled fullgraph by Inductor,
and called in their steady state under torch.cuda.set_sync_debug_mode("error") (any host sync
raises). GPU only; the CPU suite covers the same logic in test_production_ops.py."""

from __future__ import annotations

import math

import pytest
import torch

from conftest import capture_graph
from omnitune.kernels import attention as attn
from omnitune.kernels import kv_cache_write as kvw
from omnitune.kernels import kv_compress as kvc
from omnitune.kernels import layers
from omnitune.kernels import paged_decode_attention as pda
from omnitune.spec import relative_error

pytestmark = pytest.mark.gpu
BF16_TOL = 2e-2


def _decode_inputs(b=8, h=28, hkv=4, lq=1, ctx=2048, d=128, block_size=16, seed=0):
    problem = pda.PagedDecodeProblem(b=b, h=h, hkv=hkv, lq=lq, ctx=ctx, d=d, block_size=block_size)
    return problem, pda.SPEC.make_inputs(problem, torch.bfloat16, "cuda", seed)


@pytest.mark.parametrize("lq", [1, 4])
def test_plan_run_replays_correctly_as_context_lengths_change(lq, monkeypatch):
    monkeypatch.setenv("OMNITUNE_CHECK", "0")
    problem, inputs = _decode_inputs(lq=lq)
    plan = pda.PagedDecodePlan(batch=problem.b, num_heads=problem.h, num_kv_heads=problem.hkv, head_dim=problem.d,
                               block_size=problem.block_size, max_blocks=inputs.block_tables.shape[1],
                               max_context_len=problem.ctx, dtype=torch.bfloat16, device="cuda", query_tokens=lq)
    lens = inputs.context_lens.clone()
    graph, out = capture_graph(lambda: plan.run(inputs.q, inputs.key_cache, inputs.value_cache, inputs.block_tables, lens))
    gen = torch.Generator().manual_seed(1)
    for _ in range(4):
        lens.copy_(torch.randint(lq, problem.ctx + 1, (problem.b,), generator=gen).to(torch.int32))
        inputs.q.copy_(torch.randn(inputs.q.shape, generator=gen).to(inputs.q))
        out.fill_(float("nan"))
        graph.replay()
        ref = pda.reference(pda.PagedDecodeInputs(inputs.q, inputs.key_cache, inputs.value_cache,
                                                  inputs.block_tables, lens, inputs.sm_scale))
        assert relative_error(out, ref) < BF16_TOL


def test_decode_function_and_cache_write_capture_and_replay_with_new_values(monkeypatch):
    monkeypatch.setenv("OMNITUNE_CHECK", "0")
    problem, inputs = _decode_inputs()
    lens = inputs.context_lens.clone()
    graph, out = capture_graph(lambda: pda.paged_decode_attention(inputs.q, inputs.key_cache, inputs.value_cache,
                                                           inputs.block_tables, lens, max_context_len=problem.ctx))
    lens.copy_(torch.full_like(lens, problem.ctx // 3))
    graph.replay()
    ref = pda.reference(pda.PagedDecodeInputs(inputs.q, inputs.key_cache, inputs.value_cache, inputs.block_tables,
                                              lens, inputs.sm_scale))
    assert relative_error(out, ref) < BF16_TOL

    wp = kvw.KVCacheWriteProblem(t=256, hkv=4, d=128)
    w = kvw.SPEC.make_inputs(wp, torch.bfloat16, "cuda", 0)
    caches = w.initial_caches.clone()
    key, value, slots = w.key.clone(), w.value.clone(), w.slot_mapping.clone()
    graph, _ = capture_graph(lambda: kvw.write_kv_cache(key, value, caches[0], caches[1], slots))
    fresh = kvw.SPEC.make_inputs(wp, torch.bfloat16, "cuda", 5)
    key.copy_(fresh.key)
    value.copy_(fresh.value)
    slots.copy_(fresh.slot_mapping)
    caches.copy_(fresh.initial_caches)
    graph.replay()
    assert torch.equal(caches, kvw.reference(fresh))


def test_attention_with_span_tensor_and_layer_capture_and_replay(monkeypatch):
    monkeypatch.setenv("OMNITUNE_CHECK", "0")
    p = attn.AttentionProblem(b=2, h=28, hkv=4, lq=1024, lk=1024, d=128, causal=True, spans=2, span_len=256)
    inputs = attn.SPEC.make_inputs(p, torch.bfloat16, "cuda", 0)
    spans = inputs.spans.clone()
    graph, out = capture_graph(lambda: attn.attention(inputs.q, inputs.k, inputs.v, causal=True, mm_spans=spans))
    spans.copy_(torch.tensor([[[100, 300], [700, 900]], [[0, 512], [600, 1000]]], dtype=torch.int32))
    graph.replay()
    ref = attn.reference(attn.AttentionInputs(inputs.q, inputs.k, inputs.v, True, inputs.sm_scale, spans))
    assert relative_error(out, ref) < BF16_TOL

    gen = torch.Generator().manual_seed(0)

    def rand(*shape, scale=1.0):
        return (torch.randn(shape, generator=gen) * scale).to("cuda", torch.bfloat16)

    x_q, x_kv = rand(8, 1, 3584), rand(8, 1024, 3584)
    wq, wkv, wo = rand(3584, 3584, scale=0.017), rand(1024, 3584, scale=0.017), rand(3584, 3584, scale=0.017)
    graph, out = capture_graph(lambda: layers.cross_attention_layer(x_q, x_kv, wq, wkv, wo, heads=28, kv_heads=4))
    x_q.copy_(rand(8, 1, 3584))
    graph.replay()
    want = layers.cross_attention_layer(x_q, x_kv, wq, wkv, wo, heads=28, kv_heads=4, config={"FUSION": "none"})
    assert relative_error(out, want) < BF16_TOL


def test_steady_state_calls_never_sync_the_host(monkeypatch):
    monkeypatch.setenv("OMNITUNE_CHECK", "0")
    problem, inputs = _decode_inputs()
    plan = pda.PagedDecodePlan(batch=problem.b, num_heads=problem.h, num_kv_heads=problem.hkv, head_dim=problem.d,
                               block_size=problem.block_size, max_blocks=inputs.block_tables.shape[1],
                               max_context_len=problem.ctx, dtype=torch.bfloat16, device="cuda")
    w = kvw.SPEC.make_inputs(kvw.KVCacheWriteProblem(t=256, hkv=4, d=128), torch.bfloat16, "cuda", 0)
    caches = w.initial_caches.clone()
    a = attn.SPEC.make_inputs(attn.AttentionProblem(b=1, h=28, hkv=4, lq=512, lk=512, d=128, causal=True, spans=2,
                                                    span_len=64), torch.bfloat16, "cuda", 0)
    span_list = [[(int(s), int(e)) for s, e in a.spans[0].tolist()]]
    x = torch.randn(2, 1, 3584, device="cuda", dtype=torch.bfloat16)
    wq = torch.randn(3584, 3584, device="cuda", dtype=torch.bfloat16) * 0.017
    wkv = torch.randn(1024, 3584, device="cuda", dtype=torch.bfloat16) * 0.017
    x_kv = torch.randn(2, 300, 3584, device="cuda", dtype=torch.bfloat16)

    def calls():
        plan.run(inputs.q, inputs.key_cache, inputs.value_cache, inputs.block_tables, inputs.context_lens)
        pda.paged_decode_attention(inputs.q, inputs.key_cache, inputs.value_cache, inputs.block_tables,
                                   inputs.context_lens, max_context_len=problem.ctx)
        pda.paged_decode_attention(inputs.q, inputs.key_cache, inputs.value_cache, inputs.block_tables,
                                   inputs.context_lens)
        kvw.write_kv_cache(w.key, w.value, caches[0], caches[1], w.slot_mapping)
        attn.attention(a.q, a.k, a.v, causal=True, mm_spans=a.spans)
        attn.attention(a.q, a.k, a.v, causal=True, mm_spans=span_list)
        attn.attention(a.q, a.k, a.v, causal=True)
        layers.cross_attention_layer(x, x_kv, wq, wkv, wq, heads=28, kv_heads=4)
        kvc.kv_importance(a.q[:, :, -32:], a.k)

    calls()  # first calls: compile, look up, copy span lists once
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        calls()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


def test_every_op_compiles_fullgraph_with_inductor(monkeypatch):
    monkeypatch.setenv("OMNITUNE_CHECK", "0")
    problem, inputs = _decode_inputs(b=4, ctx=512)
    a = attn.SPEC.make_inputs(attn.AttentionProblem(b=1, h=28, hkv=4, lq=256, lk=256, d=128, causal=True, spans=1,
                                                    span_len=64), torch.bfloat16, "cuda", 0)
    w = kvw.SPEC.make_inputs(kvw.KVCacheWriteProblem(t=64, hkv=4, d=128), torch.bfloat16, "cuda", 0)
    x = torch.randn(2, 1, 3584, device="cuda", dtype=torch.bfloat16)
    wq = torch.randn(3584, 3584, device="cuda", dtype=torch.bfloat16) * 0.017
    wkv = torch.randn(1024, 3584, device="cuda", dtype=torch.bfloat16) * 0.017
    x_kv = torch.randn(2, 300, 3584, device="cuda", dtype=torch.bfloat16)

    def step(caches):
        o1 = attn.attention(a.q, a.k, a.v, causal=True, mm_spans=a.spans) * 2
        kvw.write_kv_cache(w.key, w.value, caches[0], caches[1], w.slot_mapping)
        o2 = pda.paged_decode_attention(inputs.q, inputs.key_cache, inputs.value_cache, inputs.block_tables,
                                        inputs.context_lens, max_context_len=problem.ctx) + 1
        o3 = layers.cross_attention_layer(x, x_kv, wq, wkv, wq, heads=28, kv_heads=4)
        o4 = kvc.kv_importance(a.q[:, :, -32:], a.k)
        return o1, o2, o3, o4

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True)
    c1, c2 = w.initial_caches.clone(), w.initial_caches.clone()
    got, want = compiled(c1), step(c2)
    for g, e in zip(got, want):
        assert relative_error(g, e) < 1e-3
    assert torch.equal(c1, c2)
    assert not math.isnan(float(got[0].float().sum()))


def test_direct_launches_never_reuse_a_binary_across_alignments_or_dtypes(monkeypatch):
    """The same public call with a 16-byte-aligned and then a misaligned view, and another dtype:
    each must get a binary specialised for it (a wrong reuse reads misaligned vectors or the
    wrong element width)."""
    monkeypatch.setenv("OMNITUNE_CHECK", "0")
    gen = torch.Generator().manual_seed(0)
    for dtype in (torch.bfloat16, torch.float16):
        whole = torch.randn(2 * 64 * 4 * 128 + 1, generator=gen).to("cuda", dtype)
        for offset in (0, 1, 0):
            key = whole[offset: offset + 64 * 4 * 128].view(64, 4, 128)
            value = torch.randn(64, 4, 128, generator=gen).to("cuda", dtype)
            caches = torch.randn(2, 16, 16, 4, 128, generator=gen).to("cuda", dtype)
            slots = torch.randperm(256, generator=gen)[:64].to("cuda")
            want = caches.clone()
            want[0].view(-1, 4, 128)[slots] = key
            want[1].view(-1, 4, 128)[slots] = value
            for _ in range(3):
                kvw.write_kv_cache(key, value, caches[0], caches[1], slots)
            assert torch.equal(caches, want), (dtype, offset)

"""Arguments that are not tensors are judged the same under torch.compile as in an eager call: a
public function traced by Dynamo used to hand them to its custom op after float() or int(), so
that sm_scale="0.1" ran as 0.1, True as 1.0, max_context_len=0, 17 (past the block table) or
10.7 was bucketed into a length without a word, check="no" was dropped and heads=True was one head.
Also the layer's meta tensors (refused on one path, returned on the other), project_kv's integer
tensors and a plan's dtype given as a string.

Small fp32 shapes on the CPU (the interpreter); torch.compile with the aot_eager backend and no
fullgraph, so that the InputError itself reaches the caller (with fullgraph=True Dynamo reports it
inside its own error, whose text carries the message)."""

from __future__ import annotations

import pytest
import torch
from conftest import DEVICE

from omnitune.errors import InputError
from omnitune.kernels import layers
from omnitune.kernels.attention import attention
from omnitune.kernels.kv_cache_write import write_kv_cache
from omnitune.kernels.kv_compress import kv_importance
from omnitune.kernels.paged_decode_attention import PagedDecodePlan, paged_decode_attention


def _attention_args():
    return torch.randn(1, 2, 8, 64, device=DEVICE), *(torch.randn(1, 2, 8, 64, device=DEVICE) for _ in range(2))


def _paged_args():
    q = torch.randn(2, 4, 1, 32, device=DEVICE)
    kc, vc = torch.randn(6, 4, 2, 32, device=DEVICE), torch.randn(6, 4, 2, 32, device=DEVICE)
    tables = torch.tensor([[0, 1, 2], [3, 4, 5]], dtype=torch.int32, device=DEVICE)
    return q, kc, vc, tables, torch.tensor([10, 5], dtype=torch.int32, device=DEVICE)


def _write_args():
    key, value = torch.randn(3, 2, 32, device=DEVICE), torch.randn(3, 2, 32, device=DEVICE)
    caches = torch.zeros(2, 3, 4, 2, 32, device=DEVICE)
    return key, value, caches[0], caches[1], torch.tensor([0, 5, -1], device=DEVICE)


def _layer_args(dtype=torch.float32, device=DEVICE):
    x_q, x_kv = torch.randn(1, 5, 64), torch.randn(1, 7, 64)
    wq, wkv, wo = torch.randn(64, 64) * 0.1, torch.randn(128, 64) * 0.1, torch.randn(64, 64) * 0.1
    return tuple(t.to(dtype=dtype, device=device) for t in (x_q, x_kv, wq, wkv, wo))


def _compiled(call):
    torch._dynamo.reset()
    return torch.compile(call, backend="aot_eager")


# What each public function is given, and the InputError an eager call of it gives.
COMPILED_CALLS = {
    "attention, sm_scale='0.1'": (lambda *a: attention(*a, sm_scale="0.1"), _attention_args, "must be a float"),
    "attention, sm_scale=True": (lambda *a: attention(*a, sm_scale=True), _attention_args, "must be a float"),
    "kv_importance, sm_scale=True": (lambda q, k, v: kv_importance(q, k, sm_scale=True), _attention_args,
                                     "must be a float"),
    "paged decode, sm_scale='0.1'": (lambda *a: paged_decode_attention(*a, sm_scale="0.1"), _paged_args,
                                     "must be a float"),
    "paged decode, max_context_len=0": (lambda *a: paged_decode_attention(*a, max_context_len=0), _paged_args,
                                        r"max_context_len=0 must be in 1\.\.12"),
    "paged decode, max_context_len past the table": (
        lambda *a: paged_decode_attention(*a, max_context_len=13), _paged_args,
        r"max_context_len=13 must be in 1\.\.12"),
    "paged decode, max_context_len=True": (lambda *a: paged_decode_attention(*a, max_context_len=True), _paged_args,
                                           "max_context_len must be a host int"),
    "paged decode, max_context_len=10.7": (lambda *a: paged_decode_attention(*a, max_context_len=10.7), _paged_args,
                                           "max_context_len must be a host int"),
    "paged decode, check='no'": (lambda *a: paged_decode_attention(*a, check="no"), _paged_args,
                                 "check must be None, True or False"),
    "write_kv_cache, check='no'": (lambda *a: write_kv_cache(*a, check="no"), _write_args,
                                   "check must be None, True or False"),
    "cross_attention_layer, heads=True": (
        lambda *a: layers.cross_attention_layer(*a, heads=True, kv_heads=True), _layer_args, "heads=True must be"),
}


@pytest.mark.parametrize("case", sorted(COMPILED_CALLS))
def test_a_compiled_call_refuses_what_an_eager_call_refuses(case):
    call, make_args, message = COMPILED_CALLS[case]
    args = make_args()
    with pytest.raises(InputError, match=message):
        call(*args)
    with pytest.raises(InputError, match=message):
        _compiled(call)(*args)


def test_under_fullgraph_the_refusal_names_the_problem():
    q, k, v = _attention_args()
    torch._dynamo.reset()
    compiled = torch.compile(lambda q, k, v: attention(q, k, v, sm_scale="0.1"), backend="aot_eager", fullgraph=True)
    with pytest.raises(Exception, match="sm_scale must be a float"):
        compiled(q, k, v)


def test_a_compiled_decode_with_a_valid_max_context_len_matches_eager():
    args = _paged_args()
    for length in (10, 12):  # 12: the table's capacity, whose bucket (12) the op clamps to it
        want = paged_decode_attention(*args, max_context_len=length)
        got = _compiled(lambda *a, n=length: paged_decode_attention(*a, max_context_len=n, sm_scale=None))(*args)
        assert torch.allclose(got, want, atol=1e-6)


@pytest.mark.parametrize("fusion", [None, "none", "q"], ids=repr)
def test_the_layer_refuses_meta_tensors_on_every_path(fusion):
    # The unfused path (the default) returned a meta tensor where the fused one refused them.
    layers.clear_state()
    config = None if fusion is None else {"FUSION": fusion}
    with pytest.raises(InputError, match="on meta"):
        layers.cross_attention_layer(*_layer_args(device="meta"), heads=1, kv_heads=1, config=config)


def test_project_kv_refuses_integer_tensors():
    # On the CPU the GEMM made an integer kv, which the layer then refused; on a GPU torch's own error.
    x_kv, wkv = torch.ones(1, 7, 64, dtype=torch.int32), torch.ones(128, 64, dtype=torch.int32)
    with pytest.raises(InputError, match="unsupported dtype torch.int32"):
        layers.project_kv(x_kv, wkv)


def test_a_plan_names_a_dtype_given_as_a_string():
    # It said "unsupported dtype float16; use float16, bfloat16 or float32".
    with pytest.raises(InputError, match="dtype must be a torch.dtype .* got 'float16'"):
        PagedDecodePlan(batch=1, num_heads=4, num_kv_heads=2, head_dim=32, block_size=4, max_blocks=3,
                        max_context_len=12, dtype="float16", device=DEVICE)


# check=True under compile: the ops take no check, so a call's own was dropped and nothing checked.
CHECKED_CALLS = {
    "attention": (lambda *a: attention(*a, check=True), _attention_args),
    "paged decode": (lambda *a: paged_decode_attention(*a, check=True), _paged_args),
    "write_kv_cache": (lambda *a: write_kv_cache(*a, check=True), _write_args),
}


@pytest.mark.parametrize("case", sorted(CHECKED_CALLS))
def test_check_true_under_compile_is_refused_unless_the_variable_checks(case, monkeypatch):
    call, make_args = CHECKED_CALLS[case]
    args = make_args()
    monkeypatch.delenv("OMNITUNE_CHECK", raising=False)
    call(*args)  # eager: checked
    with pytest.raises(InputError, match="check=True cannot reach a compiled op .*OMNITUNE_CHECK=1"):
        _compiled(call)(*args)
    monkeypatch.setenv("OMNITUNE_CHECK", "1")  # the op checks as the variable says: the call is served
    _compiled(call)(*make_args())


def test_a_plan_run_with_check_true_under_compile_is_refused(monkeypatch):
    monkeypatch.delenv("OMNITUNE_CHECK", raising=False)
    q, kc, vc, tables, lens = _paged_args()
    plan = PagedDecodePlan(batch=2, num_heads=4, num_kv_heads=2, head_dim=32, block_size=4, max_blocks=3,
                           max_context_len=12, dtype=torch.float32, device=DEVICE)
    with pytest.raises(InputError, match="check=True cannot reach a compiled op"):
        _compiled(lambda *a: plan.run(*a, check=True))(q, kc, vc, tables, lens)

"""Bad input to the public ops that the per-op tests did not cover, each of which used to end in
an error from deep inside (AttributeError, IndexError, RuntimeError, NotImplementedError, Triton's
AssertionError), a hidden sync, or silently wrong output. Each must now be one InputError whose
message names the problem, raised before anything is launched or written.

Small fp32 shapes on the CPU (the interpreter); the check mode is on (conftest) unless a case says
otherwise."""

from __future__ import annotations

import pytest
import torch
from conftest import DEVICE

from omnitune.errors import InputError
from omnitune.kernels._fp8 import FP8
from omnitune.kernels.attention import attention
from omnitune.kernels.kv_cache_write import write_kv_cache
from omnitune.kernels.kv_compress import compress_kv, kv_importance
from omnitune.kernels.paged_decode_attention import (
    PagedDecodePlan,
    paged_decode_attention,
)

SCALE_NAMED = r"sm_scale"


# --- sm_scale: a tensor, a string, NaN or inf ---------------------------------------------------

BAD_SCALES = {
    "string": ("0.1", "must be a float"),
    "one-element tensor": (torch.tensor(0.1), "must be a float"),  # was read back: a hidden sync
    "two-element tensor": (torch.tensor([0.1, 0.2]), "must be a float"),  # was a RuntimeError
    "bool": (True, "must be a float"),
    "nan": (float("nan"), "not finite"),  # was NaN output, silently
    "inf": (float("inf"), "not finite"),
}


def _attention_args():
    return tuple(torch.randn(1, 2, 8, 64, device=DEVICE) for _ in range(3))


def _paged_args(dtype=torch.float32):
    q = torch.randn(2, 4, 1, 32, device=DEVICE, dtype=dtype)
    kc = torch.randn(6, 4, 2, 32, device=DEVICE, dtype=dtype)
    vc = torch.randn(6, 4, 2, 32, device=DEVICE, dtype=dtype)
    tables = torch.tensor([[0, 1, 2], [3, 4, 5]], dtype=torch.int32, device=DEVICE)
    lens = torch.tensor([10, 5], dtype=torch.int32, device=DEVICE)
    return q, kc, vc, tables, lens


def _plan(**changes):
    kwargs = {"batch": 2, "num_heads": 4, "num_kv_heads": 2, "head_dim": 32, "block_size": 4, "max_blocks": 3,
              "max_context_len": 12, "dtype": torch.float32, "device": DEVICE}
    return PagedDecodePlan(**{**kwargs, **changes})


def _compress_args():
    q = torch.randn(1, 2, 4, 16, device=DEVICE)
    k, v = torch.randn(1, 2, 16, 16, device=DEVICE), torch.randn(1, 2, 16, 16, device=DEVICE)
    modality = torch.zeros(1, 16, dtype=torch.int64, device=DEVICE)
    modality[0, :8] = 1
    return q, k, v, modality


OPS_WITH_SM_SCALE = {
    "attention": lambda s: attention(*_attention_args(), sm_scale=s),
    "paged_decode_attention": lambda s: paged_decode_attention(*_paged_args(), sm_scale=s),
    "PagedDecodePlan": lambda s: _plan(sm_scale=s),
    "kv_importance": lambda s: kv_importance(*_compress_args()[:2], sm_scale=s),
    "compress_kv": lambda s: compress_kv(*_compress_args(), keep_ratio={"image": 0.5}, sm_scale=s),
}


@pytest.mark.parametrize("case", sorted(BAD_SCALES))
@pytest.mark.parametrize("op", sorted(OPS_WITH_SM_SCALE))
def test_a_bad_sm_scale_is_one_clear_input_error(op, case):
    value, message = BAD_SCALES[case]
    with pytest.raises(InputError, match=message) as caught:
        OPS_WITH_SM_SCALE[op](value)
    assert SCALE_NAMED in str(caught.value)


def test_a_plan_reads_a_negative_sm_scale_as_the_default_as_the_function_does():
    # The custom op that run calls under torch.compile reads a negative scale as "unset"; the
    # plan kept it, so eager and compiled runs of one plan disagreed.
    assert _plan(sm_scale=-1.0).sm_scale == pytest.approx(32 ** -0.5)
    assert _plan(sm_scale=0.25).sm_scale == 0.25
    args = _paged_args()
    assert torch.equal(paged_decode_attention(*args, sm_scale=-1.0), paged_decode_attention(*args))


# --- max_context_len: a host int, nothing else ------------------------------------------------


@pytest.mark.parametrize("value", [torch.tensor(10), torch.tensor([10, 5]), float("inf"), float("nan"), 10.7, "10",
                                   [10], True], ids=repr)
@pytest.mark.parametrize("check", [True, False])
def test_max_context_len_must_be_a_host_int(value, check):
    # A tensor was read back by int() (a sync; several values: RuntimeError); inf was an
    # OverflowError, "10" a TypeError naming nothing, 10.7 silently 10.
    with pytest.raises(InputError, match="max_context_len must be a host int"):
        paged_decode_attention(*_paged_args(), max_context_len=value, check=check)


def test_a_numpy_integer_max_context_len_is_still_taken():
    numpy = pytest.importorskip("numpy")
    args = _paged_args()
    out = paged_decode_attention(*args, max_context_len=numpy.int64(12))
    assert torch.equal(out, paged_decode_attention(*args, max_context_len=12))


# --- fp8 caches: scales that are zero, negative or not finite (check mode) -------------------


BAD_SCALE_VALUES = {"zero": 0.0, "negative": -0.5, "nan": float("nan"), "inf": float("inf")}


@pytest.mark.parametrize("bad", sorted(BAD_SCALE_VALUES))
@pytest.mark.parametrize("which", ["k_scale", "v_scale"])
def test_check_mode_refuses_fp8_write_scales_that_are_not_positive_and_finite(which, bad):
    key, value = torch.randn(5, 2, 32, device=DEVICE), torch.randn(5, 2, 32, device=DEVICE)
    caches = torch.zeros(2, 3, 4, 2, 32, device=DEVICE).to(FP8)
    before = caches.view(torch.uint8).clone()
    slots = torch.tensor([0, 1, 2, 5, -1], device=DEVICE)
    scales = {"k_scale": torch.ones(2, device=DEVICE), "v_scale": torch.ones(2, device=DEVICE)}
    scales[which] = torch.tensor([1.0, BAD_SCALE_VALUES[bad]], device=DEVICE)  # one bad head of two
    with pytest.raises(InputError, match="must be positive and finite"):
        write_kv_cache(key, value, caches[0], caches[1], slots, check=True, **scales)
    assert torch.equal(caches.view(torch.uint8), before)  # nothing written


@pytest.mark.parametrize("bad", sorted(BAD_SCALE_VALUES))
def test_check_mode_refuses_fp8_decode_scales_that_are_not_positive_and_finite(bad):
    q, kc, vc, tables, lens = _paged_args()
    kc8, vc8 = kc.to(FP8), vc.to(FP8)
    good = torch.ones(1, device=DEVICE)
    bad_scale = torch.full((1,), BAD_SCALE_VALUES[bad], device=DEVICE)
    with pytest.raises(InputError, match="must be positive and finite"):
        paged_decode_attention(q, kc8, vc8, tables, lens, k_scale=good, v_scale=bad_scale, check=True)
    plan = _plan(cache_dtype=FP8)
    with pytest.raises(InputError, match="must be positive and finite"):
        plan.run(q, kc8, vc8, tables, lens, k_scale=bad_scale, v_scale=good, check=True)
    # Good scales still run, in both.
    paged_decode_attention(q, kc8, vc8, tables, lens, k_scale=good, v_scale=good, check=True)
    plan.run(q, kc8, vc8, tables, lens, k_scale=good, v_scale=good, check=True)


# --- PagedDecodePlan.run with tensors of the wrong kind --------------------------------------


def _run_cases():
    q, kc, vc, tables, lens = _paged_args()
    return {
        "q None": ((None, kc, vc, tables, lens), {}, "q must be a torch.Tensor"),  # was AttributeError
        "key_cache None": ((q, None, vc, tables, lens), {}, "key_cache must be a torch.Tensor"),
        "block_tables None": ((q, kc, vc, None, lens), {}, "block_tables must be a torch.Tensor"),
        "out a list": ((q, kc, vc, tables, lens), {"out": [1]}, "out must be None or a torch.Tensor"),
        "2-D key_cache": ((q, kc[0, 0], vc, tables, lens), {}, "planned for"),  # was IndexError
        "1-D key_cache": ((q, kc[0, 0, 0], vc, tables, lens), {}, "planned for"),
        "q on meta": ((q.to("meta"), kc, vc, tables, lens), {}, "as planned"),  # was RuntimeError
        "caches on meta": ((q, kc.to("meta"), vc.to("meta"), tables, lens), {}, "one device"),
    }


@pytest.mark.skipif(DEVICE != "cpu", reason="the meta cases are about a CPU plan")
@pytest.mark.parametrize("case", sorted(_run_cases()))
def test_a_plan_refuses_tensors_of_the_wrong_kind_clearly(case):
    args, kwargs, message = _run_cases()[case]
    with pytest.raises(InputError, match=message):
        _plan().run(*args, **kwargs)


@pytest.mark.parametrize("device", ["nope", 3.5, "meta"], ids=repr)
def test_a_plan_for_no_device_the_kernels_run_on_is_refused_when_planned(device):
    # "nope" was torch's RuntimeError; a meta plan failed at its first run, inside the launcher.
    with pytest.raises(InputError, match="device="):
        _plan(device=device)


# --- meta tensors, and kv_importance's dtypes -------------------------------------------------


META_CALLS = {
    # each used to fail inside the launcher: NotImplementedError("Cannot copy out of meta tensor")
    "attention": lambda: attention(*(t.to("meta") for t in _attention_args())),
    "kv_importance": lambda: kv_importance(*(t.to("meta") for t in _compress_args()[:2])),
    "write_kv_cache": lambda: write_kv_cache(
        torch.randn(5, 2, 32, device="meta"), torch.randn(5, 2, 32, device="meta"),
        torch.zeros(3, 4, 2, 32, device="meta"), torch.zeros(3, 4, 2, 32, device="meta"),
        torch.zeros(5, dtype=torch.int64, device="meta"), check=False),
    "paged_decode_attention": lambda: paged_decode_attention(*(t.to("meta") for t in _paged_args()), check=False),
}


@pytest.mark.parametrize("op", sorted(META_CALLS))
def test_meta_tensors_are_refused_clearly(op):
    with pytest.raises(InputError, match="on meta"):
        META_CALLS[op]()


@pytest.mark.parametrize("dtype", [torch.int32, torch.bool, torch.float64])
def test_kv_importance_refuses_a_dtype_it_cannot_compute_in(dtype):
    # int32 and bool reached the kernel: an AssertionError inside tl.dot under the interpreter.
    q, k = (t.to(dtype) for t in _compress_args()[:2])
    with pytest.raises(InputError, match="unsupported dtype"):
        kv_importance(q, k)


# --- attention's span lists -------------------------------------------------------------------


@pytest.mark.parametrize("spans, message", [
    ([[(0, 2**40)]], "outside int32"),  # was RuntimeError: value cannot be converted to type int32
    ([[(-(2**31) - 1, 2)]], "outside int32"),
    ([[(0.5, 2)]], "pairs of ints"),  # was cut to 0 silently
], ids=["end past int32", "start below int32", "float start"])
@pytest.mark.parametrize("check", [True, False])
def test_span_lists_of_values_no_int32_holds_are_refused(spans, message, check):
    q, k, v = _attention_args()
    with pytest.raises(InputError, match=message):
        attention(q, k, v, causal=True, mm_spans=spans, check=check)

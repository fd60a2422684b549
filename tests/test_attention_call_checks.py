"""attention()'s call arguments that were taken without a word: `check` was validated only on calls
with mm_spans, so check="no" or check=2 ran; and span lists are cached by value, so a list with a
bool bound ([[(True, 3)]] == [[(1, 3)]], same hash) was served the entry its int twin left and
skipped the refusal of bools that a fresh list meets.

Small fp32 shapes on the CPU (the interpreter); the check mode is on (conftest) unless a case says
otherwise."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import DEVICE

from omnitune.errors import InputError
from omnitune.kernels import attention as attention_module
from omnitune.kernels.attention import attention

# fp32 under the interpreter against SDPA in fp32: the two differ only in summation order.
ATOL = RTOL = 1e-4
CHECK_REFUSED = r"^check must be None, True or False, got "
BOOL_REFUSED = r"^mm_spans must hold \(start, end\) pairs of ints, not booleans$"


def _qkv():
    return tuple(torch.randn(1, 2, 8, 64, device=DEVICE) for _ in range(3))


def _assert_one_line(caught) -> None:
    message = str(caught.value)
    assert "\n" not in message and len(message) < 200, message


@pytest.fixture
def no_cached_spans(monkeypatch):
    """An empty span-list cache, so that which call fills it is the test's choice."""
    monkeypatch.setattr(attention_module, "_span_tensors", {})


# --- check: validated on every call, spans or not ------------------------------------------------


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("check", ["no", 2], ids=repr)
def test_a_check_that_is_no_bool_is_refused_without_spans(check, causal):
    q, k, v = _qkv()
    with pytest.raises(InputError, match=CHECK_REFUSED) as caught:
        attention(q, k, v, causal=causal, check=check)
    _assert_one_line(caught)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("check", [True, False, None], ids=repr)
def test_the_accepted_checks_match_sdpa_where_a_string_in_their_place_is_refused(check, causal):
    q, k, v = _qkv()
    out = attention(q, k, v, causal=causal, check=check)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=causal)  # Lq == Lk: no alignment question
    torch.testing.assert_close(out, expected, atol=ATOL, rtol=RTOL)
    with pytest.raises(InputError, match=CHECK_REFUSED):
        attention(q, k, v, causal=causal, check=str(check))


# --- a bool span bound: refused whatever the cache holds -----------------------------------------

INT_AND_BOOL_SPANS = {
    "start": ([[(1, 3)]], [[(True, 3)]]),
    "end": ([[(0, 2), (1, 1)]], [[(0, 2), (1, True)]]),
    "bool tensor": ([[(0, 3)]], [[(torch.tensor(False), 3)]]),
}


@pytest.mark.parametrize("check", [True, False])
@pytest.mark.parametrize("ints, bools", INT_AND_BOOL_SPANS.values(), ids=INT_AND_BOOL_SPANS.keys())
def test_a_bool_bound_after_its_int_twin_is_refused(ints, bools, check, no_cached_spans):
    q, k, v = _qkv()
    assert attention(q, k, v, causal=True, mm_spans=ints, check=check).isfinite().all()
    with pytest.raises(InputError, match=BOOL_REFUSED) as caught:
        attention(q, k, v, causal=True, mm_spans=bools, check=check)
    _assert_one_line(caught)


@pytest.mark.parametrize("check", [True, False])
@pytest.mark.parametrize("ints, bools", INT_AND_BOOL_SPANS.values(), ids=INT_AND_BOOL_SPANS.keys())
def test_a_bool_bound_is_refused_before_and_after_its_int_twin(ints, bools, check, no_cached_spans):
    q, k, v = _qkv()
    with pytest.raises(InputError, match=BOOL_REFUSED):
        attention(q, k, v, causal=True, mm_spans=bools, check=check)
    assert attention(q, k, v, causal=True, mm_spans=ints, check=check).isfinite().all()
    with pytest.raises(InputError, match=BOOL_REFUSED):
        attention(q, k, v, causal=True, mm_spans=bools, check=check)

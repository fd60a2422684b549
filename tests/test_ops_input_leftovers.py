"""Bad input to the public ops that the earlier audits left open, each of which was taken without a
word (a duplicate slot, causal="no", a bool as a share or a head count, a window longer than the
sequence) or ended in a ValueError or ZeroDivisionError from inside (an empty batch, no heads, a
head dim of 0). Each must now be one InputError whose message names the problem, raised before
anything is launched or written.

Small fp32 shapes on the CPU (the interpreter); the check mode is on (conftest) unless a case says
otherwise."""

from __future__ import annotations

import pytest
import torch
from conftest import DEVICE

from omnitune.errors import InputError
from omnitune.kernels import layers
from omnitune.kernels.attention import attention
from omnitune.kernels.kv_cache_write import write_kv_cache
from omnitune.kernels.kv_compress import compress_kv, kv_importance
from omnitune.kernels.paged_decode_attention import paged_decode_attention


def _attention_args(b=1, h=2, hkv=2, d=64):
    return torch.randn(b, h, 8, d, device=DEVICE), *(torch.randn(b, hkv, 8, d, device=DEVICE) for _ in range(2))


def _write_args(slots, t=5, hkv=2, d=32, blocks=3, block_size=4):
    key, value = torch.randn(t, hkv, d, device=DEVICE), torch.randn(t, hkv, d, device=DEVICE)
    caches = torch.randn(2, blocks, block_size, hkv, d, device=DEVICE)
    return key, value, caches, torch.tensor(slots, device=DEVICE)


def _compress_args(b=1, h=2, hkv=2, w=4, n=16, d=16):
    q = torch.randn(b, h, w, d, device=DEVICE)
    k, v = torch.randn(b, hkv, n, d, device=DEVICE), torch.randn(b, hkv, n, d, device=DEVICE)
    modality = torch.zeros(b, n, dtype=torch.int64, device=DEVICE)
    modality[:, : n // 2] = 1
    return q, k, v, modality


def _paged_args(b=2, h=4, hkv=2, d=32):
    q = torch.randn(b, h, 1, d, device=DEVICE)
    kc, vc = torch.randn(6, 4, hkv, d, device=DEVICE), torch.randn(6, 4, hkv, d, device=DEVICE)
    tables = torch.tensor([[0, 1, 2], [3, 4, 5]], dtype=torch.int32, device=DEVICE)[:b]
    lens = torch.tensor([10, 5], dtype=torch.int32, device=DEVICE)[:b]
    return q, kc, vc, tables, lens


# --- write_kv_cache: a slot given to two tokens (check mode) ----------------------------------


@pytest.mark.parametrize("slot_dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("slots", [[0, 7, 3, 7, -1], [5, 5, -1, -1, 2], [11, -1, 4, 9, 11]], ids=str)
def test_check_mode_refuses_a_slot_given_to_two_tokens(slots, slot_dtype):
    # Documented as not allowed, never checked: one of the two writes silently won.
    key, value, caches, slot_mapping = _write_args(slots)
    before = caches.clone()
    duplicate = max(s for s in slots if slots.count(s) > 1)
    with pytest.raises(InputError, match=f"gives slot {duplicate} to more than one token") as caught:
        write_kv_cache(key, value, caches[0], caches[1], slot_mapping.to(slot_dtype), check=True)
    assert "distinct" in str(caught.value)
    assert torch.equal(caches, before)  # nothing written


def test_padding_slots_may_repeat_and_distinct_slots_are_written():
    key, value, caches, slot_mapping = _write_args([3, -1, 0, -1, 10])
    write_kv_cache(key, value, caches[0], caches[1], slot_mapping, check=True)
    flat = caches.view(2, -1, *caches.shape[-2:])
    assert torch.equal(flat[0, [3, 0, 10]], key[[0, 2, 4]])
    assert torch.equal(flat[1, [3, 0, 10]], value[[0, 2, 4]])


def test_the_production_path_does_not_look_for_duplicates():
    # No sync outside the check mode: a duplicate is the caller's promise to keep, not read back.
    key, value, caches, slot_mapping = _write_args([1, 1, 2, 3, 4])
    write_kv_cache(key, value, caches[0], caches[1], slot_mapping, check=False)


# --- causal: a bool, nothing else --------------------------------------------------------------


@pytest.mark.parametrize("value", ["no", "False", 2, -1, 1.0, None, torch.tensor(True), [True]], ids=repr)
@pytest.mark.parametrize("check", [True, False])
def test_causal_must_be_a_bool(value, check):
    # "no" (and every other string) was taken as True; a tensor's truth value was a hidden sync.
    with pytest.raises(InputError, match="causal must be a bool"):
        attention(*_attention_args(), causal=value, check=check)


def test_a_numpy_bool_or_0_or_1_causal_is_taken_as_the_bool():
    numpy = pytest.importorskip("numpy")
    args = _attention_args()
    for flag in (True, False):
        expected = attention(*args, causal=flag)
        assert torch.equal(attention(*args, causal=numpy.bool_(flag)), expected)
        assert torch.equal(attention(*args, causal=int(flag)), expected)


# --- compress_kv: keep_ratio shares, recent ---------------------------------------------------


@pytest.mark.parametrize("ratio", [True, False, float("nan"), float("inf"), float("-inf")], ids=repr)
def test_keep_ratio_refuses_bools_and_non_finite_numbers(ratio):
    # True was counted as 1.0 (keep everything), False as 0.0.
    with pytest.raises(InputError, match=r"keep_ratio\[image\]"):
        compress_kv(*_compress_args(), keep_ratio={"image": ratio})


def test_recent_refuses_a_bool():
    # (It was refused later, after a sync, as the lookup's ShapeError "recent=True is not a valid int".)
    with pytest.raises(InputError, match=r"recent=True; use an integer in 0\.\.16"):
        compress_kv(*_compress_args(), keep_ratio={"image": 0.5}, recent=True)


# --- the cross-attention layer: head counts ---------------------------------------------------


def _layer_args(hidden=64, d=64, h=1, hkv=1):
    x_q, x_kv = torch.randn(1, 5, hidden, device=DEVICE), torch.randn(1, 7, hidden, device=DEVICE)
    wq = torch.randn(h * d, hidden, device=DEVICE) * 0.1
    wkv = torch.randn(2 * hkv * d, hidden, device=DEVICE) * 0.1
    wo = torch.randn(hidden, h * d, device=DEVICE) * 0.1
    return x_q, x_kv, wq, wkv, wo


@pytest.mark.parametrize("heads, kv_heads", [(True, True), (True, 1), (1, True)])
def test_the_layer_refuses_bool_head_counts(heads, kv_heads):
    # heads=True was taken as one head.
    with pytest.raises(InputError, match=r"heads=.* must be a positive multiple of kv_heads="):
        layers.cross_attention_layer(*_layer_args(), heads=heads, kv_heads=kv_heads)


# --- kv_importance: the window, as compress_kv judges it ---------------------------------------


@pytest.mark.parametrize("w", [17, 32])
def test_kv_importance_refuses_a_window_longer_than_the_sequence_as_compress_kv_does(w):
    q, k, v, modality = _compress_args(w=w, n=16)
    with pytest.raises(InputError) as from_compress:
        compress_kv(q, k, v, modality, keep_ratio={"image": 0.5})
    with pytest.raises(InputError) as from_importance:
        kv_importance(q, k)
    assert str(from_importance.value) == str(from_compress.value)
    assert f"the observation window has {w} queries; use 1..16" in str(from_importance.value)


# --- empty batches, no heads, a head dim of 0 --------------------------------------------------


EMPTY_CALLS = {
    # each was a ValueError from the problem dataclass ("b must be ≥ 1, got 0"), or worse
    "attention, B=0": (lambda: attention(*_attention_args(b=0)), "batch is empty"),
    "attention, H=0": (lambda: attention(*_attention_args(h=0)), "positive multiple"),
    "paged_decode_attention, H=0": (lambda: paged_decode_attention(*_paged_args(h=0)), "positive multiple"),
    "write_kv_cache, Hkv=0": (lambda: write_kv_cache(*_split_write(_write_args([0, 1, 2, 3, -1], hkv=0))),
                              "0 kv heads"),
    "write_kv_cache, D=0": (lambda: write_kv_cache(*_split_write(_write_args([0, 1, 2, 3, -1], d=0))),
                            "head dim 0"),
    "write_kv_cache, block_size=0": (
        lambda: write_kv_cache(*_split_write(_write_args([-1, -1, -1, -1, -1], block_size=0))), "block_size is 0"),
    "kv_importance, B=0": (lambda: kv_importance(*_compress_args(b=0)[:2]), "batch is empty"),
    "kv_importance, H=0": (lambda: kv_importance(*_compress_args(h=0)[:2]), "positive multiple"),
    "kv_importance, D=0": (lambda: kv_importance(*_compress_args(d=0)[:2]), "head dim 0"),  # ZeroDivisionError
    "kv_importance, W=0": (lambda: kv_importance(*_compress_args(w=0)[:2]), "window has 0 queries"),
    "compress_kv, B=0": (lambda: compress_kv(*_compress_args(b=0), keep_ratio={"image": 0.5}), "batch is empty"),
    "compress_kv, H=0": (lambda: compress_kv(*_compress_args(h=0), keep_ratio={"image": 0.5}), "positive multiple"),
    # said "the observation window has 4 queries; use 1..0 (the sequence length)"
    "compress_kv, N=0": (lambda: compress_kv(*_compress_args(n=0), keep_ratio={"image": 0.5}),
                         r"the sequence is empty \(N = 0"),
    "kv_importance, N=0": (lambda: kv_importance(*_compress_args(n=0)[:2]), r"the sequence is empty \(N = 0"),
}


@pytest.mark.parametrize("merge", ["none", "average", "weighted"])
def test_a_batch_past_the_grid_bound_is_compressed_in_batch_slices(merge, monkeypatch):
    # The scoring and merging kernels' grids hold B·Hkv along y, which CUDA bounds at 65535 (here
    # lowered to 5: 3 sequences × 2 kv heads are 6, launched as slices of 2 sequences and 1). It was
    # refused; each slice's launch now takes views, so the result is the unsliced one, bit for bit.
    from omnitune.kernels import _host

    q, k, v, modality = _compress_args(b=3, h=4, hkv=2, n=24)
    modality[1, :20] = 1  # sequences that evict different counts of image tokens
    whole = compress_kv(q, k, v, modality, keep_ratio={"image": 0.5}, merge=merge)
    whole_scores = kv_importance(q, k)
    monkeypatch.setattr(_host, "MAX_GRID_Y", 5)
    assert len(_host.batch_slices(3, 2)) == 2
    sliced = compress_kv(q, k, v, modality, keep_ratio={"image": 0.5}, merge=merge)
    for name in ("k", "v", "lengths", "positions"):
        assert torch.equal(getattr(sliced, name), getattr(whole, name)), name
    assert torch.equal(kv_importance(q, k), whole_scores)
    assert not torch.equal(whole.k[0], whole.k[2]) and whole_scores.abs().sum(-1).min() > 0  # every row written


def test_a_sequence_with_more_kv_heads_than_a_grid_holds_is_one_clear_error(monkeypatch):
    from omnitune.kernels import _host

    monkeypatch.setattr(_host, "MAX_GRID_Y", 1)
    q, k, v, modality = _compress_args(b=1, h=2, hkv=2)
    with pytest.raises(InputError, match=r"2 heads a sequence: more than a launch's grid holds \(1\)"):
        kv_importance(q, k)


def _split_write(args):
    key, value, caches, slot_mapping = args
    return key, value, caches[0], caches[1], slot_mapping


@pytest.mark.parametrize("case", sorted(EMPTY_CALLS))
@pytest.mark.parametrize("check", [True, False])
def test_empty_batches_and_zero_sizes_are_one_clear_input_error(case, check, monkeypatch):
    # The check mode only adds value checks: these are metadata, refused either way.
    monkeypatch.setenv("OMNITUNE_CHECK", "1" if check else "0")
    call, message = EMPTY_CALLS[case]
    with pytest.raises(InputError, match=message):
        call()

"""kv_compress merge modes (average, pivotal, weighted, none) and the merge threshold: each mode
against the float64 reference on fresh random inputs at thresholds that merge every evicted token
(-1) or some of them, each mode's conservation law over the tokens it merged, a threshold that
merges nothing giving exactly "none", and what no mode may change (which tokens are kept, text).
Under the interpreter on the CPU (fp32 and fp16), on the GPU when there is one."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from omnitune.errors import InputError, ShapeError
from omnitune.kernels import kv_compress as kvc
from omnitune.kernels.kv_compress import DEFAULT_MERGE_THRESHOLD, MERGE_MODES, KVCompressInputs, Modality, compress_kv
from omnitune.spec import relative_error

SPEC = kvc.SPEC
CPU_DTYPES = (torch.float32, torch.float16)
MERGING = ("average", "pivotal", "weighted")
T, I, A, V = (int(m) for m in (Modality.TEXT, Modality.IMAGE, Modality.AUDIO, Modality.VIDEO))
TILES = {"BLOCK_N": 16, "BLOCK_E": 16, "BLOCK_K": 16, "num_warps": 2, "num_stages": 1}
RATIO = {"image": 0.25, "audio": 0.5, "video": 0.2}
RECENT = 6
ALWAYS = -1.0  # every evicted token with a kept token of its modality merges
NEVER = 1.01   # above any cosine similarity: nothing merges


def _random_case(dtype, device, seed):
    """Two sequences of plain Gaussian q/k/v (so some evicted tokens' best match points away,
    which the weighted mode must clamp) with different layouts; 2 kv heads, GQA 2."""
    gen = torch.Generator().manual_seed(seed)
    n, d, w = 40, 32, 4
    modality = torch.tensor([
        [T] * 4 + [I] * 14 + [T] * 2 + [A] * 8 + [V] * 6 + [T] * 6,
        [T] * 2 + [A] * 6 + [I] * 20 + [T] * 4 + [V] * 4 + [T] * 4,
    ])

    def randn(*shape):
        return torch.randn(shape, generator=gen).to(device=device, dtype=dtype)

    return randn(2, 4, w, d), randn(2, 2, n, d), randn(2, 2, n, d), modality.to(device)


def _reference_for(q, k, v, modality, merge, threshold):
    inputs = KVCompressInputs(q, k, v, modality, kvc._quotas(modality, RATIO, RECENT), RECENT,
                              1 / math.sqrt(q.shape[-1]), merge, threshold)
    return SPEC.reference(inputs)


def _assignment(k, modality, positions):
    """For one (sequence, kv head): each evicted non-text token's target row in the kept list and
    its cosine similarity, in float64 — the test's own oracle for the conservation laws."""
    kept = [p for p in positions.tolist() if p >= 0]
    keys = k.double()
    unit = torch.nn.functional.normalize(keys, dim=-1)
    out = []
    for e in range(keys.shape[0]):
        if e in kept or int(modality[e]) == T:
            continue
        rows = [r for r, p in enumerate(kept) if int(modality[p]) == int(modality[e])]
        if not rows:
            continue
        sims = torch.stack([unit[e] @ unit[kept[r]] for r in rows])
        best = int(torch.argmax(sims))  # the first maximum: the earlier kept token
        out.append((e, rows[best], float(sims[best])))
    return kept, out


def _middle_threshold(q, k, v, modality):
    """A threshold that merges about half the evicted tokens of the case, placed in the widest gap
    between their best similarities (float64) near the median, so that no token's similarity in
    the kernel's precision (fp16 keys: ~1e-3) lands on the other side of it than in float64."""
    out = compress_kv(q, k, v, modality, keep_ratio=RATIO, recent=RECENT, config=TILES, merge="none")
    sims = sorted(s for bi in range(k.shape[0]) for hk in range(k.shape[1])
                  for _, _, s in _assignment(k[bi, hk].cpu(), modality[bi].cpu(), out.positions[bi, hk].cpu())[1])
    middle = range(len(sims) // 4, 3 * len(sims) // 4)
    i = max(middle, key=lambda i: sims[i + 1] - sims[i])
    assert sims[i + 1] - sims[i] > 5e-3, "no clear gap near the median: pick another seed"
    return (sims[i] + sims[i + 1]) / 2


# ------------------------------------------------------------------------------------------------
# Every mode against the reference
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=str)
@pytest.mark.parametrize("threshold", [ALWAYS, DEFAULT_MERGE_THRESHOLD], ids=["always", "default"])
@pytest.mark.parametrize("merge", MERGE_MODES)
def test_spec_launch_matches_reference_for_each_mode(merge, threshold, dtype, device):
    problem = dataclasses.replace(SPEC.example_problem, merge=merge, merge_threshold=threshold)
    inputs = SPEC.make_inputs(problem, dtype, device, 21)
    assert inputs.merge == merge and inputs.merge_threshold == threshold
    expected = SPEC.reference(inputs)
    out = SPEC.new_output(inputs)
    assert bool(out.isnan().all())
    SPEC.launch(inputs, out, SPEC.default_config(problem, dtype))
    assert SPEC.compare(out, expected) <= SPEC.tolerance[dtype]


@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=str)
@pytest.mark.parametrize("threshold", ["always", "middle"])
def test_modes_match_reference_on_plain_random_inputs_and_differ_from_each_other(threshold, dtype, device):
    q, k, v, modality = _random_case(dtype, device, seed=31)
    t = ALWAYS if threshold == "always" else _middle_threshold(q, k, v, modality)
    results = {}
    for merge in MERGE_MODES:
        out = compress_kv(q, k, v, modality, keep_ratio=RATIO, recent=RECENT, config=TILES, merge=merge,
                          merge_threshold=t)
        got = torch.stack([out.k, out.v])
        assert relative_error(got, _reference_for(q, k, v, modality, merge, t)) <= SPEC.tolerance[dtype], merge
        results[merge] = got.double()
    # the modes are not the same computation under different names
    for a in MERGE_MODES:
        for b in MERGE_MODES:
            if a < b:
                assert relative_error(results[a], results[b]) > 1e-2, (a, b)


# ------------------------------------------------------------------------------------------------
# Conservation laws, on the fp32 kernel output against the test's own assignment
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("threshold", ["always", "middle"])
@pytest.mark.parametrize("merge", MERGE_MODES)
def test_each_mode_conserves_what_it_should(merge, threshold, device):
    # Over the tokens the threshold lets merge (all of them at -1); the others are dropped and
    # count nowhere, so a pivot none of them chose stays as it was.
    q, k, v, modality = _random_case(torch.float32, device, seed=47)
    t = ALWAYS if threshold == "always" else _middle_threshold(q, k, v, modality)
    out = compress_kv(q, k, v, modality, keep_ratio=RATIO, recent=RECENT, config=TILES, merge=merge,
                      merge_threshold=t)
    checked = dropped = 0
    for bi in range(2):
        for hk in range(2):
            kept, candidates = _assignment(k[bi, hk].cpu(), modality[bi].cpu(), out.positions[bi, hk].cpu())
            merges = [(e, row, sim) for e, row, sim in candidates if sim >= t]
            dropped += len(candidates) - len(merges)
            for name, src, got in (("k", k, out.k), ("v", v, out.v)):
                x = src[bi, hk].double().cpu()
                o = got[bi, hk, : len(kept)].double().cpu()
                pivots = x[kept]
                merged_sum = torch.zeros_like(pivots)  # Σ e_i per kept row
                count = torch.zeros(len(kept), dtype=torch.float64)
                weighted_sum = torch.zeros_like(pivots)  # Σ max(s_i, 0) e_i per kept row
                weight = torch.zeros(len(kept), dtype=torch.float64)
                for e, row, sim in merges:
                    merged_sum[row] += x[e]
                    count[row] += 1
                    weighted_sum[row] += max(sim, 0.0) * x[e]
                    weight[row] += max(sim, 0.0)
                if merge == "none":
                    assert torch.equal(got[bi, hk, : len(kept)], src[bi, hk, kept]), name
                    continue
                if merge == "average":
                    # (1 + c)·output = pivot + Σ merged, row by row and so in total
                    lhs, rhs = ((1 + count)[:, None] * o).sum(0), (pivots + merged_sum).sum(0)
                elif merge == "weighted":
                    lhs, rhs = ((1 + weight)[:, None] * o).sum(0), (pivots + weighted_sum).sum(0)
                else:  # pivotal: c·(2·output − pivot) = Σ merged; untouched pivots stay
                    lhs, rhs = (count[:, None] * (2 * o - pivots)).sum(0), merged_sum.sum(0)
                    assert torch.allclose(o[count == 0], pivots[count == 0], rtol=0, atol=1e-6), name
                assert relative_error(lhs, rhs) <= 1e-5, (name, bi, hk)
                untouched = count == 0
                assert torch.allclose(o[untouched], pivots[untouched], rtol=0, atol=1e-6), name
                checked += len(merges)
    if merge != "none":
        assert checked > 20  # the laws were exercised on many merged tokens
    assert (dropped == 0) == (threshold == "always") and (threshold == "always" or dropped > 10)


def test_weighted_merging_clamps_negative_similarity(device):
    # 3 image tokens: one kept (the attended one), one evicted along it (s > 0), one against it (s < 0).
    d = 16
    e = torch.eye(d)
    k = torch.zeros(1, 1, 8, d)
    k[0, 0, :] = 0.3 * e[5]  # text tokens
    k[0, 0, 1] = 6 * e[0] + e[1]
    k[0, 0, 2] = e[1] + 0.5 * e[2]
    k[0, 0, 3] = -e[1] + 0.2 * e[3]
    v = torch.randn(1, 1, 8, d, generator=torch.Generator().manual_seed(3))
    q = 3 * e[0].expand(1, 1, 4, d).clone()
    modality = torch.tensor([[T, I, I, I, T, T, T, T]])
    # the clamp matters only below a threshold of 0: here every token merges
    out = compress_kv(q.to(device), k.to(device), v.to(device), modality.to(device),
                      keep_ratio={"image": 1 / 3}, config=TILES, merge="weighted", merge_threshold=ALWAYS)
    assert out.positions[0, 0].tolist() == [0, 1, 4, 5, 6, 7]
    unit = torch.nn.functional.normalize(k[0, 0].double(), dim=-1)
    s2, s3 = float(unit[2] @ unit[1]), float(unit[3] @ unit[1])
    assert s2 > 0 > s3
    want_v = (v[0, 0, 1].double() + s2 * v[0, 0, 2].double()) / (1 + s2)  # token 3 weighs nothing
    assert relative_error(out.v[0, 0, 1].double().cpu(), want_v) <= 1e-6


@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=str)
@pytest.mark.parametrize("merge", MERGING)
def test_threshold_above_one_merges_nothing_and_gives_exactly_none(merge, dtype, device):
    # the kernel runs and masks every atomic: the kept tokens come out bitwise as with "none"
    q, k, v, modality = _random_case(dtype, device, seed=61)
    none = compress_kv(q, k, v, modality, keep_ratio=RATIO, recent=RECENT, config=TILES, merge="none")
    out = compress_kv(q, k, v, modality, keep_ratio=RATIO, recent=RECENT, config=TILES, merge=merge,
                      merge_threshold=NEVER)
    assert torch.equal(out.positions, none.positions)
    assert torch.equal(out.k, none.k) and torch.equal(out.v, none.v)
    everything = compress_kv(q, k, v, modality, keep_ratio=RATIO, recent=RECENT, config=TILES, merge=merge,
                             merge_threshold=ALWAYS)
    assert relative_error(everything.k, none.k) > 1e-2  # the same case does merge at -1


# ------------------------------------------------------------------------------------------------
# What no mode changes
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=str)
def test_budgets_and_text_do_not_depend_on_the_mode(dtype, device):
    q, k, v, modality = _random_case(dtype, device, seed=53)
    quotas = kvc._quotas(modality, RATIO, RECENT)
    n = modality.shape[1]
    first = None
    for merge in MERGE_MODES:
        out = compress_kv(q, k, v, modality, keep_ratio=RATIO, recent=RECENT, config=TILES, merge=merge)
        if first is None:
            first = out
        assert torch.equal(out.positions, first.positions) and torch.equal(out.lengths, first.lengths), merge
        for bi in range(2):
            for hk in range(2):
                pos = out.positions[bi, hk]
                kept = pos[pos >= 0]
                mods = modality[bi, kept]
                outside_recent = kept < n - RECENT
                for m in (I, A, V):  # each modality's budget, exactly (the recent window on top)
                    assert int(((mods == m) & outside_recent).sum()) == int(quotas[bi, m]), (merge, m)
                text = (modality[bi] == T).nonzero().flatten()
                assert set(text.tolist()) <= set(kept.tolist()), merge  # text never evicted
                rows = (mods == T).nonzero().flatten()
                # nothing is merged into text: its rows are the input, bitwise
                assert torch.equal(out.k[bi, hk, rows], k[bi, hk, kept[rows]]), merge
                assert torch.equal(out.v[bi, hk, rows], v[bi, hk, kept[rows]]), merge


# ------------------------------------------------------------------------------------------------
# The option's plumbing
# ------------------------------------------------------------------------------------------------


def test_problem_key_round_trips_each_mode_and_rejects_unknown_ones():
    for merge in MERGE_MODES:
        p = dataclasses.replace(SPEC.example_problem, merge=merge)
        assert f"merge={merge}" in SPEC.problem_key(p)
        assert SPEC.parse_shape(SPEC.problem_key(p)) == p
    assert SPEC.parse_shape("b=1,h=2,hkv=1,n=64,d=32,window=8").merge == "average"
    with pytest.raises(ShapeError, match="impossible.*merge='mean'"):
        SPEC.parse_shape("b=1,h=2,hkv=1,n=64,d=32,window=8,merge=mean")
    plain = dataclasses.replace(SPEC.example_problem, merge="average")
    none = dataclasses.replace(plain, merge="none")
    assert SPEC.flops(none) < SPEC.flops(plain) and SPEC.bytes_moved(none, torch.float16) < SPEC.bytes_moved(
        plain, torch.float16)


def test_problem_key_round_trips_the_threshold_and_matches_only_the_same_one():
    p = dataclasses.replace(SPEC.example_problem, merge_threshold=0.5)
    assert "merge_threshold=0.5" in SPEC.problem_key(p)
    assert SPEC.parse_shape(SPEC.problem_key(p)) == p
    assert SPEC.parse_shape("b=1,h=2,hkv=1,n=64,d=32,window=8").merge_threshold == DEFAULT_MERGE_THRESHOLD
    assert SPEC.parse_shape("b=1,h=2,hkv=1,n=64,d=32,window=8,merge_threshold=-1").merge_threshold == -1.0
    with pytest.raises(ShapeError, match="merge_threshold='high' is not a valid float"):
        SPEC.parse_shape("b=1,h=2,hkv=1,n=64,d=32,window=8,merge_threshold=high")
    with pytest.raises(ShapeError, match="merge_threshold='nan' is not a valid float"):
        SPEC.parse_shape("b=1,h=2,hkv=1,n=64,d=32,window=8,merge_threshold=nan")
    # a config tuned at one threshold is not looked up for another (a negative one has no ratio)
    assert SPEC.match.distance(p, p) == 0.0
    assert SPEC.match.distance(p, dataclasses.replace(p, merge_threshold=-1.0)) is None


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), "0.9", True, None])
def test_bad_merge_threshold_is_one_clear_error(bad, device):
    q, k, v, modality = _random_case(torch.float32, device, seed=1)
    with pytest.raises(InputError, match="merge_threshold=.*use a cosine similarity"):
        compress_kv(q, k, v, modality, keep_ratio=RATIO, config=TILES, merge_threshold=bad)


def test_unknown_merge_mode_is_one_clear_error(device):
    q, k, v, modality = _random_case(torch.float32, device, seed=1)
    with pytest.raises(InputError, match="merge='max'; choose one of average, pivotal, weighted, none"):
        compress_kv(q, k, v, modality, keep_ratio=RATIO, config=TILES, merge="max")


# ------------------------------------------------------------------------------------------------
# On the GPU: a real shape per merging mode, bf16 included (the interpreter gets bf16 wrong)
# ------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("threshold", [ALWAYS, NEVER], ids=["always", "never"])
@pytest.mark.parametrize("merge", MERGE_MODES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_gpu_each_mode_matches_reference_at_a_real_shape(merge, threshold, dtype):
    # -1: every evicted token merges (the factory's copies are < 0.85 from their anchor, so the
    # default threshold would merge none of them); 1.01: none merges, the kernel masks every add
    problem = SPEC.parse_shape(f"b=2,h=28,hkv=4,n=1024,d=128,window=32,recent=32,keep_pct=25,merge={merge},"
                               f"merge_threshold={threshold}")
    inputs = SPEC.make_inputs(problem, dtype, "cuda", 5)
    expected = SPEC.reference(inputs)
    out = SPEC.new_output(inputs)
    SPEC.launch(inputs, out, SPEC.default_config(problem, dtype))
    assert SPEC.compare(out, expected) <= SPEC.tolerance[dtype]

"""Modality-aware KV compression: its spec's contract, the selection rule, the merge on a case
built by hand, a ragged batch, and bad input. Under the interpreter on the CPU (fp32 and fp16),
on the GPU when there is one."""

from __future__ import annotations

import math

import pytest
import torch

from omnitune.errors import InputError
from omnitune.kernels import kv_compress as kvc
from omnitune.kernels.kv_compress import KVCompressInputs, KVCompressProblem, Modality, compress_kv, select_tokens
from omnitune.spec import Config, DeviceLimits, relative_error
from conftest import assert_constraint_case, assert_registered_with_valid_defaults

SPEC = kvc.SPEC
CPU_DTYPES = (torch.float32, torch.float16)
T, I, A, V = (int(m) for m in (Modality.TEXT, Modality.IMAGE, Modality.AUDIO, Modality.VIDEO))
PROBLEMS = (
    SPEC.example_problem,
    *SPEC.sample_problems,
    KVCompressProblem(b=1, h=28, hkv=4, n=8192, d=128, window=32, recent=64, keep_pct=25),
)


# ------------------------------------------------------------------------------------------------
# The spec's contract
# ------------------------------------------------------------------------------------------------


def test_registered_with_valid_default_configs():
    assert_registered_with_valid_defaults(SPEC, PROBLEMS)


def test_problem_layout_and_impossible_shapes():
    p = KVCompressProblem(b=1, h=2, hkv=1, n=64, d=32, window=8, keep_pct=25)
    spans = p.spans()
    assert [m for m, _, _ in spans] == [Modality.TEXT, Modality.IMAGE, Modality.TEXT, Modality.AUDIO,
                                        Modality.TEXT, Modality.VIDEO, Modality.TEXT]
    assert spans[0][1] == 0 and spans[-1][2] == 64 and all(a[2] == b[1] for a, b in zip(spans, spans[1:]))
    assert [p.quota(m) for m in (Modality.IMAGE, Modality.AUDIO, Modality.VIDEO)] == [6, 2, 2]  # 24, 8, 8 tokens
    assert p.kept == 24 + 10
    assert SPEC.parse_shape(SPEC.problem_key(p)) == p
    for bad in ("b=1,h=2,hkv=1,n=64,d=32,window=9", "b=1,h=2,hkv=1,n=8,d=32,window=1",
                "b=1,h=3,hkv=2,n=64,d=32,window=4", "b=1,h=2,hkv=1,n=64,d=32,window=4,keep_pct=101"):
        with pytest.raises(Exception, match="impossible"):
            SPEC.parse_shape(bad)


def test_make_inputs_is_deterministic_per_seed_and_never_zero():
    p = SPEC.example_problem
    a, b, c = (SPEC.make_inputs(p, torch.float16, "cpu", s) for s in (3, 3, 4))
    for name in ("q_window", "k", "v"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
        assert not torch.equal(getattr(a, name), getattr(c, name)), name
        assert bool((getattr(a, name) != 0).any())
    assert torch.equal(a.modality, c.modality) and torch.equal(a.quotas, c.quotas)


def test_factory_makes_the_anchors_the_clear_choice():
    # The planted anchors are exactly what the reference keeps: no near tie decides the answer.
    p = SPEC.example_problem
    inputs = SPEC.make_inputs(p, torch.float32, "cpu", 0)
    expected = SPEC.reference(inputs)
    assert expected.shape == (2, p.b, p.hkv, p.kept, p.d)
    assert bool(torch.isfinite(expected).all())


def _some_configs(problem, dtype, count=3):
    valid = SPEC.valid_configs(problem, dtype)
    step = max(1, len(valid) // count)
    return [SPEC.default_config(problem, dtype)] + valid[::step][:count]


@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=str)
def test_launch_matches_reference_on_poisoned_output(dtype, device):
    problem = SPEC.example_problem
    inputs = SPEC.make_inputs(problem, dtype, device, 11)
    expected = SPEC.reference(inputs)
    for cfg in _some_configs(problem, dtype):
        out = SPEC.new_output(inputs)
        assert bool(out.isnan().all())
        SPEC.launch(inputs, out, cfg)
        assert SPEC.compare(out, expected) <= SPEC.tolerance[dtype], cfg.label()


def test_flops_and_bytes_are_positive():
    for p in PROBLEMS:
        assert SPEC.flops(p) > 0 and SPEC.bytes_moved(p, torch.float16) > 0
    p = SPEC.example_problem
    keep_all = KVCompressProblem(b=p.b, h=p.h, hkv=p.hkv, n=p.n, d=p.d, window=p.window, keep_pct=100)
    assert SPEC.flops(keep_all) < SPEC.flops(p)  # nothing evicted, no similarity to compute


_BIG = KVCompressProblem(b=1, h=1, hkv=1, n=512, d=128, window=64, keep_pct=5)
_NO_EVICTION = KVCompressProblem(b=1, h=2, hkv=2, n=48, d=32, window=6, keep_pct=100)
CONSTRAINT_CASES = {
    "shared_memory": (_BIG, Config(BLOCK_N=128, BLOCK_E=64, BLOCK_K=64, num_warps=8, num_stages=3)),
    "window_registers": (_BIG, Config(BLOCK_N=128, BLOCK_E=16, BLOCK_K=16, num_warps=2, num_stages=1)),
    "merge_registers": (_BIG, Config(BLOCK_N=16, BLOCK_E=64, BLOCK_K=64, num_warps=2, num_stages=1)),
    "block_n_exceeds_tokens": (_NO_EVICTION, Config(BLOCK_N=128, BLOCK_E=16, BLOCK_K=16, num_warps=4, num_stages=1)),
    "merge_tile_exceeds_tokens": (_NO_EVICTION, Config(BLOCK_N=16, BLOCK_E=32, BLOCK_K=16, num_warps=4, num_stages=1)),
}


@pytest.mark.parametrize("name", sorted(CONSTRAINT_CASES))
def test_constraint_rejects_what_it_should(name):
    assert_constraint_case(SPEC, CONSTRAINT_CASES, name, limits=DeviceLimits(shared_memory_per_block_bytes=48 * 1024))


# ------------------------------------------------------------------------------------------------
# Importance and selection
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=str)
@pytest.mark.parametrize("h,hkv,w,block_n", [(2, 2, 1, 16), (7, 1, 5, 32), (4, 2, 16, 64)])
def test_importance_matches_reference_scores(h, hkv, w, block_n, dtype, device):
    # Plain Gaussian inputs: the importance itself, not just the ranking it induces, must agree.
    gen = torch.Generator().manual_seed(h * 100 + w)
    n, d = 37, 32
    q = torch.randn(2, h, w, d, generator=gen).to(device=device, dtype=dtype)
    k = torch.randn(2, hkv, n, d, generator=gen).to(device=device, dtype=dtype)
    cfg = Config(BLOCK_N=block_n, BLOCK_E=16, BLOCK_K=16, num_warps=2, num_stages=1)
    got = kvc.importance(q, k, 0.2, cfg)
    want = kvc.reference_importance(q, k, 0.2)
    assert relative_error(got, want) <= {torch.float32: 1e-5, torch.float16: 2e-3}[dtype]
    # each window row's probabilities sum to one: the mean over rows and heads sums to one too
    assert torch.allclose(got.sum(-1).double().cpu(), torch.ones(2, hkv, dtype=torch.float64), atol=1e-4)


# ------------------------------------------------------------------------------------------------
# Selection
# ------------------------------------------------------------------------------------------------


def test_select_tokens_follows_the_rule_token_by_token():
    gen = torch.Generator().manual_seed(0)
    b, hkv, n, recent = 2, 3, 40, 5
    modality = torch.randint(0, 4, (b, n), generator=gen)
    scores = torch.randint(0, 6, (b, hkv, n), generator=gen).double()  # many ties on purpose
    quotas = torch.tensor([[0, 3, 1, 0], [0, 50, 2, 4]])
    keep = select_tokens(scores, modality, quotas, recent)
    for bi in range(b):
        for hk in range(hkv):
            want = set()
            for j in range(n):
                if modality[bi, j] == T or j >= n - recent:
                    want.add(j)
            for m in (I, A, V):
                cands = [j for j in range(n) if modality[bi, j] == m and j < n - recent]
                cands.sort(key=lambda j: (-float(scores[bi, hk, j]), j))  # ties: the earlier token
                want.update(cands[: int(quotas[bi, m])])
            assert set(keep[bi, hk].nonzero().flatten().tolist()) == want


def _select_by_loop(scores, modality, quotas, recent):
    """The selection rule written out token by token, for one (sequence, kv head) at a time."""
    b, hkv, n = scores.shape
    keep = torch.zeros((b, hkv, n), dtype=torch.bool)
    for bi in range(b):
        for hk in range(hkv):
            for j in range(n):
                keep[bi, hk, j] = int(modality[bi, j]) == T or j >= n - recent
            for m in (I, A, V):
                cands = [j for j in range(n) if int(modality[bi, j]) == m and j < n - recent]
                cands.sort(key=lambda j: (-float(scores[bi, hk, j]), j))  # ties: the earlier token
                keep[bi, hk, cands[: int(quotas[bi, m])]] = True
    return keep


@pytest.mark.parametrize("seed", range(6))
def test_select_tokens_and_positions_match_a_loop_on_random_ties(seed):
    # fp32 scores from 3 values (ties everywhere), random layouts, recent windows from 0 to n,
    # quotas from 0 to more than a modality has
    gen = torch.Generator().manual_seed(100 + seed)
    b, hkv, n = 3, 2, int(torch.randint(8, 70, (1,), generator=gen))
    modality = torch.randint(0, 4, (b, n), generator=gen)
    scores = torch.randint(0, 3, (b, hkv, n), generator=gen).float() / 7
    quotas = torch.randint(0, n // 2 + 2, (b, len(Modality)), generator=gen)
    recent = (0, n, int(torch.randint(0, n, (1,), generator=gen)))[seed % 3]
    keep = select_tokens(scores, modality, quotas, recent)
    assert torch.equal(keep, _select_by_loop(scores, modality, quotas, recent))
    for width in (int(keep.sum(-1).max()), 3):
        pos = kvc._positions_of(keep, width)
        assert pos.is_contiguous() and pos.shape == (b, hkv, width)
        for bi in range(b):
            for hk in range(hkv):
                want = keep[bi, hk].nonzero().flatten().tolist()[:width]
                assert pos[bi, hk].tolist() == want + [-1] * (width - len(want))


# ------------------------------------------------------------------------------------------------
# The public function
# ------------------------------------------------------------------------------------------------


def _hand_built(dtype, device):
    """16 tokens: text 0–1, image 2–5, audio 6–7, text 8–15 (window: the last 4). Query heads
    look along e0; tokens 2 and 6 have large e0 components (the important ones); 3–5 are near
    copies of 2 and 7 of 6, orthogonal to e0."""
    d, n = 16, 16
    gen = torch.Generator().manual_seed(5)
    e = torch.eye(d)
    k = 0.1 * torch.randn(1, 1, n, d, generator=gen)
    k[0, 0, :, 0] = 0.0
    k[0, 0, 2] += 8 * e[0] + e[1]
    k[0, 0, 3:6] += e[1]
    k[0, 0, 6] += 8 * e[0] + e[2]
    k[0, 0, 7] += e[2]
    k[0, 0, [0, 1, *range(8, 16)]] += torch.randn(10, d, generator=gen)
    v = torch.randn(1, 1, n, d, generator=gen)
    q = 4 * e[0].expand(1, 2, 4, d) + 0.1 * torch.randn(1, 2, 4, d, generator=gen)
    modality = torch.tensor([[T, T, I, I, I, I, A, A] + [T] * 8])

    def to(x):
        return x.to(device=device, dtype=dtype)

    return to(q), to(k), to(v), modality.to(device)


@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=str)
def test_evicted_tokens_are_averaged_into_their_most_similar_kept_token(dtype, device):
    # merge_threshold=-1: every evicted token merges, however dissimilar (3–5 and 7 are far from
    # the attended 2 and 6: cosine ≈ 0.12)
    q, k, v, modality = _hand_built(dtype, device)
    out = compress_kv(q, k, v, modality, keep_ratio={"image": 0.25, Modality.AUDIO: 0.5},
                      config={"BLOCK_N": 16, "BLOCK_E": 16, "BLOCK_K": 16}, merge_threshold=-1)
    kept = [0, 1, 2, 6, *range(8, 16)]
    assert out.lengths.tolist() == [12]
    assert out.positions[0, 0].tolist() == kept
    want_k, want_v = k[0, 0, kept].float().clone(), v[0, 0, kept].float().clone()
    want_k[2], want_v[2] = k[0, 0, 2:6].float().mean(0), v[0, 0, 2:6].float().mean(0)
    want_k[3], want_v[3] = k[0, 0, 6:8].float().mean(0), v[0, 0, 6:8].float().mean(0)
    tol = 1e-6 if dtype == torch.float32 else 1e-3
    assert relative_error(out.k[0, 0].float(), want_k) <= tol
    assert relative_error(out.v[0, 0].float(), want_v) <= tol


@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=str)
def test_default_threshold_keeps_attended_pivots_undiluted(dtype, device):
    # The same case at the default threshold: no evicted token is similar enough to 2 or 6, so
    # all are dropped and the attended keys stay bitwise what they were.
    q, k, v, modality = _hand_built(dtype, device)
    out = compress_kv(q, k, v, modality, keep_ratio={"image": 0.25, Modality.AUDIO: 0.5},
                      config={"BLOCK_N": 16, "BLOCK_E": 16, "BLOCK_K": 16})
    kept = [0, 1, 2, 6, *range(8, 16)]
    assert out.positions[0, 0].tolist() == kept
    assert torch.equal(out.k[0, 0], k[0, 0, kept]) and torch.equal(out.v[0, 0], v[0, 0, kept])


def test_zero_ratio_drops_a_modality_and_unnamed_modalities_stay_whole(device):
    q, k, v, modality = _hand_built(torch.float32, device)
    out = compress_kv(q, k, v, modality, keep_ratio={"image": 0.0}, config={"BLOCK_N": 16})
    kept = [0, 1, 6, 7, *range(8, 16)]  # image gone (nothing to merge into), audio whole
    assert out.positions[0, 0].tolist() == kept
    assert torch.equal(out.k[0, 0], k[0, 0, kept]) and torch.equal(out.v[0, 0], v[0, 0, kept])


@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=str)
def test_ragged_batch_with_recent_window_matches_reference(dtype, device):
    # Two sequences with different layouts keep different lengths; the shorter is zero-padded.
    # The recent window (6) covers video tokens of sequence 1, which are then kept whatever.
    gen = torch.Generator().manual_seed(9)
    n, d, w, recent = 40, 32, 4, 6
    modality = torch.tensor([
        [T] * 4 + [I] * 14 + [T] * 2 + [A] * 8 + [V] * 6 + [T] * 6,
        [T] * 2 + [A] * 6 + [I] * 20 + [T] * 4 + [V] * 4 + [T] * 4,
    ])
    q = torch.randn(2, 4, w, d, generator=gen).to(device=device, dtype=dtype)
    k = torch.randn(2, 2, n, d, generator=gen).to(device=device, dtype=dtype)
    v = torch.randn(2, 2, n, d, generator=gen).to(device=device, dtype=dtype)
    ratio = {"image": 0.25, "audio": 0.5, "video": 0.2}
    out = compress_kv(q, k, v, modality.to(device), keep_ratio=ratio, recent=recent,
                      config={"BLOCK_N": 16, "BLOCK_E": 16, "BLOCK_K": 16, "num_warps": 2})
    # Quotas round half up. seq 0: 12 text + round(14·.25)=4 image + 4 audio + round(6·.2)=1 video
    # (28–33, outside the recent 34–39) = 21. seq 1: 10 text + 5 image + round(6·.5)=3 audio + the
    # recent video 34, 35 + round(2·.2)=0 other video = 20.
    assert out.lengths.tolist() == [21, 20]
    assert bool((out.positions[1, :, 20:] == -1).all()) and bool((out.k[1, :, 20:] == 0).all())
    assert {34, 35} <= set(out.positions[1, 0].tolist())
    inputs = KVCompressInputs(q, k, v, modality.to(device), kvc._quotas(modality.to(device), ratio, recent),
                              recent, 1 / math.sqrt(d))
    expected = SPEC.reference(inputs)
    assert relative_error(torch.stack([out.k, out.v]), expected) <= SPEC.tolerance[dtype]


def test_default_lookup_through_runtime(device):
    q, k, v, modality = _hand_built(torch.float32, device)
    out = compress_kv(q, k, v, modality, keep_ratio={"image": 0.25, "audio": 0.5})
    assert out.positions[0, 0].tolist() == [0, 1, 2, 6, *range(8, 16)]


# A window longer than the final text span a problem can hold: the lookup judges a config at the
# problem's window (16 rows here), the kernels run it at the caller's (32). Shared memory of 6 KiB
# lets BLOCK_N=32 at 16 rows (6,144 bytes, fp32, d=32) but not at 32 rows (8,192).
LONG_WINDOW = dict(n=64, d=32, w=32)
SMALL_SMEM = DeviceLimits(6144, (9, 0), 132)
FITS_ONLY_SHORT = Config(BLOCK_N=32, BLOCK_E=16, BLOCK_K=16, num_warps=4, num_stages=1)


def _long_window_case(dtype, device):
    n, d, w = LONG_WINDOW["n"], LONG_WINDOW["d"], LONG_WINDOW["w"]
    gen = torch.Generator().manual_seed(11)
    modality = torch.tensor([[I] * (n - w) + [T] * w])
    q = torch.randn(1, 2, w, d, generator=gen).to(device=device, dtype=dtype)
    k, v = (torch.randn(1, 1, n, d, generator=gen).to(device=device, dtype=dtype) for _ in range(2))
    return q, k, v, modality.to(device)


def test_a_looked_up_config_is_judged_at_the_window_the_kernels_run(device, monkeypatch):
    from omnitune import runtime

    q, k, v, modality = _long_window_case(torch.float32, device)
    monkeypatch.setattr(runtime, "_device_limits", lambda: SMALL_SMEM)
    monkeypatch.setattr(runtime, "get_config", lambda *args, **kwargs: FITS_ONLY_SHORT)  # as a table would serve it
    held = KVCompressProblem(b=1, h=2, hkv=1, n=64, d=32, window=kvc.tail_length(64), keep_pct=25)
    assert held.window < LONG_WINDOW["w"] and not SPEC.violations(held, FITS_ONLY_SHORT, torch.float32, SMALL_SMEM)
    assert kvc._window_misfit(FITS_ONLY_SHORT, held, LONG_WINDOW["w"], torch.float32, SMALL_SMEM)
    served = []
    real = kvc._compress
    monkeypatch.setattr(kvc, "_compress", lambda *args: (served.append(args[7]), real(*args))[1])
    out = compress_kv(q, k, v, modality, keep_ratio={"image": 0.25})
    assert len(served) == 1 and served[0] != FITS_ONLY_SHORT
    assert kvc._window_misfit(served[0], held, LONG_WINDOW["w"], torch.float32, SMALL_SMEM) is None
    inputs = KVCompressInputs(q, k, v, modality, kvc._quotas(modality, {"image": 0.25}, 0), 0, 1 / math.sqrt(32))
    assert relative_error(torch.stack([out.k, out.v]), SPEC.reference(inputs)) <= SPEC.tolerance[torch.float32]


def test_a_window_no_config_fits_and_a_callers_config_that_does_not_are_one_clear_error(device, monkeypatch):
    from omnitune import runtime
    from omnitune.errors import ConfigError

    q, k, v, modality = _long_window_case(torch.float32, device)
    monkeypatch.setattr(runtime, "_device_limits", lambda: SMALL_SMEM)
    with pytest.raises(ConfigError, match="cannot run a window of 32 queries .*shared memory"):
        compress_kv(q, k, v, modality, keep_ratio={"image": 0.25}, config=FITS_ONLY_SHORT.as_dict())
    with pytest.raises(ConfigError, match="cannot run a window of 32 queries"):
        kvc.kv_importance(q, k, config=FITS_ONLY_SHORT.as_dict())
    tiny = DeviceLimits(4096, (9, 0), 132)
    monkeypatch.setattr(runtime, "_device_limits", lambda: tiny)
    with pytest.raises(InputError, match="window of 32 queries .* too long for this GPU"):
        compress_kv(q, k, v, modality, keep_ratio={"image": 0.25})


def _bad_inputs(device):
    q, k, v, modality = _hand_built(torch.float32, device)
    image_last = modality.clone()
    image_last[0, -1] = I
    return {
        "window not text": ((q, k, v, image_last), {}, "must be text"),
        "modality out of range": ((q, k, v, modality * 2), {}, "outside 0 \\(text\\)"),
        "unknown modality name": ((q, k, v, modality), {"keep_ratio": {"speech": 0.5}},
                                  "choose one of image, audio, video"),
        "ratio above one": ((q, k, v, modality), {"keep_ratio": {"image": 1.5}}, r"in \[0, 1\]"),
        "text ratio": ((q, k, v, modality), {"keep_ratio": {"text": 0.5}}, "text is always kept whole"),
        "ratio not a mapping": ((q, k, v, modality), {"keep_ratio": 0.5}, "keep_ratio must map"),
        "heads not a multiple": ((q[:, :1].expand(1, 3, 4, 16), k.expand(1, 2, 16, 16), v.expand(1, 2, 16, 16),
                                  modality), {}, "multiple of k/v heads"),
        "window longer than the sequence": ((q[:, :, :1].expand(1, 2, 17, 16), k, v, modality), {}, "use 1..16"),
        "recent past the sequence": ((q, k, v, modality), {"recent": 17}, "recent=17"),
        "float modality": ((q, k, v, modality.float()), {}, "integer tensor"),
        "dtype differs": ((q.half(), k, v, modality), {}, "share one dtype"),
        "fp8 cache": ((q, k.to(torch.float8_e4m3fn), v.to(torch.float8_e4m3fn), modality), {},
                      "does not read fp8 caches"),
    }


@pytest.mark.parametrize("case", sorted(_bad_inputs("cpu")))
def test_bad_input_raises_input_error(case, device):
    args, kwargs, message = _bad_inputs(device)[case]
    kwargs = {"keep_ratio": {"image": 0.5}, **kwargs}
    before = [a.clone() for a in args]
    with pytest.raises(InputError, match=message):
        compress_kv(*args, config={}, **kwargs)
    assert all(torch.equal(a.view(torch.uint8) if a.dtype == torch.float8_e4m3fn else a,
                           b.view(torch.uint8) if b.dtype == torch.float8_e4m3fn else b) for a, b in zip(args, before))


def test_importance_refuses_an_fp8_cache_clearly(device):
    q, k, v, modality = _hand_built(torch.float32, device)
    with pytest.raises(InputError, match="does not read fp8 caches"):
        kvc.kv_importance(q, k.to(torch.float8_e4m3fn))


# ------------------------------------------------------------------------------------------------
# On the GPU: real shapes, bf16 included (the interpreter gets bf16 wrong)
# ------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [
    "b=1,h=28,hkv=4,n=4096,d=128,window=32,recent=64,keep_pct=25",
    "b=4,h=16,hkv=2,n=1000,d=128,window=16,keep_pct=10",
])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_real_shapes(shape, dtype):
    from omnitune.measure.runner import Runner
    from omnitune.trial import TrialStatus

    problem = SPEC.parse_shape(shape)
    runner = Runner(SPEC, problem, dtype)
    for cfg in _some_configs(problem, dtype):
        result = runner.measure(cfg)
        assert result.status in (TrialStatus.OK, TrialStatus.OUT_OF_RESOURCES), (cfg.label(), result.detail)
    assert runner.measure(SPEC.default_config(problem, dtype)).status is TrialStatus.OK

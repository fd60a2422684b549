"""Paged split-KV decode attention: its spec's contract, and the public function on odd cases
(partial last pages, GQA ratios 1/4/7, Lq 1 and 4, one and several splits) and bad input.
Under the interpreter on the CPU (fp32 and fp16), on the GPU when there is one."""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
import torch
import triton

from omnitune.errors import InputError, OmnituneError
from omnitune.kernels import paged_decode_attention as pda
from omnitune.kernels.paged_decode_attention import (
    PagedDecodeInputs,
    PagedDecodePlan,
    PagedDecodeProblem,
    paged_decode_attention,
)
from omnitune.measure.runner import Runner
from omnitune.trial import TrialStatus
from omnitune.spec import Config, DeviceLimits, relative_error
from conftest import INTERPRETED, assert_constraint_case, assert_registered_with_valid_defaults

SPEC = pda.SPEC
CPU_DTYPES = (torch.float32, torch.float16)
PROBLEMS = (
    SPEC.example_problem,
    PagedDecodeProblem(b=1, h=7, hkv=1, lq=4, ctx=23, d=32, block_size=8),
    PagedDecodeProblem(b=3, h=2, hkv=2, lq=1, ctx=1, d=64),
    PagedDecodeProblem(b=64, h=28, hkv=4, lq=1, ctx=4096, d=128),
    PagedDecodeProblem(b=1, h=32, hkv=4, lq=16, ctx=32768, d=128),
    PagedDecodeProblem(b=2, h=8, hkv=1, lq=16, ctx=100, d=256),
)


# ------------------------------------------------------------------------------------------------
# The spec's contract
# ------------------------------------------------------------------------------------------------


def test_registered_with_valid_default_configs():
    assert_registered_with_valid_defaults(SPEC, PROBLEMS)


def test_the_default_split_fills_one_wave_of_the_gpu_at_any_batch():
    """A few long sequences split until the SMs hold one wave of the default tile — 3 programs
    an SM over 3 stages at head dim 128 — not 2 an SM with at most 32 splits: batch 1 at 128k got
    128 programs that way and read 45% of copy bandwidth on the H200. Batch 64 takes one split."""
    sms = DeviceLimits().multiprocessors
    for b, hkv, ctx, expected in ((1, 4, 131072, 64), (2, 4, 65536, 32), (4, 4, 32768, 16),
                                  (1, 4, 32768, 64), (64, 4, 4096, 1), (1, 4, 2048, 8)):
        cfg = SPEC.default_config(PagedDecodeProblem(b=b, h=7 * hkv, hkv=hkv, lq=1, ctx=ctx, d=128), torch.bfloat16)
        assert cfg["NUM_SPLITS"] == expected, (b, ctx)
        assert cfg["num_stages"] == 3 and cfg["BLOCK_N"] == 64 and cfg["num_warps"] == 4
        assert b * hkv * cfg["NUM_SPLITS"] <= 3 * sms
        assert ctx >= cfg["NUM_SPLITS"] * 256  # every split keeps enough keys to pay its partials


def test_the_default_takes_smaller_tiles_where_one_split_overfills_the_wave_and_keeps_its_rules_per_dtype():
    sms = DeviceLimits().multiprocessors
    crowded = PagedDecodeProblem(b=128, h=28, hkv=4, lq=1, ctx=1024, d=128)  # 512 programs > 3 an SM
    cfg = SPEC.default_config(crowded, torch.bfloat16)
    assert (cfg["NUM_SPLITS"], cfg["BLOCK_N"], cfg["num_warps"], cfg["num_stages"]) == (1, 32, 2, 3)
    # Head dim 64 and fp8 tiles: 4 programs an SM over 3 stages; fp32 keeps 2 stages.
    small = SPEC.default_config(PagedDecodeProblem(b=8, h=16, hkv=2, lq=1, ctx=30000, d=64), torch.float16)
    assert small["NUM_SPLITS"] * 16 <= 4 * sms < small["NUM_SPLITS"] * 2 * 16 and small["num_stages"] == 3
    fp8 = SPEC.default_config(PagedDecodeProblem(b=64, h=28, hkv=4, lq=1, ctx=4096, d=128, cache_dtype="fp8_e4m3"),
                              torch.bfloat16)
    assert (fp8["NUM_SPLITS"], fp8["num_stages"]) == (2, 3)
    exact = SPEC.default_config(PagedDecodeProblem(b=64, h=28, hkv=4, lq=1, ctx=4096, d=128), torch.float32)
    assert (exact["NUM_SPLITS"], exact["num_stages"]) == (2, 2)


def test_the_default_follows_the_query_rows_a_program_serves_and_how_far_one_split_overfills():
    sms = DeviceLimits().multiprocessors

    def shape(cfg):
        return cfg["BLOCK_N"], cfg["num_warps"], cfg["num_stages"]

    # 17–32 rows (GQA group × query tokens, padded to 32): 32-key tiles over 2 warps.
    for b, h, hkv, lq in ((6, 40, 8, 4), (12, 32, 8, 6), (24, 28, 4, 4)):
        assert shape(SPEC.default_config(PagedDecodeProblem(b=b, h=h, hkv=hkv, lq=lq, ctx=9000, d=128),
                                         torch.bfloat16)) == (32, 2, 3), (b, h, hkv, lq)
    # 65–128 rows: 8 warps and the 64-key tile, one of which an SM holds: the splits fill one
    # program an SM (16 programs × 8 splits ≤ 132 SMs), where 3 an SM had them overfill it.
    many = SPEC.default_config(PagedDecodeProblem(b=4, h=28, hkv=4, lq=16, ctx=8000, d=128), torch.bfloat16)
    assert shape(many) == (64, 8, 3) and 4 * 4 * many["NUM_SPLITS"] <= sms < 4 * 4 * many["NUM_SPLITS"] * 2
    # 32 rows at head dim 128: five of their tile an SM (8 programs × 64 splits ≤ 5 × 132).
    few = SPEC.default_config(PagedDecodeProblem(b=1, h=40, hkv=8, lq=4, ctx=40000, d=128, block_size=64),
                              torch.bfloat16)
    assert shape(few) == (32, 2, 3) and 8 * few["NUM_SPLITS"] <= 5 * sms < 8 * few["NUM_SPLITS"] * 2
    # ... and where a head dim of 64 makes every tile smaller, the 3-stage count of its own tile.
    small = SPEC.default_config(PagedDecodeProblem(b=1, h=40, hkv=8, lq=4, ctx=40000, d=64, block_size=64),
                                torch.bfloat16)
    assert shape(small) == (32, 2, 3) and 8 * small["NUM_SPLITS"] <= 4 * sms < 8 * small["NUM_SPLITS"] * 2
    # 16 and 64 rows keep the 64-key tile over 4 warps.
    for lq in (2, 8):
        assert shape(SPEC.default_config(PagedDecodeProblem(b=8, h=32, hkv=4, lq=lq, ctx=6000, d=128),
                                         torch.bfloat16)) == (64, 4, 3), lq
    # One split filling two waves or more (128 × 8 kv heads = 1024 programs): 16-key tiles.
    assert shape(SPEC.default_config(PagedDecodeProblem(b=128, h=32, hkv=8, lq=1, ctx=2500, d=128,
                                                        block_size=32), torch.bfloat16)) == (16, 2, 3)
    # fp8 and fp32 keep their own rules.
    fp8 = PagedDecodeProblem(b=4, h=28, hkv=4, lq=16, ctx=8000, d=128, cache_dtype="fp8_e4m3")
    assert SPEC.default_config(fp8, torch.bfloat16)["num_warps"] == 4
    for problem in (fp8, PagedDecodeProblem(b=128, h=32, hkv=8, lq=1, ctx=2500, d=128)):
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            assert not SPEC.violations(problem, SPEC.default_config(problem, dtype), dtype)


def test_every_default_is_a_valid_config_over_a_sweep():
    """Whatever the rows a program serves (GQA group × query tokens), the batch, context, head
    dim, page size, dtype or cache: the default breaks no constraint, and the 8-warp 128-row and
    2-warp 32-row tiles split no further than one program an SM and five an SM fill."""
    sms = DeviceLimits().multiprocessors
    checked = 0
    for (h, hkv), lq, ctx, d, block_size, b, cache in itertools.product(
            ((1, 1), (8, 1), (28, 4), (40, 8), (64, 8)), (1, 2, 4, 8, 16), (1, 300, 9000, 131072),
            (64, 80, 128, 256), (16, 64), (1, 4, 64), ("auto", "fp8_e4m3")):
        if lq > ctx:
            continue
        problem = PagedDecodeProblem(b=b, h=h, hkv=hkv, lq=lq, ctx=ctx, d=d, block_size=block_size, cache_dtype=cache)
        for dtype in (torch.float16, torch.bfloat16, torch.float32):
            cfg = SPEC.default_config(problem, dtype)
            assert not SPEC.violations(problem, cfg, dtype), (problem, dtype, cfg)
            checked += 1
            programs = b * (hkv if cfg["PACK_GQA"] else h)
            if cache == "auto" and dtype != torch.float32 and triton.next_power_of_2(d) == 128:
                if cfg["num_warps"] == 8 and cfg["NUM_SPLITS"] > 1:
                    assert programs * cfg["NUM_SPLITS"] <= sms, (problem, cfg)
                if (cfg["BLOCK_N"], cfg["num_warps"]) == (32, 2) and cfg["NUM_SPLITS"] > 1:
                    assert programs * cfg["NUM_SPLITS"] <= 5 * sms, (problem, cfg)
    assert checked > 1000


def test_problem_parses_from_its_key_and_rejects_impossible_shapes():
    p = SPEC.example_problem
    assert SPEC.parse_shape(SPEC.problem_key(p)) == p
    for bad in ("b=1,h=6,hkv=4,lq=1,ctx=64,d=64", "b=1,h=4,hkv=4,lq=17,ctx=64,d=64",
                "b=1,h=4,hkv=4,lq=8,ctx=4,d=64", "b=1,h=4,hkv=4,lq=1,ctx=64,d=512"):
        with pytest.raises(Exception, match="impossible"):
            SPEC.parse_shape(bad)


def _same(x: torch.Tensor, y: torch.Tensor) -> bool:
    """Equal, NaN for NaN (the caches these tests build hold NaN where no context lies)."""
    return torch.equal(x.isnan(), y.isnan()) and torch.equal(x.nan_to_num(), y.nan_to_num())


def test_make_inputs_is_deterministic_per_seed_and_never_zero():
    p = SPEC.example_problem
    a = SPEC.make_inputs(p, torch.float16, "cpu", 3)
    b = SPEC.make_inputs(p, torch.float16, "cpu", 3)
    c = SPEC.make_inputs(p, torch.float16, "cpu", 4)
    for name in ("q", "key_cache", "value_cache", "block_tables"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
        assert not torch.equal(getattr(a, name), getattr(c, name)), name
    assert torch.equal(a.context_lens, torch.full((p.b,), p.ctx, dtype=torch.int32))
    for t in (a.q, a.key_cache, a.value_cache):
        assert bool((t != 0).any()) and not bool(t.isnan().any())


def test_factory_pages_are_distinct_and_only_the_context_holds_finite_data():
    p = PagedDecodeProblem(b=3, h=2, hkv=1, lq=1, ctx=21, d=32, block_size=8)
    inputs = SPEC.make_inputs(p, torch.float32, "cpu", 0)
    tables = inputs.block_tables
    assert tables.dtype == torch.int32 and tables.shape == (3, 3)
    assert tables.unique().numel() == tables.numel() and int(tables.max()) < p.num_blocks
    assert p.num_blocks > tables.numel()  # spare blocks
    finite = torch.isfinite(inputs.key_cache).all(dim=(2, 3))  # [num_blocks, block_size]
    assert int(finite.sum()) == p.b * p.ctx
    assert bool(inputs.value_cache[~finite].isinf().all())
    for seq in range(p.b):
        last = int(tables[seq, -1])
        assert finite[last, : 21 - 16].all() and not finite[last, 21 - 16:].any()  # partial last page


def _some_configs(problem, dtype, count=4):
    """The default and `count` other valid configs spread through the valid space, with at least
    one that splits and one that does not."""
    valid = SPEC.valid_configs(problem, dtype)
    step = max(1, len(valid) // count)
    picked = [SPEC.default_config(problem, dtype)] + valid[::step][:count]
    for splits in (1, max(int(c["NUM_SPLITS"]) for c in valid)):
        if not any(int(c["NUM_SPLITS"]) == splits for c in picked):
            picked.append(next(c for c in valid if int(c["NUM_SPLITS"]) == splits))
    return picked


@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=str)
def test_launch_matches_reference_on_poisoned_output(dtype, device):
    problem = SPEC.example_problem
    inputs = SPEC.make_inputs(problem, dtype, device, 11)
    expected = SPEC.reference(inputs)
    configs = _some_configs(problem, dtype)
    assert {int(c["NUM_SPLITS"]) > 1 for c in configs} == {False, True}
    for cfg in configs:
        out = SPEC.new_output(inputs)
        assert bool(out.isnan().all())
        SPEC.launch(inputs, out, cfg)
        assert SPEC.compare(out, expected) <= SPEC.tolerance[dtype], cfg.label()


def test_flops_and_bytes_are_positive_and_follow_the_model():
    for p in PROBLEMS:
        assert SPEC.flops(p) > 0 and SPEC.bytes_moved(p, torch.float16) > 0
    p = SPEC.example_problem
    # Lq=2 queries at the end of a 45-token context see 44 and 45 keys.
    assert SPEC.flops(p) == 4 * p.b * p.h * p.d * (44 + 45)
    longer = PagedDecodeProblem(b=p.b, h=p.h, hkv=p.hkv, lq=p.lq, ctx=2 * p.ctx, d=p.d)
    assert SPEC.bytes_moved(longer, torch.float16) > SPEC.bytes_moved(p, torch.float16)


def test_runner_accepts_the_default_config():
    problem = PagedDecodeProblem(b=1, h=4, hkv=1, lq=1, ctx=20, d=32, block_size=8)
    runner = Runner(SPEC, problem, torch.float32, interpret=INTERPRETED)
    result = runner.measure(SPEC.default_config(problem, torch.float32))
    assert result.status is TrialStatus.OK and result.rel_error <= SPEC.tolerance[torch.float32]


def test_an_interpreting_runner_without_the_interpreter_says_so(monkeypatch):
    """Without TRITON_INTERPRET every config would fail to launch on CPU tensors, one trial
    status at a time: the runner refuses at once, saying what to set."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    problem = PagedDecodeProblem(b=1, h=4, hkv=1, lq=1, ctx=20, d=32, block_size=8)
    with pytest.raises(OmnituneError, match="TRITON_INTERPRET=1"):
        Runner(SPEC, problem, torch.float32, interpret=True)


# Each constraint, a config on a problem that it must reject.
_BIG = PagedDecodeProblem(b=1, h=8, hkv=1, lq=16, ctx=4096, d=256)
CONSTRAINT_CASES = {
    "shared_memory": (_BIG, Config(NUM_SPLITS=4, BLOCK_N=128, num_warps=8, num_stages=4, PACK_GQA=False,
                                   FUSED_REDUCE=True)),
    "accumulator_registers": (_BIG, Config(NUM_SPLITS=4, BLOCK_N=32, num_warps=4, num_stages=1, PACK_GQA=True,
                                           FUSED_REDUCE=True)),
    "pack_gqa_needs_groups": (PagedDecodeProblem(b=1, h=4, hkv=4, lq=1, ctx=512, d=64),
                              Config(NUM_SPLITS=1, BLOCK_N=64, num_warps=4, num_stages=2, PACK_GQA=True,
                                     FUSED_REDUCE=False)),
    "block_n_exceeds_context": (PagedDecodeProblem(b=1, h=4, hkv=4, lq=1, ctx=20, d=64),
                                Config(NUM_SPLITS=1, BLOCK_N=64, num_warps=4, num_stages=2, PACK_GQA=False,
                                       FUSED_REDUCE=False)),
    "empty_splits": (PagedDecodeProblem(b=1, h=4, hkv=4, lq=1, ctx=70, d=64),  # 3 splits of 32 cover 70
                     Config(NUM_SPLITS=4, BLOCK_N=32, num_warps=4, num_stages=2, PACK_GQA=False,
                            FUSED_REDUCE=False)),
    "fused_reduce_needs_splits": (PagedDecodeProblem(b=1, h=4, hkv=1, lq=1, ctx=64, d=64),
                                  Config(NUM_SPLITS=1, BLOCK_N=32, num_warps=4, num_stages=2, PACK_GQA=True,
                                         FUSED_REDUCE=True)),
}


@pytest.mark.parametrize("name", sorted(CONSTRAINT_CASES))
def test_constraint_rejects_what_it_should(name):
    assert_constraint_case(SPEC, CONSTRAINT_CASES, name)


# ------------------------------------------------------------------------------------------------
# The public function
# ------------------------------------------------------------------------------------------------


def _paged_case(lens, h, hkv, lq, d, block_size, dtype, device, seed=0, spare=3):
    """Sequences of the given context lengths, their pages scattered through a cache whose
    unused slots hold NaN; block table entries past a context hold junk (−1 or past the cache)."""
    gen = torch.Generator().manual_seed(seed)
    pages = [math.ceil(n / block_size) for n in lens]
    num_blocks = sum(pages) + spare
    max_pages = max(pages) + 1
    order = torch.randperm(num_blocks, generator=gen).tolist()
    tables = torch.full((len(lens), max_pages), -1, dtype=torch.int32)
    tables[:, -1] = num_blocks + 5
    kc = torch.full((num_blocks, block_size, hkv, d), float("nan"))
    vc = torch.full_like(kc, float("nan"))
    for seq, n in enumerate(lens):
        for j in range(pages[seq]):
            blk = order.pop()
            tables[seq, j] = blk
            fill = min(block_size, n - j * block_size)
            kc[blk, :fill] = torch.randn(fill, hkv, d, generator=gen)
            vc[blk, :fill] = torch.randn(fill, hkv, d, generator=gen)
    q = torch.randn(len(lens), h, lq, d, generator=gen)

    def to(t):
        return t.to(device=device, dtype=dtype)

    return (to(q), to(kc), to(vc), tables.to(device), torch.tensor(lens, dtype=torch.int32, device=device))


def _naive(q, kc, vc, tables, lens, sm_scale):
    """Position by position in float64: key p of sequence b is kc[tables[b, p // bs], p % bs]."""
    b, h, lq, d = q.shape
    bs, hkv = kc.shape[1], kc.shape[2]
    out = torch.zeros(b, h, lq, d, dtype=torch.float64)
    for bi in range(b):
        n = int(lens[bi])
        rows = [(int(tables[bi, p // bs]), p % bs) for p in range(n)]
        keys = torch.stack([kc[blk, off] for blk, off in rows]).double().cpu()
        values = torch.stack([vc[blk, off] for blk, off in rows]).double().cpu()
        for head in range(h):
            hk = head // (h // hkv)
            for i in range(lq):
                seen = n - lq + i + 1
                scores = keys[:seen, hk] @ q[bi, head, i].double().cpu() * sm_scale
                out[bi, head, i] = torch.softmax(scores, 0) @ values[:seen, hk]
    return out


TOL = {torch.float32: 1e-4, torch.float16: 5e-3}


@pytest.mark.parametrize("block_size", [4, 16, 32, 48, 12, 24],
                         ids=["pages-in-a-tile", "tile-is-a-page", "tiles-in-a-page", "three-tiles-a-page",
                              "page-of-12", "page-of-24"])
@pytest.mark.parametrize("splits", [1, 3])
def test_every_geometry_of_tiles_and_pages_reads_the_right_rows(block_size, splits, device):
    """16-key tiles over pages of 4 (whole pages in a tile), 16 (one page), 32 and 48 (tiles
    inside one page, the second and third starting past the page's first slot), 12 and 24
    (neither divides the other: a tile straddles pages)."""
    lens = [150, 37, 16, 1]
    q, kc, vc, tables, ctx = _paged_case(lens, 4, 2, 1, 32, block_size, torch.float32, device, seed=block_size)
    cfg = Config(NUM_SPLITS=splits, BLOCK_N=16, num_warps=2, num_stages=2, PACK_GQA=True, FUSED_REDUCE=False)
    out = paged_decode_attention(q, kc, vc, tables, ctx, config=cfg)
    assert relative_error(out.cpu(), _naive(q, kc, vc, tables, ctx, 1 / math.sqrt(32))) <= TOL[torch.float32]


@pytest.mark.parametrize(
    "h,hkv,lq,splits,pack,dtype",
    [
        (2, 2, 1, 1, False, torch.float32),
        (4, 1, 4, 3, True, torch.float32),
        (7, 1, 4, 1, True, torch.float16),
        (7, 1, 1, 4, False, torch.float16),
        (4, 1, 1, 2, True, torch.float16),
    ],
    ids=lambda v: str(v).replace("torch.", "") if isinstance(v, torch.dtype) else None,
)
def test_matches_naive_attention_over_ragged_pages(h, hkv, lq, splits, pack, dtype, device):
    # Lengths: a partial last page (37 = 4·8 + 5), exactly one page (8), an odd page count with
    # a partial last page (19 = 2·8 + 3), and a context of exactly Lq tokens.
    lens = [37, 8, 19, lq]
    q, kc, vc, tables, ctx = _paged_case(lens, h, hkv, lq, 32, 8, dtype, device)
    cfg = Config(NUM_SPLITS=splits, BLOCK_N=16, num_warps=2, num_stages=1, PACK_GQA=pack, FUSED_REDUCE=False)
    out = paged_decode_attention(q, kc, vc, tables, ctx, config=cfg)
    assert out.shape == q.shape and out.dtype == dtype
    want = _naive(q, kc, vc, tables, ctx, 1 / math.sqrt(32))
    assert relative_error(out.cpu(), want) <= TOL[dtype]
    inputs = PagedDecodeInputs(q, kc, vc, tables, ctx, 1 / math.sqrt(32))
    assert relative_error(SPEC.reference(inputs).cpu(), want) <= 1e-6  # the spec's reference agrees


@pytest.mark.parametrize("splits", (1, 3))
@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=str)
def test_scores_that_rise_along_the_context_move_the_running_max_and_stay_exact(splits, dtype, device):
    """The key loop moves a row's running max only when a tile's scores rise past it by more than
    2^8 (lazy rescaling). Scores 60 times larger than usual (q · 60: tile maxima tens of log2
    units apart) rescale on some tiles and not on others, across 13 tiles of 16 keys."""
    lens = [200, 37, 8, 19]
    q, kc, vc, tables, ctx = _paged_case(lens, 7, 1, 4, 32, 8, torch.float32, "cpu", seed=5)
    q = (q * 60).to(device=device, dtype=dtype)
    kc, vc, tables, ctx = (t.to(device) for t in (kc.to(dtype), vc.to(dtype), tables, ctx))
    cfg = Config(NUM_SPLITS=splits, BLOCK_N=16, num_warps=2, num_stages=1, PACK_GQA=True, FUSED_REDUCE=False)
    out = paged_decode_attention(q, kc, vc, tables, ctx, config=cfg)
    assert relative_error(out.cpu(), _naive(q, kc, vc, tables, ctx, 1 / math.sqrt(32))) <= TOL[dtype]


def test_strided_q_tile_spanning_pages_and_custom_scale(device):
    # BLOCK_N = 32 keys over pages of 4: one tile gathers eight pages. q is a transposed view.
    q, kc, vc, tables, ctx = _paged_case([30, 13], 4, 2, 2, 64, 4, torch.float32, device, seed=2)
    q_view = q.transpose(1, 2).contiguous().transpose(1, 2)
    assert not q_view.is_contiguous()
    out = paged_decode_attention(q_view, kc, vc, tables, ctx, sm_scale=0.3,
                                 config={"NUM_SPLITS": 1, "BLOCK_N": 32, "PACK_GQA": True})
    assert relative_error(out.cpu(), _naive(q, kc, vc, tables, ctx, 0.3)) <= TOL[torch.float32]


@pytest.mark.parametrize("planned", (False, True))
def test_strided_context_lengths_are_read_by_their_strides(planned, device):
    # Every other length of a longer vector (a decode step's lengths sliced out of a bigger
    # batch's), through the function and through a plan.
    q, kc, vc, tables, ctx = _paged_case([30, 13, 22], 4, 2, 1, 32, 8, torch.float32, device, seed=4)
    wide = torch.stack([ctx, torch.full_like(ctx, 2**30)], 1).reshape(-1)
    lens = wide[::2]
    assert lens.stride(0) == 2 and torch.equal(lens, ctx)
    want = _naive(q, kc, vc, tables, ctx, 1 / math.sqrt(32))
    cfg = Config(NUM_SPLITS=2, BLOCK_N=16, num_warps=2, num_stages=1, PACK_GQA=True, FUSED_REDUCE=False)
    if planned:
        plan = PagedDecodePlan(batch=3, num_heads=4, num_kv_heads=2, head_dim=32, block_size=8,
                               max_blocks=tables.shape[1], max_context_len=30, dtype=torch.float32,
                               device=device, config=cfg)
        out = plan.run(q, kc, vc, tables, lens, check=False)
    else:
        out = paged_decode_attention(q, kc, vc, tables, lens, config=cfg, check=False)
    assert relative_error(out.cpu(), want) <= TOL[torch.float32]


def test_default_lookup_through_runtime(device):
    q, kc, vc, tables, ctx = _paged_case([21, 9], 4, 2, 1, 32, 8, torch.float16, device, seed=3)
    out = paged_decode_attention(q, kc, vc, tables, ctx)
    assert relative_error(out.cpu(), _naive(q, kc, vc, tables, ctx, 1 / math.sqrt(32))) <= TOL[torch.float16]


def _bad_inputs(device):
    """What is wrong → (the arguments, a fragment of the InputError's message), for inputs that must
    be refused before any launch."""
    q, kc, vc, tables, ctx = _paged_case([10, 5], 4, 2, 2, 32, 4, torch.float32, device)
    past_cache = tables.clone()
    past_cache[1, 0] = kc.shape[0]
    negative_in_use = tables.clone()
    negative_in_use[0, 2] = -1
    over_capacity = ctx.clone()
    over_capacity[0] = tables.shape[1] * 4 + 1
    under_lq = ctx.clone()
    under_lq[1] = 1
    return {
        "block table points past the cache": ((q, kc, vc, past_cache, ctx), "is not a block of the cache"),
        "negative block table entry in use": ((q, kc, vc, negative_in_use, ctx), "is not a block of the cache"),
        "context over the table's capacity": ((q, kc, vc, tables, over_capacity), "exceeds the block table's capacity"),
        "context shorter than Lq": ((q, kc, vc, tables, under_lq), "shorter than the 2 query tokens"),
        "heads not a multiple of kv heads": ((q[:, :3], kc, vc, tables, ctx), "multiple of the cache's kv heads"),
        "head dim differs from the cache": ((q[..., :16], kc, vc, tables, ctx), "head dims differ"),
        "more than 16 query tokens": ((q[:, :, :1].expand(-1, -1, 17, -1), kc, vc, tables, ctx), "decode takes 1..16"),
        "dtype differs": ((q.half(), kc, vc, tables, ctx), "in q.s dtype"),
        "int64 block table": ((q, kc, vc, tables.long(), ctx), "block_tables must be int32"),
        "context_lens of another batch": ((q, kc, vc, tables, ctx[:1]), "context_lens must be int32"),
        "caches differ": ((q, kc, vc[:-1], tables, ctx), "shapes differ"),
    }, (kc, vc)


@pytest.mark.parametrize("case", sorted(_bad_inputs("cpu")[0]))
def test_bad_input_raises_and_leaves_caches_untouched(case, device):
    cases, (kc, vc) = _bad_inputs(device)
    before_k, before_v = kc.clone(), vc.clone()
    args, message = cases[case]
    with pytest.raises(InputError, match=message):
        paged_decode_attention(*args, config={"NUM_SPLITS": 1})
    assert _same(kc, before_k) and _same(vc, before_v)


def test_block_table_error_names_entry_and_valid_range(device):
    cases, (kc, _) = _bad_inputs(device)
    last = kc.shape[0] - 1
    with pytest.raises(InputError, match=rf"block_tables\[1, 0\] = {last + 1} .* valid blocks are 0\.\.{last}"):
        paged_decode_attention(*cases["block table points past the cache"][0], config={})


# ------------------------------------------------------------------------------------------------
# On the GPU: real shapes, bf16 included (the interpreter gets bf16 wrong)
# ------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [
    "b=64,h=28,hkv=4,lq=1,ctx=4096,d=128",
    "b=1,h=32,hkv=4,lq=1,ctx=32768,d=128",
    "b=8,h=28,hkv=4,lq=16,ctx=2000,d=128,block_size=32",
    "b=4,h=16,hkv=16,lq=4,ctx=777,d=80",
])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_real_shapes(shape, dtype):
    problem = SPEC.parse_shape(shape)
    runner = Runner(SPEC, problem, dtype)
    for cfg in _some_configs(problem, dtype, count=3):
        result = runner.measure(cfg)
        assert result.status in (TrialStatus.OK, TrialStatus.OUT_OF_RESOURCES), (cfg.label(), result.detail)
    assert runner.measure(SPEC.default_config(problem, dtype)).status is TrialStatus.OK


def test_the_function_reuses_its_split_partials_per_thread_and_stream_and_stays_exact(device):
    """The function's partials are kept per (device, stream, thread, shape, config): two calls of
    one thread share them (a call's two launches finish with them before the next call's, in
    stream order) and both results stay right; another thread gets its own."""
    import threading

    problem = SPEC.example_problem
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    inputs = SPEC.make_inputs(problem, dtype, device, 5)
    config = next(c for c in SPEC.valid_configs(problem, dtype) if int(c["NUM_SPLITS"]) > 1)
    pda._scratches.clear()

    def call(q):
        return pda.paged_decode_attention(q, inputs.key_cache, inputs.value_cache, inputs.block_tables,
                                          inputs.context_lens, sm_scale=inputs.sm_scale, config=config)

    first = call(inputs.q)
    other_q = torch.randn_like(inputs.q)
    second = call(other_q)
    assert len(pda._scratches) == 1
    assert SPEC.compare(first, SPEC.reference(inputs)) <= SPEC.tolerance[dtype]
    other_inputs = dataclasses.replace(inputs, q=other_q)
    assert SPEC.compare(second, SPEC.reference(other_inputs)) <= SPEC.tolerance[dtype]
    elsewhere = threading.Thread(target=call, args=(inputs.q,))
    elsewhere.start()
    elsewhere.join()
    assert len(pda._scratches) == 2

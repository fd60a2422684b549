"""omnitune.runtime's answer cache: problems bucketed before it (so the steps of a decode loop hit
one entry), bounded, and never answering a problem of a bucket with a config that breaks one of
its constraints. Timings live in benchmarks/runtime_lookup.py, not here."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

import omnitune.runtime as runtime
from omnitune import registry
from omnitune.kernels.paged_decode_attention import SPEC as DECODE
from omnitune.kernels.paged_decode_attention import PagedDecodeProblem
from omnitune.runtime import Rung
from omnitune.runtime._buckets import Bucketing, _bound, _floor
from omnitune.spec import DTYPES, Config, Constraint, KernelSpec, MatchPolicy, Param

REPO_TABLES = Path(__file__).resolve().parents[1] / "tuned_configs"
H200 = "NVIDIA H200"
STEP = PagedDecodeProblem(b=8, h=28, hkv=4, lq=1, ctx=4097, d=128)


@pytest.fixture
def shipped(tables_dir):
    """The repository's tables, as the only config directory."""
    for kernel_dir in REPO_TABLES.iterdir():
        if kernel_dir.is_dir():
            (tables_dir / kernel_dir.name).mkdir()
            for table in kernel_dir.glob("*.json"):
                (tables_dir / kernel_dir.name / table.name).write_text(table.read_text())
    return tables_dir


def _cached(kernel: str) -> list:
    return [key for key in runtime._answers if key[0] == kernel]


def test_bucket_bounds_keep_three_significant_bits():
    assert [_bound(v, 3) for v in (1, 7, 8, 9, 10, 11, 16, 17, 4095, 4096, 4097, 5120, 5121)] == \
        [1, 7, 8, 10, 10, 12, 16, 20, 4096, 4096, 5120, 5120, 6144]
    assert [_floor(v, 3) for v in (8, 9, 4096, 4097, 5120)] == [8, 9, 3585, 4097, 4097]
    assert [_bound(v, 1) for v in (1, 2, 3, 5, 1000, 1024, 1025)] == [1, 2, 4, 8, 1024, 1024, 2048]  # one per octave
    assert _bound(2**31 - 1, 3) == 2**31 - 1  # never past the largest dimension


def test_consecutive_decode_steps_share_one_cache_entry(shipped):
    first = runtime.lookup("paged_decode_attention", STEP, torch.bfloat16, H200)
    entries = len(runtime._answers)
    for ctx in range(4097, 5121):  # 1,024 decode steps, one bucket
        assert runtime.lookup("paged_decode_attention", dataclasses.replace(STEP, ctx=ctx), torch.bfloat16, H200) is first
    assert len(runtime._answers) == entries
    key = runtime._bucket_keys["paged_decode_attention"]
    assert key(STEP) == key(dataclasses.replace(STEP, ctx=5120)) != key(dataclasses.replace(STEP, ctx=5121))


def test_a_whole_generation_touches_a_few_buckets(shipped):
    for ctx in range(1, 20_001, 7):
        runtime.get_config("paged_decode_attention", dataclasses.replace(STEP, ctx=ctx), torch.bfloat16, H200)
    assert len(_cached("paged_decode_attention")) < 70  # ~4 per octave, not one per length


def test_fields_matched_exactly_are_cached_exactly(shipped):
    runtime.lookup("paged_decode_attention", STEP, torch.bfloat16, H200)
    key = runtime._bucket_keys["paged_decode_attention"]
    assert key(STEP) != key(dataclasses.replace(STEP, h=32, hkv=4)) and key(STEP) != key(dataclasses.replace(STEP, d=64))
    assert key(dataclasses.replace(STEP, b=8)) != key(dataclasses.replace(STEP, b=7))  # small values: their own buckets


def test_the_cache_is_bounded_least_recently_used_first(shipped, monkeypatch):
    assert runtime.CACHE_ENTRIES == 4096
    monkeypatch.setattr(runtime, "CACHE_ENTRIES", 40)
    kept = dataclasses.replace(STEP, ctx=100)
    runtime.get_config("paged_decode_attention", kept, torch.bfloat16, H200)
    for b in range(1, 200):  # 199 buckets (b up to 8 are each their own)
        runtime.get_config("paged_decode_attention", dataclasses.replace(STEP, b=b), torch.bfloat16, H200)
        runtime.get_config("paged_decode_attention", kept, torch.bfloat16, H200)  # used again: stays
        assert len(runtime._answers) <= 40
    key = runtime._bucket_keys["paged_decode_attention"]
    assert ("paged_decode_attention", torch.bfloat16, H200, key(kept)) in runtime._answers


def test_tuned_problems_inside_a_bucket_keep_their_own_entries(tables_dir):
    tuned = {4000: Config(NUM_SPLITS=2, BLOCK_N=64, num_warps=4, num_stages=2, PACK_GQA=True, FUSED_REDUCE=False),
             4090: Config(NUM_SPLITS=4, BLOCK_N=32, num_warps=8, num_stages=1, PACK_GQA=True, FUSED_REDUCE=True)}
    entries = {}
    for ctx, config in tuned.items():
        problem = dataclasses.replace(STEP, ctx=ctx)
        entries[f"bf16|{DECODE.problem_key(problem)}"] = {
            "problem": dataclasses.asdict(problem), "dtype": "bf16", "config": config.as_dict()}
    (tables_dir / "paged_decode_attention").mkdir()
    (tables_dir / "paged_decode_attention" / "NVIDIA_H200.json").write_text(json.dumps({
        "schema_version": 1, "kernel": "paged_decode_attention", "device": {"key": "NVIDIA_H200"}, "entries": entries}))
    for ctx, config in tuned.items():
        answer = runtime.lookup("paged_decode_attention", dataclasses.replace(STEP, ctx=ctx), torch.bfloat16, H200)
        assert (answer.rung, answer.config) == (Rung.EXACT, config)
    between = runtime.lookup("paged_decode_attention", dataclasses.replace(STEP, ctx=4050), torch.bfloat16, H200)
    assert between.rung is Rung.NEAREST and between.config in tuned.values()
    bound = Bucketing(DECODE).bound(dataclasses.replace(STEP, ctx=4050))
    assert bound.ctx == 4096 and between.distance == pytest.approx(DECODE.match.distance(bound, dataclasses.replace(
        STEP, ctx=next(c for c, cfg in tuned.items() if cfg == between.config))))


@pytest.mark.parametrize("kernel", sorted(registry.BUILTIN_KERNELS))
def test_every_problem_of_a_bucket_gets_a_valid_config(shipped, kernel):
    """Around every shipped entry, each bucketed field walked through several whole buckets: the
    shared answers are checked at the buckets' corners only, so this checks that the shipped
    constraints are monotone there as the runtime assumes."""
    spec = registry.get_spec(kernel)
    doc = json.loads((REPO_TABLES / kernel / "NVIDIA_H200.json").read_text())
    bucketing = Bucketing(spec)
    for raw in doc["entries"].values():
        problem, dtype = spec.problem_from_mapping(raw["problem"]), DTYPES[raw["dtype"]]
        for name in bucketing.shifts:
            value = getattr(problem, name)
            for candidate in range(max(0, value * 3 // 4), value * 5 // 4 + 2, max(1, value // 200)):
                try:
                    neighbour = dataclasses.replace(problem, **{name: candidate})
                except Exception:  # noqa: BLE001 — not a problem of this kernel at all
                    continue
                config = runtime.get_config(kernel, neighbour, dtype, H200)
                assert not spec.violations(neighbour, config, dtype), (neighbour, config)
        assert runtime.lookup(kernel, problem, dtype, H200).rung is Rung.EXACT


# --- a spec whose constraint is not monotone: answered problem by problem -------------------------


@dataclass(frozen=True)
class ParityProblem:
    n: int
    m: int = 1


def _parity(problem, config, dtype, limits):
    if (config["X"] == 2) != (problem.n % 2 == 0):
        return f"X={config['X']} does not suit n={problem.n}"
    return None


def _parity_spec(**match) -> KernelSpec:
    def unused(*args):
        raise AssertionError("not launched in these tests")

    return KernelSpec(
        name="parity", description="a constraint that is not monotone in n", problem_type=ParityProblem,
        params=(Param("X", (1, 2)),), constraints=(Constraint("parity", _parity),),
        default_config=lambda p, dtype: Config(X=2 if p.n % 2 == 0 else 1),
        make_inputs=unused, new_output=unused, launch=unused, reference=unused, tolerance={},
        flops=unused, bytes_moved=unused, match=MatchPolicy(**match), example_problem=ParityProblem(n=3),
    )


def test_a_bucket_no_config_can_serve_is_answered_per_problem(tables_dir, monkeypatch):
    monkeypatch.setitem(registry._loaded, "parity", _parity_spec())
    for n in range(1, 3000):
        config = runtime.get_config("parity", ParityProblem(n=n), torch.float32, H200)
        assert config["X"] == (2 if n % 2 == 0 else 1), n
    assert len(_cached("parity")) > 2000  # one answer per problem (and per bucket), not one per bucket


def test_a_field_can_be_cached_exactly_or_in_octaves(tables_dir, monkeypatch):
    monkeypatch.setitem(registry._loaded, "exact", _parity_spec(bucket_overrides={"n": 0}))
    key = Bucketing(registry._loaded["exact"]).key
    assert key(ParityProblem(n=4097)) != key(ParityProblem(n=4098))
    octaves = Bucketing(_parity_spec(buckets_per_octave=1)).key
    assert octaves(ParityProblem(n=2049)) == octaves(ParityProblem(n=4096)) != octaves(ParityProblem(n=4097))
    with pytest.raises(ValueError, match="power of two"):
        Bucketing(_parity_spec(buckets_per_octave=3))

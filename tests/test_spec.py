"""The spec's own machinery: configs, parameters, shapes, match policy."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch

from omnitune.errors import ConfigError, ShapeError, UnknownKernelError
from omnitune.kernels.attention import SPEC
from omnitune.registry import get_spec
from omnitune.spec import Config, MatchPolicy, Param, parse_dtype, relative_error


def test_config_is_an_immutable_hashable_mapping():
    a = Config(BLOCK_M=64, num_warps=4)
    b = Config({"num_warps": 4, "BLOCK_M": 64})
    assert a == b and hash(a) == hash(b) and {a: 1}[b] == 1
    assert a.replace(num_warps=8)["num_warps"] == 8 and a["num_warps"] == 4
    assert list(a) == ["BLOCK_M", "num_warps"]
    assert a.label() == "BLOCK_M=64 num_warps=4"


def test_param_coerce_accepts_json_and_cli_spellings():
    p = Param("BLOCK_M", (16, 32, 64))
    assert p.coerce("32") == 32 and p.coerce(64) == 64
    flag = Param("USE_TMA", (False, True))
    assert flag.coerce("1") is True and flag.coerce(0) is False and flag.coerce("true") is True
    assert flag.coerce(1) is True and flag.coerce(True) is True
    with pytest.raises(ConfigError, match="16, 32, 64"):
        p.coerce(7)
    with pytest.raises(ConfigError):
        p.coerce(True)


@pytest.mark.parametrize("value", [64.0, "64.0", float("inf"), float("nan"), 10**400, "1_6", "６４", b"64", "6" * 10**6, None])
def test_an_integer_param_takes_only_an_integer(value):
    with pytest.raises(ConfigError, match="BLOCK_M=.* is not a valid choice"):
        Param("BLOCK_M", (16, 32, 64)).coerce(value)


@pytest.mark.parametrize("value", [1.0, 0.0, 2, "2", "1.0", None, [1]])
def test_a_flag_takes_no_float_and_no_other_number(value):
    # 1.0 once read as False and 1 as True: now neither float is a flag, whatever its value
    with pytest.raises(ConfigError, match="USE_TMA"):
        Param("USE_TMA", (False, True)).coerce(value)


def test_strict_coercion_takes_only_what_export_writes():
    flag, block = Param("USE_TMA", (False, True)), Param("BLOCK_M", (16, 32, 64))
    assert flag.coerce(True, strict=True) is True and block.coerce(32, strict=True) == 32
    for param, value in ((flag, 1), (flag, "true"), (flag, 1.0), (block, "32"), (block, 32.0)):
        with pytest.raises(ConfigError):
            param.coerce(value, strict=True)


def test_coerce_config_rejects_unknown_and_missing():
    with pytest.raises(ConfigError, match="no parameter 'BLOCK_Q'"):
        SPEC.coerce_config({"BLOCK_Q": 16})
    with pytest.raises(ConfigError, match="lacks"):
        SPEC.coerce_config({"BLOCK_M": 16})
    with pytest.raises(ConfigError, match="JSON object"):
        SPEC.coerce_config([1, 2])
    partial = SPEC.complete_config({"BLOCK_N": "32"}, SPEC.example_problem, torch.float16)
    assert partial["BLOCK_N"] == 32 and len(partial) == len(SPEC.params)


def test_parse_shape_aliases_and_errors():
    p = SPEC.parse_shape("b=1,h=28,hkv=4,l=8192,d=128,causal=1")
    assert (p.lq, p.lk, p.causal) == (8192, 8192, True)
    for bad, message in [
        ("b=1,h=28,hkv=5,l=8,d=128", "multiple"),
        ("b=1,h=2,hkv=1,l=8,d=100", "head dim"),
        ("b=1,h=2,hkv=1,l=8", "lacks d"),
        ("b=1,h=2,hkv=1,l=8,d=64,x=3", "no dimension 'x'"),
        ("b=one,h=2,hkv=1,l=8,d=64", "not a valid int"),
        ("b=0,h=2,hkv=1,l=8,d=64", "≥ 1"),
        ("b 1", "name=value"),
        ("b=1,h=2,hkv=1,l=8,d=64,spans=2,span_len=5", "causal"),
        ("b=1,h=2,hkv=1,l=8,d=64,causal=1,spans=2,span_len=5", "do not fit"),
    ]:
        with pytest.raises(ShapeError, match=message):
            SPEC.parse_shape(bad)


def test_parse_dtype():
    assert parse_dtype("bf16") is torch.bfloat16 and parse_dtype("float16") is torch.float16
    with pytest.raises(ShapeError, match="fp32, fp16, bf16"):
        parse_dtype("fp8")


def test_unknown_kernel_lists_choices():
    with pytest.raises(UnknownKernelError, match="attention"):
        get_spec("atention")


def test_user_kernel_file_without_spec(tmp_path):
    f = tmp_path / "k.py"
    f.write_text("X = 1\n")
    with pytest.raises(UnknownKernelError, match="defines no SPEC"):
        get_spec(str(f))
    with pytest.raises(UnknownKernelError, match="does not exist"):
        get_spec(str(tmp_path / "missing.py"))


@dataclass(frozen=True)
class _P:
    b: int
    lq: int
    d: int
    causal: bool


def test_match_policy_bounds_each_dimension():
    policy = MatchPolicy(exact=("d",), max_ratio=4.0)
    base = _P(8, 512, 128, True)
    assert policy.distance(base, base) == 0
    assert math.isclose(policy.distance(base, _P(8, 1024, 128, True)), 1.0)
    assert policy.distance(base, _P(8, 1, 128, True)) is None          # decode never snaps to prefill
    assert policy.distance(base, _P(8, 512, 64, True)) is None         # exact field differs
    assert policy.distance(base, _P(8, 512, 128, False)) is None       # bools are always exact
    assert policy.distance(base, _P(64, 512, 128, True)) is None       # b ratio 8 > 4


def test_relative_error_treats_nan_as_failure():
    ref = torch.ones(4)
    assert relative_error(ref.clone(), ref) == 0
    bad = ref.clone()
    bad[2] = float("nan")
    assert relative_error(bad, ref) == math.inf
    assert relative_error(torch.ones(3), ref) == math.inf


# --- hostile values: a clear ShapeError (an InputError), never OverflowError or a guess ----------

HOSTILE_DIMENSIONS = {
    "inf": float("inf"),
    "-inf": float("-inf"),
    "nan": float("nan"),
    "1e400 text": "1e400",
    "Infinity text": "Infinity",
    "a megabyte of digits": "9" * 1_000_000,
    "bytes": b"16",
    "fullwidth digits": "１６",
    "underscore": "1_0",
    "2**31": 2**31,
    "10**400": 10**400,
    "a float": 16.0,
    "a bool": True,
    "None": None,
}


@pytest.mark.parametrize("name", sorted(HOSTILE_DIMENSIONS))
def test_a_hostile_dimension_is_an_input_error(name):
    from omnitune.errors import InputError

    with pytest.raises(InputError, match="lq=.* is not a valid int") as raised:
        SPEC.problem_from_mapping({"b": 1, "h": 2, "hkv": 1, "lq": HOSTILE_DIMENSIONS[name], "lk": 8, "d": 64})
    assert isinstance(raised.value, ShapeError) and len(str(raised.value)) < 200


def test_dimensions_up_to_2_31_minus_1_parse_and_beyond_do_not():
    assert SPEC.parse_shape(f"b=1,h=2,hkv=1,lq=1,lk={2**31 - 1},d=64").lk == 2**31 - 1
    with pytest.raises(ShapeError, match=r"out of range \(at most 2,147,483,647"):
        SPEC.parse_shape(f"b=1,h=2,hkv=1,lq=1,lk={2**31},d=64")


def test_flags_and_floats_parse_strictly():
    from omnitune.kernels.kv_compress import SPEC as COMPRESS

    shape = "b=1,h=2,hkv=1,n=64,d=32,window=8"
    assert SPEC.parse_shape("b=1,h=2,hkv=1,l=8,d=64,causal=yes").causal is True
    assert COMPRESS.parse_shape(shape + ",merge_threshold=-0.5").merge_threshold == -0.5
    for bad in ("1e400", "Infinity", "nan", "1_0.5", "０.５", "-" + "9" * 400):
        with pytest.raises(ShapeError, match="merge_threshold=.* is not a valid float"):
            COMPRESS.parse_shape(shape + f",merge_threshold={bad}")
    for bad in (10**400, -(10**400), float("inf")):
        with pytest.raises(ShapeError, match="merge_threshold"):
            COMPRESS.problem_from_mapping({"b": 1, "h": 2, "hkv": 1, "n": 64, "d": 32, "merge_threshold": bad})
    with pytest.raises(ShapeError, match="causal=1.0 is not a valid bool"):
        SPEC.problem_from_mapping({"b": 1, "h": 2, "hkv": 1, "l": 8, "d": 64, "causal": 1.0})


def test_canonical_problem_converts_numpy_integers_and_rejects_hostile_fields():
    import dataclasses

    import numpy as np

    problem = SPEC.example_problem
    odd = dataclasses.replace(problem, lq=np.int64(problem.lq))
    assert SPEC.canonical_problem(odd) == problem and type(SPEC.canonical_problem(odd).lq) is int
    with pytest.raises(ShapeError, match="lk=inf"):
        SPEC.canonical_problem(dataclasses.replace(problem, lk=float("inf")))


def test_match_policy_distance_never_overflows():
    policy = MatchPolicy(exact=("d",), max_ratio=4.0)
    base = _P(8, 512, 128, True)
    for far in (10**400, 2**1100, float("inf"), float("nan"), -512, 0, "512"):
        assert policy.distance(base, _P(8, far, 128, True)) is None, far
        assert policy.distance(_P(8, far, 128, True), base) is None, far
    assert policy.distance(_P(10**400, 512, 128, True), _P(10**400, 512, 128, True)) == 0


def test_resolve_config_takes_a_config_as_given_and_checks_a_mapping():
    from omnitune.errors import ConfigError
    from omnitune.kernels import kv_cache_write as kvw

    spec = kvw.SPEC
    problem = kvw.KVCacheWriteProblem(t=5, hkv=2, d=64)
    outside = Config(spec.default_config(problem, torch.float16).as_dict(), BLOCK_T=3)
    assert spec.resolve_config(outside, problem, torch.float16) is outside  # what the search launches
    with pytest.raises(ConfigError, match="BLOCK_T"):
        spec.resolve_config(outside, problem, torch.float16, check_given="all")
    with pytest.raises(ConfigError, match="BLOCK_T"):
        spec.resolve_config({"BLOCK_T": 3}, problem, torch.float16)
    with pytest.raises(ConfigError, match="block_t_exceeds_tokens"):
        spec.resolve_config({"BLOCK_T": 64}, problem, torch.float16)
    assert spec.resolve_config({}, problem, torch.float16) == spec.default_config(problem, torch.float16)
    with pytest.raises(ConfigError, match="mapping"):
        spec.resolve_config(["BLOCK_T"], problem, torch.float16)

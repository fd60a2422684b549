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
    assert p.coerce("32") == 32 and p.coerce(64.0) == 64
    flag = Param("USE_TMA", (False, True))
    assert flag.coerce("1") is True and flag.coerce(0) is False and flag.coerce("true") is True
    with pytest.raises(ConfigError, match="16, 32, 64"):
        p.coerce(7)
    with pytest.raises(ConfigError):
        p.coerce(True)


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

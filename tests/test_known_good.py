"""The spec's known-good configs are measured right after the default, when valid."""

from __future__ import annotations

import json
import sqlite3

import torch
from typer.testing import CliRunner

from omnitune.cli import app
from omnitune.kernels.attention import SPEC

SHAPE = "b=1,h=4,hkv=2,lq=24,lk=40,d=64,causal=1"


def test_known_good_configs_follow_the_default(tmp_path):
    db = tmp_path / "r.db"
    result = CliRunner().invoke(app, ["search", "attention", "--shape", SHAPE, "--dtype", "fp16",
                                      "--trials", "2", "--interpret", "--db", str(db)])
    assert result.exit_code == 0, result.output
    rows = sqlite3.connect(db).execute(
        "select trial_number, config_json, status, is_default from trials order by trial_number").fetchall()
    problem = SPEC.parse_shape(SHAPE)
    expected = SPEC.known_good_configs(problem, torch.float16)
    default = SPEC.default_config(problem, torch.float16)
    assert expected and expected[0] != default
    assert rows[0][3] == 1
    measured = [SPEC.coerce_config(json.loads(r[1])) for r in rows if r[2] == "ok"]
    assert measured[:2] == [default, expected[0]]


def test_known_good_configs_skip_invalid_ones():
    # Every known-good Triton config has BLOCK_M ≥ 64: for one query row (2 packed) none is
    # valid, and only the SDPA backends remain.
    sdpa = [{"BACKEND": "sdpa"}, {"BACKEND": "sdpa_cudnn"}]
    decode = SPEC.parse_shape("b=2,h=4,hkv=2,lq=1,lk=64,d=64")
    assert [{"BACKEND": c["BACKEND"]} for c in SPEC.known_good_configs(decode, torch.float16)] == sdpa
    prefill = SPEC.parse_shape("b=1,h=4,hkv=2,l=4096,d=128,causal=1")
    found = SPEC.known_good_configs(prefill, torch.bfloat16)
    assert len(found) == len(SPEC.known_good)
    assert all(SPEC.violations(prefill, cfg, torch.bfloat16) == [] for cfg in found)

"""`omnitune verify --model a,b`: several presets in one run, as `omnitune search` takes them — the
tables checked once, the memory and soak parts once per preset and named by it, one report — run
for real through the command line (under the interpreter on the CPU, every part on a GPU); an
unknown preset among several is one line before anything runs."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import assert_one_line_error
from test_verify import assert_schema, attention_table, tables_for_this_gpu
from typer.testing import CliRunner

from omnitune.cli import app

ON_GPU = torch.cuda.is_available()
cpu_only = pytest.mark.skipif(ON_GPU, reason="runs the kernels through --interpret, on a machine without a GPU")
MODE = [] if ON_GPU else ["--interpret"]
PRESETS = ("qwen2.5-omni-7b", "qwen2.5-omni-3b")


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def part(report: dict, name: str) -> list[dict]:
    return [c for c in report["checks"] if c["part"] == name]


@cpu_only
def test_two_models_check_the_tables_once_and_each_preset_s_parts(tmp_path):
    tables = attention_table(tmp_path)
    out = tmp_path / "r.json"
    result = invoke("verify", "--tables", tables, "--interpret", "--model", " QWEN2.5-omni-7b, qwen2.5-omni-3b",
                    "--soak", "1", "--json", out)
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert_schema(report)  # the documented report, one for every preset
    assert report["options"]["model"] == ",".join(PRESETS) and report["verdict"] == "pass"
    # The one table and its one entry, once; speed has no GPU here.
    assert len(part(report, "compat")) == 1 and len(part(report, "numerics")) == 1
    assert [c["subject"] for c in part(report, "speed")] == ["all"]
    for name in ("memory", "soak"):
        checks = part(report, name)
        assert [(c["subject"], c["details"]["model"]) for c in checks] == [(f"{p}: all", p) for p in PRESETS]
        assert {c["summary"] for c in checks} == {"skipped (no GPU)"}
    assert report["counts"]["skipped"] == 5
    for preset in PRESETS:
        assert f"{preset}: all" in result.stdout
    # The tables are checked once, whatever the number of presets.
    assert result.stderr.count("compat: ") == 1


@pytest.mark.parametrize("model, message", [
    ("qwen2.5-omni-7b,llama-9", "unknown model 'llama-9'; choose one of qwen2.5-omni-7b"),
    ("llama-9,qwen2.5-omni-7b", "unknown model 'llama-9'"),
    (",", "no model named in ','"),
])
def test_an_unknown_model_among_several_is_one_line_before_anything_runs(tmp_path, model, message):
    tables = attention_table(tmp_path)
    # one line and nothing else on stderr: no progress, so no check ran
    assert_one_line_error(invoke("verify", "--tables", tables, *MODE, "--model", model), message)


def test_verify_help_says_how_several_presets_are_verified():
    result = invoke("verify", "--help")
    assert result.exit_code == 0
    text = " ".join(result.stdout.replace("│", " ").split())  # each option's help wraps inside a box
    assert "Several, comma-separated, as search takes them: the tables are checked once" in text


@pytest.mark.gpu
def test_two_models_run_each_preset_s_memory_check_on_the_gpu(tmp_path):
    kernels = ("kv_cache_write",)
    tables = tables_for_this_gpu(tmp_path / "tables", kernels)
    out = tmp_path / "r.json"
    result = invoke("verify", "--model", ",".join(PRESETS), "--kernels", ",".join(kernels), "--tables", tables,
                    "--soak", "0.1", "--json", out)
    assert result.exit_code in (0, 1), result.output
    report = json.loads(out.read_text())
    assert_schema(report)
    memory = part(report, "memory")
    assert [c["details"]["model"] for c in memory] == list(PRESETS)
    for preset, check in zip(PRESETS, memory):
        assert check["subject"].startswith(f"{preset}: t=") and check["status"] != "skipped", check
        assert check["details"].get("peak_bytes", 0) > 0 or check["status"] == "fail"
    soaks = {c["subject"]: c for c in part(report, "soak")}
    for preset in PRESETS:
        assert soaks[f"{preset}: all"]["details"]["calls"] > 0
    # The tables were checked once: one compat check for the one table.
    assert len(part(report, "compat")) == 1

"""`omnitune plan` over several model presets and several dtypes in one call, run for real through
the command line: `--model a,b` and `--dtype bf16,fp16` as `omnitune search` takes them, each
problem planned once (as search searches it) with the presets that send it, one block per kernel
and dtype; --coverage over several as one JSON list; a bad name among several is one line."""

from __future__ import annotations

import json

import pytest
from conftest import assert_one_line_error
from typer.testing import CliRunner

from omnitune.cli import app
from omnitune.presets import get_preset, get_presets, models_problems, preset_problems
from omnitune.registry import get_spec

H200 = "NVIDIA H200"
# Two presets that share most of their problems (the same language model), one sending a few of its own.
OMNI, VL = "qwen2.5-omni-7b", "qwen2.5-vl-7b"


def invoke(*args: str):
    return CliRunner().invoke(app, [str(a) for a in args])


def plan(tmp_path, *args: str) -> str:
    """The plan's output; no results database, so the assumed rates (the same on any machine)."""
    result = invoke("plan", *args, "--db", tmp_path / "none.db")
    assert result.exit_code == 0, result.output
    return result.stdout


def problem_lines(out: str, kernel: str, dtype: str) -> list[str]:
    """The problem lines of one kernel's block in one dtype."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{kernel} ({dtype}): "))
    block = []
    for line in lines[start + 1:]:
        if not line.startswith("  "):
            break
        if not line.startswith("      "):  # a problem's budget, below its line
            block.append(line.strip())
    return block


def keys(kernel: str, preset: str) -> list[str]:
    """The problem keys one preset sends `kernel`, in its order."""
    spec = get_spec(kernel)
    return [spec.problem_key(p.problem) for p in preset_problems(get_preset(preset), kernel)]


def test_two_models_in_one_plan_list_each_problem_once_with_the_presets_that_send_it(tmp_path):
    out = plan(tmp_path, "--model", f"{OMNI},{VL}", "--kernels", "attention")
    # Both presets described, and what the plan stands for said once.
    assert out.startswith("Qwen2.5-Omni-7B thinker: hidden 3584")
    assert "\nQwen2.5-VL-7B: hidden 3584" in out
    assert f"planned as one session of `omnitune search --model {OMNI},{VL} --dtype bf16`" in out
    lines = problem_lines(out, "attention", "bf16")
    # The problems search --model OMNI,VL searches: each once, in its order.
    spec = get_spec("attention")
    searched = [spec.problem_key(p.problem) for p in models_problems(get_presets(f"{OMNI},{VL}"), "attention",
                                                                     spec.problem_key)]
    assert [line.split()[0] for line in lines] == searched
    assert f"attention (bf16): {len(searched)} problems, " in out
    shared = set(keys("attention", OMNI)) & set(keys("attention", VL))
    assert shared and len(searched) < len(keys("attention", OMNI)) + len(keys("attention", VL))
    for line in lines:
        key = line.split()[0]
        senders = (f"{OMNI}, {VL}" if key in shared else OMNI if key in keys("attention", OMNI) else VL)
        assert line.endswith(f"  from {senders}"), line


def test_two_models_plan_the_kernel_one_of_them_never_runs(tmp_path):
    out = plan(tmp_path, "--model", f"qwen-image-dit,{OMNI}", "--kernels", "attention,kv_cache_write")
    assert "kv_cache_write (bf16): 8 problems" in out  # the DiT sends it nothing; the Omni does
    assert all(line.endswith(f"from {OMNI}") for line in problem_lines(out, "kv_cache_write", "bf16"))
    dit = [line for line in problem_lines(out, "attention", "bf16") if line.endswith("from qwen-image-dit")]
    assert len(dit) == len(keys("attention", "qwen-image-dit"))


def test_two_dtypes_in_one_plan_give_one_block_per_kernel_and_dtype(tmp_path):
    one = plan(tmp_path, "--model", OMNI, "--kernels", "kv_cache_write")
    out = plan(tmp_path, "--model", OMNI, "--kernels", "kv_cache_write", "--dtype", "bf16,fp16")
    assert problem_lines(out, "kv_cache_write", "bf16") == problem_lines(one, "kv_cache_write", "bf16")
    assert [line.split()[0] for line in problem_lines(out, "kv_cache_write", "fp16")] == keys("kv_cache_write", OMNI)
    assert (f"planned as one session of `omnitune search --model {OMNI} --dtype bf16,fp16`: each problem in bf16 "
            "and fp16, one search each") in out
    # Twice the searches: 8 problems in each dtype, 338 trials each at the assumed rates.
    assert "kv_cache_write (bf16): 8 problems, 338 trials, ~86 s" in one
    assert "kv_cache_write (fp16): 8 problems, 338 trials, ~86 s" in out
    assert "\ntotal ~86 s: " in one and "\ntotal ~3 min: " in out
    # One table per kernel and GPU, whatever the dtypes.
    assert out.count("tuned_configs/kv_cache_write/") == 1


def test_two_models_and_two_dtypes_in_one_plan(tmp_path):
    out = plan(tmp_path, "--model", f"{OMNI},qwen2.5-omni-3b", "--kernels", "kv_cache_write", "--dtype", "fp16,bf16")
    for dtype in ("fp16", "bf16"):
        lines = problem_lines(out, "kv_cache_write", dtype)
        assert len(lines) == 16  # the two presets share no problem: 8 each
        assert sum(line.endswith(f"from {OMNI}") for line in lines) == 8
    assert out.index("kv_cache_write (fp16)") < out.index("kv_cache_write (bf16)")  # in the order given


def test_coverage_of_two_models_in_two_dtypes_is_a_json_list_one_object_each(tables_dir):
    args = ["plan", "--model", f"{OMNI},qwen2.5-omni-3b", "--kernels", "kv_cache_write", "--dtype", "bf16,fp16",
            "--coverage", "--device", H200]
    result = invoke(*args, "--json")
    assert result.exit_code == 0, result.output
    docs = json.loads(result.stdout)
    assert [(d["model"], d["dtype"]) for d in docs] == [(OMNI, "bf16"), (OMNI, "fp16"),
                                                        ("qwen2.5-omni-3b", "bf16"), ("qwen2.5-omni-3b", "fp16")]
    for doc in docs:  # no table here: every problem answers the default, with the search to tune it
        assert doc["problems"] == 8 and doc["rungs"]["default"] == 8
        assert all(f"--dtype {doc['dtype']}" in p["search"] and p["trials"] for p in doc["listed"])
    lines = invoke(*args)
    assert lines.exit_code == 0, lines.output
    for doc in docs:
        assert f"coverage of {doc['model']} " in lines.stdout and f" in {doc['dtype']} on {H200}: 8 problems" in \
            lines.stdout
    assert lines.stdout.count("coverage of ") == 4


def test_coverage_of_a_preset_that_sends_none_of_the_kernels_says_so(tables_dir):
    result = invoke("plan", "--model", f"{OMNI},qwen-image-dit", "--kernels", "kv_cache_write", "--coverage",
                    "--device", H200)
    assert result.exit_code == 0, result.output
    assert "qwen-image-dit sends none of these kernels any problem: nothing to tune" in result.stdout
    assert "tuned exactly" not in result.stdout


@pytest.mark.parametrize("args, message", [
    (["--model", f"{OMNI},llama-9"], "unknown model 'llama-9'; choose one of qwen2.5-omni-7b"),
    (["--model", f"llama-9,{OMNI}", "--coverage", "--device", H200], "unknown model 'llama-9'"),
    (["--model", f"{OMNI},{VL}", "--dtype", "bf16,fp9"], "unknown dtype 'fp9'; choose one of fp32, fp16, bf16"),
    (["--model", OMNI, "--dtype", ","], "--dtype ',' names no dtype"),
    (["--model", ","], "no model named in ','"),
])
def test_an_unknown_name_among_several_is_one_line(args, message):
    assert_one_line_error(invoke("plan", *args), message)


def test_plan_help_says_how_several_presets_and_dtypes_are_planned():
    result = invoke("plan", "--help")
    assert result.exit_code == 0
    text = " ".join(result.stdout.replace("│", " ").split())  # each option's help wraps inside a box
    assert "Several, comma-separated" in text and "a problem two presets share is planned, and listed, once" in text
    assert "a JSON list of such objects, one per preset and dtype" in text

"""`omnitune plan --model NAME --coverage` and what `omnitune lookup` says of each rung, run for real
on tables exported from a temporary database (the synthetic kv_cache_write sweep of
tests/predictor_sweep.py: 64 to 4,096 tokens, 4 kv heads, in the activations' dtype, fp16)."""

from __future__ import annotations

import json

import pytest
import torch
from predictor_sweep import problem, sweep_rows
from trial_rows import H200, results_db
from typer.testing import CliRunner

from omnitune import export
from omnitune.cli import app
from omnitune.kernels.kv_cache_write import SPEC

COVERAGE = ["plan", "--model", "qwen2.5-omni-7b", "--kernels", "kv_cache_write", "--dtype", "fp16", "--coverage",
            "--device", H200]


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


@pytest.fixture
def tables(tmp_path, tables_dir):
    export.export_tables(results_db(tmp_path / "results.db", sweep_rows()), tables_dir)
    return tables_dir


def _key(t, cache=""):
    return SPEC.problem_key(problem(t)) + (f",cache_dtype={cache}" if cache else "")


def _listed(out: str) -> list[str]:
    """The problem keys of the "tune next" list, in order."""
    return [line.split()[2] for line in out.splitlines() if line[:4].strip().rstrip(".").isdigit()]


def _block(out: str, place: int, key: str) -> str:
    """The lines of one proposal: its numbered line and the indented ones below it."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{place:3}. kv_cache_write {key} "))
    end = next((i for i in range(start + 1, len(lines)) if not lines[i].startswith("     ")), len(lines))
    return "\n".join(lines[start:end])


def test_coverage_ranks_the_preset_by_gap_with_the_search_for_each(tables):
    result = invoke(*COVERAGE, "--db", str(tables / "none.db"))
    assert result.exit_code == 0, result.output
    out = result.stdout
    # The preset writes 4, 64, 1,024 and 16,384 tokens, to an fp16 cache and to an fp8 one.
    assert "8 problems — 2 exact, 1 nearest, 0 predictor, 5 default" in out
    # Largest gap first: the fp8 cache has no tuned problem at all (nothing to say what its default
    # costs), then 4 tokens (16x from the nearest tuned: the default, expected 1.11x the best there),
    # then 16,384 tokens (lent 4,096's entry); 64 and 1,024 are tuned.
    assert _listed(out) == [_key(t, "fp8_e4m3") for t in (4, 64, 1024, 16384)] + [_key(4), _key(16384)]
    default = _block(out, 1, _key(4, "fp8_e4m3"))
    assert "differs in cache_dtype" in default
    assert "the predictor holds no tuned problem of this dtype and the same cache_dtype" in default
    assert f"omnitune search kv_cache_write --shape {_key(4, 'fp8_e4m3')} --dtype fp16" in default
    short = _block(out, 5, _key(4))
    assert "has t 16× apart (4 here, 64 there; at most 4×)" in short and f"closest tuned: fp16|{_key(64)}" in short
    assert "no config measured on them is expected to beat the default config" in short
    assert "expected 1.11× the best, by the table's predictor" in short
    nearest = _block(out, 6, _key(16384))
    assert f"lent by: fp16|{_key(4096)} (distance 2.00)" in nearest
    assert f"omnitune search kv_cache_write --shape {_key(16384)} --dtype fp16  (~" in nearest
    assert "tuned exactly (no gap): 2 — kv_cache_write 2" in out


def test_coverage_lists_predicted_problems_after_the_defaults(tables):
    # Two kv heads: a field the MatchPolicy matches exactly, so the 4-head entries lend nothing.
    result = invoke(*[a if a != "qwen2.5-omni-7b" else "qwen2.5-omni-3b" for a in COVERAGE])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "8 problems — 0 exact, 0 nearest, 2 predictor, 6 default" in out
    keys = [k.replace("hkv=4", "hkv=2") for k in (_key(16384), _key(1024))]
    assert _listed(out)[-2:] == keys  # the larger expected ratio first
    predicted = _block(out, 8, keys[1])
    assert "predictor — no tuned shape within kv_cache_write's MatchPolicy" in predicted
    assert "differs in hkv (2 here, 4 there; matched exactly)" in predicted
    assert f"nearest tuned: fp16|{_key(1024)} (distance 1.00)" in predicted
    assert f"omnitune search kv_cache_write --shape {keys[1]} --dtype fp16" in predicted


def test_coverage_json_holds_what_the_lines_list(tables):
    """--json: the counts per rung and every problem, largest gap first, with the search and its
    estimate for each gap; the same order and searches as the printed list."""
    lines = invoke(*COVERAGE).stdout
    result = invoke(*COVERAGE, "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert (doc["model"], doc["dtype"], doc["device"], doc["problems"]) == ("qwen2.5-omni-7b", "fp16", H200, 8)
    assert doc["rungs"] == {"exact": 2, "nearest": 1, "predictor": 0, "default": 5}
    gaps = [p for p in doc["listed"] if p["rung"] != "exact"]
    assert [p["problem_key"] for p in gaps] == _listed(lines)
    assert [p["rung"] for p in doc["listed"]][-2:] == ["exact", "exact"]  # the tuned ones after every gap
    for p in gaps:
        assert p["search"] in lines and p["trials"] >= 1 and p["estimate_s"] > 0
        assert p["why"].split(":")[0] in lines
    assert all(p["search"] is None for p in doc["listed"] if p["rung"] == "exact")
    nearest = next(p for p in gaps if p["rung"] == "nearest")
    assert nearest["matched_key"] == f"fp16|{_key(4096)}" and nearest["distance"] == 2.0

    top = json.loads(invoke(*COVERAGE, "--json", "--top", "2").stdout)
    assert [p["problem_key"] for p in top["listed"]] == _listed(lines)[:2] and top["problems"] == 8


def test_top_lists_only_the_largest_gaps(tables):
    result = invoke(*COVERAGE, "--top", "2")
    assert result.exit_code == 0, result.output
    assert "tune next, largest gap first (2 of 6)" in result.stdout
    assert "  2. kv_cache_write" in result.stdout and "  3. kv_cache_write" not in result.stdout


def test_coverage_without_tables_says_every_problem_answers_the_default(tables_dir):
    result = invoke(*COVERAGE)
    assert result.exit_code == 0, result.output
    assert "8 problems — 0 exact, 0 nearest, 0 predictor, 8 default" in result.stdout
    assert "no readable kv_cache_write table for NVIDIA H200" in result.stdout


def test_coverage_of_a_fully_tuned_preset_proposes_nothing(tmp_path, tables_dir):
    rows = [r for t, cache in ((4, "auto"), (64, "auto"), (1024, "auto"), (16384, "auto"))
            for r in sweep_rows(tokens=(t,))]
    export.export_tables(results_db(tmp_path / "r.db", rows), tables_dir)
    result = invoke("plan", "--model", "qwen2.5-omni-7b", "--kernels", "kv_cache_write", "--dtype", "fp16",
                    "--coverage", "--device", H200)
    assert result.exit_code == 0, result.output
    assert "4 default" in result.stdout  # the fp8 cache's problems are still open
    assert "tuned exactly (no gap): 4" in result.stdout


def test_coverage_on_a_gpu_of_the_same_chip_says_whose_tables_answered(tables):
    h100 = "NVIDIA H100 80GB HBM3"  # no table of its own: the H200's serve it (same_chip_keys)
    args = [*COVERAGE[:-1], h100]
    out = invoke(*args).stdout
    assert "8 problems — 2 exact, 1 nearest, 0 predictor, 5 default" in out
    assert ("3 answered from NVIDIA_H200's tables, a GPU of the same chip: to tune them on this GPU, omnitune "
            "search --model qwen2.5-omni-7b --dtype fp16") in out
    doc = json.loads(invoke(*args, "--json").stdout)
    assert sorted(str(p["tuned_on"]) for p in doc["listed"]) == ["NVIDIA_H200"] * 3 + ["None"] * 5
    assert "answered from" not in invoke(*COVERAGE).stdout  # on the H200 itself


@pytest.mark.parametrize("args, message", [
    (["--coverage"], "pass --device NAME"),
    (["--device", H200], "--device, --top and --json go with --coverage"),
    (["--top", "3"], "--device, --top and --json go with --coverage"),
    (["--json"], "--device, --top and --json go with --coverage"),
    (["--coverage", "--device", " "], "--device needs a GPU's name"),
    (["--coverage", "--top", "0", "--device", H200], "Invalid value for '--top'"),
])
def test_bad_coverage_options_are_one_line(tables_dir, monkeypatch, args, message):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    result = invoke("plan", "--model", "qwen2.5-omni-7b", *args)
    assert result.exit_code == 2, result.output
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("name", ["", "  "])
def test_lookup_with_an_empty_device_name_is_one_line(tables_dir, name):
    result = invoke("lookup", "kv_cache_write", "--shape", SPEC.problem_key(problem(1024, 4)), "--device", name)
    assert result.exit_code == 2, result.output
    assert "--device needs a GPU's name" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_plan_help_explains_coverage():
    result = invoke("plan", "--help")
    assert result.exit_code == 0
    text = " ".join(result.stdout.split())
    assert "--coverage" in text and "largest gap first" in text and "--device" in text and "--top" in text


# --- omnitune lookup says which rung answered and why ---------------------------------------------


def _lookup(t, hkv=4, cache=""):
    shape = SPEC.problem_key(problem(t, hkv)) + (f",cache_dtype={cache}" if cache else "")
    result = invoke("lookup", "kv_cache_write", "--shape", shape, "--dtype", "fp16", "--device", H200)
    assert result.exit_code == 0, result.output
    return result.stdout


def test_lookup_says_exact(tables):
    out = _lookup(1024)
    assert "rung: exact — this shape was tuned in this dtype on this GPU" in out
    assert f"entry: fp16|{_key(1024)} (distance 0.00)" in out and "to tune it" not in out


def test_lookup_says_nearest_and_what_the_predictor_expects(tables):
    out = _lookup(16384)
    assert "rung: nearest — not tuned itself" in out and f"entry: fp16|{_key(4096)} (distance 2.00)" in out
    assert "expected: " in out and "by the table's predictor" in out
    assert f"to tune it: omnitune search kv_cache_write --shape {_key(16384)} --dtype fp16" in out


def test_lookup_says_predictor_and_from_what(tables):
    out = _lookup(1024, hkv=8)
    assert "rung: predictor — no tuned shape within kv_cache_write's MatchPolicy (hkv, d equal; other dimensions " \
           "within 4×): the closest differs in hkv (8 here, 4 there; matched exactly); predicted from the 3 nearest " \
           "tuned shapes: expected" in out
    assert f"predicted from: fp16|{_key(1024)}, " in out and "(the nearest at distance 1.00)" in out
    assert str(tables / "kv_cache_write" / "NVIDIA_H200.json") in out


def test_lookup_says_default_and_why(tables):
    out = _lookup(1024, cache="fp8_e4m3")
    assert "rung: default — no tuned shape within kv_cache_write's MatchPolicy" in out
    assert "differs in cache_dtype (fp8_e4m3 here, auto there; matched exactly)" in out
    assert f"closest tuned: fp16|{_key(1024)}" in out


@pytest.mark.parametrize("t, hkv, cache, rung", [(1024, 4, "", "exact"), (16384, 4, "", "nearest"),
                                                 (1024, 8, "", "predictor"), (1024, 4, "fp8_e4m3", "default")])
def test_lookup_json_says_what_the_lines_say(tables, t, hkv, cache, rung):
    """--json: one object with the rung, the config, the entry or neighbours and the file, the
    same answer the lines give (which stay the default)."""
    shape = SPEC.problem_key(problem(t, hkv)) + (f",cache_dtype={cache}" if cache else "")
    result = invoke("lookup", "kv_cache_write", "--shape", shape, "--dtype", "fp16", "--device", H200, "--json")
    assert result.exit_code == 0, result.output
    found = json.loads(result.stdout)
    lines = _lookup(t, hkv, cache)
    assert found["rung"] == rung and f"rung: {rung} — {found['why']}" in lines
    assert found["kernel"] == "kv_cache_write" and found["dtype"] == "fp16" and found["device"] == H200
    assert f"as --config: {json.dumps(found['config'], sort_keys=True)}" in lines
    assert (found["to_tune"] is None) == (rung == "exact")
    if rung in ("exact", "nearest"):
        assert f"entry: {found['matched_key']} (distance {found['distance']:.2f})" in lines
        assert found["file"] == str(tables / "kv_cache_write" / "NVIDIA_H200.json")
    if rung == "predictor":
        assert len(found["neighbours"]) == 3 and f"predicted from: {', '.join(found['neighbours'])}" in lines
    if rung == "default":
        assert found["matched_key"] is None and f"closest tuned: {found['closest']}" in lines

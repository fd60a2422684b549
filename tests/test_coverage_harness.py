"""benchmarks/coverage.py run for real on a few tiny KV-cache writes (under Triton's interpreter on
the CPU, on the GPU where there is one), with a table of our own: each rung named (exact,
nearest, default), ratios that are the recorded times' ratios, a failing problem kept as an error
row while the run goes on, --resume skipping what is done, and --report's Markdown and plot. The
interpreter's times mean nothing (CPU wall clock); everything else is what a GPU run writes."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import statistics
import sys
from pathlib import Path

import pytest
import torch

import omnitune
from omnitune.kernels.kv_cache_write import SPEC, KVCacheWriteProblem
from omnitune.spec import Config

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "coverage.py"
# Loaded under another name: "coverage" is also the name of a well-known package.
_spec = importlib.util.spec_from_file_location("coverage_harness", _PATH)
harness = importlib.util.module_from_spec(_spec)
sys.modules["coverage_harness"] = harness
_spec.loader.exec_module(harness)

ON_GPU = torch.cuda.is_available()
# conftest imports the kernels interpreted without a GPU and compiled with one; --interpret must match.
MODE = [] if ON_GPU else ["--interpret"]
GPU = "NVIDIA H200"  # whose tables are looked up, GPU or not
TUNED = KVCacheWriteProblem(t=8, hkv=2, d=64, block_size=16)       # in the table: exact
NEAR = KVCacheWriteProblem(t=4, hkv=2, d=64, block_size=16)        # 2x from it: nearest
UNTUNED = KVCacheWriteProblem(t=12, hkv=2, d=64, block_size=8)     # fp32: no entry, the default
BROKEN = KVCacheWriteProblem(t=5, hkv=2, d=64, block_size=16)      # a dtype no kernel has
TABLE_CONFIG = Config(BLOCK_T=2, BLOCK_H=2, num_warps=1)

TINY = {"kv_cache_write": [(NEAR, "fp16"), (TUNED, "fp16"), (BROKEN, "fp64"), (UNTUNED, "fp32")]}
PROBLEMS = f"{__name__}:TINY"


def _write_table(folder: Path) -> None:
    key = f"fp16|{SPEC.problem_key(TUNED)}"
    entry = {"problem": dataclasses.asdict(TUNED), "dtype": "fp16", "config": TABLE_CONFIG.as_dict(),
             "time_ms": 0.01, "p20_ms": 0.01, "p80_ms": 0.01, "trials": 40, "rel_error": 0.0}
    doc = {"schema_version": 1, "kernel": SPEC.name,
           "device": {"name": GPU, "key": "NVIDIA_H200", "compute_capability": "9.0", "driver": "580"},
           "software": {"omnitune": omnitune.__version__}, "kernel_source_hash": SPEC.source_hash(),
           "exported_at": "2026-12-01T00:00:00+00:00", "representative": True, "entries": {key: entry}}
    path = folder / SPEC.name / "NVIDIA_H200.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(doc))


def _run(out: Path, tables: Path, *extra: str) -> int:
    return harness.main([*MODE, "--problems", PROBLEMS, "--tables", str(tables), "--device-name", GPU,
                         "--trials", "3", "--rounds", "3", "--precompile", "0", "--out", str(out), *extra])


@pytest.fixture
def evaluated(tables_dir, tmp_path, capsys):
    """A run of two problems, then a --resume that judges the other two: (results, output)."""
    _write_table(tables_dir)
    out = tmp_path / "coverage.json"
    assert _run(out, tables_dir, "--limit", "2") == 0
    first = json.loads(out.read_text())
    assert [r["key"].split("|")[1] for r in first["rows"]] == [SPEC.problem_key(NEAR), SPEC.problem_key(TUNED)]
    assert _run(out, tables_dir, "--resume") == 0
    return out, first, capsys.readouterr().out


def test_rows_name_their_rung_and_their_ratios_are_the_times_ratios(evaluated, tables_dir):
    out, first, printed = evaluated
    doc = json.loads(out.read_text())
    near, exact, broken, untuned = doc["rows"]
    assert [r["run"] for r in doc["rows"]] == [0, 0, 1, 1]
    assert near == first["rows"][0] and exact == first["rows"][1]  # resume kept them as they were

    assert near["rung"] == "nearest" and near["matched_key"] == f"fp16|{SPEC.problem_key(TUNED)}"
    assert exact["rung"] == "exact" and exact["distance"] == 0.0
    assert Path(exact["table"]).parent.parent == tables_dir
    assert near["configs"]["pick"] == exact["configs"]["pick"] == TABLE_CONFIG.as_dict()
    default = SPEC.default_config(UNTUNED, torch.float32).as_dict()
    assert untuned["rung"] == "default" and untuned["configs"]["pick"] == untuned["configs"]["default"] == default

    for row in (near, exact, untuned):
        assert row["status"] == "ok" and row["error"] is None
        assert row["search"]["measured_total"] == 3 and row["search"]["stop_reason"] == "budget"
        assert row["search"]["warm_start"][0] == row["configs"]["pick"]  # the search starts from the pick
        assert all(check["status"] == "ok" for check in row["checks"].values())
        times, ratios, timings = row["times_ms"], row["ratios"], row["timings"]
        for role in ("pick", "default", "tuned"):
            (name,) = [n for n in timings if role in n.split("+")]
            assert times[role] == timings[name]["median_ms"] > 0 and timings[name]["rounds"] == 3
            assert timings[name]["representative"] is ON_GPU
        assert row["best_pytorch"] == "torch_index_copy"
        assert times["best_pytorch"] == timings["torch_index_copy"]["median_ms"]
        assert ratios["pick_over_tuned"] == pytest.approx(times["pick"] / times["tuned"])
        assert ratios["default_over_tuned"] == pytest.approx(times["default"] / times["tuned"])
        assert ratios["best_pytorch_over_tuned"] == pytest.approx(times["best_pytorch"] / times["tuned"])
        assert row["pick_slower_than_pytorch"] == (times["pick"] > times["best_pytorch"])
        # index_copy_ reads the op's own inputs: it is also the best a caller could run instead
        assert row["prepared_baselines"] == [] and row["best_pytorch_same_inputs"] == "torch_index_copy"
        assert row["pick_slower_than_pytorch_same_inputs"] == row["pick_slower_than_pytorch"]
        assert row["pick_is_tuned"] == (row["configs"]["pick"] == row["configs"]["tuned"])

    assert broken["status"] == "error" and "fp64" in broken["error"] and "ratios" not in broken
    assert "ETA" in printed and "failed (ShapeError" in printed

    settings = doc["settings"]
    assert settings["trials"] == 3 and settings["interpret"] is not ON_GPU and settings["tables_device"] == GPU
    assert settings["tables"] == str(tables_dir.resolve())
    assert len(doc["runs"]) == 2 and doc["command"].endswith(f"--out {out} --resume")
    device = torch.cuda.get_device_name() if ON_GPU else "triton-interpreter"
    assert doc["device"]["name"] == device and {"torch", "triton", "omnitune"} <= set(doc["software"])
    assert str(tables_dir.resolve()) in doc["config_dirs"]


def test_the_summary_is_computed_from_the_rows(evaluated):
    doc = json.loads(evaluated[0].read_text())
    timed = [r for r in doc["rows"] if r["status"] == "ok"]
    picks = [r["ratios"]["pick_over_tuned"] for r in timed]
    summary = doc["summary"]["kv_cache_write"]
    assert summary["problems"] == 4 and summary["evaluated"] == 3 and summary["errors"] == 1
    assert summary["rungs"] == {"exact": 1, "nearest": 1, "predictor": 0, "default": 1}
    assert summary["pick_within_95pct"] == sum(1 for p in picks if 1 / p >= 0.95)
    assert summary["pick_within_95pct_share"] == pytest.approx(summary["pick_within_95pct"] / 3)
    by_rung = summary["pick_within_95pct_by_rung"]
    assert set(by_rung) == {r["rung"] for r in timed} and sum(n for _, n in by_rung.values()) == 3
    for rung, (good, total) in by_rung.items():
        ours = [r["ratios"]["pick_over_tuned"] for r in timed if r["rung"] == rung]
        assert (good, total) == (sum(1 for p in ours if 1 / p >= 0.95), len(ours))
    assert summary["median_pick_over_tuned"] == pytest.approx(statistics.median(picks))
    assert summary["worst_pick_over_tuned"] == pytest.approx(max(picks))
    assert summary["pick_slower_than_pytorch"] == sum(r["pick_slower_than_pytorch"] for r in timed)
    assert summary["with_pytorch"] == summary["with_pytorch_same_inputs"] == 3
    beyond = [r for r in timed if r["pick_slower_than_pytorch"] and harness.coverage_report.slower_beyond_spread(r)]
    assert summary["pick_slower_than_pytorch_beyond_spread"] == len(beyond)
    assert summary["pick_slower_than_pytorch_same_inputs"] == summary["pick_slower_than_pytorch"]
    assert doc["summary"]["all"] == summary


def test_a_baseline_prepared_ahead_is_reported_but_not_the_bar():
    """SDPA over a cache gathered ahead is faster than the pick here, the gather-then-SDPA path a
    caller could run is slower: slower than PyTorch, yes; than a path over the same inputs, no."""
    from coverage_eval import Candidate, times_and_ratios

    def run():
        return None

    candidates = [Candidate("pick", run, ("pick",)), Candidate("default+tuned", run, ("default", "tuned")),
                  Candidate("gather_sdpa", run), Candidate("sdpa_contiguous", run, prepared=True)]
    medians = {"pick": 0.05, "default+tuned": 0.04, "gather_sdpa": 0.5, "sdpa_contiguous": 0.045}
    row = times_and_ratios(candidates, {name: {"median_ms": ms} for name, ms in medians.items()})
    assert row["best_pytorch"] == "sdpa_contiguous" and row["pick_slower_than_pytorch"] is True
    assert row["best_pytorch_same_inputs"] == "gather_sdpa" and row["pick_slower_than_pytorch_same_inputs"] is False
    assert row["times_ms"]["best_pytorch_same_inputs"] == 0.5 and row["prepared_baselines"] == ["sdpa_contiguous"]
    assert row["ratios"]["pick_over_tuned"] == pytest.approx(0.05 / 0.04)

    from coverage_report import kernel_summary, summary_sentence

    ok = {"status": "ok", "rung": "nearest", "dtype": "bf16", "problem_key": "b=1"}
    older = {**ok, "ratios": row["ratios"], "pick_slower_than_pytorch": True}  # a row from before the split
    summary = kernel_summary([{**ok, **row}, older])
    assert (summary["with_pytorch"], summary["pick_slower_than_pytorch"]) == (2, 2)
    assert (summary["with_pytorch_same_inputs"], summary["pick_slower_than_pytorch_same_inputs"]) == (1, 0)
    assert "(`sdpa_contiguous`): slower on 0 of 1" in summary_sentence(summary)


@pytest.mark.parametrize("pick_p20, slower_beyond", [(0.0502, True), (0.0498, False)])
def test_slower_beyond_the_spread_needs_the_pick_p20_above_the_baseline_p80(pick_p20, slower_beyond):
    """Two timings of one implementation differ by a fraction of a percent: only a pick whose
    p20 lies above the baseline's p80 counts as clearly slower."""
    from coverage_report import kernel_summary, slower_beyond_spread

    timings = {"pick+default": {"median_ms": 0.0505, "p20_ms": pick_p20, "p80_ms": 0.0510},
               "tuned": {"median_ms": 0.0495, "p20_ms": 0.0490, "p80_ms": 0.0500},
               "sdpa": {"median_ms": 0.0500, "p20_ms": 0.0495, "p80_ms": 0.0501}}
    row = {"status": "ok", "rung": "default", "dtype": "bf16", "problem_key": "b=1", "timings": timings,
           "best_pytorch": "sdpa", "pick_slower_than_pytorch": True,
           "ratios": {"pick_over_tuned": 0.0505 / 0.0495, "default_over_tuned": 0.0505 / 0.0495}}
    assert slower_beyond_spread(row) is slower_beyond
    assert slower_beyond_spread({**row, "best_pytorch": None}) is None
    summary = kernel_summary([row])
    assert (summary["pick_slower_than_pytorch"], summary["pick_slower_than_pytorch_beyond_spread"]) == (1, int(slower_beyond))


def test_resume_skips_what_is_done_and_refuses_other_settings(evaluated, tables_dir, capsys):
    out = evaluated[0]
    before = json.loads(out.read_text())["rows"]
    assert _run(out, tables_dir, "--resume") == 0
    assert "judging 0" in capsys.readouterr().out
    assert json.loads(out.read_text())["rows"] == before
    assert _run(out, tables_dir, "--resume", "--retry-errors") == 0  # only the failed problem again
    rows = json.loads(out.read_text())["rows"]
    assert [r["run"] for r in rows] == [0, 0, 3, 1] and rows[2]["status"] == "error"
    with pytest.raises(SystemExit, match="exists: add --resume"):
        _run(out, tables_dir)
    with pytest.raises(SystemExit, match="trials: 3 there, 4 now"):
        _run(out, tables_dir, "--resume", "--trials", "4")


def test_report_prints_a_table_per_kernel_and_plots(evaluated, tmp_path, capsys, monkeypatch):
    out = evaluated[0]
    plot = tmp_path / "plots" / "coverage.png"
    assert harness.main(["--report", str(out), "--plot", str(plot)]) == 0
    printed = capsys.readouterr().out
    assert "## kv_cache_write" in printed and "| problem | dtype | rung |" in printed
    assert printed.count("\n| `") == 4 and "failed: ShapeError" in printed and "| nearest |" in printed
    assert ("interpreter" in printed) is not ON_GPU and f"wrote {plot}" in printed
    assert plot.stat().st_size > 0
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if it were not installed
    assert harness.main(["--report", str(out), "--plot", str(tmp_path / "none.png")]) == 0
    assert "no plot: matplotlib is not installed" in capsys.readouterr().out
    assert not (tmp_path / "none.png").exists()


def test_the_runtime_reads_what_it_read_before_the_run(evaluated, tables_dir):
    assert os.environ["OMNITUNE_CONFIG_DIR"] == str(tables_dir)  # --tables was put in front for the run only


def test_with_compile_ahead_the_next_problem_compiles_before_this_one_ends(tables_dir, tmp_path, monkeypatch):
    """With compile-ahead workers, the harness hands its searches the session's look-ahead: the
    second problem's pool is opened and given its first configs while the first problem's pool is
    still open (its search, finalists and final timing not done). Fake pools: nothing compiles."""
    from omnitune.search.prepare_next import ProblemsAhead
    from tests.test_prepare_next import LoggedPool

    _write_table(tables_dir)
    log: list = []

    def make_pool(spec, problem, dtype):
        log.append(("open", spec.problem_key(problem)))
        return LoggedPool(log, spec.problem_key(problem))

    def look_ahead(todo, setup):
        order = [(SPEC, i.problem, harness.problem_dtype(i.dtype_name, setup.interpret)) for i in todo]
        return ProblemsAhead(order, workers=2, trials=setup.trials, make_pool=make_pool)

    monkeypatch.setattr(harness, "look_ahead", look_ahead)
    monkeypatch.setattr(harness, "precompile_workers", lambda args: 2)  # the interpreter's runs have none
    out = tmp_path / "coverage.json"
    assert _run(out, tables_dir, "--limit", "2") == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["status"] for r in rows] == ["ok", "ok"]
    near, tuned = SPEC.problem_key(NEAR), SPEC.problem_key(TUNED)
    submitted_next = next(i for i, e in enumerate(log) if e[0] == "submit" and e[1] == tuned)
    assert log.index(("close", near)) > submitted_next
    assert log.count(("open", tuned)) == 1  # the prepared pool is the one its search used


def test_tuned_from_an_earlier_file_keeps_its_optima_and_searches_only_what_it_lacks(evaluated, tables_dir, tmp_path,
                                                                                      capsys):
    """--tuned-from: tables judged again without searching each problem again. The earlier file's
    optimum of each problem it judged is checked and timed beside the (new) pick; a problem it
    lacks is searched as before; a file that is no results file is one line."""
    earlier_path = evaluated[0]
    earlier = json.loads(earlier_path.read_text())
    # The earlier file loses one judged problem: that one must be searched again.
    lacking = earlier["rows"][-1]
    assert all(r["kernel_source_hash"] == SPEC.source_hash() for r in earlier["rows"])
    kept = [dict(r) for r in earlier["rows"][:-1]]
    kept[1]["kernel_source_hash"] = "older source"  # its optimum was found on other kernel source
    # An optimum that is no longer a valid config of the kernel (here: 3 warps, which its
    # constraints reject) is searched again, and the row says why.
    kept[0]["configs"] = {**kept[0]["configs"], "tuned": {**kept[0]["configs"]["tuned"], "num_warps": 3}}
    trimmed = tmp_path / "trimmed.json"
    trimmed.write_text(json.dumps({**earlier, "rows": kept}))
    out = tmp_path / "again.json"
    assert _run(out, tables_dir, "--tuned-from", str(trimmed)) == 0
    doc = json.loads(out.read_text())
    assert doc["settings"]["tuned_from"] == str(trimmed)
    rows = {r["key"]: r for r in doc["rows"]}
    resurveyed = rows[kept[0]["key"]]
    assert resurveyed["status"] == "ok" and resurveyed["search"]["measured_total"] == 3
    assert "3 warps" in resurveyed["earlier_optimum_invalid"]
    for before in earlier["rows"][1:-1]:
        row = rows[before["key"]]
        if before["status"] != "ok":
            assert row["status"] == "error"
            continue
        same_source = before["key"] != kept[1]["key"]
        assert row["status"] == "ok" and row["search"] == {"tuned_from": str(trimmed),
                                                           "tuned_measured_at": before["measured_at"],
                                                           "tuned_on_this_source": same_source}
        assert row["configs"]["tuned"] == before["configs"]["tuned"]
        assert row["configs"]["pick"] == before["configs"]["pick"]
        assert row["ratios"]["pick_over_tuned"] == pytest.approx(row["times_ms"]["pick"] / row["times_ms"]["tuned"])
    searched = rows[lacking["key"]]
    assert searched["status"] == "ok" and searched["search"]["measured_total"] == 3
    assert "tuned optimum is the one found by the search of" in harness.coverage_report.markdown(doc)
    # Resuming with another source is refused, as any other setting is.
    with pytest.raises(SystemExit, match="tuned_from"):
        _run(out, tables_dir, "--resume", "--tuned-from", str(earlier_path))
    # Not a results file: one line, nothing written.
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(SystemExit, match=r"--tuned-from .*bad.json: not a coverage results file"):
        _run(tmp_path / "never.json", tables_dir, "--tuned-from", str(bad))
    assert not (tmp_path / "never.json").exists()

"""omnitune.report and `omnitune report`: a database populated here, every format checked against
numbers computed from the rows put in."""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path

import pandas as pd
import pytest
from rich.console import Console
from typer.testing import CliRunner

from omnitune import report
from omnitune.cli import app
from omnitune.errors import StoreError
from omnitune.store import TrialRecord, open_db, record_trials
from omnitune.kernels.attention import SPEC, AttentionProblem
from omnitune.profile.device import INTERPRETER_DEVICE, device_key
from omnitune.spec import Config

PREFILL = AttentionProblem(b=1, h=8, hkv=2, lq=512, lk=512, d=64, causal=True)
CROSS = AttentionProblem(b=2, h=8, hkv=8, lq=128, lk=1024, d=128)
H200 = "NVIDIA H200"
DEFAULT = SPEC.default_config(PREFILL, SPEC.dtypes[0])
FAST = Config(BLOCK_M=128, BLOCK_N=32, num_warps=8, num_stages=2, PACK_GQA=False, USE_TMA=True)
TIED = FAST.replace(USE_TMA=False)
PRUNED = FAST.replace(num_stages=4, BLOCK_N=128)
WRONG = FAST.replace(BLOCK_N=64)


# --- a results database --------------------------------------------------------------------------


def trial_row(number, problem, config, *, status="ok", time_ms=None, dtype="fp16", device=H200,
              is_default=False, tflops=None, tbps=None, measured_at="2026-11-29T12:00:00+00:00"):
    """One row of the agreed `trials` schema; p20/p80 are set 5% either side of the median."""
    key, dkey = SPEC.problem_key(problem), device_key(device)
    ok = status == "ok"
    return {
        "study": f"attention|{key}|{dtype}|{dkey}", "trial_number": number, "kernel": "attention",
        "problem_key": key, "problem_json": json.dumps(dataclasses.asdict(problem), sort_keys=True),
        "dtype": dtype, "device_key": dkey, "device_name": device, "sampler": "tpe",
        "config_json": json.dumps(config.as_dict(), sort_keys=True), "config_label": config.label(),
        "status": status, "time_ms": time_ms if ok else None,
        "p20_ms": time_ms * 0.95 if ok else None, "p80_ms": time_ms * 1.05 if ok else None,
        "rel_error": 1e-4 if ok else None, "tflops": tflops, "tbps": tbps,
        "detail": "" if ok else f"{status}: because", "representative": device != INTERPRETER_DEVICE,
        "is_default": is_default, "extra_json": "{}", "source_hash": "0123456789abcdef",
        "torch_version": "2.11.0", "triton_version": "3.6.0", "omnitune_version": "0.1.0",
        "measured_at": measured_at,
    }


def results_db(path: Path, rows: list[dict]) -> Path:
    """A results database made by omnitune.store, holding `rows`."""
    db = open_db(path)
    record_trials(db, [TrialRecord(**row) for row in rows])
    db.conn.close()
    return path


DEFAULT_MS, FAST_MS = 2.0, 1.25


@pytest.fixture
def populated(tmp_path) -> Path:
    rows = [
        trial_row(0, PREFILL, DEFAULT, time_ms=DEFAULT_MS, is_default=True, tflops=100.0, tbps=1.0),
        trial_row(1, PREFILL, FAST, time_ms=FAST_MS, tflops=160.0, tbps=1.6),
        trial_row(2, PREFILL, TIED, time_ms=FAST_MS, tflops=160.0, tbps=1.6),  # a tie: the earlier wins
        trial_row(3, PREFILL, PRUNED, status="pruned"),
        trial_row(4, PREFILL, PRUNED.replace(BLOCK_M=64), status="pruned"),
        trial_row(5, PREFILL, WRONG, status="mismatch"),
        trial_row(0, CROSS, FAST, time_ms=0.75, device=INTERPRETER_DEVICE, dtype="fp32"),
        trial_row(0, CROSS, PRUNED, status="compile_error"),
    ]
    return results_db(tmp_path / "results.db", rows)


def _row(frame: pd.DataFrame, problem, device=H200) -> dict:
    match = frame[(frame["problem_key"] == SPEC.problem_key(problem)) & (frame["device_key"] == device_key(device))]
    assert len(match) == 1
    return match.iloc[0].to_dict()


# --- the frame -----------------------------------------------------------------------------------


def test_summary_has_one_row_per_key_with_the_right_numbers(populated):
    summary = report.summarize(report.load_trials(populated))
    assert len(summary) == 3
    best = _row(summary, PREFILL)
    assert best["best_config"] == FAST.label()
    assert best["time_ms"] == FAST_MS
    assert (best["p20_ms"], best["p80_ms"]) == pytest.approx((FAST_MS * 0.95, FAST_MS * 1.05))
    assert (best["tflops"], best["tbps"]) == (160.0, 1.6)
    assert best["default_time_ms"] == DEFAULT_MS
    assert best["speedup_vs_default"] == pytest.approx(DEFAULT_MS / FAST_MS)
    assert (best["trials"], best["ok_trials"]) == (6, 3)
    assert best["failures"] == "pruned 2, mismatch 1"
    assert best["representative"]

    interpreted = _row(summary, CROSS, INTERPRETER_DEVICE)
    assert interpreted["time_ms"] == 0.75
    assert not interpreted["representative"]
    assert pd.isna(interpreted["default_time_ms"]) and pd.isna(interpreted["speedup_vs_default"])

    failed = _row(summary, CROSS)
    assert pd.isna(failed["best_config"]) and pd.isna(failed["time_ms"])
    assert (failed["trials"], failed["ok_trials"], failed["failures"]) == (1, 0, "compile_error 1")


def test_load_trials_filters_by_kernel(populated):
    assert len(report.load_trials(populated, "attention")) == 8
    assert report.load_trials(populated, "kv_cache_write").empty


def test_missing_database_is_an_error_and_is_not_created(tmp_path):
    path = tmp_path / "nowhere" / "results.db"
    with pytest.raises(StoreError, match="no results database"):
        report.load_trials(path)
    assert not path.exists() and not path.parent.exists()


def test_a_file_that_is_not_a_database(tmp_path):
    path = tmp_path / "results.db"
    path.write_text("these are not the results you are looking for " * 100)
    with pytest.raises(StoreError, match="is not an omnitune results database"):
        report.load_trials(path)


# --- the renderers -------------------------------------------------------------------------------


def test_csv(populated):
    text = report.render_csv(report.summarize(report.load_trials(populated)))
    frame = pd.read_csv(io.StringIO(text))
    assert list(frame.columns) == report.SUMMARY_COLUMNS
    best = _row(frame, PREFILL)
    assert best["best_config"] == FAST.label()
    assert best["speedup_vs_default"] == pytest.approx(DEFAULT_MS / FAST_MS)
    assert best["failures"] == "pruned 2, mismatch 1"
    assert not _row(frame, CROSS, INTERPRETER_DEVICE)["representative"]


def test_json(populated):
    rows = json.loads(report.render_json(report.summarize(report.load_trials(populated))))
    by_device = {(r["problem_key"], r["device_key"]): r for r in rows}
    best = by_device[(SPEC.problem_key(PREFILL), device_key(H200))]
    assert best["time_ms"] == FAST_MS and best["default_time_ms"] == DEFAULT_MS
    assert best["speedup_vs_default"] == pytest.approx(DEFAULT_MS / FAST_MS)
    assert best["representative"] is True
    interpreted = by_device[(SPEC.problem_key(CROSS), device_key(INTERPRETER_DEVICE))]
    assert interpreted["speedup_vs_default"] is None and interpreted["representative"] is False


def test_markdown(populated):
    text = report.render_markdown(report.summarize(report.load_trials(populated)))
    lines = text.splitlines()
    assert lines[0].startswith("| kernel | problem | dtype | device | best config | ms |")
    assert set(lines[1]) <= set("|-: ")
    best = next(line for line in lines if SPEC.problem_key(PREFILL) in line and H200 in line)
    cells = [c.strip() for c in best.strip("|").split("|")]
    assert cells[4] == FAST.label()
    assert cells[5] == f"{FAST_MS:#.4g}"
    assert cells[9] == f"{DEFAULT_MS:#.4g}"
    assert cells[10] == f"{DEFAULT_MS / FAST_MS:.2f}×"
    assert cells[12] == "pruned 2, mismatch 1"
    assert cells[13] == ""
    assert report.NOT_REPRESENTATIVE_NOTE in text
    interpreted = next(line for line in lines if INTERPRETER_DEVICE in line)
    assert report.NOT_REPRESENTATIVE_MARK in interpreted


def test_rich_table(populated):
    console = Console(width=400, record=True, highlight=False)
    console.print(report.render_table(report.summarize(report.load_trials(populated)), title="results"))
    text = console.export_text()
    h200 = text[text.index(f"attention on {H200}"):text.index(f"attention on {INTERPRETER_DEVICE}")]
    lines = h200.splitlines()
    first = next(i for i, line in enumerate(lines) if SPEC.problem_key(PREFILL) in line)
    # Two lines per result: median, TFLOP/s, default time, trials; then spread, TB/s, speedup, failures.
    assert FAST.label() in lines[first]
    assert lines[first].split()[-4:] == [f"{FAST_MS:#.4g}", "160.0", f"{DEFAULT_MS:#.4g}", "6"]
    assert lines[first + 1].split() == [
        f"{FAST_MS * 0.95:#.4g}–{FAST_MS * 1.05:#.4g}", "1.60", f"{DEFAULT_MS / FAST_MS:.2f}×",
        "pruned", "2,", "mismatch", "1",
    ]
    assert report.NOT_REPRESENTATIVE_MARK not in h200
    assert report.NOT_REPRESENTATIVE_NOTE in text


# --- omnitune report -----------------------------------------------------------------------------


@pytest.mark.parametrize("output_format", ["csv", "md", "json", "table"])
def test_report_command_formats(populated, output_format):
    result = CliRunner().invoke(app, ["report", "--db", str(populated), "--format", output_format])
    assert result.exit_code == 0, result.output
    if output_format == "json":
        assert len(json.loads(result.stdout)) == 3
    elif output_format == "csv":
        assert len(pd.read_csv(io.StringIO(result.stdout))) == 3
    elif output_format == "md":
        assert "| attention |" in result.stdout and "pruned 2, mismatch 1" in result.stdout
    else:
        assert f"attention on {H200}" in result.stdout


def test_report_command_reads_omnitune_db(populated, monkeypatch):
    monkeypatch.setenv("OMNITUNE_DB", str(populated))
    result = CliRunner().invoke(app, ["report", "--format", "json", "--kernel", "attention"])
    assert result.exit_code == 0, result.output
    assert {r["kernel"] for r in json.loads(result.stdout)} == {"attention"}


def test_report_command_on_an_empty_database(tmp_path):
    path = results_db(tmp_path / "empty.db", [])
    result = CliRunner().invoke(app, ["report", "--db", str(path)])
    assert result.exit_code == 0
    assert result.stdout.strip().startswith(f"no results in {path}; run omnitune search")


def test_report_command_missing_database(tmp_path):
    path = tmp_path / "missing.db"
    result = CliRunner().invoke(app, ["report", "--db", str(path)])
    assert result.exit_code == 2
    assert len(result.stderr.strip().splitlines()) == 1
    assert "no results database" in result.stderr
    assert not path.exists()


def test_report_command_unknown_kernel_lists_the_ones_present(populated):
    result = CliRunner().invoke(app, ["report", "--db", str(populated), "--kernel", "nope"])
    assert result.exit_code == 2
    assert "no results for kernel 'nope'" in result.stderr and "attention" in result.stderr


def test_report_command_rejects_an_unknown_format(populated):
    result = CliRunner().invoke(app, ["report", "--db", str(populated), "--format", "xml"])
    assert result.exit_code == 2
    assert "xml" in result.output

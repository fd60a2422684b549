"""omnitune.report and `omnitune report`: a database populated here, every format checked against
numbers computed from the rows put in — the roofline fractions from the calibration put in, the
ncu profiles, the finalists' re-timings, and the figures of --plot."""

from __future__ import annotations

import io
import json
import sqlite3
from pathlib import Path

import pandas as pd
import pytest
from rich.console import Console
from typer.testing import CliRunner

from omnitune import report
from omnitune.cli import app
from omnitune.errors import StoreError
from omnitune.store import (
    ProfileKind,
    ProfileRecord,
    open_db,
    record_calibration,
    record_profile,
)
from omnitune.kernels.attention import SPEC, AttentionProblem
from omnitune.profile.device import INTERPRETER_DEVICE, device_key
from omnitune.spec import Config
from trial_rows import H200, results_db, trial_row

PREFILL = AttentionProblem(b=1, h=8, hkv=2, lq=512, lk=512, d=64, causal=True)
CROSS = AttentionProblem(b=2, h=8, hkv=8, lq=128, lk=1024, d=128)
DEFAULT = SPEC.default_config(PREFILL, SPEC.dtypes[0])
FAST = Config(BLOCK_M=128, BLOCK_N=32, num_warps=8, num_stages=2, PACK_GQA=False, USE_TMA=True)
TIED = FAST.replace(USE_TMA=False)
PRUNED = FAST.replace(num_stages=4, BLOCK_N=128)
WRONG = FAST.replace(BLOCK_N=64)


# --- a results database --------------------------------------------------------------------------


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
    # The two pruned configs were never measured: not trials, and not failures either.
    assert (best["trials"], best["ok_trials"], best["pruned"]) == (4, 3, 2)
    assert best["failures"] == "mismatch 1"
    assert best["representative"]

    interpreted = _row(summary, CROSS, INTERPRETER_DEVICE)
    assert interpreted["time_ms"] == 0.75
    assert not interpreted["representative"]
    assert pd.isna(interpreted["default_time_ms"]) and pd.isna(interpreted["speedup_vs_default"])

    failed = _row(summary, CROSS)
    assert pd.isna(failed["best_config"]) and pd.isna(failed["time_ms"])
    assert (failed["trials"], failed["ok_trials"], failed["failures"], failed["pruned"]) == (1, 0, "compile_error 1", 0)


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
    assert (best["trials"], best["failures"], best["pruned"]) == (4, "mismatch 1", 2)
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


def markdown_rows(text: str, first_line: int = 0) -> list[dict[str, str]]:
    """The rows of the Markdown table starting at first_line, as {header: cell}."""
    lines = text.splitlines()[first_line:]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = []
    for line in lines[2:]:
        if not line.startswith("|"):
            break
        rows.append(dict(zip(header, (c.strip() for c in line.strip("|").split("|")))))
    return rows


def test_markdown(populated):
    text = report.render_markdown(report.summarize(report.load_trials(populated)))
    lines = text.splitlines()
    assert lines[0].startswith("| kernel | problem | dtype | device | best config | ms |")
    assert set(lines[1]) <= set("|-: ")
    best = next(r for r in markdown_rows(text) if r["problem"] == SPEC.problem_key(PREFILL) and r["device"] == H200)
    assert best["best config"] == FAST.label()
    assert best["ms"] == f"{FAST_MS:#.4g}"
    assert best["p20–p80 ms"] == f"{FAST_MS * 0.95:#.4g}–{FAST_MS * 1.05:#.4g}"
    assert best["TFLOP/s"] == "160.0" and best["TB/s"] == "1.60"  # no calibration: no fractions
    assert best["bound"] == "—" and best["CV"] == "—"
    assert best["default ms"] == f"{DEFAULT_MS:#.4g}"
    assert best["speedup"] == f"{DEFAULT_MS / FAST_MS:.2f}×"
    assert (best["trials"], best["failures"], best["pruned"]) == ("4", "mismatch 1", "2")
    assert best["note"] == ""
    assert report.NOT_REPRESENTATIVE_NOTE in text
    interpreted = next(line for line in lines if INTERPRETER_DEVICE in line)
    assert report.NOT_REPRESENTATIVE_MARK in interpreted


def test_rich_table(populated):
    console = Console(width=400, record=True, highlight=False)
    console.print(report.render_table(report.summarize(report.load_trials(populated)), title="results"))
    text = console.export_text()
    h200 = text[text.index(f"attention on {H200}, fp16"):text.index(f"attention on {INTERPRETER_DEVICE}, fp32")]
    lines = h200.splitlines()
    # The problem key on a line of its own; below it two lines per result: median, TFLOP/s, bound,
    # default time, trials; then spread, TB/s, speedup, failures and the configs pruned.
    first = lines.index(SPEC.problem_key(PREFILL)) + 1
    assert FAST.label() in lines[first]
    assert lines[first].split()[-5:] == [f"{FAST_MS:#.4g}", "160.0", "—", f"{DEFAULT_MS:#.4g}", "4"]
    assert lines[first + 1].split() == [
        f"{FAST_MS * 0.95:#.4g}–{FAST_MS * 1.05:#.4g}", "1.60", f"{DEFAULT_MS / FAST_MS:.2f}×",
        "mismatch", "1", "·", "2", "pruned",
    ]
    assert report.NOT_REPRESENTATIVE_MARK not in h200
    assert report.NOT_REPRESENTATIVE_NOTE in text


@pytest.mark.parametrize("width", [60, 80, 200])
def test_the_table_prints_every_problem_key_whole_on_one_line(populated, width):
    """Keys are copied back as --shape: a key folded mid-token in a narrow column would not paste."""
    long_key = AttentionProblem(b=16, h=28, hkv=4, lq=131072, lk=131072, d=128, causal=True, spans=3, span_len=9)
    path = results_db(populated.with_name("long.db"), [trial_row(0, long_key, FAST, time_ms=1.0, is_default=True)])
    result = CliRunner().invoke(app, ["report", "--db", str(path)], env={"COLUMNS": str(width)})
    assert result.exit_code == 0, result.output
    assert len(SPEC.problem_key(long_key)) > 60
    assert SPEC.problem_key(long_key) in result.stdout.splitlines()
    assert SPEC.parse_shape(SPEC.problem_key(long_key)) == long_key


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
        assert "| attention |" in result.stdout and "| mismatch 1 | 2 |" in result.stdout
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


# --- the roofline --------------------------------------------------------------------------------

COMPUTE = AttentionProblem(b=4, h=8, hkv=8, lq=1024, lk=1024, d=128)
H100 = "NVIDIA H100"
# A made-up calibration, so that every fraction below follows from these numbers by hand.
COPY_TBPS, FP16_TFLOPS, BF16_TFLOPS = 2.0, 500.0, 1000.0


def calibrate(path: Path, device: str = H200, **values: float) -> None:
    db = open_db(path)
    for metric, value in values.items():
        record_calibration(db, device_key(device), metric, value, {"median_ms": 1.0})
    db.conn.close()


@pytest.fixture
def calibrated(tmp_path) -> Path:
    rows = [
        trial_row(0, PREFILL, DEFAULT, time_ms=DEFAULT_MS, is_default=True, tflops=100.0, tbps=1.0),
        trial_row(1, PREFILL, FAST, time_ms=FAST_MS, tflops=160.0, tbps=1.6),
        trial_row(0, COMPUTE, FAST, time_ms=3.0, tflops=400.0, tbps=0.8),
        trial_row(0, COMPUTE, FAST, time_ms=2.5, tflops=300.0, tbps=0.5, dtype="bf16"),
        trial_row(0, CROSS, FAST, time_ms=0.5, tflops=50.0, tbps=1.0, device=H100),  # not calibrated
        trial_row(0, CROSS, FAST, time_ms=0.75, device=INTERPRETER_DEVICE, dtype="fp32"),
    ]
    path = results_db(tmp_path / "calibrated.db", rows)
    calibrate(path, copy_tbps=COPY_TBPS, matmul_fp16_tflops=FP16_TFLOPS, matmul_bf16_tflops=BF16_TFLOPS)
    return path


def _expected_place(tflops: float, tbps: float, peak_tflops: float) -> tuple[float, float, str]:
    ridge = peak_tflops / COPY_TBPS
    return tflops / peak_tflops, tbps / COPY_TBPS, "memory" if tflops / tbps < ridge else "compute"


def test_each_best_is_placed_on_its_devices_roofline(calibrated):
    summary = report.summarize(report.load_trials(calibrated), report.load_calibrations(calibrated))

    def place(problem, dtype="fp16", device=H200):
        row = summary[(summary["problem_key"] == SPEC.problem_key(problem)) & (summary["dtype"] == dtype)
                      & (summary["device_key"] == device_key(device))].iloc[0]
        return row["tflops_fraction_of_peak"], row["tbps_fraction_of_peak"], row["bound_by"]

    # fp16 kernels are judged against the fp16 matmul rate, bf16 ones against the bf16 rate.
    assert place(PREFILL) == pytest.approx(_expected_place(160.0, 1.6, FP16_TFLOPS))
    assert place(PREFILL)[2] == "memory"
    assert place(COMPUTE) == pytest.approx(_expected_place(400.0, 0.8, FP16_TFLOPS))
    assert place(COMPUTE)[2] == "compute"
    assert place(COMPUTE, "bf16") == pytest.approx(_expected_place(300.0, 0.5, BF16_TFLOPS))
    for problem, device in ((CROSS, H100), (CROSS, INTERPRETER_DEVICE)):
        tflops_fraction, tbps_fraction, bound = place(problem, "fp32" if device == INTERPRETER_DEVICE else "fp16",
                                                      device)
        assert pd.isna(tflops_fraction) and pd.isna(tbps_fraction) and bound is None
    # Only the GPU lacks a calibration: the interpreter has no rates to judge.
    assert report.uncalibrated_devices(summary, report.load_calibrations(calibrated)) == [H100]


def test_the_fractions_are_rendered_beside_the_rates(calibrated):
    summary = report.summarize(report.load_trials(calibrated), report.load_calibrations(calibrated))
    rows = markdown_rows(report.render_markdown(summary))
    prefill = next(r for r in rows if r["problem"] == SPEC.problem_key(PREFILL))
    assert prefill["TFLOP/s"] == f"160.0 ({160.0 / FP16_TFLOPS:.0%})"
    assert prefill["TB/s"] == f"1.60 ({1.6 / COPY_TBPS:.0%})"
    assert prefill["bound"] == "memory"
    csv = pd.read_csv(io.StringIO(report.render_csv(summary)))
    compute = csv[(csv["problem_key"] == SPEC.problem_key(COMPUTE)) & (csv["dtype"] == "fp16")].iloc[0]
    assert compute["tflops_fraction_of_peak"] == pytest.approx(400.0 / FP16_TFLOPS)
    assert compute["bound_by"] == "compute"


def test_report_without_a_calibration_says_so_once_and_succeeds(populated):
    for output_format in ("table", "md"):
        result = CliRunner().invoke(app, ["report", "--db", str(populated), "--format", output_format])
        assert result.exit_code == 0, result.output
        assert result.stdout.count("run omnitune calibrate") == 1
        assert f"no calibration for {H200}" in result.stdout
    # Piped formats keep stdout to the data: the note goes to stderr.
    result = CliRunner().invoke(app, ["report", "--db", str(populated), "--format", "json"])
    assert result.exit_code == 0
    assert len(json.loads(result.stdout)) == 3
    assert result.stderr.count("run omnitune calibrate") == 1


def test_report_with_a_calibration_shows_fractions_and_no_note(calibrated):
    db = open_db(calibrated)
    record_calibration(db, device_key(H100), "copy_tbps", COPY_TBPS)
    record_calibration(db, device_key(H100), "matmul_fp16_tflops", FP16_TFLOPS)
    db.conn.close()
    result = CliRunner().invoke(app, ["report", "--db", str(calibrated), "--format", "md"])
    assert result.exit_code == 0, result.output
    assert "calibrate" not in result.stdout
    assert f"({160.0 / FP16_TFLOPS:.0%})" in result.stdout


# --- ncu profiles --------------------------------------------------------------------------------


def add_profile(path: Path, problem, config, which: ProfileKind, *, l2_hit_pct: float, duration_us: float) -> None:
    db = open_db(path)
    record_profile(db, ProfileRecord(
        kernel="attention", problem_key=SPEC.problem_key(problem), dtype="fp16", device_key=device_key(H200),
        config=config.as_dict(), which=which, duration_us=duration_us, l1_hit_pct=1.5, l2_hit_pct=l2_hit_pct,
        dram_pct_of_peak=40.0, achieved_occupancy_pct=12.5, raw={"launches": 3},
    ))
    db.conn.close()


def test_profiles_are_shown_beside_the_result_and_in_their_own_table(populated):
    add_profile(populated, PREFILL, DEFAULT, ProfileKind.DEFAULT, l2_hit_pct=91.0, duration_us=2000.0)
    add_profile(populated, PREFILL, FAST, ProfileKind.CUSTOM, l2_hit_pct=97.5, duration_us=1250.0)
    profiles = report.load_profiles(populated)
    summary = report.summarize(report.load_trials(populated), {}, profiles)

    # Beside the result: the profile of its best config, not the newest or the default's.
    best = _row(summary, PREFILL)
    assert (best["ncu_config"], best["ncu_which"]) == (FAST.label(), "custom")
    assert (best["ncu_l2_hit_pct"], best["ncu_duration_us"]) == (97.5, 1250.0)
    assert pd.isna(_row(summary, CROSS)["ncu_l2_hit_pct"])
    assert json.loads(report.render_json(summary))[0]["ncu_l2_hit_pct"] == 97.5

    # Their own table, in md and in the terminal: every profile of the keys shown.
    shown = report.profiles_for(summary, profiles)
    text = report.render_markdown(summary, profiles=shown)
    lines = text.splitlines()
    table = markdown_rows(text, lines.index("ncu profiles:") + 2)
    assert [(r["config"], r["which"], r["L2 hit %"], r["µs"]) for r in table] == [
        (DEFAULT.label(), "default", "91.0", "2000.0"), (FAST.label(), "custom", "97.5", "1250.0"),
    ]
    result = CliRunner().invoke(app, ["report", "--db", str(populated)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "ncu profiles" in result.stdout and "97.5" in result.stdout


# --- the finalists' re-timing ----------------------------------------------------------------------


def retimed_row(number, config, median_ms, *, session, cv, retime_of, is_default=False):
    """A re-timing trial as the search driver stores it: the re-timed median as its time."""
    extra = {"finalist": {"session": session, "retime_of": retime_of, "search_time_ms": 1.0, "median_ms": median_ms,
                          "mean_ms": median_ms, "cv": cv, "noisy": cv > 0.02, "rounds": 30}}
    return trial_row(number, PREFILL, config, time_ms=median_ms, is_default=is_default, tflops=160.0, tbps=1.6,
                     extra=extra)


def test_the_best_is_the_fastest_re_timed_median_of_the_latest_re_timing(tmp_path):
    search_rows = [
        trial_row(0, PREFILL, DEFAULT, time_ms=DEFAULT_MS, is_default=True),
        trial_row(1, PREFILL, FAST, time_ms=FAST_MS),   # the search's fastest
        trial_row(2, PREFILL, TIED, time_ms=1.3),
        trial_row(3, PREFILL, PRUNED, status="pruned"),
    ]
    first = [  # TIED wins the re-timing, noisily; the default re-timed beside them
        retimed_row(4, FAST, 1.40, session=1, cv=0.01, retime_of=1),
        retimed_row(5, TIED, 1.32, session=1, cv=0.03, retime_of=2),
        retimed_row(6, DEFAULT, 1.90, session=1, cv=0.005, retime_of=0, is_default=True),
    ]
    path = results_db(tmp_path / "retimed.db", search_rows + first)
    best = _row(report.summarize(report.load_trials(path)), PREFILL)
    # Not FAST at 1.25 (the search's time): the side-by-side medians decide.
    assert (best["best_config"], best["time_ms"]) == (TIED.label(), 1.32)
    assert best["cv"] == pytest.approx(0.03) and best["noisy"] is True
    assert best["default_time_ms"] == 1.90 and best["speedup_vs_default"] == pytest.approx(1.90 / 1.32)
    # Neither the re-timings nor the pruned config count as trials.
    assert (best["trials"], best["ok_trials"], best["failures"], best["pruned"]) == (3, 3, "", 1)
    cells = next(r for r in markdown_rows(report.render_markdown(report.summarize(report.load_trials(path)))))
    assert cells["CV"] == "3.0% noisy" and cells["ms"] == "1.320"
    assert _best_view(path) == (TIED.label(), 1.32, 1.90)  # the database's view agrees

    # A later re-timing (of other finalists) supersedes the first; without the default in it,
    # the default's time is the search's.
    second = [retimed_row(7, FAST, 1.35, session=2, cv=0.004, retime_of=1),
              retimed_row(8, TIED, 1.45, session=2, cv=0.006, retime_of=2)]
    path = results_db(tmp_path / "retimed_twice.db", search_rows + first + second)
    best = _row(report.summarize(report.load_trials(path)), PREFILL)
    assert (best["best_config"], best["time_ms"], best["noisy"]) == (FAST.label(), 1.35, False)
    assert best["default_time_ms"] == DEFAULT_MS
    assert _best_view(path) == (FAST.label(), 1.35, DEFAULT_MS)
    # Without any re-timing, the view is the search's fastest trial.
    assert _best_view(results_db(tmp_path / "searched.db", search_rows)) == (FAST.label(), FAST_MS, DEFAULT_MS)


def _best_view(path: Path) -> tuple:
    """(config label, ms, default ms) of the results database's `best` view for the prefill key."""
    with sqlite3.connect(path) as con:
        return con.execute("SELECT config_label, time_ms, default_time_ms FROM best WHERE problem_key = ?",
                           [SPEC.problem_key(PREFILL)]).fetchone()


def test_the_best_view_and_best_per_key_agree_on_every_key(tmp_path):
    """"Best" has two readers: the database's `best` view (omnitune profile) and best_per_key
    (report, export). Over seeded random catalogues — ties, failures, a failed default, keys
    with nothing ok, zero to two re-timing sessions with or without the default — they pick the
    same trial and the same default time for every key."""
    import random

    rng = random.Random(7)
    configs = [FAST, TIED, WRONG, PRUNED, FAST.replace(num_warps=4), TIED.replace(num_stages=3)]
    rows = []
    for b in range(1, 41):
        problem = AttentionProblem(b=b, h=8, hkv=2, lq=512, lk=512, d=64, causal=True)
        number = 0

        def add(row):
            nonlocal number
            rows.append(row)
            number += 1

        default_status = rng.choice(["ok", "ok", "ok", "mismatch"])
        add(trial_row(number, problem, DEFAULT, status=default_status, is_default=True,
                      time_ms=rng.choice([1.0, 1.5, 2.0]) if default_status == "ok" else None))
        searched = rng.sample(configs, rng.randint(0, len(configs)))
        for config in searched:
            status = rng.choice(["ok", "ok", "ok", "pruned", "compile_error", "mismatch"])
            add(trial_row(number, problem, config, status=status,
                          time_ms=rng.choice([0.5, 1.0, 1.25, 1.5]) if status == "ok" else None))
        ok = [r for r in rows if r["problem_key"] == SPEC.problem_key(problem) and r["status"] == "ok"]
        for session in range(1, rng.randint(0, 2) + 1 if ok else 1):
            retimed = rng.sample(ok, rng.randint(1, len(ok)))
            # The configs the session re-timed: those stored, more (a session cut short while
            # storing), or not recorded (rows stored before the count was).
            session_size = rng.choice([len(retimed), len(retimed) + 1, None])
            for row in retimed:
                median = rng.choice([0.9, 1.1, 1.2])
                extra = {"finalist": {"session": session, "retime_of": row["trial_number"], "search_time_ms": 1.0,
                                      "median_ms": median, "mean_ms": median, "cv": 0.01, "noisy": False, "rounds": 30}}
                if session_size is not None:
                    extra["finalist"]["configs"] = session_size
                add(trial_row(number, problem, Config(json.loads(row["config_json"])), time_ms=median,
                              is_default=row["is_default"], extra=extra))
    path = results_db(tmp_path / "random.db", rows)
    with sqlite3.connect(path) as con:
        view = {key: (number, time_ms, default_ms) for key, number, time_ms, default_ms in con.execute(
            "SELECT problem_key, trial_number, time_ms, default_time_ms FROM best")}
    best = report.best_per_key(report.load_trials(path))
    frame = {r["problem_key"]: (int(r["trial_number"]), r["time_ms"],
                                None if pd.isna(r["default_time_ms"]) else r["default_time_ms"])
             for r in best.to_dict("records") if r["status"] == "ok"}
    assert len(frame) > 30 and any(r["extra_json"] != "{}" for r in rows)  # the catalogue exercises both paths
    assert view == frame


# --- figures -------------------------------------------------------------------------------------


def _png_written(path: Path) -> bool:
    return path.is_file() and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 8_000


def test_plot_writes_the_figures_of_each_kernel_and_prints_their_paths(calibrated, tmp_path):
    out = tmp_path / "figures"
    result = CliRunner().invoke(app, ["report", "--db", str(calibrated), "--plot", str(out)])
    assert result.exit_code == 0, result.output
    written = sorted(out.iterdir())
    # The calibrated H200 gets a roofline; the uncalibrated H100 and the interpreter do not.
    assert [p.name for p in written] == [
        "attention_convergence.png", "attention_importance.png", "attention_roofline.png",
    ]
    assert all(_png_written(p) for p in written)
    for path in written:
        assert f"wrote {path}" in result.stdout
    assert f"roofline figure skipped: no calibration for {H100}" in result.stdout


def test_plot_without_a_calibration_skips_the_roofline_with_one_line(populated, tmp_path):
    out = tmp_path / "figures"
    result = CliRunner().invoke(app, ["report", "--db", str(populated), "--plot", str(out), "--format", "csv"])
    assert result.exit_code == 0, result.output
    assert len(pd.read_csv(io.StringIO(result.stdout))) == 3  # stdout stays CSV
    assert sorted(p.name for p in out.iterdir()) == ["attention_convergence.png", "attention_importance.png"]
    skipped = [line for line in result.stderr.splitlines() if "roofline figure skipped" in line]
    assert len(skipped) == 1 and "omnitune calibrate" in skipped[0]


def test_plot_into_a_folder_that_cannot_be_made_is_one_line(populated, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    result = CliRunner().invoke(app, ["report", "--db", str(populated), "--format", "csv",
                                      "--plot", str(blocker / "figures")])
    assert result.exit_code == 2
    # Refused before anything is printed: not a report and then an error.
    assert result.stdout == "" and result.stderr.strip().splitlines() == [
        f"error: cannot write --plot {blocker / 'figures'}: {blocker} is a file, not a folder"]

"""Nsight Compute: parsing its raw CSV (a recorded sample), the missing-ncu and no-counters paths
through a stand-in ncu executable, the profile command's config choice and error exits."""

from __future__ import annotations

import json
import os
import stat
import statistics
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from omnitune.cli import app
from omnitune.errors import ConfigError
from omnitune.profile import ncu
from omnitune.profile.ncu import NcuError, parse_raw_csv, profile_with_ncu, summarize

RECORDED = Path(__file__).parent / "data" / "ncu_raw.csv"
# The recorded sample's three launches of _attention_fwd, column by column.
DURATIONS_US = (3184.29, 3179.65, 3190.11)
L1_HIT = (1.73, 1.71, 1.74)
L2_HIT = (93.41, 93.52, 93.38)
DRAM = (6.91, 6.84, 6.80)
OCCUPANCY = (12.43, 12.44, 12.41)

HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size",'
          '"Grid Size","Device","CC","gpu__time_duration.sum","lts__t_sector_hit_rate.pct"')
IDS = '"python3","h","{name}","1","7","(128, 1, 1)","(8, 4, 1)","0","9.0"'


def _row(launch: int, name: str, duration: str, l2: str) -> str:
    return f'"{launch}","1",' + IDS.format(name=name) + f',"{duration}","{l2}"'


def test_parse_the_recorded_csv():
    launches = parse_raw_csv(RECORDED.read_text())
    assert [launch.launch_id for launch in launches] == ["0", "1", "2"]
    assert {launch.kernel_name for launch in launches} == {"_attention_fwd"}
    assert [launch.values["gpu__time_duration.sum"] for launch in launches] == pytest.approx(DURATIONS_US)
    assert [launch.values["lts__t_sector_hit_rate.pct"] for launch in launches] == pytest.approx(L2_HIT)


def test_summary_averages_the_matching_launches():
    profile = summarize(parse_raw_csv(RECORDED.read_text()), "_attention_fwd")
    assert profile.kernel_name == "_attention_fwd"
    assert profile.launches == 3
    assert profile.duration_us == pytest.approx(statistics.fmean(DURATIONS_US))
    assert profile.l1_hit_pct == pytest.approx(statistics.fmean(L1_HIT))
    assert profile.l2_hit_pct == pytest.approx(statistics.fmean(L2_HIT))
    assert profile.dram_pct_of_peak == pytest.approx(statistics.fmean(DRAM))
    assert profile.achieved_occupancy_pct == pytest.approx(statistics.fmean(OCCUPANCY))
    raw = profile.raw()
    assert json.loads(json.dumps(raw)) == raw
    assert raw["per_kernel"]["_attention_fwd"]["gpu__time_duration.sum"] == pytest.approx(profile.duration_us)


def test_time_units_are_converted_to_microseconds():
    text = "\n".join([
        HEADER,
        '"","","","","","","","","","","","msecond","%"',
        _row(0, "k", "1.5", "50"),
    ])
    assert parse_raw_csv(text)[0].values["gpu__time_duration.sum"] == pytest.approx(1500.0)
    text_ns = text.replace('"msecond"', '"nsecond"').replace('"1.5"', '"2,500"')
    assert parse_raw_csv(text_ns)[0].values["gpu__time_duration.sum"] == pytest.approx(2.5)


def test_only_matching_kernels_count_and_na_is_absent():
    text = "\n".join([
        HEADER,
        '"","","","","","","","","","","","usecond","%"',
        _row(0, "_attention_fwd", "10", "90"),
        _row(1, "elementwise_kernel", "1,000", "5"),
        _row(2, "_attention_fwd", "30", "n/a"),
        "program output that is not CSV",
    ])
    profile = summarize(parse_raw_csv(text), "_attention_fwd")
    assert profile.launches == 2
    assert profile.duration_us == pytest.approx(20.0)
    assert profile.l2_hit_pct == pytest.approx(90.0)  # the n/a reading is no evidence, not a zero
    assert profile.l1_hit_pct is None  # not measured at all
    assert summarize(parse_raw_csv(text), "no_such_kernel") is None


def test_output_without_a_table_has_no_launches():
    assert parse_raw_csv("==PROF== Disconnected from process 1\n") == []
    assert parse_raw_csv("") == []


# --- running ncu: a stand-in executable that answers as ncu would ------------------------------

def _fake_ncu(tmp_path: Path, stdout: str = "", stderr: str = "", code: int = 0) -> Path:
    """A script named ncu that records its arguments and prints the given output."""
    (tmp_path / "stdout.txt").write_text(stdout)
    (tmp_path / "stderr.txt").write_text(stderr)
    script = tmp_path / "ncu"
    script.write_text(
        "#!/bin/sh\n"
        f'printf "%s\\n" "$@" > "{tmp_path}/args.txt"\n'
        f'cat "{tmp_path}/stdout.txt"\n'
        f'cat "{tmp_path}/stderr.txt" >&2\n'
        f"exit {code}\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


@pytest.fixture
def no_ncu_anywhere(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(ncu, "_NCU_LOCATIONS", ())


def test_missing_ncu(no_ncu_anywhere):
    assert ncu.ncu_available() is False
    with pytest.raises(NcuError, match="not installed"):
        profile_with_ncu(["python", "-c", "pass"], "k")


def test_ncu_on_path_is_found(monkeypatch, tmp_path):
    script = _fake_ncu(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert ncu.find_ncu() == str(script)


def test_a_profile_through_ncu(tmp_path):
    script = _fake_ncu(tmp_path, stdout=RECORDED.read_text())
    profile = profile_with_ncu(["python3", "-m", "target", "x"], "_attention_fwd", ncu=str(script))
    assert profile.launches == 3
    assert profile.duration_us == pytest.approx(statistics.fmean(DURATIONS_US))
    args = (tmp_path / "args.txt").read_text().splitlines()
    assert args[:6] == ["--clock-control", "none", "--csv", "--page", "raw", "--metrics"]
    assert set(args[6].split(",")) == set(ncu.METRICS)
    assert args[args.index("-k") + 1] == "regex:_attention_fwd"
    assert args[-4:] == ["python3", "-m", "target", "x"]


@pytest.mark.parametrize("stderr, reason", [
    ("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance "
     "Counters on the target device 0.", "ERR_NVGPUCTRPERM"),
    ("==ERROR== Failed to prepare kernel for profiling: LibraryNotLoaded", "LibraryNotLoaded"),
])
def test_counters_not_readable(tmp_path, stderr, reason):
    script = _fake_ncu(tmp_path, stdout="==PROF== Connected to process 7\n", stderr=stderr, code=1)
    with pytest.raises(NcuError, match=reason) as info:
        profile_with_ncu(["python3", "t.py"], "k", ncu=str(script))
    assert "\n" not in str(info.value)


def test_no_rows(tmp_path):
    script = _fake_ncu(tmp_path, stdout="==PROF== Connected to process 7\n",
                       stderr="==WARNING== No kernels were profiled.")
    with pytest.raises(NcuError, match="profiled no launch .*No kernels were profiled"):
        profile_with_ncu(["python3", "t.py"], "_attention_fwd", ncu=str(script))


# --- the profile command -----------------------------------------------------------------------

SHAPE = "b=1,h=2,hkv=2,lq=16,lk=16,d=64"
no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the path without a GPU")


@no_gpu
def test_profile_command_without_gpu(tmp_db):
    result = CliRunner().invoke(app, ["profile", "attention", "--shape", SHAPE, "--dtype", "fp16"])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == ["error: no CUDA GPU here; profiling needs one"]


def test_profile_command_without_ncu(tmp_db, monkeypatch, no_ncu_anywhere):
    from omnitune.cli import profile_cmd

    monkeypatch.setattr(profile_cmd, "_require_gpu", lambda what: None)
    result = CliRunner().invoke(app, ["profile", "attention", "--shape", SHAPE, "--dtype", "fp16"])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "ncu" in lines[0] and lines[0].startswith("error:")


def test_profile_command_rejects_a_bad_dtype_before_anything_runs(tmp_db):
    result = CliRunner().invoke(app, ["profile", "attention", "--shape", SHAPE, "--dtype", "int3"])
    assert result.exit_code == 2
    assert "fp32" in result.output  # lists the valid dtypes


@pytest.fixture
def attention_case(tmp_path, monkeypatch):
    from omnitune.registry import get_spec
    from omnitune.runtime import clear_cache

    monkeypatch.setenv("OMNITUNE_CONFIG_DIR", str(tmp_path / "no_tables"))
    clear_cache()
    spec = get_spec("attention")
    yield spec, spec.parse_shape(SHAPE), torch.float16
    clear_cache()


def _store_trial(database, spec, problem, config, time_ms: float, number: int, device: str,
                 extra: dict | None = None) -> None:
    from omnitune.store import TrialRecord, record_trial

    record_trial(database, TrialRecord(
        study=f"attention|{spec.problem_key(problem)}|fp16|{device}", trial_number=number, kernel="attention",
        problem_key=spec.problem_key(problem), problem_json="{}", dtype="fp16", device_key=device,
        device_name="Test GPU", sampler="tpe", config_json=json.dumps(config.as_dict(), sort_keys=True),
        config_label=config.label(), status="ok", time_ms=time_ms, p20_ms=time_ms, p80_ms=time_ms,
        rel_error=1e-4, tflops=1.0, tbps=1.0, detail="", representative=True, is_default=number == 0,
        extra_json=json.dumps(extra or {}), source_hash="x", torch_version="t", triton_version="3.6.0", omnitune_version="0.1.0",
        measured_at="2026-11-29T00:00:00Z",
    ))


def test_config_choice_default_and_custom(attention_case, tmp_db):
    from omnitune.cli.profile_cmd import resolve_config
    from omnitune.store import open_db

    spec, problem, dtype = attention_case
    database = open_db(tmp_db)
    default, which = resolve_config(spec, problem, dtype, "default", database, "Test GPU")
    assert (default, which) == (spec.default_config(problem, dtype), "default")
    custom, which = resolve_config(spec, problem, dtype, '{"num_warps": 8}', database, "Test GPU")
    assert which == "custom"
    assert custom == default.replace(num_warps=8)


def test_tuned_config_comes_from_the_database_best(attention_case, tmp_db):
    from omnitune.cli.profile_cmd import resolve_config
    from omnitune.store import open_db

    spec, problem, dtype = attention_case
    database = open_db(tmp_db)
    with pytest.raises(ConfigError, match="omnitune search"):
        resolve_config(spec, problem, dtype, "tuned", database, "Test GPU")
    default = spec.default_config(problem, dtype)
    faster = default.replace(num_warps=8 if default["num_warps"] != 8 else 4)
    _store_trial(database, spec, problem, default, 2.0, 0, "Test_GPU")
    _store_trial(database, spec, problem, faster, 1.0, 1, "Test_GPU")
    _store_trial(database, spec, problem, default.replace(num_stages=1), 0.5, 2, "Other_GPU")
    tuned, which = resolve_config(spec, problem, dtype, "tuned", database, "Test GPU")
    assert (tuned, which) == (faster, "tuned")
    # Re-timed side by side, the default won: the database's best is then the re-timing's, as in
    # omnitune report and export.
    for number, (config, median, of) in enumerate(((default, 1.1, 0), (faster, 1.3, 1)), start=3):
        _store_trial(database, spec, problem, config, median, number, "Test_GPU", extra={"finalist": {
            "session": 1, "retime_of": of, "search_time_ms": 1.0, "median_ms": median, "mean_ms": median,
            "cv": 0.01, "noisy": False, "rounds": 30}})
    tuned, _ = resolve_config(spec, problem, dtype, "tuned", database, "Test GPU")
    assert tuned == default


def test_ncu_target_reports_a_user_error_in_one_line(capsys):
    from omnitune.profile.ncu_target import main

    code = main(["attention", SHAPE, "fp16", "{not json"])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:")


@pytest.mark.gpu
def test_ncu_target_launches_on_the_gpu():
    from omnitune.profile.ncu_target import main

    assert main(["attention", SHAPE, "fp16", "{}", "--launches", "2"]) == 0


@pytest.mark.gpu
@pytest.mark.skipif(not ncu.ncu_available(), reason="Nsight Compute is not installed here")
def test_profile_a_real_kernel(tmp_path):
    import re
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    command = [sys.executable, "-m", "omnitune.profile.ncu_target", "attention", SHAPE, "fp16", "{}"]
    try:
        profile = profile_with_ncu(command, re.escape("_attention_fwd"), env=env)
    except NcuError as exc:
        if "ERR_NVGPUCTRPERM" in str(exc):
            pytest.skip(str(exc))
        raise
    assert profile.launches == 3
    assert profile.duration_us > 0

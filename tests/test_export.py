"""omnitune.export and `omnitune export`: the file format, atomic writes, merging, and the round
trip into omnitune.runtime."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import omnitune.runtime as runtime
from omnitune import export
from omnitune.cli import app
from omnitune.errors import StoreError
from omnitune.kernels.attention import SPEC, AttentionProblem
from omnitune.profile.device import INTERPRETER_DEVICE, DeviceFacts, device_key
from omnitune.spec import Config
from trial_rows import H200, results_db, trial_row

PREFILL = AttentionProblem(b=1, h=8, hkv=2, lq=512, lk=512, d=64, causal=True)
CROSS = AttentionProblem(b=2, h=8, hkv=8, lq=128, lk=1024, d=128)
UNTOUCHED = AttentionProblem(b=1, h=8, hkv=2, lq=8192, lk=8192, d=64, causal=True)
DEFAULT = SPEC.default_config(PREFILL, torch.float16)
FAST = Config(BACKEND="triton", BLOCK_M=128, BLOCK_N=32, num_warps=8, num_stages=2, PACK_GQA=False, USE_TMA=True)
SLOWER = FAST.replace(num_stages=3)
WRONG = FAST.replace(BLOCK_N=64)
DEFAULT_MS, FAST_MS, CROSS_MS = 2.0, 1.25, 0.5
H200_FACTS = DeviceFacts(
    name=H200, compute_capability="9.0", multiprocessors=132, memory_gib=139.8, l2_cache_mib=60.0,
    shared_memory_per_block_kib=227.0, driver="575.51", cuda="12.8", torch="2.11.0", triton="3.6.0",
    omnitune="0.1.0", python="3.12.3",
)


@pytest.fixture
def populated(tmp_path) -> Path:
    rows = [
        trial_row(0, PREFILL, DEFAULT, time_ms=DEFAULT_MS, is_default=True),
        trial_row(1, PREFILL, FAST, time_ms=FAST_MS, tflops=150.0, tbps=1.5, rel_error=2e-4,
                  measured_at="2026-11-29T13:00:00+00:00", source_hash="fedcba9876543210"),
        trial_row(2, PREFILL, SLOWER, time_ms=FAST_MS * 1.5),
        trial_row(3, PREFILL, WRONG, status="mismatch", time_ms=FAST_MS / 2),  # faster, but wrong
        trial_row(4, PREFILL, FAST.replace(BLOCK_N=128, num_stages=4), status="pruned"),
        trial_row(0, CROSS, FAST, status="compile_error"),  # nothing ok: nothing to export
        trial_row(0, CROSS, SLOWER, time_ms=CROSS_MS, dtype="fp32", device=INTERPRETER_DEVICE),
    ]
    return results_db(tmp_path / "results.db", rows, [H200_FACTS])


def _key(problem, dtype="fp16"):
    return f"{dtype}|{SPEC.problem_key(problem)}"


def _h200_file(out: Path) -> Path:
    return out / "attention" / f"{device_key(H200)}.json"


# --- the files -----------------------------------------------------------------------------------


def test_one_file_per_kernel_and_device_with_the_schema(populated, tmp_path):
    out = tmp_path / "tuned"
    written = export.export_tables(populated, out, exported_at="2026-11-30T00:00:00+00:00")
    assert sorted(f.path for f in written) == sorted([
        out / "attention" / "NVIDIA_H200.json", out / "attention" / f"{device_key(INTERPRETER_DEVICE)}.json",
    ])

    doc = json.loads(_h200_file(out).read_text())
    assert doc["schema_version"] == 1 and doc["kernel"] == "attention"
    assert doc["device"] == {"name": H200, "key": "NVIDIA_H200", "compute_capability": "9.0", "driver": "575.51"}
    assert doc["software"] == {"torch": "2.11.0", "triton": "3.6.0", "omnitune": "0.1.0"}
    assert doc["kernel_source_hash"] == "fedcba9876543210"  # the newest measurement's
    assert doc["exported_at"] == "2026-11-30T00:00:00+00:00"
    assert doc["representative"] is True
    assert list(doc["entries"]) == [_key(PREFILL)]  # CROSS on the H200 never ran ok
    entry = doc["entries"][_key(PREFILL)]
    assert entry["problem"] == dataclasses.asdict(PREFILL)
    assert entry["dtype"] == "fp16"
    assert entry["config"] == FAST.as_dict()  # not the faster mismatch
    assert entry["time_ms"] == FAST_MS
    assert (entry["p20_ms"], entry["p80_ms"]) == pytest.approx((FAST_MS * 0.95, FAST_MS * 1.05))
    assert (entry["tflops"], entry["tbps"], entry["rel_error"]) == (150.0, 1.5, 2e-4)
    assert entry["default_config"] == DEFAULT.as_dict()
    assert entry["default_time_ms"] == DEFAULT_MS
    assert entry["speedup_vs_default"] == pytest.approx(DEFAULT_MS / FAST_MS)
    assert entry["trials"] == 4  # the configs measured: the pruned one was not
    assert entry["measured_at"] == "2026-11-29T13:00:00+00:00"

    interpreted = json.loads((out / "attention" / f"{device_key(INTERPRETER_DEVICE)}.json").read_text())
    assert interpreted["representative"] is False
    assert interpreted["device"]["name"] == INTERPRETER_DEVICE
    assert interpreted["device"]["compute_capability"] is None  # no devices row for it
    only = interpreted["entries"][_key(CROSS, "fp32")]
    assert only["default_config"] is None and only["default_time_ms"] is None and only["speedup_vs_default"] is None


def test_files_are_canonical_sorted_json(populated, tmp_path):
    export.export_tables(populated, tmp_path)
    text = _h200_file(tmp_path).read_text()
    assert text == json.dumps(json.loads(text), sort_keys=True, indent=2) + "\n"


def test_kernel_filter(populated, tmp_path):
    assert export.export_tables(populated, tmp_path, "kv_cache_write") == []
    assert not (tmp_path / "attention").exists()


# --- merging -------------------------------------------------------------------------------------


def test_merge_keeps_other_keys_and_replaces_the_same_key(populated, tmp_path):
    # An earlier session (another database) exported UNTOUCHED and its own PREFILL result.
    earlier = results_db(tmp_path / "earlier.db", [
        trial_row(0, UNTOUCHED, SLOWER, time_ms=9.0), trial_row(0, PREFILL, SLOWER, time_ms=3.0),
    ])
    export.export_tables(earlier, tmp_path)
    path = _h200_file(tmp_path)
    kept_entry = json.loads(path.read_text())["entries"][_key(UNTOUCHED)]

    written = export.export_tables(populated, tmp_path)

    h200 = next(f for f in written if f.path == path)
    assert (h200.entries, h200.from_db, h200.kept, h200.changed) == (2, 1, 1, True)
    entries = json.loads(path.read_text())["entries"]
    assert entries[_key(UNTOUCHED)] == kept_entry
    assert entries[_key(PREFILL)]["config"] == FAST.as_dict()


def test_an_unchanged_export_leaves_the_file_alone(populated, tmp_path):
    export.export_tables(populated, tmp_path, exported_at="2026-11-30T00:00:00+00:00")
    before = _h200_file(tmp_path).read_text()
    written = export.export_tables(populated, tmp_path, exported_at="2026-12-25T00:00:00+00:00")
    assert not any(f.changed for f in written)
    assert _h200_file(tmp_path).read_text() == before


def test_a_corrupt_existing_file_is_not_overwritten(populated, tmp_path):
    path = _h200_file(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text('{"schema_version": 1, "entries": {')
    with pytest.raises(StoreError, match="cannot merge into .*move it aside"):
        export.export_tables(populated, tmp_path)
    assert path.read_text() == '{"schema_version": 1, "entries": {'


# --- atomic writes -------------------------------------------------------------------------------


def test_the_target_is_replaced_whole(tmp_path, monkeypatch):
    path = _h200_file(tmp_path)
    export.write_json_atomic(path, {"schema_version": 1, "kernel": "attention", "entries": {}})
    old = path.read_text()
    new = {"schema_version": 1, "kernel": "attention", "entries": {"x": {"time_ms": 1.5}}}
    seen_while_writing = []
    real_fsync = os.fsync

    def fsync(fd):  # the new text is complete in the temporary file; the target is still the old one
        seen_while_writing.append(path.read_text())
        real_fsync(fd)

    monkeypatch.setattr(export.os, "fsync", fsync)
    export.write_json_atomic(path, new)
    assert seen_while_writing == [old]
    assert path.read_text() == export.document_text(new)
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]


def test_a_failed_write_leaves_the_old_file_and_no_debris(populated, tmp_path, monkeypatch):
    path = _h200_file(tmp_path)
    export.write_json_atomic(path, {"schema_version": 1, "kernel": "attention", "entries": {}})
    old = path.read_text()

    def crash(src, dst):
        raise OSError("disk on fire")

    monkeypatch.setattr(export.os, "replace", crash)
    with pytest.raises(OSError, match="disk on fire"):
        export.export_tables(populated, tmp_path)
    assert path.read_text() == old
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]


# --- into the runtime ----------------------------------------------------------------------------


def test_exported_tables_serve_the_runtime(populated, tmp_path, monkeypatch):
    export.export_tables(populated, tmp_path)
    monkeypatch.setenv("OMNITUNE_CONFIG_DIR", str(tmp_path))
    runtime.clear_cache()
    try:
        answer = runtime.lookup("attention", PREFILL, torch.float16, H200)
        assert (answer.rung, answer.config, answer.source) == (runtime.Rung.EXACT, FAST, _h200_file(tmp_path))
        near = runtime.lookup("attention", dataclasses.replace(PREFILL, lq=1024, lk=1024), torch.float16, H200)
        assert (near.rung, near.config) == (runtime.Rung.NEAREST, FAST)
    finally:
        runtime.clear_cache()


# --- omnitune export -----------------------------------------------------------------------------


def test_export_command_reports_what_it_wrote(populated, tmp_path):
    out = tmp_path / "tuned"
    result = CliRunner().invoke(app, ["export", "--db", str(populated), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert f"wrote {_h200_file(out)}: 1 entries (1 from the database)" in result.stdout
    assert "interpreter results" in result.stderr
    again = CliRunner().invoke(app, ["export", "--db", str(populated), "--out", str(out)])
    assert f"unchanged {_h200_file(out)}" in again.stdout


def test_export_command_missing_database(tmp_path):
    path = tmp_path / "missing.db"
    result = CliRunner().invoke(app, ["export", "--db", str(path), "--out", str(tmp_path / "out")])
    assert result.exit_code == 2
    assert len(result.stderr.strip().splitlines()) == 1 and "no results database" in result.stderr
    assert not path.exists() and not (tmp_path / "out").exists()


def test_export_command_empty_database(tmp_path):
    path = results_db(tmp_path / "empty.db", [])
    result = CliRunner().invoke(app, ["export", "--db", str(path), "--out", str(tmp_path / "out")])
    assert result.exit_code == 0
    assert result.stdout.startswith(f"no results in {path}")
    assert not (tmp_path / "out").exists()


def test_export_command_corrupt_target_is_a_one_line_error(populated, tmp_path):
    path = _h200_file(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text("{")
    result = CliRunner().invoke(app, ["export", "--db", str(populated), "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert len(result.stderr.strip().splitlines()) == 1 and "cannot merge into" in result.stderr



def test_export_command_with_no_ok_trial(tmp_path):
    path = results_db(tmp_path / "failed.db", [trial_row(0, PREFILL, WRONG, status="mismatch")])
    result = CliRunner().invoke(app, ["export", "--db", str(path), "--out", str(tmp_path / "out")])
    assert result.exit_code == 0
    assert result.stdout.startswith(f"nothing to export from {path}")
    assert not (tmp_path / "out").exists()


def test_export_command_unknown_kernel_lists_the_ones_present(populated, tmp_path):
    result = CliRunner().invoke(app, ["export", "--db", str(populated), "--out", str(tmp_path), "--kernel", "nope"])
    assert result.exit_code == 2
    assert "no results for kernel 'nope'" in result.stderr and "attention" in result.stderr

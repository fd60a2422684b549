"""omnitune.export and `omnitune export`: the file format, atomic writes, merging, and the round
trip into omnitune.runtime."""

from __future__ import annotations

import dataclasses
import json
import os
import re
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
    # kept as it was, save that the earlier session's source (not the file's now) goes with it
    assert entries[_key(UNTOUCHED)] == {**kept_entry, "kernel_source_hash": "0123456789abcdef"}
    assert entries[_key(PREFILL)]["config"] == FAST.as_dict()


def test_a_file_holding_another_devices_table_is_not_merged_into(populated, tmp_path):
    """A table renamed or copied to this device's file name: its entries, tuned on the other
    GPU, were kept and served as this one's."""
    export.export_tables(populated, tmp_path)
    path = _h200_file(tmp_path)
    other = json.loads(path.read_text())
    other["device"]["key"] = "NVIDIA_H100_80GB_HBM3"
    path.write_text(json.dumps(other))
    before = path.read_text()
    with pytest.raises(StoreError, match="it is the table of device 'NVIDIA_H100_80GB_HBM3', not of NVIDIA_H200"):
        export.export_tables(populated, tmp_path)
    assert path.read_text() == before


def test_a_table_reached_through_a_symlink_is_written_where_the_link_points(populated, tmp_path):
    shared = tmp_path / "shared" / "attention_h200.json"
    export.export_tables(populated, tmp_path / "shared_out")
    shared.parent.mkdir()
    first = _h200_file(tmp_path / "shared_out")
    doc = json.loads(first.read_text())
    doc["entries"] = {}
    shared.write_text(json.dumps(doc))
    link = _h200_file(tmp_path / "out")
    link.parent.mkdir(parents=True)
    link.symlink_to(shared)
    export.export_tables(populated, tmp_path / "out")
    assert link.is_symlink() and json.loads(shared.read_text())["entries"] == json.loads(first.read_text())["entries"]


OLDER, NEWER = "0123456789abcdef", "fedcba9876543210"  # the earlier session's source, populated's winner's


def test_merging_into_a_table_of_other_kernel_source_keeps_its_entries_with_their_hash(populated, tmp_path):
    """The file takes the newest measurement's hash; what it kept from a file tuned on other source
    says so per entry, rather than passing for measured on today's."""
    earlier = results_db(tmp_path / "earlier.db", [trial_row(0, UNTOUCHED, SLOWER, time_ms=9.0, source_hash=OLDER)])
    export.export_tables(earlier, tmp_path)
    path = _h200_file(tmp_path)
    assert "kernel_source_hash" not in json.loads(path.read_text())["entries"][_key(UNTOUCHED)]  # the file's

    (h200,) = [f for f in export.export_tables(populated, tmp_path) if f.path == path]
    doc = json.loads(path.read_text())
    assert doc["kernel_source_hash"] == NEWER
    assert doc["entries"][_key(UNTOUCHED)]["kernel_source_hash"] == OLDER
    assert "kernel_source_hash" not in doc["entries"][_key(PREFILL)]
    assert (h200.kept, h200.kept_on_other_source, h200.from_db_on_other_source) == (1, 1, 0)
    assert (h200.source_hash, h200.other_source_hashes) == (NEWER, (OLDER,))

    # A third source: each kept entry keeps the source it was good for, its own or the file's.
    third = results_db(tmp_path / "third.db", [trial_row(0, CROSS, FAST, time_ms=1.0, source_hash="aaaaaaaaaaaaaaaa")])
    (h200,) = [f for f in export.export_tables(third, tmp_path) if f.path == path]
    entries = json.loads(path.read_text())["entries"]
    assert entries[_key(UNTOUCHED)]["kernel_source_hash"] == OLDER
    assert entries[_key(PREFILL)]["kernel_source_hash"] == NEWER
    assert "kernel_source_hash" not in entries[_key(CROSS)]
    assert (h200.kept_on_other_source, h200.other_source_hashes) == (2, (OLDER, NEWER))

    # Back on the older source: the entries measured on it go by the file's hash again.
    export.export_tables(earlier, tmp_path)
    doc = json.loads(path.read_text())
    assert doc["kernel_source_hash"] == OLDER and "kernel_source_hash" not in doc["entries"][_key(UNTOUCHED)]


def test_merging_into_a_table_of_the_same_kernel_source_is_as_before(tmp_path):
    earlier = results_db(tmp_path / "earlier.db", [trial_row(0, UNTOUCHED, SLOWER, time_ms=9.0)])
    export.export_tables(earlier, tmp_path)
    path = _h200_file(tmp_path)
    before = json.loads(path.read_text())["entries"][_key(UNTOUCHED)]
    (h200,) = export.export_tables(_one_entry_db(tmp_path, "later", PREFILL), tmp_path)
    doc = json.loads(path.read_text())
    assert doc["kernel_source_hash"] == OLDER and doc["entries"][_key(UNTOUCHED)] == before
    assert not any("kernel_source_hash" in e for e in doc["entries"].values())
    assert (h200.kept, h200.kept_on_other_source, h200.other_source_hashes) == (1, 0, ())


def test_an_older_whole_module_hash_of_todays_source_marks_no_kept_entry(tmp_path):
    import sys

    from omnitune.source_hash import module_source_hash

    today = SPEC.source_hash()
    export.export_tables(results_db(tmp_path / "earlier.db", [trial_row(0, UNTOUCHED, SLOWER, time_ms=9.0,
                                                                        source_hash=today)]), tmp_path)
    path = _h200_file(tmp_path)
    doc = json.loads(path.read_text())
    doc["kernel_source_hash"] = module_source_hash(sys.modules[SPEC.module])  # as exports before the jit hash wrote
    export.write_json_atomic(path, doc)
    export.export_tables(results_db(tmp_path / "later.db", [trial_row(0, PREFILL, FAST, time_ms=1.0,
                                                                      source_hash=today)]), tmp_path)
    doc = json.loads(path.read_text())
    assert doc["kernel_source_hash"] == today
    assert not any("kernel_source_hash" in e for e in doc["entries"].values())


def test_a_kept_entry_a_partial_fix_revalidated_for_the_new_source_is_not_marked(tmp_path):
    export.export_tables(results_db(tmp_path / "earlier.db", [
        trial_row(0, UNTOUCHED, SLOWER, time_ms=9.0), trial_row(0, CROSS, SLOWER, time_ms=9.0)]), tmp_path)
    path = _h200_file(tmp_path)
    doc = json.loads(path.read_text())
    doc["entries"][_key(UNTOUCHED)]["revalidated"] = {"at": "2026-12-01T00:00:00+00:00", "from_source_hash": OLDER,
                                                      "to_source_hash": NEWER, "measured": {}}
    export.write_json_atomic(path, doc)  # the file kept its hash: CROSS was not revalidated
    export.export_tables(results_db(tmp_path / "later.db", [trial_row(0, PREFILL, FAST, time_ms=1.0,
                                                                      source_hash=NEWER)]), tmp_path)
    entries = json.loads(path.read_text())["entries"]
    assert "kernel_source_hash" not in entries[_key(UNTOUCHED)]
    assert entries[_key(CROSS)]["kernel_source_hash"] == OLDER


def test_a_best_trial_measured_on_older_source_than_the_newest_says_so(tmp_path):
    db = results_db(tmp_path / "results.db", [
        trial_row(0, UNTOUCHED, SLOWER, time_ms=9.0, source_hash=OLDER, measured_at="2026-11-01T00:00:00+00:00"),
        trial_row(0, PREFILL, FAST, time_ms=1.0, source_hash=NEWER, measured_at="2026-11-29T00:00:00+00:00"),
    ])
    (h200,) = export.export_tables(db, tmp_path)
    doc = json.loads(_h200_file(tmp_path).read_text())
    assert doc["kernel_source_hash"] == NEWER
    assert doc["entries"][_key(UNTOUCHED)]["kernel_source_hash"] == OLDER
    assert "kernel_source_hash" not in doc["entries"][_key(PREFILL)]
    assert (h200.kept_on_other_source, h200.from_db_on_other_source) == (0, 1)


def test_entries_with_their_own_source_hash_serve_the_runtime(tmp_path, monkeypatch, caplog):
    """The runtime reads only problem, dtype and config: whatever the field holds, the entry is served."""
    import logging

    export.export_tables(results_db(tmp_path / "earlier.db", [trial_row(0, UNTOUCHED, SLOWER, time_ms=9.0)]), tmp_path)
    export.export_tables(results_db(tmp_path / "later.db", [trial_row(0, PREFILL, FAST, time_ms=1.0,
                                                                      source_hash=NEWER)]), tmp_path)
    path = _h200_file(tmp_path)
    doc = json.loads(path.read_text())
    assert doc["entries"][_key(UNTOUCHED)]["kernel_source_hash"] == OLDER
    doc["entries"][_key(PREFILL)]["kernel_source_hash"] = [None, {"not": "a hash"}, 1e308]  # hand-edited
    export.write_json_atomic(path, doc)
    monkeypatch.setenv("OMNITUNE_CONFIG_DIR", str(tmp_path))
    runtime.clear_cache()
    caplog.set_level(logging.WARNING, logger="omnitune.runtime")
    try:
        for problem, config in ((UNTOUCHED, SLOWER), (PREFILL, FAST)):
            answer = runtime.lookup("attention", problem, torch.float16, H200)
            assert (answer.rung, answer.config, answer.source) == (runtime.Rung.EXACT, config, path)
    finally:
        runtime.clear_cache()
    assert [r for r in caplog.records if r.name == "omnitune.runtime"] == []


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


@pytest.mark.parametrize("content, said", [("[]", "it holds an array, not a table object"),
                                           ("null", "it holds null, not a table object"),
                                           ('{"schema_version": "1", "entries": {}}', "schema_version '1', expected 1")])
def test_an_existing_file_that_is_not_a_table_is_named_and_left_alone(populated, tmp_path, content, said):
    path = _h200_file(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text(content)
    with pytest.raises(StoreError, match=f"cannot merge into .*: {re.escape(said)}; move it aside"):
        export.export_tables(populated, tmp_path)
    assert path.read_text() == content


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

    monkeypatch.setattr(os, "fsync", fsync)
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

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk on fire"):
        export.export_tables(populated, tmp_path)
    assert path.read_text() == old
    assert sorted(p.name for p in path.parent.iterdir()) == sorted([path.name, f".{path.name}.lock"])


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


def test_export_command_says_how_many_kept_entries_are_from_other_kernel_source(populated, tmp_path):
    earlier = results_db(tmp_path / "earlier.db", [trial_row(0, UNTOUCHED, SLOWER, time_ms=9.0),
                                                    trial_row(0, CROSS, SLOWER, time_ms=9.0)])
    assert CliRunner().invoke(app, ["export", "--db", str(earlier), "--out", str(tmp_path)]).exit_code == 0
    result = CliRunner().invoke(app, ["export", "--db", str(populated), "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert f"wrote {_h200_file(tmp_path)}: 3 entries (1 from the database, 2 kept from the file)" in result.stdout
    (note,) = [line for line in result.stderr.splitlines() if "kernel source" in line]
    assert (f"{_h200_file(tmp_path)}: 2 entries kept from the file were measured on other kernel source "
            f"({OLDER}) than the file's {NEWER}") in note
    assert "omnitune verify --fix" in note

    # merging into a file of the same source: no note
    same = tmp_path / "same"
    assert CliRunner().invoke(app, ["export", "--db", str(earlier), "--out", str(same)]).exit_code == 0
    again = CliRunner().invoke(app, ["export", "--db", str(_one_entry_db(tmp_path, "later", PREFILL)), "--out", str(same)])
    assert again.exit_code == 0 and "kept from the file" in again.stdout and "kernel source" not in again.stderr


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


# --- hardening: modes, concurrent exports, debris, what is kept -----------------------------------


def _one_entry_db(tmp_path: Path, name: str, problem) -> Path:
    return results_db(tmp_path / f"{name}.db", [trial_row(0, problem, FAST, time_ms=1.0)])


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_tables_get_the_mode_the_umask_gives(populated, tmp_path, umask, mode):
    """Not mkstemp's 0600, which another user's inference process could not read."""
    previous = os.umask(umask)
    try:
        export.export_tables(populated, tmp_path)
    finally:
        os.umask(previous)
    assert _h200_file(tmp_path).stat().st_mode & 0o777 == mode


def test_an_export_waits_for_the_one_holding_the_tables_lock(tmp_path):
    """The read-merge-write of one file is serialized: an entry another export wrote while this
    one waited is kept, not overwritten by a merge of what was there before."""
    import threading

    from omnitune import table_files

    path = _h200_file(tmp_path)
    export.export_tables(_one_entry_db(tmp_path, "first", PREFILL), tmp_path)
    done = threading.Event()
    with table_files.locked(path):
        worker = threading.Thread(target=lambda: (export.export_tables(_one_entry_db(tmp_path, "second", CROSS), tmp_path),
                                                  done.set()))
        worker.start()
        assert not done.wait(1.0)  # blocked on the lock
        # Meanwhile the holder adds an entry (as a concurrent export from another machine would).
        export.write_json_atomic(path, export.merge_document(
            json.loads(path.read_text()) | {"entries": {**json.loads(path.read_text())["entries"],
                                                        _key(UNTOUCHED): _kept_entry(UNTOUCHED)}}, None))
    worker.join(30)
    assert done.is_set()
    assert set(json.loads(path.read_text())["entries"]) == {_key(PREFILL), _key(CROSS), _key(UNTOUCHED)}


def _kept_entry(problem, **changes):
    entry = {"problem": dataclasses.asdict(problem), "dtype": "fp16", "config": FAST.as_dict(), "time_ms": 2.0}
    entry.update(changes)
    return entry


def _export_after(barrier, db: Path, out: Path) -> None:
    barrier.wait()
    export.export_tables(db, out)


def test_concurrent_exports_into_one_folder_keep_both_sides(tmp_path):
    """Processes, as concurrent exports are (forked, so that none imports torch again)."""
    import multiprocessing

    context = multiprocessing.get_context("fork")
    problems = [dataclasses.replace(PREFILL, lq=lq, lk=lq) for lq in (64, 256, 1024, 4096)]
    databases = [_one_entry_db(tmp_path, f"db{i}", p) for i, p in enumerate(problems)]
    for round_ in range(2):
        out = tmp_path / f"round{round_}"
        barrier = context.Barrier(len(databases))
        workers = [context.Process(target=_export_after, args=(barrier, db, out)) for db in databases]
        for w in workers:
            w.start()
        for w in workers:
            w.join(120)
        assert [w.exitcode for w in workers] == [0] * len(workers)
        assert set(json.loads(_h200_file(out).read_text())["entries"]) == {_key(p) for p in problems}


def test_temporary_and_lock_files_are_ignored_by_git_and_stale_ones_removed(populated, tmp_path):
    import subprocess

    repo = Path(__file__).resolve().parents[1]
    names = ["tuned_configs/attention/.NVIDIA_H200.json.1a2b3c4d.tmp", "tuned_configs/attention/.NVIDIA_H200.json.lock"]
    ignored = subprocess.run(["git", "check-ignore", "--no-index", *names, "tuned_configs/attention/NVIDIA_H200.json"],
                             cwd=repo, capture_output=True, text=True)
    assert ignored.stdout.split() == names  # the table itself is not ignored

    path = _h200_file(tmp_path)
    path.parent.mkdir(parents=True)
    stale = path.parent / f".{path.name}.dead0001.tmp"  # what a killed export leaves
    stale.write_text('{"half of a')
    export.export_tables(populated, tmp_path)
    assert not stale.exists() and not list(path.parent.glob("*.tmp"))


def test_invalid_entries_of_the_existing_file_are_dropped_with_one_warning(populated, tmp_path, caplog):
    import logging

    path = _h200_file(tmp_path)
    path.parent.mkdir(parents=True)
    far = dataclasses.replace(PREFILL, lq=4096, lk=4096)
    entries = {
        _key(UNTOUCHED): _kept_entry(UNTOUCHED),                                 # valid: kept
        _key(far): _kept_entry(far, config=FAST.replace(BLOCK_M=7).as_dict()),  # outside the space
        _key(CROSS): _kept_entry(PREFILL),                                      # key and problem disagree
        "fp16|b=1": {"problem": "b=1"},                                         # not an entry at all
    }
    path.write_text(json.dumps({"schema_version": 1, "kernel": "attention", "device": {"key": "NVIDIA_H200"},
                                "entries": entries}))
    caplog.set_level(logging.WARNING, logger="omnitune.export")
    written = export.export_tables(populated, tmp_path)
    h200 = next(f for f in written if f.path == path)
    assert (h200.kept, h200.dropped, h200.changed) == (1, 3, True)
    assert set(json.loads(path.read_text())["entries"]) == {_key(PREFILL), _key(UNTOUCHED)}
    warned = [r.getMessage() for r in caplog.records if r.name == "omnitune.export"]
    assert len(warned) == 1 and "dropping 3 invalid entries" in warned[0] and "BLOCK_M=7" in warned[0]


@pytest.mark.parametrize("raw", ["NaN", "Infinity", "-Infinity", "1e999", "1" + "0" * 500])
def test_merging_into_a_table_holding_a_nan_does_not_crash(populated, tmp_path, raw):
    path = _h200_file(tmp_path)
    path.parent.mkdir(parents=True)
    entries = {_key(UNTOUCHED): _kept_entry(UNTOUCHED, time_ms="@@RAW@@"),  # kept otherwise: dropped
               _key(PREFILL): _kept_entry(PREFILL, time_ms="@@RAW@@")}      # replaced by the database's
    text = json.dumps({"schema_version": 1, "kernel": "attention", "device": {"key": "NVIDIA_H200"}, "entries": entries})
    path.write_text(text.replace('"@@RAW@@"', raw))
    export.export_tables(populated, tmp_path)
    written = json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"{c} written"))
    assert set(written["entries"]) == {_key(PREFILL)}
    assert written["entries"][_key(PREFILL)]["time_ms"] == FAST_MS


def test_a_fifo_at_the_target_is_an_error_not_a_hang(populated, tmp_path):
    import threading

    path = _h200_file(tmp_path)
    path.parent.mkdir(parents=True)
    os.mkfifo(path)
    outcome = []
    worker = threading.Thread(target=lambda: outcome.append(_raises(lambda: export.export_tables(populated, tmp_path))),
                              daemon=True)
    worker.start()
    worker.join(30)
    assert outcome and isinstance(outcome[0], StoreError) and "not a regular file" in str(outcome[0])


def _raises(call):
    try:
        call()
    except Exception as exc:  # noqa: BLE001
        return exc
    return None


def test_a_lock_held_too_long_is_a_clear_error(populated, tmp_path, monkeypatch):
    from omnitune import table_files

    monkeypatch.setattr(table_files, "LOCK_TIMEOUT_S", 0.3)
    with table_files.locked(_h200_file(tmp_path)):
        with pytest.raises(StoreError, match="another export has been writing"):
            export.export_tables(populated, tmp_path)


@pytest.mark.parametrize("column, value", [("device_key", "../../escaped"), ("device_key", ""),
                                           ("kernel", "../escaped")])
def test_a_database_whose_names_cannot_name_a_table_file_exports_nothing(tmp_path, populated, column, value):
    """The kernel and device key make the table's path: a tampered database that holds a path
    there is refused in one line, and nothing is written, inside --out or outside it."""
    import sqlite3

    db = populated
    with sqlite3.connect(db) as conn:
        conn.execute(f"UPDATE trials SET {column} = ?", (value,))
    out = tmp_path / "deep" / "er" / "out"
    before = sorted(p for p in tmp_path.rglob("*") if p.suffix == ".json")
    result = CliRunner().invoke(app, ["export", "--db", str(db), "--out", str(out)])
    assert result.exit_code != 0 and result.exception is None or isinstance(result.exception, SystemExit)
    assert "nothing exported" in result.output and len(result.output.strip().splitlines()) == 1, result.output
    assert sorted(p for p in tmp_path.rglob("*") if p.suffix == ".json") == before


@pytest.mark.parametrize("column, value", [("time_ms", "fast"), ("tflops", "x"), ("p20_ms", "x"),
                                           ("config_json", "{not json"), ("problem_json", "{bad"),
                                           ("config_json", "null"), ("config_json", '{"ZZ": 1}'),
                                           ("dtype", "int8")])
def test_a_cell_changed_by_hand_costs_its_row_not_the_report_or_the_export(tmp_path, populated, column, value):
    """SQLite keeps whatever a cell is given: report and export read a non-number as missing and
    leave out a row that cannot make a table entry (saying so), never a traceback, and never
    write an entry the runtime would skip."""
    import sqlite3

    db = populated
    with sqlite3.connect(db) as conn:  # the fast row of PREFILL: what export would pick
        conn.execute(f"UPDATE trials SET {column} = ? WHERE trial_number = 1 AND problem_key = ?",
                     (value, SPEC.problem_key(PREFILL)))
    for fmt in ("table", "csv", "json"):
        result = CliRunner().invoke(app, ["report", "--db", str(db), "--format", fmt])
        assert result.exit_code == 0 and result.exception is None, (fmt, result.output[-1500:])
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["export", "--db", str(db), "--out", str(out)])
    assert result.exit_code == 0 and result.exception is None, result.output[-1500:]
    assert "Traceback" not in result.output
    for path in out.rglob("*.json"):
        doc = json.loads(path.read_text())
        for key, raw in doc["entries"].items():
            runtime_entry = export.parse_entry(key, raw, SPEC)  # what the runtime reads, or raises
            assert runtime_entry.config is not None

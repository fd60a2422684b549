"""benchmarks/merge_trials.py: trials of the problems a results database lacks copied in from
others, on real databases made by omnitune's store (no GPU)."""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import merge_trials  # noqa: E402

from omnitune.store import open_db  # noqa: E402


def _database(path: Path, trials: list[tuple[str, str, int, float]]) -> Path:
    """A results database holding (kernel, problem key, trial number, time) trials."""
    open_db(path).conn.close()
    with sqlite3.connect(path) as db:
        db.executemany(
            "INSERT INTO trials (study, trial_number, kernel, problem_key, problem_json, dtype, device_key,"
            " config_json, status, time_ms, representative, is_default) VALUES (?, ?, ?, ?, '{}', 'bf16',"
            " 'NVIDIA_H200', '{}', 'ok', ?, 1, 0)",
            [(f"{kernel}|{key}|{path.stem}", number, kernel, key, time) for kernel, key, number, time in trials])
    return path


def _trials(path: Path) -> list[tuple]:
    with sqlite3.connect(path) as db:
        return sorted(db.execute("SELECT kernel, problem_key, trial_number, time_ms FROM trials"))


def test_only_problems_the_target_lacks_come_over_whole(tmp_path):
    target = _database(tmp_path / "new.db", [("kv_compress", "n=4096", 0, 2.0), ("kv_compress", "n=4096", 1, 2.5)])
    old = _database(tmp_path / "old.db", [("kv_compress", "n=4096", 0, 1.5), ("kv_compress", "n=9000", 0, 4.0),
                                          ("kv_compress", "n=9000", 1, 3.9), ("attention", "lq=64", 0, 0.1)])
    other = _database(tmp_path / "other.db", [("kv_compress", "n=9000", 0, 9.9), ("kv_compress", "n=512", 0, 0.3)])

    assert merge_trials.main([str(target), str(old), str(other), "--kernel", "kv_compress"]) == 0

    assert _trials(target) == [  # n=4096 keeps the target's own two; n=9000 comes from old, the first source
        ("kv_compress", "n=4096", 0, 2.0), ("kv_compress", "n=4096", 1, 2.5), ("kv_compress", "n=512", 0, 0.3),
        ("kv_compress", "n=9000", 0, 4.0), ("kv_compress", "n=9000", 1, 3.9)]
    assert merge_trials.merge(target, [old], "kv_compress") == {str(old): 0}  # nothing left to copy
    assert merge_trials.merge(target, [old]) == {str(old): 1}  # without --kernel: attention's too


def test_a_missing_or_foreign_file_is_one_line(tmp_path, capsys):
    target = _database(tmp_path / "new.db", [])
    assert merge_trials.main([str(target), str(tmp_path / "absent.db")]) == 2
    assert capsys.readouterr().err.strip() == f"error: {tmp_path / 'absent.db'}: no such database"
    junk = tmp_path / "junk.db"
    junk.write_text("not a database")
    assert merge_trials.main([str(target), str(junk)]) == 2
    assert capsys.readouterr().err.startswith("error: file is not a database")

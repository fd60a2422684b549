"""The Optuna storage beside the results database, mishandled: `omnitune search` and `omnitune
worker` run for real (kv_cache_write on a tiny shape; under Triton's interpreter on the CPU) on a
journal lost, emptied or swapped, cut short by a killed process, garbled in the middle, and on
storage URLs that name another results database or no file. Stored rows are never overwritten,
and a journal that cannot be read is never written."""

from __future__ import annotations

import json
import logging
import sqlite3

import optuna
import pytest
import torch
from typer.testing import CliRunner

from omnitune.cli import app
from omnitune.store import open_optuna_storage

SHAPE = "t=37,hkv=2,d=64,block_size=16"
ON_GPU = torch.cuda.is_available()
# conftest imports the kernels interpreted without a GPU and compiled with one; --interpret must match.
MODE = [] if ON_GPU else ["--interpret"]


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def search(db, *extra: str):
    return invoke("search", "kv_cache_write", "--shape", SHAPE, *MODE, "--db", str(db), *extra)


def rows(db) -> list[tuple]:
    conn = sqlite3.connect(db)
    try:
        return conn.execute("SELECT trial_number, config_json, status, time_ms FROM trials "
                            "ORDER BY trial_number").fetchall()
    finally:
        conn.close()


def schema(db) -> list[tuple]:
    conn = sqlite3.connect(db)
    try:
        return conn.execute("SELECT type, name, sql FROM sqlite_master ORDER BY type, name").fetchall()
    finally:
        conn.close()


def assert_one_line_error(result, *words: str) -> None:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for word in words:
        assert word in lines[0], lines[0]


@pytest.fixture
def searched(tmp_path):
    """A results database with two measured trials, and the journal beside it."""
    db = tmp_path / "r.db"
    result = search(db, "--trials", "2")
    assert result.exit_code == 0, result.output
    assert len(rows(db)) == 2
    return db, tmp_path / "r.optuna.log"


# --- a journal that lacks the trials the database holds -----------------------------------------

@pytest.mark.parametrize("lost", ["missing", "emptied", "another journal", "another sqlite storage"])
def test_a_storage_lacking_the_stored_trials_is_refused_and_the_rows_are_kept(searched, lost, tmp_path):
    db, journal = searched
    before, kept = rows(db), journal.read_bytes()
    storage = []
    if lost == "missing":
        journal.unlink()
    elif lost == "emptied":
        journal.write_bytes(b"")
    elif lost == "another journal":
        storage = ["--storage", f"journal:///{tmp_path / 'new.optuna.log'}"]
    else:
        storage = ["--storage", f"sqlite:///{tmp_path / 'new.optuna.db'}"]
    # Without the check, a random search numbered its trials from 0 again, over the stored rows.
    result = search(db, "--trials", "2", "--sampler", "random", "--seed", "5", *storage)
    assert_one_line_error(result, f"{db} holds 2 trials of kv_cache_write|", "lacks", "new --db")
    assert rows(db) == before

    # The journal restored (or the other storage left out), the search goes on after them.
    journal.write_bytes(kept)
    result = search(db, "--trials", "3", "--sampler", "random", "--seed", "5")
    assert result.exit_code == 0, result.output
    assert rows(db)[:2] == before and len(rows(db)) == 3


# --- a journal whose last record was cut short ----------------------------------------------------

def _cut(journal) -> None:
    data = journal.read_bytes()
    journal.write_bytes(data[:-40])  # the write of the last record interrupted


DAMAGE = {
    "truncated": _cut,
    "garbage line": lambda journal: journal.write_bytes(journal.read_bytes() + b"{garbage\n"),
    "zeros": lambda journal: journal.write_bytes(journal.read_bytes() + bytes(300)),
    "zeros and a newline": lambda journal: journal.write_bytes(journal.read_bytes() + bytes(30) + b"\n"),
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_an_interrupted_last_record_is_dropped_with_a_backup_and_the_search_resumes(searched, damage, caplog):
    db, journal = searched
    before = rows(db)
    DAMAGE[damage](journal)
    damaged = journal.read_bytes()

    with caplog.at_level(logging.WARNING):
        result = search(db, "--trials", "3")
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    (backup,) = journal.parent.glob("r.optuna.log.bak-*")
    assert backup.read_bytes() == damaged  # the journal as it was, kept
    warned = [r.getMessage() for r in caplog.records if "incomplete record" in r.getMessage()]
    assert len(warned) == 1 and str(backup) in warned[0]
    after = rows(db)
    assert after[:2] == before  # every earlier row kept, as it was
    # --trials 3 measured 3, each config once: a trial whose tell was cut off after its
    # measurement was stored is completed with it, not failed and its config measured again
    assert len(after) == 3 and len({row[1] for row in after}) == 3, after
    # Every line of the journal is a record again, and the next search reads it.
    assert all(isinstance(json.loads(line), dict) for line in journal.read_bytes().splitlines())
    again = search(db, "--trials", "3")
    assert again.exit_code == 0 and "Traceback" not in again.output, again.output
    assert rows(db) == after


def test_a_last_record_cut_only_at_its_newline_is_ended_not_dropped(searched, caplog):
    db, journal = searched
    journal.write_bytes(journal.read_bytes()[:-1])  # the record whole, its newline not written
    with caplog.at_level(logging.WARNING):
        result = search(db, "--trials", "3")
    assert result.exit_code == 0, result.output
    assert not list(journal.parent.glob("r.optuna.log.bak-*"))  # nothing dropped, nothing to keep
    assert any("added it" in r.getMessage() for r in caplog.records)
    assert not any("incomplete record" in r.getMessage() for r in caplog.records)
    after = rows(db)
    assert len(after) == 3 and len({row[1] for row in after}) == 3, after
    assert all(isinstance(json.loads(line), dict) for line in journal.read_bytes().splitlines())


def test_a_writer_does_not_append_after_a_record_another_process_left_cut(tmp_path):
    """A process killed mid-append while another has the journal open: the live one's next record
    must not glue onto the cut line (no process could read the journal after)."""
    path = tmp_path / "j.optuna.log"
    study = optuna.create_study(study_name="s", storage=open_optuna_storage(f"journal:///{path}"))
    with open(path, "ab") as f:
        f.write(b'{"op_code":5,"worker_id":"gone","study_id":0,"datetime_st')
    study.set_user_attr("after", 1)  # appends under the journal's lock
    assert list(tmp_path.glob("j.optuna.log.bak-*"))
    reopened = open_optuna_storage(f"journal:///{path}")
    (summary,) = optuna.get_all_study_summaries(reopened)
    assert summary.user_attrs == {"after": 1}


def test_a_journal_unreadable_before_its_end_is_refused_untouched(searched):
    db, journal = searched
    before = rows(db)
    lines = journal.read_bytes().splitlines(keepends=True)
    lines[2] = lines[2].replace(b":", b";", 1)
    journal.write_bytes(b"".join(lines))
    damaged = journal.read_bytes()
    result = search(db, "--trials", "3")
    assert_one_line_error(result, f"cannot open the Optuna journal {journal}", "line 3 is not a journal record",
                          "restore the journal")
    assert journal.read_bytes() == damaged
    assert not list(journal.parent.glob("r.optuna.log.bak-*"))
    assert rows(db) == before


# --- storage URLs that name no storage --------------------------------------------------------------

def _worker(db, storage: str):
    return invoke("worker", "kv_cache_write", "--shape", SHAPE, *MODE, "--trials", "2", "--db", str(db),
                  "--storage", storage)


@pytest.mark.parametrize("command", ["search", "worker"])
@pytest.mark.parametrize("scheme", ["sqlite", "journal"])
def test_a_storage_that_is_another_results_database_is_refused_untouched(searched, tmp_path, command, scheme):
    other, _ = searched
    before = schema(other)
    new_db = tmp_path / "new.db"
    storage = f"{scheme}:///{other}"
    result = search(new_db, "--storage", storage) if command == "search" else _worker(new_db, storage)
    if scheme == "sqlite":
        assert_one_line_error(result, f"the Optuna storage {storage} is an omnitune results database")
    else:
        assert_one_line_error(result, f"the journal storage {storage} names an SQLite database")
    assert schema(other) == before
    assert not new_db.exists()  # nothing was started


def _another_programs_database(path) -> bytes:
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
        conn.execute("INSERT INTO users (name) VALUES ('ada')")
    conn.close()
    return path.read_bytes()


@pytest.mark.parametrize("command", ["search", "report", "export"])
def test_a_storage_that_is_another_programs_sqlite_database_is_refused_untouched(searched, tmp_path, command):
    db, _ = searched
    app_db = tmp_path / "app.db"
    before = _another_programs_database(app_db)
    storage = f"sqlite:///{app_db}"
    if command == "search":
        result = search(tmp_path / "new.db", "--storage", storage)
    else:
        extra = ["--out", str(tmp_path / "tables")] if command == "export" else []
        result = invoke(command, "--db", str(db), "--storage", storage, *extra)
    assert_one_line_error(result, f"the Optuna storage {storage} is an SQLite database of another program")
    assert app_db.read_bytes() == before


@pytest.mark.parametrize("command", ["report", "export"])
def test_reading_an_empty_file_as_an_sqlite_storage_is_refused_and_leaves_it_empty(searched, tmp_path, command):
    db, _ = searched
    empty = tmp_path / "empty.db"
    empty.touch()
    extra = ["--out", str(tmp_path / "tables")] if command == "export" else []
    result = invoke(command, "--db", str(db), "--storage", f"sqlite:///{empty}", *extra)
    assert_one_line_error(result, "is an empty file, not an Optuna storage")
    assert empty.stat().st_size == 0


@pytest.mark.parametrize("command", ["search", "worker"])
@pytest.mark.parametrize("url", ["sqlite:///", "sqlite:///?timeout=5"])
def test_an_sqlite_storage_that_names_no_file_is_refused(tmp_path, command, url):
    db = tmp_path / "r.db"
    result = search(db, "--storage", url) if command == "search" else _worker(db, url)
    assert_one_line_error(result, f"the Optuna storage {url} names no file")
    assert not db.exists()

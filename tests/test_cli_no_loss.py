"""Results are never lost, and bad input is one line: checked through the real command line on
temporary files. A storage that lacks trials --db has rows of is refused by report and export as
by search (before, they dropped the rows: a truncated journal took a database from 3 trials to
0); a search that cannot open its storage leaves no empty database; and plan --kernels ',', an
empty --db, --timeout nan and bench --causal on a kernel without that flag each get one line."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import optuna
import pytest
import torch
from conftest import assert_one_line_error
from typer.testing import CliRunner

from omnitune.cli import app

ON_GPU = torch.cuda.is_available()
# conftest imports the kernels interpreted without a GPU and compiled with one; --interpret must match.
MODE = [] if ON_GPU else ["--interpret"]
SHAPE = "t=37,hkv=2,d=64,block_size=16"  # kv_cache_write's: the quickest kernel to run interpreted


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def search_args(db: Path, *extra) -> list:
    return ["search", "kv_cache_write", "--shape", SHAPE, "--dtype", "fp16", *MODE, "--db", db, *extra]


def trial_rows(db: Path) -> list[tuple]:
    with sqlite3.connect(db) as con:
        return con.execute("SELECT study, trial_number, config_json FROM trials ORDER BY study, trial_number").fetchall()


@pytest.fixture
def searched(tmp_path) -> tuple[Path, Path]:
    """A database searched for 3 trials, and its journal (the default storage beside it)."""
    db = tmp_path / "omnitune.db"
    result = invoke(*search_args(db, "--trials", 3))
    assert result.exit_code == 0, result.output
    assert len(trial_rows(db)) == 3
    return db, tmp_path / "omnitune.optuna.log"


def truncated_copy(journal: Path, to: Path) -> Path:
    """The journal cut after its study was created, before its first trial: what a journal
    restored from an early copy, or cut by a full disk, holds."""
    kept = []
    for line in journal.read_text().splitlines(keepends=True):
        if json.loads(line)["op_code"] == 4:  # the first trial
            break
        kept.append(line)
    to.write_text("".join(kept))
    return to


# --- 1. report and export never drop rows that their --storage lacks ----------------------------


@pytest.mark.parametrize("command", ["report", "export"])
def test_a_storage_lacking_the_databases_trials_is_refused_and_no_row_is_dropped(command, searched, tmp_path):
    db, journal = searched
    before = trial_rows(db)
    cut = truncated_copy(journal, tmp_path / "cut.optuna.log")
    out = tmp_path / "tables"
    extra = ["--out", out] if command == "export" else []
    line = assert_one_line_error(invoke(command, "--db", db, "--storage", f"journal:///{cut}", *extra),
                                 f"{db} holds 3 trials of kv_cache_write|")
    # Search's message, with what reading the storage in would do and what to do instead.
    assert f"that the Optuna journal {cut} lacks" in line and "leave out --storage" in line
    assert trial_rows(db) == before
    assert not out.exists()
    # The same storage is refused by a search too, in the same words but its own ending.
    assert_one_line_error(invoke(*search_args(db, "--storage", f"journal:///{cut}")), "a search would overwrite them")
    assert trial_rows(db) == before


def test_a_search_refused_for_a_lost_journal_leaves_no_empty_journal_behind(searched):
    db, journal = searched
    before = trial_rows(db)
    journal.unlink()
    lock = Path(f"{journal}.lock")
    lock.unlink(missing_ok=True)
    assert_one_line_error(invoke(*search_args(db)), "a search would overwrite them")
    # Opening the storage made both files; the refusal takes them back (an empty journal left
    # there read as one the search had written, and a restored copy had to go over it).
    assert not journal.exists() and not lock.exists()
    assert trial_rows(db) == before


def test_the_storage_the_database_was_searched_with_is_read_in_as_before(searched):
    db, journal = searched
    before = trial_rows(db)
    result = invoke("report", "--db", db, "--storage", f"journal:///{journal}", "--format", "json")
    assert result.exit_code == 0, result.output
    assert "3 trials read from the Optuna storage" in result.stderr
    assert trial_rows(db) == before and json.loads(result.stdout)


def test_a_study_deleted_from_the_storage_on_purpose_keeps_its_rows(searched, tmp_path):
    """Deleting a study is the one way a storage drops trials on purpose: its rows are not the
    storage's any more, and stay as they are (rows of studies elsewhere always did)."""
    db, journal = searched
    before = trial_rows(db)
    copy = tmp_path / "copy.optuna.log"
    copy.write_bytes(journal.read_bytes())
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(copy)))
    optuna.delete_study(study_name=before[0][0], storage=storage)
    result = invoke("report", "--db", db, "--storage", f"journal:///{copy}", "--format", "json")
    assert result.exit_code == 0, result.output
    assert "0 trials read from the Optuna storage" in result.stderr
    assert trial_rows(db) == before and json.loads(result.stdout)


# --- 2. a search that cannot open its storage leaves no database behind ----------------------------


@pytest.mark.parametrize("storage", ["foo", "sqlite:///", "postgresql://u:p@127.0.0.1:1/omnitune"],
                         ids=["not-a-url", "sqlite-no-file", "no-server"])
def test_a_search_whose_storage_cannot_be_opened_leaves_no_empty_database(storage, tmp_path):
    db = tmp_path / "omnitune.db"
    result = invoke(*search_args(db, "--trials", 1, "--storage", storage))
    assert result.exit_code == 2 and "error: " in result.stderr, result.output
    assert list(tmp_path.iterdir()) == []


def test_report_from_a_storage_that_cannot_be_opened_leaves_no_empty_database(tmp_path):
    db = tmp_path / "omnitune.db"
    assert_one_line_error(invoke("report", "--db", db, "--storage", "nosuchdriver://host/x"),
                          "cannot open the Optuna storage 'nosuchdriver://host/x'")
    assert not db.exists()


@pytest.mark.parametrize("command", ["report", "export"])
@pytest.mark.parametrize("storage", ["journal:///{tmp}/missing.optuna.log", "journal:///{tmp}/no/such/dir/x.log",
                                     "sqlite:///{tmp}/missing.optuna.db"], ids=["journal", "journal-folder", "sqlite"])
def test_reading_a_storage_that_does_not_exist_is_one_line_and_makes_no_file(command, storage, tmp_path):
    """Opening a missing storage, Optuna made it (a journal with its folders, an SQLite file), and
    report and export read "0 trials" from it, into a new empty database."""
    url = storage.format(tmp=tmp_path)
    out = tmp_path / "tables"
    extra = ["--out", out] if command == "export" else []
    line = assert_one_line_error(invoke(command, "--db", tmp_path / "omnitune.db", "--storage", url, *extra),
                                 f"--storage {url}: there is no Optuna storage at ")
    assert "leave out --storage" in line
    assert list(tmp_path.iterdir()) == []  # no storage, no folder, no database, no tables


@pytest.mark.parametrize("scheme", ["journal", "sqlite"])
def test_a_three_slash_storage_url_for_an_absolute_path_names_the_four_slash_one(scheme, tmp_path, monkeypatch):
    """journal:///tmp/x.log, as sqlite:///, names ./tmp/x.log: a user who meant the file at /tmp/x.log
    is told how to write it."""
    storage_file = tmp_path / "studies.log"
    storage_file.write_text("")
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    url = f"{scheme}://{storage_file}"  # three slashes: the absolute path's own is the third
    line = assert_one_line_error(invoke("report", "--db", cwd / "omnitune.db", "--storage", url),
                                 f"there is no Optuna storage at {str(storage_file).lstrip('/')}")
    assert f"for {storage_file} write {scheme}:///{storage_file}" in line
    assert list(cwd.iterdir()) == []


@pytest.mark.parametrize("scheme", ["journal", "sqlite"])
def test_a_search_into_a_three_slash_storage_url_for_an_absolute_folder_is_refused_with_the_four_slash_one(
        scheme, tmp_path, monkeypatch):
    """A search given journal:///tmp/x.log from another folder made ./tmp/x.log, folders and all,
    where /tmp/x.log was meant: refused before anything is written, with the URL that names it."""
    storage_file = tmp_path / "studies.log"
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    url = f"{scheme}://{storage_file}"
    result = invoke("search", "kv_cache_write", "--shape", "t=37,hkv=2,d=64,block_size=16", "--dtype", "fp16",
                    "--interpret", "--trials", "1", "--db", cwd / "omnitune.db", "--storage", url)
    line = assert_one_line_error(result, f"--storage {url} names {str(storage_file).lstrip('/')}, whose folder")
    assert f"for {storage_file} write {scheme}:///{storage_file}" in line
    assert list(cwd.iterdir()) == [] and not storage_file.exists()


@pytest.mark.parametrize("command", ["search", "report"])
def test_a_path_given_for_a_storage_url_is_one_line_naming_the_urls_and_makes_no_file(command, tmp_path):
    """--storage /path/studies.log was SQLAlchemy's "Could not parse SQLAlchemy URL", which does not
    say that a journal wants journal:////path."""
    storage_file = tmp_path / "studies.log"
    args = {"search": ["search", "kv_cache_write", "--shape", "t=37,hkv=2,d=64,block_size=16", "--dtype", "fp16",
                       "--interpret", "--trials", "1"],
            "report": ["report"]}[command]
    result = invoke(*args, "--db", tmp_path / "omnitune.db", "--storage", storage_file)
    assert_one_line_error(result, f"the Optuna storage '{storage_file}' is not a URL; for a journal file write "
                                  f"journal:///{storage_file}, for an SQLite file sqlite:///{storage_file}")
    assert list(tmp_path.iterdir()) == []


def test_credentials_given_without_a_scheme_are_refused_without_repeating_them(tmp_path):
    result = invoke("report", "--db", tmp_path / "omnitune.db", "--storage", "me:secret@db.example:5432/omnitune")
    line = assert_one_line_error(result, "the Optuna storage given is not a URL: it lacks a scheme")
    assert "secret" not in result.output and "secret" not in line


# --- 3. plan --kernels that names nothing --------------------------------------------------------------


@pytest.mark.parametrize("args, message", [
    (["--kernels", ","], "--kernels ',' names no kernel"),
    (["--kernels", ""], "--kernels '' names no kernel"),
    (["--kernels", ",", "--coverage", "--device", "NVIDIA H200"], "--kernels ',' names no kernel"),
])
def test_plan_kernels_that_name_no_kernel_is_one_line(args, message):
    assert_one_line_error(invoke("plan", "--model", "qwen2.5-omni-7b", *args), message)


@pytest.mark.parametrize("extra", [[], ["--coverage", "--device", "NVIDIA H200"]], ids=["plan", "coverage"])
def test_plan_of_kernels_the_preset_never_runs_is_one_line(extra):
    assert_one_line_error(invoke("plan", "--model", "qwen-image-dit", "--kernels", "kv_cache_write", *extra),
                          "nothing to plan: qwen-image-dit sends none of the kernels asked for any problem")


def test_search_kernels_that_name_no_kernel_says_so(tmp_path):
    db = tmp_path / "omnitune.db"
    assert_one_line_error(invoke("search", "--model", "qwen2.5-omni-7b", "--kernels", ",", *MODE, "--db", db),
                          "--kernels ',' names no kernel")
    assert not db.exists()


# --- 4. an empty --db -------------------------------------------------------------------------------------


@pytest.mark.parametrize("args", [
    ["report"], ["export"], ["plan", "--model", "qwen2.5-omni-7b"], search_args(""),
    ["worker", "kv_cache_write", "--shape", SHAPE, "--storage", "sqlite:///shared.optuna.db", *MODE],
], ids=["report", "export", "plan", "search", "worker"])
def test_an_empty_db_is_one_line_not_the_default_database(args, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("OMNITUNE_DB", raising=False)
    if "--db" not in args:
        args = [*args, "--db", ""]
    assert_one_line_error(invoke(*args), "--db is empty; name the results database")
    assert list(tmp_path.iterdir()) == []  # no ./omnitune.db, no storage, no tables


# --- 5. --timeout nan ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("option, value", [("--timeout", "nan"), ("--timeout", "inf"), ("--trial-timeout", "nan")])
def test_a_timeout_that_is_not_a_finite_number_says_so(option, value, tmp_path):
    db = tmp_path / "omnitune.db"
    line = assert_one_line_error(invoke(*search_args(db, option, value)), f"{value} is not a finite number")
    assert "should be" not in line and "greater than" not in line
    assert not db.exists()


def test_a_timeout_below_its_minimum_is_still_refused_and_a_good_one_taken(tmp_path):
    db = tmp_path / "omnitune.db"
    assert_one_line_error(invoke(*search_args(db, "--timeout", "0")), "0 is less than 0.001")
    result = invoke(*search_args(db, "--timeout", "600", "--trials", 1))
    assert result.exit_code == 0, result.output


# --- 6. bench --causal on a kernel without a causal flag --------------------------------------------------


@pytest.mark.parametrize("flag", ["--causal", "--no-causal"])
def test_bench_causal_on_a_kernel_without_the_flag_is_one_line(flag, monkeypatch):
    from omnitune.profile import bench

    def must_not_run(*args, **kwargs):
        raise AssertionError("the bench ran")

    monkeypatch.setattr(bench, "run_bench", must_not_run)
    assert_one_line_error(invoke("bench", "kv_cache_write", "--shape", SHAPE, "--dtype", "fp16", *MODE, flag),
                          f"{flag}: kv_cache_write has no causal flag")


# --- 7. verify --kernels and search --storage given empty -------------------------------------------------


@pytest.mark.parametrize("kernels", ["", ",", " , "])
def test_verify_kernels_that_name_no_kernel_is_one_line_not_every_table(kernels, tmp_path, monkeypatch):
    from omnitune.verify import pipeline

    def must_not_run(*args, **kwargs):
        raise AssertionError("verify checked the tables")

    monkeypatch.setattr(pipeline, "run_verify", must_not_run)
    assert_one_line_error(invoke("verify", *MODE, "--kernels", kernels), f"--kernels {kernels!r} names no kernel")


@pytest.mark.parametrize("storage", ["", " "])
def test_search_storage_empty_is_one_line_not_the_journal_beside_the_db(storage, tmp_path):
    db = tmp_path / "omnitune.db"
    assert_one_line_error(invoke(*search_args(db, "--trials", 1, "--storage", storage)), "--storage is empty")
    assert list(tmp_path.iterdir()) == []  # no database, no journal


# --- 8. --json FILE never replaces results, a journal or a table ----------------------------------------------


def test_json_reports_never_replace_a_database_a_journal_or_a_table(searched, tmp_path):
    db, journal = searched
    before, journal_bytes = trial_rows(db), journal.read_bytes()
    bench = ["bench", "kv_cache_write", "--shape", SHAPE, "--dtype", "fp16", *MODE]
    assert_one_line_error(invoke(*bench, "--json", db), "is an SQLite database (a results database?)")
    assert_one_line_error(invoke(*bench, "--json", journal), "exists and is not a JSON report")
    tables = tmp_path / "tables"
    assert invoke("export", "--db", db, "--out", tables).exit_code == 0
    (table,) = tables.glob("kv_cache_write/*.json")
    table_bytes = table.read_bytes()
    for target, said in ((db, "is an SQLite database"), (table, "is inside the tables folder")):
        assert_one_line_error(invoke("verify", *MODE, "--tables", tables, "--json", target), said)
    assert trial_rows(db) == before and journal.read_bytes() == journal_bytes and table.read_bytes() == table_bytes
    # An earlier report is replaced, as the help says; the report is JSON any parser reads (NaN as null).
    report = tmp_path / "bench.json"
    for _ in range(2):
        result = invoke(*bench, "--json", report)
        assert result.exit_code == 0, result.output
    assert "NaN" not in report.read_text() and json.loads(report.read_text())["results"]


def test_json_reports_never_replace_a_table_anywhere_a_config_or_another_programs_json(tmp_path):
    bench = ["bench", "kv_cache_write", "--shape", SHAPE, "--dtype", "fp16", *MODE]
    config = tmp_path / "config.json"
    config.write_text('{"BLOCK_T": 16}')
    table = tmp_path / "elsewhere" / "NVIDIA_H200.json"  # a table outside any --tables folder
    table.parent.mkdir()
    table.write_text(json.dumps({"kernel": "kv_cache_write", "entries": {}}))
    other = tmp_path / "package.json"
    other.write_text('{"name": "app", "results": []}')  # one of a report's keys is not enough
    files = {path: path.read_bytes() for path in (config, table, other)}
    empty_tables = tmp_path / "tables"
    empty_tables.mkdir()
    assert_one_line_error(invoke(*bench, "--config", config, "--json", config), "JSON but not a bench report")
    assert_one_line_error(invoke(*bench, "--json", table), "not a bench report but a tuned table")
    assert_one_line_error(invoke(*bench, "--json", other), "JSON but not a bench report")
    assert_one_line_error(invoke("verify", *MODE, "--tables", empty_tables, "--json", other),
                          "JSON but not a verify report")
    assert {path: path.read_bytes() for path in files} == files
    # A bench report is not a verify report either: each command replaces only its own.
    report = tmp_path / "bench.json"
    assert invoke(*bench, "--json", report).exit_code == 0
    assert_one_line_error(invoke("verify", *MODE, "--tables", empty_tables, "--json", report),
                          "JSON but not a verify report")


def test_a_json_report_into_a_fifo_is_written_into_it_not_over_it(tmp_path):
    import os
    import stat
    import threading

    fifo = tmp_path / "report.fifo"
    os.mkfifo(fifo)
    received = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()), daemon=True)
    reader.start()
    result = invoke("bench", "kv_cache_write", "--shape", SHAPE, "--dtype", "fp16", *MODE, "--json", fifo)
    reader.join(timeout=60)
    assert result.exit_code == 0, result.output
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)  # still the FIFO, not a plain file put in its place
    assert json.loads(received[0])["results"][0]["kernel"] == "kv_cache_write"


# --- 9. options given empty ------------------------------------------------------------------------------


@pytest.mark.parametrize("args, said", [
    (["bench", "kv_cache_write", "--shape", SHAPE, "--dtype", "fp16", *MODE, "--json", ""], "--json is empty"),
    (["bench", "kv_cache_write", "--shape", SHAPE, "--dtype", "fp16", *MODE, "--config", ""], "--config is empty"),
    (["bench", "kv_cache_write", "--shape", SHAPE, "--dtype", "fp16", *MODE, "--config", "null"],
     "--config null: a config must be a JSON object"),
    (["verify", *MODE, "--tables", ""], "--tables is empty"),
    (["verify", *MODE, "--json", ""], "--json is empty"),
])
def test_an_option_given_empty_is_one_line_not_the_current_folder(args, said, tmp_path, monkeypatch):
    # As Paths they were the current folder: "--json . is a folder", "no tables under .".
    monkeypatch.chdir(tmp_path)
    assert_one_line_error(invoke(*args), said)
    assert list(tmp_path.iterdir()) == []


# --- 10. a --device no table is for --------------------------------------------------------------------


@pytest.mark.parametrize("command", [["lookup", "kv_cache_write", "--shape", "t=4,hkv=2,d=128,block_size=16",
                                      "--dtype", "fp16"],
                                     ["plan", "--model", "qwen2.5-omni-7b", "--kernels", "kv_cache_write",
                                      "--coverage"]])
def test_a_device_no_table_is_for_is_said_once_with_the_gpus_that_have_tables(command, monkeypatch):
    """A misspelt --device answered every problem with the default, which read as "nothing is
    tuned"; a same-chip twin's tables (the H100 SXM served from the H200's) are not that case."""
    monkeypatch.delenv("OMNITUNE_CONFIG_DIR", raising=False)  # the shipped tables: the H200's and the H100's
    result = invoke(*command, "--device", "NVIDIA H20")
    assert result.exit_code == 0, result.output
    notes = [line for line in result.stderr.splitlines() if line.startswith("note: no table here is for")]
    assert len(notes) == 1 and "NVIDIA_H200" in notes[0] and "NVIDIA_H20.json" in notes[0], result.stderr
    for served in ("NVIDIA H200", "NVIDIA H100 80GB HBM3"):
        assert "note: no table here" not in invoke(*command, "--device", served).stderr


def test_a_config_naming_a_parameter_twice_is_refused_and_a_padded_dtype_taken_everywhere():
    # JSON's last value won, unsaid; lookup refused ' fp16', which plan and search take.
    bench = ["bench", "kv_cache_write", "--shape", SHAPE, "--dtype", "fp16", *MODE]
    assert_one_line_error(invoke(*bench, "--config", '{"BLOCK_T": 2, "BLOCK_T": 4}'), "--config names BLOCK_T twice")
    result = invoke("lookup", "kv_cache_write", "--shape", SHAPE, "--dtype", " fp16", "--device", "NVIDIA H200")
    assert result.exit_code == 0 and " fp16 on NVIDIA H200" in result.stdout, result.output

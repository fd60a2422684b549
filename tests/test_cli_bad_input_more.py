"""More user mistakes the CLI used to answer with a traceback, a soak without end, or files where
they were not wanted, checked through the real command line on temporary files: a kernel file of
the user's own that cannot be imported, a results database with a table gone, a corrupt best
config read by profile, --soak nan/inf, and an empty --plot."""

from __future__ import annotations

import json
import math
import shutil
import sqlite3
from pathlib import Path

import pytest
import torch
from conftest import assert_one_line_error as _one_line_error
from typer.testing import CliRunner

from omnitune.cli import app
from omnitune.errors import UnknownKernelError
from omnitune.profile.device import current_device_facts


def assert_one_line_error(result, message: str) -> str:
    # The runtime's note that no table is tuned for a GPU may come before the error.
    return _one_line_error(result, message, after_progress=True)

ON_GPU = torch.cuda.is_available()
# conftest imports the kernels interpreted without a GPU and compiled with one; --interpret must match.
MODE = [] if ON_GPU else ["--interpret"]
SHAPE = "t=37,hkv=2,d=64,block_size=16"  # kv_cache_write's: the quickest kernel to run interpreted


def invoke(*args: str):
    return CliRunner().invoke(app, [str(a) for a in args])


def searched_db(tmp_path: Path, trials: int = 1) -> Path:
    db = tmp_path / "omnitune.db"
    result = invoke("search", "kv_cache_write", "--shape", SHAPE, "--dtype", "fp16", *MODE, "--trials", trials,
                    "--db", db)
    assert result.exit_code == 0, result.output
    return db


# --- a kernel file of the user's own that cannot be imported --------------------------------------

BROKEN_MODULES = {
    "syntax": ("def (\n", "SyntaxError: invalid syntax"),
    "raises": ("raise RuntimeError('boom at import')\n", "RuntimeError: boom at import"),
    "dependency": ("import omnitune_no_such_dependency\n", "No module named 'omnitune_no_such_dependency'"),
}


@pytest.mark.parametrize("command", ["lookup", "search", "bench", "verify"])
@pytest.mark.parametrize("broken", sorted(BROKEN_MODULES))
def test_a_kernel_file_that_cannot_be_imported_is_one_line(broken, command, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    source, message = BROKEN_MODULES[broken]
    path = tmp_path / f"broken_{broken}_{command}.py"
    path.write_text(source)
    args = {
        "lookup": ["lookup", path, "--shape", "a=1", "--device", "NVIDIA H200"],
        "search": ["search", path, "--shape", "a=1", *MODE, "--db", tmp_path / "omnitune.db"],
        "bench": ["bench", path, "--shape", "a=1", *MODE],
        "verify": ["verify", "--kernels", path, *MODE],
    }[command]
    line = assert_one_line_error(invoke(*args), message)
    assert f"cannot import kernel {str(path)!r}" in line
    assert not (tmp_path / "omnitune.db").exists()


def test_a_module_that_cannot_be_imported_is_one_line_and_debug_shows_where(tmp_path, monkeypatch):
    package = tmp_path / "userkernels_broken"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "mine.py").write_text("x = 1\nraise ValueError('bad constant in my kernel')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    line = assert_one_line_error(invoke("lookup", "userkernels_broken.mine", "--shape", "a=1", "--device", "X"),
                                 "ValueError: bad constant in my kernel")
    assert "--debug" in line
    # --debug: the traceback, down to the user's own line.
    result = invoke("--debug", "lookup", "userkernels_broken.mine", "--shape", "a=1", "--device", "X")
    assert isinstance(result.exception, UnknownKernelError)
    assert isinstance(result.exception.__cause__, ValueError)


# --- a results database with a table gone ----------------------------------------------------------


@pytest.mark.parametrize("dropped", [["DROP VIEW best", "DROP TABLE trials"], ["DROP TABLE search_runs"]],
                         ids=["trials", "search_runs"])
def test_a_database_missing_a_table_is_refused_before_the_search(dropped, tmp_path):
    db = searched_db(tmp_path)
    conn = sqlite3.connect(db)
    for statement in dropped:
        conn.execute(statement)
    conn.commit()
    conn.close()
    result = invoke("search", "kv_cache_write", "--shape", SHAPE, "--dtype", "fp16", *MODE, "--trials", 3,
                    "--db", db)
    assert_one_line_error(result, "is a damaged omnitune results database")
    assert "trial 2/3" not in result.stdout  # refused up front, not after measuring


# --- profile --config tuned: the database's best config, corrupt -----------------------------------


def test_profile_of_a_corrupt_best_config_in_the_database_is_one_line(tmp_path, monkeypatch):
    from omnitune.cli import profile_cmd
    from omnitune.profile import ncu

    db = searched_db(tmp_path)
    conn = sqlite3.connect(db)
    conn.execute("UPDATE trials SET config_json = '{\"BLOCK_H\": 1,'")
    conn.commit()
    conn.close()
    # As on a GPU with ncu whose tables do not answer this shape: the database's best is asked for.
    device_name = current_device_facts(interpret=not ON_GPU).name
    monkeypatch.setattr(profile_cmd, "_require_gpu", lambda what: None)
    monkeypatch.setattr(profile_cmd, "_tuned_from_runtime", lambda *args: None)
    monkeypatch.setattr(ncu, "ncu_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *args: device_name)
    profiled = []
    monkeypatch.setattr(ncu, "profile_config", lambda *args: profiled.append(args))
    result = invoke("profile", "kv_cache_write", "--shape", SHAPE, "--dtype", "fp16", "--db", db)
    assert_one_line_error(result, "the best kv_cache_write config in the results database")
    assert profiled == []


# --- verify --soak: minutes that are a number, and that end ----------------------------------------


@pytest.mark.parametrize("minutes", ["nan", "inf", "-inf"])
def test_verify_soak_that_is_not_a_finite_number_is_one_line(minutes, tmp_path):
    result = invoke("verify", "--tables", tmp_path / "no-tables", "--model", "qwen2.5-omni-7b", *MODE,
                    "--soak", minutes)
    assert_one_line_error(result, f"--soak {minutes}: give a positive number of minutes")


@pytest.mark.parametrize("minutes", ["1e308", "10081"])
def test_verify_soak_longer_than_a_week_is_one_line(minutes, tmp_path):
    # 1e308 minutes overflowed to infinite seconds: a soak that never ends, its report never written.
    result = invoke("verify", "--tables", tmp_path / "no-tables", "--model", "qwen2.5-omni-7b", *MODE,
                    "--soak", minutes)
    assert_one_line_error(result, "give a positive number of minutes, at most 10080 (a week)")


def test_verify_soak_of_a_week_is_taken(tmp_path, monkeypatch):
    from omnitune.errors import OmnituneError
    from omnitune.verify import pipeline

    asked = []

    def stop_before_running(options, *args, **kwargs):
        asked.append(options.soak_minutes)
        raise OmnituneError("stopped before running")

    monkeypatch.setattr(pipeline, "run_verify", stop_before_running)
    (tmp_path / "tables").mkdir()
    result = invoke("verify", "--tables", tmp_path / "tables", "--model", "qwen2.5-omni-7b", *MODE, "--soak", "10080")
    assert_one_line_error(result, "stopped before running")
    assert asked == [10080.0]


# --- report --plot '': not the current folder --------------------------------------------------------


@pytest.mark.parametrize("plot", ["", " "])
def test_report_plot_empty_is_one_line_and_writes_nothing(plot, tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    db = searched_db(tmp_path)
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    assert_one_line_error(invoke("report", "--db", db, "--plot", plot), "--plot is empty")
    assert list(here.iterdir()) == []


def test_report_plot_names_the_figure_it_cannot_write(tmp_path):
    pytest.importorskip("matplotlib")
    db = searched_db(tmp_path)
    plots = tmp_path / "plots"
    assert invoke("report", "--db", db, "--plot", plots).exit_code == 0
    figure = sorted(plots.iterdir())[0]
    figure.unlink()
    figure.mkdir()  # a folder where the figure goes
    line = assert_one_line_error(invoke("report", "--db", db, "--plot", plots), f"cannot write the figures to {plots}")
    assert str(figure) in line


# --- export into a folder the runtime does not read ---------------------------------------------


def test_export_says_when_the_runtime_would_not_read_its_folder(tmp_path, monkeypatch):
    """The default ./tuned_configs is read only in omnitune's own checkout: tables exported
    elsewhere went unused without a word. Listed in OMNITUNE_CONFIG_DIR, no note."""
    db = searched_db(tmp_path)
    out = tmp_path / "tables"
    monkeypatch.delenv("OMNITUNE_CONFIG_DIR", raising=False)
    first = invoke("export", "--db", db, "--out", out)
    assert first.exit_code == 0, first.output
    assert f"OMNITUNE_CONFIG_DIR={out.resolve()}" in first.stderr
    monkeypatch.setenv("OMNITUNE_CONFIG_DIR", str(out))
    again = invoke("export", "--db", db, "--out", out)
    assert again.exit_code == 0, again.output
    assert "does not read" not in again.stderr


# --- a results database with damaged pages ----------------------------------------------------------


def damage_trials_pages(db: Path) -> None:
    """Overwrite the page that holds the trials table's rows, as a copy cut short or a disk error
    leaves it: the file still opens and its schema still reads, only those rows do not."""
    with sqlite3.connect(db) as conn:
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        (root,) = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'trials'").fetchone()
    conn.close()
    with open(db, "r+b") as f:
        f.seek((root - 1) * page_size)
        f.write(b"\xff" * page_size)


@pytest.mark.parametrize("command", ["report", "export"])
def test_report_and_export_of_a_database_with_damaged_pages_are_one_line(command, tmp_path):
    db = searched_db(tmp_path)
    damage_trials_pages(db)
    out = tmp_path / "tables"
    args = {"report": ["report", "--db", db], "export": ["export", "--db", db, "--out", out]}[command]
    assert_one_line_error(invoke(*args), f"{db} is a damaged omnitune results database")
    assert not out.exists()


@pytest.mark.parametrize("folder", ["plain", "runs; old"])
def test_plan_from_a_database_with_damaged_pages_says_so_and_assumes_its_timings(folder, tmp_path):
    """plan works without a database (assumed timings), so it goes on; but a file whose trials'
    pages are damaged still reads its search_runs, and plan said "no searches on a GPU" in it. A
    path holding "; " is named whole (the message was cut at its first ";")."""
    (tmp_path / folder).mkdir()
    db = searched_db(tmp_path / folder)
    damage_trials_pages(db)
    result = invoke("plan", "--model", "qwen2.5-omni-7b", "--kernels", "kv_cache_write", "--db", db)
    assert result.exit_code == 0, result.output
    [total] = [line for line in result.stdout.splitlines() if line.startswith("total ")]
    assert "assumed" in total and f"{db} is a damaged omnitune results database (" in total
    assert "no searches" not in result.stdout


def test_a_search_into_a_database_with_damaged_pages_is_refused_before_it_runs(tmp_path):
    db = searched_db(tmp_path)
    damage_trials_pages(db)
    damaged = db.read_bytes()
    result = invoke("search", "kv_cache_write", "--shape", SHAPE, "--dtype", "fp16", *MODE, "--trials", 3,
                    "--db", db)
    assert_one_line_error(result, "is a damaged omnitune results database")
    assert "trial 2/3" not in result.stdout  # refused up front, not after measuring
    assert db.read_bytes() == damaged


# --- export of a database whose best rows cannot make entries ---------------------------------------


def test_export_of_best_rows_that_make_no_entry_does_not_say_no_trial_ran_ok(tmp_path, caplog):
    db = searched_db(tmp_path)
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE trials SET config_json = '[1, 2]'")
    conn.close()
    result = invoke("export", "--db", db, "--out", tmp_path / "tables")
    assert result.exit_code == 0, result.output
    assert "no trial there ran ok" not in result.stdout
    assert "the best trial of each of its problems cannot make a table entry" in result.stdout
    assert "cannot make a table entry (changed by hand, or corrupt)" in caplog.text  # the warning it points to


# --- export of trials whose times no measurement gives ----------------------------------------------


@pytest.fixture(scope="module")
def three_trials_db(tmp_path_factory) -> Path:
    """A database searched for 3 trials, copied by each test that changes it."""
    return searched_db(tmp_path_factory.mktemp("three_trials"), trials=3)


@pytest.mark.parametrize("time_ms", [-3.6, 0.0, math.inf], ids=["negative", "zero", "inf"])
@pytest.mark.parametrize("row", ["fastest", "default"])
def test_export_leaves_out_a_trial_whose_time_is_impossible(row, time_ms, three_trials_db, tmp_path, caplog):
    """A time that is zero, negative or infinite, written by hand or by a corrupt writer, went into the
    table as it was (-3.6 ms, -62x the default) and verify passed it: it is left out with the
    warning of rows that cannot make an entry, and the key's best measured trial makes its entry."""
    db = tmp_path / "omnitune.db"
    shutil.copy(three_trials_db, db)
    with sqlite3.connect(db) as conn:
        times = dict(conn.execute("SELECT trial_number, time_ms FROM trials WHERE status = 'ok'").fetchall())
        (default,) = conn.execute("SELECT trial_number FROM trials WHERE is_default = 1").fetchone()
        others = {n: t for n, t in times.items() if n != default}
        changed = default if row == "default" else min(others, key=others.get)
        conn.execute("UPDATE trials SET time_ms = ? WHERE trial_number = ?", (time_ms, changed))
    conn.close()
    assert len(times) == 3, times
    out = tmp_path / "tables"
    result = invoke("export", "--db", db, "--out", out)
    assert result.exit_code == 0, result.output
    [path] = (out / "kv_cache_write").glob("*.json")
    [entry] = json.loads(path.read_text())["entries"].values()
    best = min(t for n, t in times.items() if n != changed)
    assert entry["time_ms"] == pytest.approx(best)
    if row == "default":  # the default's time is not known: no speedup over it, rather than an impossible one
        assert entry["speedup_vs_default"] is None
    else:
        assert entry["speedup_vs_default"] == pytest.approx(times[default] / best)
    assert (f"trial {changed}: time_ms {time_ms!r} is not a positive number of milliseconds" in caplog.text
            and "cannot make a table entry (changed by hand, or corrupt)" in caplog.text)


def _with_one_time_changed(three_trials_db: Path, tmp_path: Path, time_ms: float) -> tuple[Path, dict, int]:
    """A copy of the three-trial database with the fastest non-default trial's time set to time_ms:
    (the copy, every ok trial's time before, the trial changed)."""
    db = tmp_path / "omnitune.db"
    shutil.copy(three_trials_db, db)
    with sqlite3.connect(db) as conn:
        times = dict(conn.execute("SELECT trial_number, time_ms FROM trials WHERE status = 'ok'").fetchall())
        (default,) = conn.execute("SELECT trial_number FROM trials WHERE is_default = 1").fetchone()
        changed = min((n for n in times if n != default), key=times.get)
        conn.execute("UPDATE trials SET time_ms = ? WHERE trial_number = ?", (time_ms, changed))
    conn.close()
    return db, times, changed


@pytest.mark.parametrize("time_ms", [-3.6, 0.0, math.inf], ids=["negative", "zero", "inf"])
def test_report_counts_a_trial_whose_time_is_impossible_as_a_failure(time_ms, three_trials_db, tmp_path):
    """report showed the -3.6 ms trial as its key's best (export left it out, so the two disagreed):
    it is counted among the failures as impossible_time, and the best measured trial is the best."""
    db, times, changed = _with_one_time_changed(three_trials_db, tmp_path, time_ms)
    result = invoke("report", "--db", db, "--format", "json")
    assert result.exit_code == 0, result.output
    [row] = json.loads(result.stdout)
    assert row["time_ms"] == pytest.approx(min(t for n, t in times.items() if n != changed))
    assert row["failures"] == "impossible_time 1"
    assert row["ok_trials"] == len(times) - 1


def test_export_drops_a_kept_entry_whose_recorded_time_is_impossible(three_trials_db, tmp_path, caplog):
    """An entry of the file merged into, written by an export from before impossible times were
    left out, chose its config by a -3.6 ms trial: it is dropped with the warning of invalid entries
    rather than kept; a sound entry of the same file is kept."""
    out = tmp_path / "tables"
    assert invoke("export", "--db", three_trials_db, "--out", out).exit_code == 0
    [path] = (out / "kv_cache_write").glob("*.json")
    document = json.loads(path.read_text())
    [(key, entry)] = document["entries"].items()
    other_key = key.replace("t=37", "t=38")
    bad_key = key.replace("t=37", "t=39")
    assert other_key != key and bad_key != key, key
    document["entries"][other_key] = dict(entry, problem=dict(entry["problem"], t=38))
    document["entries"][bad_key] = dict(entry, problem=dict(entry["problem"], t=39), default_time_ms=-3.6)
    path.write_text(json.dumps(document))
    result = invoke("export", "--db", three_trials_db, "--out", out)
    assert result.exit_code == 0, result.output
    kept = json.loads(path.read_text())["entries"]
    assert set(kept) == {key, other_key}
    assert ("dropping 1 invalid entries" in caplog.text
            and "default_time_ms -3.6 is not a positive number of milliseconds" in caplog.text)


def test_a_blank_omnitune_db_and_a_tables_file_are_one_line_each(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OMNITUNE_DB", "  ")
    assert_one_line_error(invoke("report"), "OMNITUNE_DB is blank")
    assert list(tmp_path.iterdir()) == []
    monkeypatch.delenv("OMNITUNE_DB")
    table_file = tmp_path / "t.json"
    table_file.write_text("{}")
    assert_one_line_error(invoke("verify", *MODE, "--tables", table_file), f"--tables {table_file}: is a file")


@pytest.mark.skipif(ON_GPU, reason="says what it does without a GPU")
def test_devices_without_a_gpu_says_so_on_stderr_only():
    result = invoke("devices")
    assert result.exit_code == 1 and result.stdout == ""
    assert result.stderr.startswith("No CUDA GPU is visible here (") and len(result.stderr.splitlines()) == 1

"""The results database: migrations, rows, the `best` view, and rebuilding the catalogue from
Optuna's studies."""

from __future__ import annotations

import dataclasses
import logging
import math
import signal
import sqlite3
import subprocess
import sys
import time

import optuna
import pytest
from optuna.distributions import IntDistribution

from omnitune.errors import StoreError
from omnitune.profile.device import DeviceFacts, current_device_facts
from omnitune.trial import TrialResult, TrialStatus
from omnitune.spec import Config
from omnitune.store import (
    SCHEMA_VERSION,
    STUDY_ATTR,
    ProfileKind,
    ProfileRecord,
    Provenance,
    StudyFacts,
    TrialRecord,
    catalogue_record,
    default_storage_url,
    finished_trial_attrs,
    open_db,
    open_optuna_storage,
    rebuild_catalogue,
    record_calibration,
    record_device,
    record_profile,
    record_trial,
    result_from_attrs,
    schema_version,
)

optuna.logging.set_verbosity(optuna.logging.WARNING)

BASE = TrialRecord(
    study="attention|b=1|fp16|NVIDIA_H200", trial_number=0, kernel="attention", problem_key="b=1",
    problem_json='{"b": 1}', dtype="fp16", device_key="NVIDIA_H200", device_name="NVIDIA H200",
    sampler="tpe", config_json='{"BLOCK_M": 64}', config_label="BLOCK_M=64", status="ok", time_ms=2.0,
    p20_ms=1.9, p80_ms=2.1, rel_error=1e-4, tflops=100.0, tbps=1.0, detail="", representative=True,
    is_default=False, extra_json="{}", source_hash="abc", torch_version="2.11", triton_version="3.6",
    omnitune_version="0.1.0", measured_at="2026-11-29T12:00:00+00:00",
)


def trial(number: int, **changes) -> TrialRecord:
    return dataclasses.replace(BASE, trial_number=number, **changes)


@pytest.fixture
def db(tmp_path):
    return open_db(tmp_path / "results.db")


# --- opening and migrating --------------------------------------------------------------------


def test_open_db_creates_its_folder_and_applies_the_migrations_once(tmp_path):
    path = tmp_path / "nested" / "deeper" / "omnitune.db"
    db = open_db(path)
    assert path.is_file()
    assert {"migrations", "trials", "devices", "calibrations", "profiles", "search_runs"} <= set(db.table_names())
    assert db.view_names() == ["best"]
    assert schema_version(db) == SCHEMA_VERSION == 6
    record_trial(db, trial(0))
    db.conn.close()

    again = open_db(path)
    assert [r["version"] for r in again.query("SELECT version FROM migrations")] == [1, 2, 3, 4, 5, 6]
    assert again.execute("SELECT COUNT(*) FROM trials").fetchone()[0] == 1


def _open_at_once(path, barrier, failures):
    barrier.wait()
    try:
        open_db(path).conn.close()
    except Exception as exc:  # noqa: BLE001 — reported to the test
        failures.put(f"{type(exc).__name__}: {exc}")


def test_processes_opening_one_new_database_at_once_all_open_it(tmp_path):
    # Workers a scheduler starts together each saw the new file empty and migrated it: all but
    # one failed ("table trials already exists", "database is locked").
    import multiprocessing

    context = multiprocessing.get_context("fork")
    failures = context.Queue()
    for round_ in range(6):
        path, barrier = tmp_path / f"new-{round_}.db", context.Barrier(4)
        processes = [context.Process(target=_open_at_once, args=(path, barrier, failures)) for _ in range(4)]
        for process in processes:
            process.start()
        for process in processes:
            process.join(60)
        assert [process.exitcode for process in processes] == [0] * 4
        db = open_db(path)
        assert [r["version"] for r in db.query("SELECT version FROM migrations")] == list(range(1, SCHEMA_VERSION + 1))
        db.conn.close()
    found = []
    while not failures.empty():
        found.append(failures.get())
    assert found == []


def test_trial_record_fields_are_the_schema_columns(db):
    """TrialRecord defines the catalogue: the migrated table, the best view and what report reads
    all have its columns, in its order."""
    from omnitune import report
    from omnitune.store import TRIAL_COLUMNS

    fields = [f.name for f in dataclasses.fields(TrialRecord)]
    assert [row[1] for row in db.execute("PRAGMA table_info(trials)").fetchall()] == fields
    assert [row[1] for row in db.execute("PRAGMA table_info(best)").fetchall()] == fields + [
        "default_time_ms", "speedup_over_default"]
    assert list(TRIAL_COLUMNS) == report.TRIAL_COLUMNS == fields


def test_a_file_that_is_not_sqlite_is_a_store_error(tmp_path):
    path = tmp_path / "notes.db"
    path.write_text("these are my notes, not a database\n" * 100)
    with pytest.raises(StoreError, match=r"notes\.db' is not an omnitune results database: "):
        open_db(path)


def test_a_database_that_cannot_be_read_now_is_not_called_foreign(db, monkeypatch):
    """An I/O error or a lock while reading is said as such, not as 'not an omnitune results
    database' (which sends a user after a file that is fine); a foreign file still is."""
    import pandas as pd

    from omnitune.store import read_trials

    record_trial(db, trial(0))
    path = db.conn.execute("PRAGMA database_list").fetchone()[2]

    def io_error(*args, **kwargs):
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(pd, "read_sql_query", io_error)
    with pytest.raises(StoreError, match=r"^cannot read .*results\.db: disk I/O error$"):
        read_trials(path)


def test_another_applications_sqlite_file_is_a_store_error(tmp_path):
    path = tmp_path / "other.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY)")
    conn.commit()
    conn.close()
    with pytest.raises(StoreError, match="holds tables .*customers.* but no migrations table"):
        open_db(path)


def test_a_database_from_a_newer_omnitune_is_refused(tmp_path):
    path = tmp_path / "future.db"
    db = open_db(path)
    db.execute("INSERT INTO migrations (version, name, applied_at) VALUES (99, 'future', 'x')")
    db.conn.commit()
    db.conn.close()
    with pytest.raises(StoreError, match="schema version 99, newer than this omnitune knows"):
        open_db(path)


def test_a_folder_is_not_a_database(tmp_path):
    with pytest.raises(StoreError, match="is a folder"):
        open_db(tmp_path)


def test_default_storage_is_a_journal_beside_the_results_database(tmp_path):
    url = default_storage_url(tmp_path / "runs" / "h200.db")
    assert url == f"journal:///{tmp_path.resolve()}/runs/h200.optuna.log"
    storage = open_optuna_storage(url)
    assert isinstance(storage, optuna.storages.JournalStorage)
    assert (tmp_path / "runs" / "h200.optuna.log").is_file()


def test_default_storage_stays_the_sqlite_file_a_database_was_searched_with(tmp_path):
    legacy = tmp_path / "h200.optuna.db"
    open_optuna_storage(f"sqlite:///{legacy}")
    assert default_storage_url(tmp_path / "h200.db") == f"sqlite:///{legacy.resolve()}"


def test_a_journal_cannot_keep_heartbeats(tmp_path):
    with pytest.raises(StoreError, match="workers with heartbeats need an RDB storage"):
        open_optuna_storage(f"journal:///{tmp_path / 'j.log'}", heartbeat_interval_s=10)


def test_a_corrupt_journal_is_a_store_error(tmp_path):
    path = tmp_path / "j.log"
    path.write_text('{"op_code": 0, "worker_id": "w"\n{"op_code": 0}\n')
    with pytest.raises(StoreError, match="cannot open the Optuna journal"):
        open_optuna_storage(f"journal:///{path}")


def test_a_search_killed_while_writing_the_journal_leaves_it_unlocked(tmp_path):
    path = tmp_path / "j.log"
    holder = subprocess.run([sys.executable, "-c", (
        "import os, signal, sys\n"
        "from omnitune.store import open_optuna_storage\n"
        "storage = open_optuna_storage('journal:///' + sys.argv[1])\n"
        "storage._backend._lock.acquire()\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"), str(path)], capture_output=True, timeout=120)
    assert holder.returncode == -signal.SIGKILL, holder.stderr
    started = time.monotonic()
    storage = open_optuna_storage(f"journal:///{path}")
    optuna.create_study(study_name="after the kill", storage=storage)  # writes: takes the lock
    assert time.monotonic() - started < 10  # not Optuna's 30 s grace period for a lock left behind
    assert [s.study_name for s in open_optuna_storage(f"journal:///{path}").get_all_studies()] == ["after the kill"]


def test_a_journal_url_must_name_a_file(tmp_path):
    with pytest.raises(StoreError, match="must name a file"):
        open_optuna_storage(f"journal:///{tmp_path}")


# --- rows ---------------------------------------------------------------------------------------


def test_record_trial_replaces_the_row_of_the_same_study_and_trial_number(db):
    record_trial(db, trial(3, status="ok", time_ms=2.0))
    record_trial(db, trial(3, status="mismatch", time_ms=None, detail="relative error 0.7"))
    record_trial(db, trial(3, study="attention|b=2|fp16|NVIDIA_H200", problem_key="b=2"))
    rows = list(db.query("SELECT study, trial_number, status, time_ms, detail FROM trials ORDER BY study"))
    assert rows == [
        {"study": "attention|b=1|fp16|NVIDIA_H200", "trial_number": 3, "status": "mismatch",
         "time_ms": None, "detail": "relative error 0.7"},
        {"study": "attention|b=2|fp16|NVIDIA_H200", "trial_number": 3, "status": "ok",
         "time_ms": 2.0, "detail": ""},
    ]


def test_nan_figures_become_null_and_an_infinite_error_is_kept(db):
    record_trial(db, trial(0, status="mismatch", time_ms=math.nan, rel_error=math.inf))
    row = next(db.query("SELECT time_ms, rel_error, representative, is_default FROM trials"))
    assert row["time_ms"] is None and row["rel_error"] == math.inf
    assert row["representative"] == 1 and row["is_default"] == 0


def test_best_view_takes_the_fastest_ok_trial_per_key_with_the_default_beside_it(db):
    record_trial(db, trial(0, time_ms=3.0, is_default=True))
    record_trial(db, trial(1, time_ms=1.5, config_label="tie, earlier"))
    record_trial(db, trial(2, time_ms=1.5, config_label="tie, later"))
    record_trial(db, trial(3, status="mismatch", time_ms=None))
    record_trial(db, trial(4, status="compile_error", time_ms=None))
    # another key: its default failed, so there is no default time to compare with
    other = dict(study="attention|b=1|fp32|NVIDIA_H200", dtype="fp32")
    record_trial(db, trial(0, **other, status="mismatch", time_ms=None, is_default=True))
    record_trial(db, trial(1, **other, time_ms=5.0))
    rows = {r["dtype"]: r for r in db.query("SELECT * FROM best")}
    assert set(rows) == {"fp16", "fp32"}
    assert rows["fp16"]["trial_number"] == 1 and rows["fp16"]["config_label"] == "tie, earlier"
    assert rows["fp16"]["default_time_ms"] == 3.0
    assert rows["fp16"]["speedup_over_default"] == pytest.approx(2.0)
    assert rows["fp32"]["trial_number"] == 1 and rows["fp32"]["default_time_ms"] is None


def test_a_key_with_no_ok_trial_has_no_best(db):
    record_trial(db, trial(0, status="mismatch", time_ms=None))
    assert list(db.query("SELECT * FROM best")) == []


def test_record_device_keeps_one_row_per_device(db):
    facts = current_device_facts(interpret=True)
    record_device(db, facts)
    record_device(db, dataclasses.replace(facts, torch="9.9"))
    rows = list(db.query("SELECT * FROM devices"))
    assert len(rows) == 1
    assert rows[0]["key"] == "triton_interpreter" and rows[0]["torch"] == "9.9"
    assert rows[0]["last_seen"].endswith("+00:00")


def test_record_calibration_replaces_per_metric_and_rejects_unknown_metrics(db):
    record_calibration(db, "NVIDIA_H200", "copy_tbps", 4.1, {"bytes": 2**30})
    record_calibration(db, "NVIDIA_H200", "copy_tbps", 4.25, {"bytes": 2**31})
    record_calibration(db, "NVIDIA_H200", "matmul_bf16_tflops", 698.0, {})
    rows = list(db.query("SELECT metric, value, detail_json FROM calibrations ORDER BY metric"))
    assert rows == [
        {"metric": "copy_tbps", "value": 4.25, "detail_json": '{"bytes": 2147483648}'},
        {"metric": "matmul_bf16_tflops", "value": 698.0, "detail_json": "{}"},
    ]
    with pytest.raises(StoreError, match="unknown calibration metric 'flops'; use one of copy_tbps"):
        record_calibration(db, "NVIDIA_H200", "flops", 1.0)


def test_record_profile_appends_rows_with_canonical_config_text(db):
    record = ProfileRecord(
        kernel="attention", problem_key="b=1", dtype="bf16", device_key="NVIDIA_H200",
        config=Config(num_warps=4, BLOCK_M=64), which=ProfileKind.TUNED, duration_us=812.5,
        l2_hit_pct=71.0, raw={"lts__t_sector_hit_rate.pct": 71.0},
    )
    first = record_profile(db, record)
    second = record_profile(db, dataclasses.replace(record, which=ProfileKind.DEFAULT))
    assert second == first + 1
    rows = list(db.query("SELECT * FROM profiles ORDER BY id"))
    assert rows[0]["config_json"] == '{"BLOCK_M": 64, "num_warps": 4}'
    assert rows[0]["config_label"] == "BLOCK_M=64 num_warps=4"
    assert [r["which"] for r in rows] == ["tuned", "default"]
    assert rows[0]["l1_hit_pct"] is None and rows[0]["duration_us"] == 812.5


# --- the Optuna contract and rebuilding ----------------------------------------------------------

FACTS = StudyFacts(
    kernel="toy", problem_key="n=8", problem_json='{"n": 8}', dtype="fp16", device_key="Fake_GPU",
    device_name="Fake GPU",
)
PROVENANCE = Provenance(source_hash="0123456789abcdef", torch="2.11", triton="3.6", omnitune="0.1.0",
                        device_name="Fake GPU")
DISTRIBUTIONS = {"BLOCK_M": IntDistribution(0, 3)}


def store_trial(study: optuna.Study, result: TrialResult, value: float, *, is_default: bool = False) -> None:
    trial = study.ask(DISTRIBUTIONS)
    for key, attr in finished_trial_attrs(
        result, is_default=is_default, sampler="random", provenance=PROVENANCE, measured_at="2026-11-29T12:00:00+00:00"
    ).items():
        trial.set_user_attr(key, attr)
    study.tell(trial, value)


def make_study(storage_url: str, facts: StudyFacts = FACTS) -> optuna.Study:
    study = optuna.create_study(study_name=facts.name, storage=open_optuna_storage(storage_url))
    study.set_user_attr(STUDY_ATTR, facts.as_user_attr())
    return study


def test_trial_attrs_round_trip_to_the_same_result():
    result = TrialResult(Config(BLOCK_M=64, PACK=True), TrialStatus.OK, time_ms=1.25, p20_ms=1.2, p80_ms=1.3,
                         rel_error=2e-4, tflops=300.0, tbps=2.5, representative=False, extra={"power_w": 412.0})
    attrs = finished_trial_attrs(result, is_default=True, sampler="tpe", provenance=PROVENANCE, measured_at="t")
    assert result_from_attrs(attrs) == result
    failed = TrialResult(Config(BLOCK_M=16), TrialStatus.LAUNCH_ERROR, detail="RuntimeError: boom")
    back = result_from_attrs(finished_trial_attrs(failed, is_default=False, sampler="tpe",
                                                  provenance=PROVENANCE, measured_at="t"))
    assert back.status is TrialStatus.LAUNCH_ERROR and back.detail == "RuntimeError: boom"
    assert back.time_ms == math.inf and math.isnan(back.rel_error)


@pytest.mark.parametrize("kind", ["sqlite", "journal"])
def test_rebuild_catalogue_rederives_every_row_from_the_studies(db, tmp_path, kind, caplog):
    storage_url = {"sqlite": f"sqlite:///{tmp_path / 'studies.optuna.db'}",
                   "journal": f"journal:///{tmp_path / 'studies.optuna.log'}"}[kind]
    study = make_study(storage_url)
    store_trial(study, TrialResult(Config(BLOCK_M=64), TrialStatus.OK, time_ms=2.0, rel_error=1e-5,
                                   tflops=10.0, tbps=0.1), 2.0, is_default=True)
    store_trial(study, TrialResult(Config(BLOCK_M=32), TrialStatus.OK, time_ms=1.0, rel_error=1e-5,
                                   tflops=20.0, tbps=0.2), 1.0)
    store_trial(study, TrialResult(Config(BLOCK_M=128), TrialStatus.PRUNED, detail="tile_area: too big"), 20.0)
    interrupted = study.ask(DISTRIBUTIONS)  # told FAIL: measured nothing, so no row
    study.tell(interrupted, state=optuna.trial.TrialState.FAIL)
    study.ask(DISTRIBUTIONS)  # still running: no row
    foreign = optuna.create_study(study_name="not omnitune's", storage=open_optuna_storage(storage_url))
    foreign.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)

    # a row of a study kept in another storage (a row of this study that the storage lacks is
    # refused, never dropped: tests/test_cli_no_loss.py)
    record_trial(db, trial(0, study="elsewhere|x|fp16|GPU"))

    caplog.set_level(logging.WARNING, logger="omnitune.store")
    assert rebuild_catalogue(db, storage_url) == 3
    rows = list(db.query("SELECT * FROM trials WHERE study = ? ORDER BY trial_number", [FACTS.name]))
    assert [r["trial_number"] for r in rows] == [0, 1, 2]
    assert [r["status"] for r in rows] == ["ok", "ok", "pruned"]
    assert rows[0]["is_default"] == 1 and rows[1]["is_default"] == 0
    assert rows[2]["detail"] == "tile_area: too big" and rows[2]["time_ms"] is None
    assert rows[1]["source_hash"] == "0123456789abcdef" and rows[1]["sampler"] == "random"
    assert rows[1]["config_json"] == '{"BLOCK_M": 32}' and rows[1]["device_name"] == "Fake GPU"
    assert db.execute("SELECT COUNT(*) FROM trials WHERE study = 'elsewhere|x|fp16|GPU'").fetchone()[0] == 1
    best = next(db.query("SELECT * FROM best WHERE kernel = 'toy'"))
    assert best["trial_number"] == 1 and best["default_time_ms"] == 2.0

    # Rebuilding twice changes nothing.
    before = list(db.query("SELECT * FROM trials ORDER BY study, trial_number"))
    rebuild_catalogue(db, storage_url)
    assert list(db.query("SELECT * FROM trials ORDER BY study, trial_number")) == before
    assert not caplog.records


def test_catalogue_record_is_none_for_a_trial_that_measured_nothing():
    assert catalogue_record(FACTS, 4, {"duplicate_of": 1}) is None
    assert catalogue_record(FACTS, 4, {"config_json": '{"BLOCK_M": 16}', "owner": "h:1"}) is None


def test_an_unreachable_storage_is_a_store_error(db):
    with pytest.raises(StoreError, match="cannot open the Optuna storage 'nosuchdb://x'"):
        rebuild_catalogue(db, "nosuchdb://x")


def test_device_facts_key_files_the_interpreter_apart():
    facts = current_device_facts(interpret=True)
    assert isinstance(facts, DeviceFacts) and facts.key == "triton_interpreter"


def test_a_write_sqlite_refuses_mid_run_is_one_store_error_that_says_what_may_have_changed(db, monkeypatch):
    def refuses(*args, **kwargs):
        raise sqlite3.OperationalError("disk I/O error")  # all SQLite says of a file made immutable

    monkeypatch.setattr(db, "execute", refuses)
    with pytest.raises(StoreError, match=r"disk I/O error \(was the file or its folder made read-only"):
        record_trial(db, trial(0))

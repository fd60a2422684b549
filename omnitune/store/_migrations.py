"""Opening the results database and bringing its schema up to date.

Each migration is a numbered list of SQL statements, applied once, in order, inside one
transaction together with its row in the `migrations` table: a database is always at exactly
one schema version, never half-way between two. A later schema change is a new numbered entry
at the end of MIGRATIONS; released entries are never edited.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import sqlite_utils

from omnitune.errors import StoreError

# The `trials` table as migration 1 created it. A released schema, so a literal that is never
# edited: deriving it from TrialRecord (the definition the code reads and writes) would rewrite
# migration 1 the day a column is added, and a later ALTER TABLE would then add it twice. A new
# column is a field of TrialRecord plus a migration; tests/test_store.py checks that the migrated
# table has exactly TrialRecord's columns.
TRIALS_V1_COLUMNS: tuple[tuple[str, str], ...] = (
    ("study", "TEXT NOT NULL"),
    ("trial_number", "INTEGER NOT NULL"),
    ("kernel", "TEXT NOT NULL"),
    ("problem_key", "TEXT NOT NULL"),
    ("problem_json", "TEXT NOT NULL"),
    ("dtype", "TEXT NOT NULL"),
    ("device_key", "TEXT NOT NULL"),
    ("device_name", "TEXT"),
    ("sampler", "TEXT"),
    ("config_json", "TEXT NOT NULL"),
    ("config_label", "TEXT"),
    ("status", "TEXT NOT NULL"),
    ("time_ms", "REAL"),
    ("p20_ms", "REAL"),
    ("p80_ms", "REAL"),
    ("rel_error", "REAL"),
    ("tflops", "REAL"),
    ("tbps", "REAL"),
    ("detail", "TEXT"),
    ("representative", "INTEGER NOT NULL"),
    ("is_default", "INTEGER NOT NULL"),
    ("extra_json", "TEXT NOT NULL DEFAULT '{}'"),
    ("source_hash", "TEXT"),
    ("torch_version", "TEXT"),
    ("triton_version", "TEXT"),
    ("omnitune_version", "TEXT"),
    ("measured_at", "TEXT"),
)

_TRIAL_SELECT = ", ".join(f"r.{name}" for name, _ in TRIALS_V1_COLUMNS)

# The ok trials of the best view (versions 2 and 6), each with its re-timing session (NULL: the
# search's own trial).
_TAGGED = """tagged AS (
                    SELECT trials.*, json_extract(extra_json, '$.finalist.session') AS retime_session
                    FROM trials WHERE status = 'ok' AND time_ms IS NOT NULL
                )"""
# The best view's part that versions 2 and 6 share: given `tagged` (the ok trials, each with its
# re-timing session) and `latest` (per key, the re-timing session to read, if any), the candidates,
# the fastest of them and the default's time — re-timed with them, else the search's.
_BEST_FROM_LATEST = f"""candidates AS (
                    SELECT t.*, l.session IS NOT NULL AS retimed FROM tagged t LEFT JOIN latest l
                        ON l.kernel = t.kernel AND l.problem_key = t.problem_key
                        AND l.dtype = t.dtype AND l.device_key = t.device_key
                    WHERE (l.session IS NULL AND t.retime_session IS NULL) OR t.retime_session = l.session
                ),
                ranked AS (
                    SELECT candidates.*, ROW_NUMBER() OVER (
                        PARTITION BY kernel, problem_key, dtype, device_key
                        ORDER BY time_ms, trial_number) AS position
                    FROM candidates
                ),
                searched_defaults AS (
                    SELECT kernel, problem_key, dtype, device_key, MIN(time_ms) AS time_ms
                    FROM tagged WHERE is_default = 1 AND retime_session IS NULL
                    GROUP BY kernel, problem_key, dtype, device_key
                ),
                retimed_defaults AS (
                    SELECT kernel, problem_key, dtype, device_key, MIN(time_ms) AS time_ms
                    FROM candidates WHERE is_default = 1 AND retimed
                    GROUP BY kernel, problem_key, dtype, device_key
                )
                SELECT {_TRIAL_SELECT}, COALESCE(rd.time_ms, sd.time_ms) AS default_time_ms,
                       COALESCE(rd.time_ms, sd.time_ms) / r.time_ms AS speedup_over_default
                FROM ranked r
                LEFT JOIN retimed_defaults rd ON rd.kernel = r.kernel AND rd.problem_key = r.problem_key
                    AND rd.dtype = r.dtype AND rd.device_key = r.device_key
                LEFT JOIN searched_defaults sd ON sd.kernel = r.kernel AND sd.problem_key = r.problem_key
                    AND sd.dtype = r.dtype AND sd.device_key = r.device_key
                WHERE r.position = 1"""


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    statements: tuple[str, ...]


MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1,
        "trials, devices, calibrations, profiles and the best view",
        (
            "CREATE TABLE trials ("
            + ", ".join(f"{name} {decl}" for name, decl in TRIALS_V1_COLUMNS)
            + ", PRIMARY KEY (study, trial_number))",
            "CREATE INDEX trials_by_key ON trials (kernel, problem_key, dtype, device_key)",
            """CREATE TABLE devices (
                key TEXT PRIMARY KEY, name TEXT, compute_capability TEXT, multiprocessors INTEGER,
                memory_gib REAL, l2_cache_mib REAL, shared_memory_per_block_kib REAL, driver TEXT,
                cuda TEXT, torch TEXT, triton TEXT, omnitune TEXT, python TEXT, last_seen TEXT)""",
            """CREATE TABLE calibrations (
                device_key TEXT NOT NULL, metric TEXT NOT NULL, value REAL, detail_json TEXT,
                measured_at TEXT, PRIMARY KEY (device_key, metric))""",
            """CREATE TABLE profiles (
                id INTEGER PRIMARY KEY, kernel TEXT NOT NULL, problem_key TEXT NOT NULL,
                dtype TEXT NOT NULL, device_key TEXT NOT NULL, config_json TEXT NOT NULL,
                config_label TEXT, which TEXT NOT NULL, duration_us REAL, l1_hit_pct REAL,
                l2_hit_pct REAL, dram_pct_of_peak REAL, achieved_occupancy_pct REAL, raw_json TEXT,
                measured_at TEXT)""",
            # The best ok trial per key (ties: the earliest trial), the default config's time
            # beside it. A view, so that the catalogue never stores a figure twice.
            f"""CREATE VIEW best AS
                WITH ranked AS (
                    SELECT trials.*, ROW_NUMBER() OVER (
                        PARTITION BY kernel, problem_key, dtype, device_key
                        ORDER BY time_ms, trial_number) AS position
                    FROM trials WHERE status = 'ok' AND time_ms IS NOT NULL
                ),
                defaults AS (
                    SELECT kernel, problem_key, dtype, device_key, MIN(time_ms) AS default_time_ms
                    FROM trials WHERE is_default = 1 AND status = 'ok'
                    GROUP BY kernel, problem_key, dtype, device_key
                )
                SELECT {_TRIAL_SELECT}, d.default_time_ms,
                       d.default_time_ms / r.time_ms AS speedup_over_default
                FROM ranked r LEFT JOIN defaults d
                    ON d.kernel = r.kernel AND d.problem_key = r.problem_key
                    AND d.dtype = r.dtype AND d.device_key = r.device_key
                WHERE r.position = 1""",
        ),
    ),
    Migration(
        2,
        "the best view prefers the finalists' latest re-timing, as report and export do",
        (
            "DROP VIEW best",
            # Per key: where the finalists were re-timed (a trial whose extra_json holds
            # "finalist"), the fastest median of the latest re-timing session, and the default's
            # re-timed median if it was re-timed with them; elsewhere the search's fastest trial
            # and the default's fastest time (omnitune.report.best_per_key).
            f"""CREATE VIEW best AS
                WITH {_TAGGED},
                latest AS (
                    SELECT kernel, problem_key, dtype, device_key, MAX(retime_session) AS session
                    FROM tagged WHERE retime_session IS NOT NULL
                    GROUP BY kernel, problem_key, dtype, device_key
                ),
                {_BEST_FROM_LATEST}""",
        ),
    ),
    Migration(
        3,
        "search_runs: each search's wall time, its fixed costs and its trials, for omnitune plan",
        (
            # The trials' measured_at (to the second, no start time) cannot give the fixed cost
            # before the first trial or the finalists' share: each run records them here.
            """CREATE TABLE search_runs (
                study TEXT NOT NULL, device_key TEXT NOT NULL, device_name TEXT, finished_at TEXT NOT NULL,
                stop_reason TEXT, measured INTEGER NOT NULL, wall_s REAL NOT NULL, setup_s REAL NOT NULL,
                retime_s REAL NOT NULL)""",
        ),
    ),
    Migration(
        4,
        "search_runs: the GPU time each search held, and its wait for the GPU behind other lanes",
        (
            "ALTER TABLE search_runs ADD COLUMN gpu_s REAL",
            "ALTER TABLE search_runs ADD COLUMN lock_wait_s REAL",
        ),
    ),
    Migration(
        5,
        "search_runs: the CPU time each search took, its own process's and its compile workers'",
        (
            "ALTER TABLE search_runs ADD COLUMN cpu_s REAL",
            "ALTER TABLE search_runs ADD COLUMN compile_cpu_s REAL",
        ),
    ),
    Migration(
        6,
        "the best view passes over a re-timing cut short while stored, as report and export do",
        (
            "DROP VIEW best",
            # As version 2's, but a re-timing session counts only when it stored a row for each
            # config it re-timed ($.finalist.configs, absent in rows stored before it was): a
            # process stopped between the winner's row and the default's left a speedup of two
            # measurements taken apart (omnitune.report.frame.in_whole_sessions).
            f"""CREATE VIEW best AS
                WITH {_TAGGED},
                sessions AS (
                    SELECT kernel, problem_key, dtype, device_key, session, COUNT(*) AS stored,
                           MAX(configs) AS configs
                    FROM (SELECT kernel, problem_key, dtype, device_key,
                                 json_extract(extra_json, '$.finalist.session') AS session,
                                 json_extract(extra_json, '$.finalist.configs') AS configs
                          FROM trials WHERE json_valid(extra_json))
                    WHERE session IS NOT NULL
                    GROUP BY kernel, problem_key, dtype, device_key, session
                ),
                latest AS (
                    SELECT t.kernel, t.problem_key, t.dtype, t.device_key, MAX(t.retime_session) AS session
                    FROM tagged t JOIN sessions s
                        ON s.kernel = t.kernel AND s.problem_key = t.problem_key
                        AND s.dtype = t.dtype AND s.device_key = t.device_key AND s.session = t.retime_session
                    WHERE s.configs IS NULL OR s.stored >= s.configs
                    GROUP BY t.kernel, t.problem_key, t.dtype, t.device_key
                ),
                {_BEST_FROM_LATEST}""",
        ),
    ),
)

SCHEMA_VERSION = MIGRATIONS[-1].version


def utc_now() -> str:
    """The current time as ISO-8601 UTC, to the second: every measured_at/last_seen."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@contextmanager
def transaction(db: sqlite_utils.Database, *, immediate: bool = False) -> Iterator[None]:
    """All statements inside commit together or not at all (nested use joins the outer one).
    immediate: take the write lock at the start, so that what is read inside is not changed by
    another writer before this one writes.

    Explicit BEGIN rather than a library helper: sqlite-utils 3 and 4 handle transactions
    differently, and in Python's legacy mode DDL would otherwise commit on its own."""
    conn = db.conn
    if conn.in_transaction:
        yield
        return
    conn.execute("BEGIN IMMEDIATE" if immediate else "BEGIN")
    try:
        yield
    except BaseException:
        conn.rollback()
        raise
    else:
        conn.commit()


def open_db(path: str | Path) -> sqlite_utils.Database:
    """Open (creating it and its folder if needed) the results database at `path` and apply
    any pending migrations. Raises StoreError for a file that is not an omnitune database."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StoreError(f"cannot create the folder for {str(path)!r}: {exc.strerror}") from None
    if path.is_dir():
        raise StoreError(f"{str(path)!r} is a folder, not an omnitune results database")
    _require_writable(path)
    try:
        db = sqlite_utils.Database(path)
        # before anything runs: a damaged page met in the middle of a search was a traceback,
        # after work it could not store
        if (damage := damaged_pages(db.conn)) is not None:
            raise damaged_database(repr(str(path)), damage, "restore it from a copy, or give a new --db")
        _migrate(db, path)
    except sqlite3.OperationalError as exc:  # locked, read-only, no room: a database, but unusable now
        raise StoreError(f"cannot use the results database {str(path)!r}: {exc}") from None
    except sqlite3.DatabaseError as exc:
        raise StoreError(f"{str(path)!r} is not an omnitune results database: {exc}") from None
    return db


def _require_writable(path: Path) -> None:
    """A StoreError unless the database file (if it exists) and its folder can be written: every
    command that opens the database writes to it, and SQLite writes its journal beside the file.
    os.access, not the mode bits: it also says no to root on a read-only mount or an immutable
    file, where SQLite would only fail at the first write, after the work that it was to store."""
    folder = path.parent
    if path.exists() and not os.access(path, os.W_OK):
        raise StoreError(f"cannot write the results database {str(path)!r}: the file is read-only; "
                         "give a writable --db")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise StoreError(f"cannot write the results database {str(path)!r}: its folder {str(folder)!r} is "
                         "read-only (SQLite writes its journal there); give a writable --db")


def damaged_pages(con: sqlite3.Connection) -> str | None:
    """What SQLite's quick_check finds on an open database, on one line, or None where every page
    reads (it reads each once: a fraction of a second for hundreds of thousands of trials). A
    damaged file (a copy cut short, a disk error) opens and reads its schema, then fails at the
    first read of a damaged page; an error that is no damage (locked, no database at all) passes."""
    try:
        found = con.execute("PRAGMA quick_check(1)").fetchone()[0]
    except sqlite3.OperationalError:
        raise
    except sqlite3.DatabaseError as exc:
        if "malformed" not in str(exc):
            raise
        found = str(exc)
    return None if found == "ok" else " ".join(found.split())  # SQLite's report spans lines


def damaged_database(name: str, damage: str, advice: str = "restore it from a copy") -> StoreError:
    """The one refusal of a results database whose pages are damaged (damaged_pages, or a read that
    met SQLite's "malformed"), whoever meets it: open_db, require_intact_pages, a read."""
    return StoreError(f"{name} is a damaged omnitune results database ({damage}); {advice}")


def schema_version(db: sqlite_utils.Database) -> int:
    """The highest migration applied to db (0 for an empty database)."""
    if "migrations" not in db.table_names():
        return 0
    row = db.execute("SELECT MAX(version) FROM migrations").fetchone()
    return int(row[0] or 0)


def _migrate(db: sqlite_utils.Database, path: Path) -> None:
    tables = db.table_names()
    if tables and "migrations" not in tables:
        raise StoreError(
            f"{str(path)!r} is not an omnitune results database: it holds tables "
            f"({', '.join(sorted(tables)[:5])}) but no migrations table"
        )
    current = schema_version(db)
    if current > SCHEMA_VERSION:
        raise StoreError(
            f"{str(path)!r} has schema version {current}, newer than this omnitune knows "
            f"({SCHEMA_VERSION}); upgrade omnitune"
        )
    for migration in MIGRATIONS:
        if migration.version <= current:
            continue
        with transaction(db, immediate=True):
            # Read again under the write lock: processes opening one new file at once (workers a
            # scheduler starts together) each saw it empty, and all but the first found "table
            # trials already exists".
            if schema_version(db) >= migration.version:
                continue
            db.execute(
                "CREATE TABLE IF NOT EXISTS migrations "
                "(version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)"
            )
            for statement in migration.statements:
                db.execute(statement)
            db.execute(
                "INSERT INTO migrations (version, name, applied_at) VALUES (?, ?, ?)",
                (migration.version, migration.name, utc_now()),
            )
    _require_schema_objects(db, path)


# What the migrations make. A file changed by hand (a table dropped, a copy restored in part) can
# record every migration and still lack one: said here, once, rather than as "no such table" in
# the middle of a search.
_SCHEMA_TABLES = ("trials", "devices", "calibrations", "profiles", "search_runs")
_SCHEMA_VIEWS = ("best",)


def _require_schema_objects(db: sqlite_utils.Database, path: Path) -> None:
    tables, views = set(db.table_names()), set(db.view_names())
    missing = [name for name in _SCHEMA_TABLES if name not in tables]
    missing += [f"{name} view" for name in _SCHEMA_VIEWS if name not in views]
    if missing:
        raise StoreError(
            f"{str(path)!r} is a damaged omnitune results database: it lacks {', '.join(missing)}; "
            "restore it from a copy, or give a new --db"
        )

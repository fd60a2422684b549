"""The contract between Optuna's storage (the truth about trials) and the `trials` catalogue.

Every fact a catalogue row holds travels in the Optuna study: what was searched in the study's
user attr STUDY_ATTR, what one trial measured in that trial's user attrs. The search driver writes
them through `finished_trial_attrs`; `rebuild_catalogue` reads them back, so the catalogue can
always be re-derived from the studies.

Optuna is imported inside functions: `import omnitune.store` stays cheap for report and export.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import math
import sqlite3
import time
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqlite_utils

from omnitune.errors import StoreError, first_line_or_type
from omnitune.trial import TrialResult, TrialStatus
from omnitune.spec import Config
from omnitune.store._journal import drop_interrupted_record, is_sqlite_file, unreadable_line
from omnitune.store._migrations import transaction
from omnitune.store._records import TrialRecord, config_json, record_trials

if TYPE_CHECKING:
    import optuna

STUDY_ATTR = "omnitune_study"


@dataclass(frozen=True)
class StudyFacts:
    """What one study searches: a kernel, a problem, a dtype, a device."""

    kernel: str
    problem_key: str
    problem_json: str
    dtype: str
    device_key: str
    device_name: str

    @property
    def name(self) -> str:
        return study_name(self.kernel, self.problem_key, self.dtype, self.device_key)

    def as_user_attr(self) -> dict[str, str]:
        return asdict(self)

    @classmethod
    def from_user_attr(cls, value: Any) -> StudyFacts | None:
        """The facts stored on a study, or None for a study omnitune did not create."""
        if not isinstance(value, Mapping):
            return None
        try:
            return cls(**{k: str(value[k]) for k in cls.__dataclass_fields__})
        except KeyError:
            return None


def study_name(kernel: str, problem_key: str, dtype: str, device_key: str) -> str:
    """The Optuna study name of one search: "{kernel}|{problem_key}|{dtype}|{device_key}"."""
    return f"{kernel}|{problem_key}|{dtype}|{device_key}"


@dataclass(frozen=True)
class Provenance:
    """What a measurement was taken with: kernel source, software versions, GPU."""

    source_hash: str
    torch: str
    triton: str
    omnitune: str
    device_name: str


# An Optuna journal file: `journal:///` and its path, as `sqlite:///` names a SQLite file
# (`journal:////abs/path`, `journal:///relative/path`).
JOURNAL_SCHEME = "journal:///"


def default_storage_url(db_path: str | Path) -> str:
    """Optuna's storage beside the results database: the journal file `<db stem>.optuna.log` in the
    same folder, or the SQLite file `<db stem>.optuna.db` where one is already there (the default
    before journals), so that a rerun resumes the studies it holds.

    A journal rather than SQLite because of what a trial costs the host: Optuna's RDB storage reads
    every unfinished trial back through the ORM on each of the ~5 reads a trial makes (the sampler,
    the ledger, ask), and a search keeps ~10 unfinished (the compile-ahead queue). A journal
    replays only the lines it has not read. On the H200's host, with the GPU taken out
    (benchmarks/search_storage_overhead.py, 50 trials of each kernel), choosing and storing took
    47.3 ms a trial on SQLite and 7.4 ms on the journal (round 17)."""
    path = Path(db_path).resolve()
    legacy = path.with_name(path.stem + ".optuna.db")
    if legacy.exists():
        return "sqlite:///" + str(legacy)
    return JOURNAL_SCHEME + str(path.with_name(path.stem + ".optuna.log"))


def journal_path(url: str) -> Path | None:
    """The file a journal URL names; None for any other URL."""
    return Path(url.removeprefix(JOURNAL_SCHEME)) if url.startswith(JOURNAL_SCHEME) else None


@contextlib.contextmanager
def journal_unmade_on_error(url: str | None):
    """Run the body; if it raises, a journal file at `url` that did not exist before and is still
    empty is removed with its lock file: a search refused on opening (its database holds trials
    the journal lost, say) leaves no empty journal behind, which would read as one it wrote."""
    path = journal_path(storage_url_for_driver(url)) if url else None
    made_here = path is not None and not path.exists()
    try:
        yield
    except BaseException:
        if made_here and path.is_file() and path.stat().st_size == 0:
            path.unlink(missing_ok=True)
            Path(f"{path}.lock").unlink(missing_ok=True)
        raise


# Opening a new storage from several processes at once: how often to look again for its tables.
SCHEMA_RACE_ATTEMPTS = 5
# A trial whose worker missed this many heartbeats in a row is taken as dead (failed and retried).
HEARTBEATS_BEFORE_STALE = 4


def storage_url_for_driver(url: str) -> str:
    """A plain postgresql:// (or postgres://) URL names psycopg 3's SQLAlchemy driver, the one
    omnitune installs (the `postgres` extra); SQLAlchemy would otherwise look for psycopg2."""
    for plain in ("postgresql://", "postgres://"):
        if url.startswith(plain):
            return "postgresql+psycopg://" + url.removeprefix(plain)
    return url


def open_optuna_storage(url: str, *, heartbeat_interval_s: int | None = None) -> optuna.storages.BaseStorage:
    """Optuna's storage at `url`: a journal file (journal:///path, the default), or an RDB
    (sqlite:///path, postgresql://...); a StoreError if it cannot be opened. With
    `heartbeat_interval_s` (an RDB only), running trials record heartbeats; one silent for
    HEARTBEATS_BEFORE_STALE intervals is failed by the next worker that asks, and retried once."""
    import optuna

    url = storage_url_for_driver(url)
    check_storage_url(url)
    if (journal := journal_path(url)) is not None:
        return _open_journal(journal, heartbeats=heartbeat_interval_s is not None)
    if name := sqlite_file_name(url):
        Path(name).parent.mkdir(parents=True, exist_ok=True)
    sqlite = url.startswith("sqlite")
    heartbeat = {}
    if heartbeat_interval_s is not None:
        heartbeat = dict(heartbeat_interval=heartbeat_interval_s,
                         grace_period=HEARTBEATS_BEFORE_STALE * heartbeat_interval_s)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            if hasattr(optuna.storages, "RetryHeartbeatStaleTrialCallback"):  # Optuna >= 4.9
                heartbeat["heartbeat_stale_trial_callback"] = optuna.storages.RetryHeartbeatStaleTrialCallback(
                    max_retry=1)
            else:
                heartbeat["failed_trial_callback"] = optuna.storages.RetryFailedTrialCallback(max_retry=1)
    if url.startswith("postgresql+psycopg") and importlib.util.find_spec("psycopg") is None:
        raise StoreError("a PostgreSQL storage needs psycopg 3: pip install 'omnitune[postgres]'")
    for attempt in range(SCHEMA_RACE_ATTEMPTS):
        try:
            # A generous lock timeout: several search processes may share one SQLite file.
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                storage = optuna.storages.RDBStorage(
                    url, engine_kwargs={"connect_args": {"timeout": 60} if sqlite else {}}, **heartbeat
                )
            break
        except Exception as exc:  # noqa: BLE001 — SQLAlchemy raises many kinds for a bad URL or file
            # Workers started at once on a new storage race to create its tables; the loser's
            # CREATE TABLE or version row fails, and a second look finds them made.
            if _lost_schema_race(exc) and attempt + 1 < SCHEMA_RACE_ATTEMPTS:
                time.sleep(0.2 * (attempt + 1))
                continue
            raise StoreError(f"cannot open the Optuna storage {_without_password(url)!r}: {first_line_or_type(exc)}") from None
    if sqlite:
        _use_write_ahead_log(storage)
    return storage


def sqlite_file_name(url: str) -> str | None:
    """The file an SQLAlchemy SQLite URL names (sqlite:///relative, sqlite:////absolute), without
    its ?query: "" where it names none; None for a URL of another kind."""
    if not url.startswith("sqlite:///"):
        return None
    return url.removeprefix("sqlite:///").split("?", 1)[0]


def check_storage_url(url: str) -> None:
    """A StoreError, before Optuna touches anything, for a storage URL naming a file Optuna must
    not open: an SQLite URL naming no file (SQLAlchemy would make a database in memory, and each
    connection a new one) or an omnitune results database (Optuna would add its tables beside the
    catalogue's, whose `trials` table clashes with its own); a journal URL naming an SQLite file
    (Optuna would append its records to the database); an SQLite URL naming another program's
    database (Optuna would add its tables to it); a path given for a URL."""
    url = storage_url_for_driver(url)
    if "://" not in url and "@" in url:  # credentials without a scheme: not repeated, they may hold a password
        raise StoreError("the Optuna storage given is not a URL: it lacks a scheme, as in "
                         "postgresql://user:password@host:5432/omnitune")
    if "://" not in url:  # a path: SQLAlchemy's "Could not parse SQLAlchemy URL" does not say what to write
        raise StoreError(f"the Optuna storage {url!r} is not a URL; for a journal file write {JOURNAL_SCHEME}{url}, "
                         f"for an SQLite file sqlite:///{url}, or give a postgresql:// URL")
    if (journal := journal_path(url)) is not None:
        if is_sqlite_file(journal):  # a results database, or an Optuna SQLite storage: no journal
            own = journal.with_name(journal.stem + ".optuna.log")
            raise StoreError(f"the journal storage {url} names an SQLite database, not an Optuna journal; give the "
                             f"journal a file of its own, e.g. {JOURNAL_SCHEME}{own}")
        return
    name = sqlite_file_name(url)
    if name is None:
        return
    if not name.strip():
        raise StoreError(f"the Optuna storage {url} names no file; give one, e.g. sqlite:///studies.optuna.db")
    path = Path(name)
    tables, trials_columns = _sqlite_schema(path) or (set(), set())  # read once: both refusals judge it
    own = f"sqlite:///{path.with_name(path.stem + '.optuna.db')}"
    # An omnitune results database: its `migrations`, or a `trials` table keyed by study, as the catalogue's is.
    if "migrations" in tables or "study" in trials_columns:
        raise StoreError(f"the Optuna storage {url} is an omnitune results database (it holds the catalogue of "
                         f"trials); give the storage a file of its own, e.g. {own}")
    if tables and not OPTUNA_TABLES & tables:
        raise StoreError(f"the Optuna storage {url} is an SQLite database of another program (none of its tables "
                         f"is Optuna's), which Optuna would add its tables to; give the storage a file of its own, "
                         f"e.g. {own}")


# Tables every Optuna RDB storage has (its schema since Optuna 1.x).
OPTUNA_TABLES = frozenset({"studies", "trials", "alembic_version"})


def _sqlite_schema(path: Path) -> tuple[set[str], set[str]] | None:
    """An SQLite file's table names and its `trials` table's columns (empty without one); None for
    no SQLite file (missing, empty, another format) or one that cannot be read (locked: Optuna
    says so when it opens it)."""
    if not path.is_file() or not is_sqlite_file(path):
        return None
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            columns = {row[1] for row in conn.execute("PRAGMA table_info(trials)")} if "trials" in tables else set()
        finally:
            conn.close()
    except sqlite3.Error:
        return None
    return tables, columns


def _open_journal(path: Path, *, heartbeats: bool) -> optuna.storages.BaseStorage:
    """Optuna's JournalStorage on the file `path` (made if missing; its folder too). Processes on
    one host share it through a lock file beside it; hosts share a PostgreSQL storage instead.
    An incomplete last record (a process killed while appending it) is dropped, with a copy of
    the file kept beside it; a journal unreadable elsewhere is a StoreError, and is never written."""
    if heartbeats:
        # Optuna's journal keeps no heartbeats: a dead worker's trial could not be found and retried.
        raise StoreError(f"workers with heartbeats need an RDB storage (postgresql://... or sqlite:///...), "
                         f"not the journal {path}")
    if not str(path).strip() or path.is_dir():
        raise StoreError(f"the journal storage {JOURNAL_SCHEME}{path} must name a file")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = _journal_lock(path)
        storage = _journal_storage(path, lock)
    except StoreError:
        raise
    except Exception as exc:  # noqa: BLE001 — a corrupt line, a file that cannot be read or made
        raise StoreError(_unreadable_journal(path, exc)) from None
    if lock is not None:  # (without flock, on Windows, Optuna skips a last line it cannot parse)
        lock.acquire()  # its end looked at now: a journal left cut is mended before the search starts
        lock.release()
    return storage


def _journal_storage(path: Path, lock) -> optuna.storages.JournalStorage:
    """JournalStorage on `path`. Optuna reads the whole file first, skipping a last line that is
    not JSON and raising on any other, so a journal unreadable before its end is refused as it is,
    uncut. A last line whose bytes are not even text (the zeros of a crash) makes it raise too:
    then, if every line before it is whole, that line is dropped (as the lock does) and it reads
    the file again."""
    import optuna
    from optuna.storages.journal import JournalFileBackend

    try:
        return optuna.storages.JournalStorage(JournalFileBackend(str(path), lock_obj=lock))
    except ValueError:
        if lock is None or unreadable_line(path) is not None:
            raise
    lock.acquire()
    lock.release()
    return optuna.storages.JournalStorage(JournalFileBackend(str(path), lock_obj=lock))


# What Optuna raises for a journal line it cannot use: not JSON, not text, or a record missing a field.
_CONTENT_ERRORS = (ValueError, KeyError, TypeError)


def _unreadable_journal(path: Path, exc: Exception) -> str:
    """Why the journal at `path` could not be opened, and what to do about it: one line."""
    if not isinstance(exc, _CONTENT_ERRORS):  # the file cannot be read or made: nothing to restore
        return f"cannot open the Optuna journal {path}: {first_line_or_type(exc)}"
    try:
        where = unreadable_line(path)
    except OSError:
        where = None
    why = first_line_or_type(exc) if where is None else f"line {where[0]} is not a journal record ({where[1]})"
    return (f"cannot open the Optuna journal {path}: {why}; restore the journal from a copy, or move it aside "
            f"and search into a new --db")


def _journal_lock(path: Path):
    """The lock that writers of the journal take: an flock on `<journal>.lock`, which the kernel
    releases when its process dies, so that a search killed mid-write leaves nothing locked
    (Optuna's own file locks are broken only after a 30 s grace period). Once it is held, an
    incomplete record that a killed writer left at the journal's end is dropped
    (drop_interrupted_record), so that nothing is appended to a line that cannot be read. None
    (Optuna's) where there is no flock."""
    try:
        import fcntl
    except ImportError:
        return None

    class FlockLock:  # what JournalFileBackend calls of a lock: acquire() and release()
        def __init__(self) -> None:
            self.fd: int | None = None

        def acquire(self) -> bool:
            fd = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(fd, fcntl.LOCK_EX)
            self.fd = fd
            try:
                drop_interrupted_record(path)
            except BaseException:
                self.release()
                raise
            return True

        def release(self) -> None:
            if self.fd is not None:
                fd, self.fd = self.fd, None
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)

    return FlockLock()


def _lost_schema_race(exc: Exception) -> bool:
    """Whether opening a storage failed because another process was creating its tables."""
    text = str(exc)
    return any(words in text for words in ("already exists", "UNIQUE constraint failed", "duplicate key"))


def _without_password(url: str) -> str:
    """The URL as an error message may show it: user:secret@host becomes user:***@host."""
    scheme, sep, rest = url.partition("://")
    credentials, at, host = rest.rpartition("@")
    if not sep or not at or ":" not in credentials:
        return url
    return f"{scheme}://{credentials.split(':', 1)[0]}:***@{host}"


def _use_write_ahead_log(storage: optuna.storages.RDBStorage) -> None:
    """WAL with synchronous=NORMAL: a commit no longer waits for the disk (a search commits a
    few times per trial, ~4 ms each otherwise). A killed process still loses nothing it
    committed; only a power cut or kernel crash can drop the last trials, which a rerun then
    measures again."""
    from sqlalchemy import event

    def on_connect(dbapi_connection, _record) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    event.listen(storage.engine, "connect", on_connect)
    storage.engine.dispose()  # connections opened before the listener reconnect with it


# --- one trial's user attrs -----------------------------------------------------------------


def _finite_or_none(value: float) -> float | None:
    return None if value is None or math.isnan(value) or math.isinf(value) else float(value)


def finished_trial_attrs(
    result: TrialResult,
    *,
    is_default: bool,
    sampler: str,
    provenance: Provenance,
    measured_at: str,
    chosen_by: str = "",
) -> dict[str, Any]:
    """The user attrs a finished trial carries: everything its catalogue row needs (and, in
    `chosen_by`, who picked the config: the default, the sampler, an enumeration, a fallback).

    `config_json` (set when the trial starts), `status` and `time_ms` are attrs of their own, so
    that Optuna's tools show them at a glance; every other figure travels in one `measurement`
    attr, because each attr is a storage round trip (~5 ms on SQLite) and a search writes them
    for every trial."""
    ok = result.status is TrialStatus.OK
    rel_error = result.rel_error
    return {
        "config_json": config_json(result.config),
        "status": result.status.value,
        "time_ms": _finite_or_none(result.time_ms) if ok else None,
        "measurement": {
            "p20_ms": _finite_or_none(result.p20_ms) if ok else None,
            "p80_ms": _finite_or_none(result.p80_ms) if ok else None,
            # inf is a real figure (a NaN-filled output); NaN means none was computed.
            "rel_error": None if rel_error is None or math.isnan(rel_error) else float(rel_error),
            "tflops": float(result.tflops) if ok else None,
            "tbps": float(result.tbps) if ok else None,
            "detail": result.detail,
            "representative": bool(result.representative),
            "is_default": bool(is_default),
            "extra": dict(result.extra),
            "provenance": asdict(provenance),
            "sampler": sampler,
            "chosen_by": chosen_by,
            "measured_at": measured_at,
        },
    }


def config_from_attrs(attrs: Mapping[str, Any]) -> Config | None:
    """The config a trial's user attrs name, or None if they name none."""
    text = attrs.get("config_json")
    if not isinstance(text, str):
        return None
    return Config(json.loads(text))


def result_from_attrs(attrs: Mapping[str, Any]) -> TrialResult | None:
    """The TrialResult a finished trial recorded, or None for a trial that measured nothing
    (interrupted, abandoned, or a repeat of another trial's config)."""
    config = config_from_attrs(attrs)
    if config is None or "status" not in attrs:
        return None
    measurement = attrs.get("measurement") or {}

    def number(value: Any, missing: float) -> float:
        return missing if value is None else float(value)

    return TrialResult(
        config=config,
        status=TrialStatus(attrs["status"]),
        time_ms=number(attrs.get("time_ms"), math.inf),
        p20_ms=number(measurement.get("p20_ms"), math.inf),
        p80_ms=number(measurement.get("p80_ms"), math.inf),
        rel_error=number(measurement.get("rel_error"), math.nan),
        tflops=number(measurement.get("tflops"), 0.0),
        tbps=number(measurement.get("tbps"), 0.0),
        detail=str(measurement.get("detail", "")),
        representative=bool(measurement.get("representative", True)),
        extra=dict(measurement.get("extra") or {}),
    )


def catalogue_record(facts: StudyFacts, trial_number: int, attrs: Mapping[str, Any]) -> TrialRecord | None:
    """The catalogue row of one finished trial, or None if it measured nothing."""
    result = result_from_attrs(attrs)
    if result is None:
        return None
    measurement = attrs.get("measurement") or {}
    provenance = measurement.get("provenance") or {}
    ok = result.status is TrialStatus.OK
    return TrialRecord(
        study=facts.name,
        trial_number=trial_number,
        kernel=facts.kernel,
        problem_key=facts.problem_key,
        problem_json=facts.problem_json,
        dtype=facts.dtype,
        device_key=facts.device_key,
        device_name=str(provenance.get("device_name", facts.device_name)),
        sampler=str(measurement.get("sampler", "")),
        config_json=config_json(result.config),
        config_label=result.config.label(),
        status=result.status.value,
        time_ms=result.time_ms if ok else None,
        p20_ms=result.p20_ms if ok else None,
        p80_ms=result.p80_ms if ok else None,
        rel_error=measurement.get("rel_error"),
        tflops=result.tflops if ok else None,
        tbps=result.tbps if ok else None,
        detail=result.detail,
        representative=result.representative,
        is_default=bool(measurement.get("is_default", False)),
        extra_json=json.dumps(result.extra, sort_keys=True, default=str),
        source_hash=str(provenance.get("source_hash", "unknown")),
        torch_version=str(provenance.get("torch", "")),
        triton_version=str(provenance.get("triton", "")),
        omnitune_version=str(provenance.get("omnitune", "")),
        measured_at=str(measurement.get("measured_at", "")),
    )


def study_records(facts: StudyFacts, trials: Iterable[optuna.trial.FrozenTrial]) -> list[TrialRecord]:
    """The catalogue rows of a study's finished trials."""
    import optuna

    records = []
    for trial in trials:
        if trial.state is not optuna.trial.TrialState.COMPLETE:
            continue
        record = catalogue_record(facts, trial.number, trial.user_attrs)
        if record is not None:
            records.append(record)
    return records


def storage_description(url: str) -> str:
    """How a message names the storage at `url`: its journal file, or its URL without a password."""
    journal = journal_path(url)
    return f"the Optuna journal {journal}" if journal is not None else f"the Optuna storage {_without_password(url)}"


# What require_catalogue_held says would become of the rows, and what to do instead: a search's words.
_SEARCH_WOULD = ("a search would overwrite them", "search into a new --db")


def require_catalogue_held(db: sqlite_utils.Database, study: str, storage: optuna.storages.BaseStorage,
                           described: str = "the Optuna storage", *,
                           would: tuple[str, str] = _SEARCH_WOULD) -> None:
    """A StoreError when the catalogue holds rows of `study` whose trials `storage` lacks (its
    journal lost, emptied or swapped for another): rows are keyed by study and trial number, and a
    storage without those trials numbers new ones from 0 again, so a search would overwrite the
    rows with other configs. Rows that a trial of the same number and config backs are held.
    `would`: what would become of the rows, and what to do instead (a search's, by default; the
    rebuild's are its own).

    The rows are read before the trials: a process sharing the storage writes a trial there before
    its row here, so a row read first always finds its trial."""
    rows = db.execute("SELECT trial_number, config_json FROM trials WHERE study = ?", [study]).fetchall()
    if not rows:
        return
    try:
        trials = storage.get_all_trials(storage.get_study_id_from_name(study), deepcopy=False)
    except KeyError:  # no such study in the storage
        trials = []
    configs = {trial.number: trial.user_attrs.get("config_json") for trial in trials}
    missing = sum(1 for number, text in rows if not _same_config(configs.get(number), text))
    if missing:
        consequence, instead = would
        raise StoreError(
            f"{_database_file(db)} holds {missing} trials of {study} that {described} lacks (lost, emptied or "
            f"swapped for another?), and {consequence}: restore it, or {instead}")


def _same_config(a: Any, b: Any) -> bool:
    """Whether two config_json texts name one config (however their JSON is spaced)."""
    try:
        return isinstance(a, str) and isinstance(b, str) and json.loads(a) == json.loads(b)
    except ValueError:
        return False


def _database_file(db: sqlite_utils.Database) -> str:
    """The file of the results database `db`, as a message names it."""
    for _, name, file in db.execute("PRAGMA database_list").fetchall():
        if name == "main" and file:
            return file
    return "the results database"


# What the rebuild would do to rows its storage lacks, and what to do instead (require_catalogue_held).
_REBUILD_WOULD = ("reading it in would drop them", "leave out --storage to use the database as it is")


def rebuild_catalogue(db: sqlite_utils.Database, storage_url: str,
                      storage: optuna.storages.BaseStorage | None = None) -> int:
    """Re-derive the catalogue rows of every omnitune study in the Optuna storage at
    `storage_url` (or `storage`, already opened from it), writing them over those studies' rows in
    one transaction; returns the row count. Rows of studies that live in another storage (or
    were deleted from this one) are left alone.

    A storage that lacks trials the database has rows of (a journal truncated or emptied, a
    storage swapped for another) is a StoreError before anything is written, as it is for a
    search (require_catalogue_held): rows are results, and a storage that lost them must not
    delete them here too. So no row is ever deleted: each is replaced by its trial's."""
    import optuna

    storage = storage if storage is not None else open_optuna_storage(storage_url)
    summaries = []
    for summary in optuna.study.get_all_study_summaries(storage, include_best_trial=False):
        facts = StudyFacts.from_user_attr(summary.user_attrs.get(STUDY_ATTR))
        if facts is not None:
            summaries.append((summary.study_name, facts))
    # Every study checked before any row is written: a refusal leaves the database as it was.
    described = storage_description(storage_url)
    for _, facts in summaries:
        require_catalogue_held(db, facts.name, storage, described, would=_REBUILD_WOULD)
    studies: list[tuple[StudyFacts, list[TrialRecord]]] = []
    for name, facts in summaries:
        study = optuna.load_study(study_name=name, storage=storage)
        studies.append((facts, study_records(facts, study.get_trials(deepcopy=False))))
    with transaction(db):
        for _, records in studies:
            record_trials(db, records)  # each replaces the row of its study and trial number
    return sum(len(records) for _, records in studies)

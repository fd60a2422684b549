"""Writing rows: one typed record per table, one function per kind of row."""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
import math
import sqlite3
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import sqlite_utils

from omnitune.errors import StoreError
from omnitune.spec import Config, ParamValue
from omnitune.store._migrations import transaction, utc_now
from omnitune.trial import DeviceFacts

CALIBRATION_METRICS: tuple[str, ...] = (
    "copy_tbps",
    "matmul_bf16_tflops",
    "matmul_fp16_tflops",
    "matmul_tf32_tflops",
)


def config_json(config: Mapping[str, ParamValue]) -> str:
    """The canonical JSON text of a config: sorted keys, so equal configs give equal text."""
    return json.dumps(dict(config), sort_keys=True)


@dataclass(frozen=True)
class TrialRecord:
    """One row of the `trials` catalogue: one measured (or pruned) config of one study."""

    study: str
    trial_number: int
    kernel: str
    problem_key: str
    problem_json: str
    dtype: str
    device_key: str
    device_name: str
    sampler: str
    config_json: str
    config_label: str
    status: str
    time_ms: float | None
    p20_ms: float | None
    p80_ms: float | None
    rel_error: float | None
    tflops: float | None
    tbps: float | None
    detail: str
    representative: bool
    is_default: bool
    extra_json: str
    source_hash: str
    torch_version: str
    triton_version: str
    omnitune_version: str
    measured_at: str

    def as_row(self) -> dict[str, Any]:
        row = dataclasses.asdict(self)
        row["representative"] = int(self.representative)
        row["is_default"] = int(self.is_default)
        for key in ("time_ms", "p20_ms", "p80_ms", "rel_error", "tflops", "tbps"):
            value = row[key]
            # NaN means "no figure": SQL's NULL says that; inf (e.g. a NaN-filled output's
            # error) is a real, if extreme, figure and is kept.
            if value is not None and math.isnan(value):
                row[key] = None
        return row


# The catalogue's columns, in order: TrialRecord is their one definition (the migrations build
# the table to match it, and report and export read these columns).
TRIAL_COLUMNS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(TrialRecord))

# Where the search writes its rows (omnitune.search.driver): a batch of rows at a time — one
# after each trial, a resumed study's catch-up in one go, so that it commits once. The SQLite
# catalogue is catalogue_sink(db); another backend is another callable.
TrialSink = Callable[[Sequence[TrialRecord]], None]

_INSERT_TRIAL = (
    f"INSERT OR REPLACE INTO trials ({', '.join(TRIAL_COLUMNS)}) "
    f"VALUES ({', '.join(':' + name for name in TRIAL_COLUMNS)})"
)


def record_trial(db: sqlite_utils.Database, record: TrialRecord) -> None:
    """Insert one catalogue row, replacing the row of the same (study, trial_number)."""
    _write(db, _INSERT_TRIAL, record.as_row())


def record_trials(db: sqlite_utils.Database, records: Sequence[TrialRecord]) -> None:
    """Insert many catalogue rows in one transaction."""
    with _write_errors(), transaction(db):
        for record in records:
            db.execute(_INSERT_TRIAL, record.as_row())


def catalogue_sink(db: sqlite_utils.Database) -> TrialSink:
    """The sink that writes the search's rows into the results database `db` (one transaction
    per batch). Call it from the thread that opened `db`: SQLite connections stay in theirs."""
    return functools.partial(record_trials, db)


def record_device(db: sqlite_utils.Database, facts: DeviceFacts) -> None:
    """Insert or refresh the row of the device `facts` describe; last_seen is now."""
    row = {"key": facts.key, **facts.as_dict(), "last_seen": utc_now()}
    columns = ", ".join(row)
    _write(db, f"INSERT OR REPLACE INTO devices ({columns}) VALUES ({', '.join(':' + c for c in row)})", row)


def record_calibration(
    db: sqlite_utils.Database,
    device_key: str,
    metric: str,
    value: float,
    detail: Mapping[str, Any] | None = None,
) -> None:
    """Store one calibration figure of a device (replacing the previous one of that metric)."""
    if metric not in CALIBRATION_METRICS:
        raise StoreError(f"unknown calibration metric {metric!r}; use one of {', '.join(CALIBRATION_METRICS)}")
    _write(
        db,
        "INSERT OR REPLACE INTO calibrations (device_key, metric, value, detail_json, measured_at) "
        "VALUES (?, ?, ?, ?, ?)",
        (device_key, metric, float(value), json.dumps(dict(detail or {}), sort_keys=True), utc_now()),
    )


class ProfileKind(str, enum.Enum):
    """Which config a profile was taken of."""

    TUNED = "tuned"
    DEFAULT = "default"
    CUSTOM = "custom"


@dataclass(frozen=True)
class ProfileRecord:
    """One hardware-counter profile of one config (what `ncu` reported)."""

    kernel: str
    problem_key: str
    dtype: str
    device_key: str
    config: Mapping[str, ParamValue]
    which: ProfileKind
    duration_us: float | None = None
    l1_hit_pct: float | None = None
    l2_hit_pct: float | None = None
    dram_pct_of_peak: float | None = None
    achieved_occupancy_pct: float | None = None
    raw: Mapping[str, Any] = field(default_factory=dict)
    measured_at: str = ""


def record_profile(db: sqlite_utils.Database, record: ProfileRecord) -> int:
    """Append one profile; returns its id."""
    row = {
        "kernel": record.kernel,
        "problem_key": record.problem_key,
        "dtype": record.dtype,
        "device_key": record.device_key,
        "config_json": config_json(record.config),
        "config_label": Config(record.config).label(),
        "which": ProfileKind(record.which).value,
        "duration_us": record.duration_us,
        "l1_hit_pct": record.l1_hit_pct,
        "l2_hit_pct": record.l2_hit_pct,
        "dram_pct_of_peak": record.dram_pct_of_peak,
        "achieved_occupancy_pct": record.achieved_occupancy_pct,
        "raw_json": json.dumps(dict(record.raw), sort_keys=True, default=str),
        "measured_at": record.measured_at or utc_now(),
    }
    cursor = _write(db, f"INSERT INTO profiles ({', '.join(row)}) VALUES ({', '.join(':' + c for c in row)})", row)
    return int(cursor.lastrowid)


def _write(db: sqlite_utils.Database, sql: str, parameters) -> sqlite3.Cursor:
    """Execute one write; commit it unless an enclosing transaction will. (sqlite-utils 4 commits
    on its own; 3.x leaves Python's implicit transaction open.)"""
    was_in_transaction = db.conn.in_transaction
    with _write_errors():
        cursor = db.execute(sql, parameters)
        if not was_in_transaction and db.conn.in_transaction:
            db.conn.commit()
    return cursor


@contextmanager
def _write_errors() -> Iterator[None]:
    """A write that SQLite refuses (the file made read-only, the disk full, a lock held too long)
    as a StoreError: one line for the user, not a traceback. open_db checks the common causes
    first; this covers what changes while a command runs."""
    try:
        yield
    except sqlite3.OperationalError as exc:
        # SQLite says only "disk I/O error" for a file made read-only or immutable under it.
        hint = (" (was the file or its folder made read-only, or the disk filled, while it ran?)"
                if "disk I/O" in str(exc) else "")
        raise StoreError(f"cannot write the results database: {exc}{hint}") from None


@dataclass(frozen=True)
class SearchRunRecord:
    """One row of `search_runs`: one run of one study's search, timed. `setup_s` (inputs and the
    reference) and `retime_s` (the finalists) are the fixed cost of a problem; the rest of
    `wall_s` spent on `measured` trials is the per-trial cost `omnitune plan` estimates with.
    `gpu_s`: how long the search held the GPU (its GPU lock: the reference, checks, timings,
    re-timing); `lock_wait_s`: how long it waited for the lock while other lanes held it — part of
    `wall_s` that a search alone on its GPU would not spend. `cpu_s`: the CPU time of the
    searching process over the search (every thread: choosing, storing, the host side of
    measuring); `compile_cpu_s`: the precompile workers' CPU time for the configs they compiled for
    it. None where not known (a search measured in isolated workers, one without precompile
    workers, or one recorded before they were)."""

    study: str
    device_key: str
    device_name: str
    finished_at: str
    stop_reason: str
    measured: int
    wall_s: float
    setup_s: float
    retime_s: float
    gpu_s: float | None = None
    lock_wait_s: float | None = None
    cpu_s: float | None = None
    compile_cpu_s: float | None = None


SEARCH_RUN_COLUMNS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(SearchRunRecord))


def record_search_run(db: sqlite_utils.Database, record: SearchRunRecord) -> None:
    row = dataclasses.asdict(record)
    _write(db, f"INSERT INTO search_runs ({', '.join(row)}) VALUES ({', '.join(':' + c for c in row)})", row)

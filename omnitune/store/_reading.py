"""Reading the results database for report and export: tables as DataFrames, read-only.

A missing file is a StoreError, never a new empty database (reading never creates or migrates
one); a database that does not hold a table yet gives an empty frame with its columns. pandas is
imported inside the functions: `import omnitune.store` stays cheap for the search.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from omnitune.errors import StoreError
from omnitune.store._migrations import damaged_database, damaged_pages
from omnitune.store._records import TRIAL_COLUMNS

if TYPE_CHECKING:
    import pandas as pd

log = logging.getLogger(__name__)

DEVICE_COLUMNS = ("key", "name", "compute_capability", "driver")


def read_table(db_path: str | Path, table: str, columns: Sequence[str], *, where: str | None = None,
               value: object = None) -> pd.DataFrame:
    """`columns` of every row of `table` (a view too), or of the rows whose `where` column
    equals `value` when both are given."""
    import pandas as pd

    db_path = Path(db_path)
    if not db_path.is_file():
        raise StoreError(f"no results database at {db_path}; run omnitune search first, or pass --db PATH")
    try:
        con = sqlite3.connect(f"{db_path.resolve().as_uri()}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        raise StoreError(f"cannot open {db_path}: {exc}") from None
    try:
        if not _is_omnitune_database(con, db_path):
            return pd.DataFrame(columns=list(columns))
        present = con.execute(
            "SELECT 1 FROM sqlite_master WHERE type IN ('table', 'view') AND name = ?", (table,)
        ).fetchone()
        if not present:
            return pd.DataFrame(columns=list(columns))
        _require_columns(con, db_path, table, columns)
        select = ", ".join(f'"{c}"' for c in columns)
        query = f'SELECT {select} FROM "{table}"'
        params: tuple = ()
        if where is not None and value is not None:
            query += f' WHERE "{where}" = ?'
            params = (value,)
        return _numbers_as_numbers(_read_query(query, con, params), con, db_path, table)
    except sqlite3.OperationalError as exc:  # a database that cannot be read now (I/O, a lock): not a foreign file
        raise StoreError(f"cannot read {db_path}: {exc}") from None
    except sqlite3.DatabaseError as exc:
        raise _unreadable(db_path, exc) from None
    finally:
        con.close()


def require_intact_pages(db_path: str | Path) -> None:
    """A StoreError for a database with damaged pages, read without writing: a reader of one table
    (plan reads search_runs alone) never meets the damaged pages of another, and would take the
    file for sound. A missing file passes: read_table says that."""
    db_path = Path(db_path)
    if not db_path.is_file():
        return
    try:
        con = sqlite3.connect(f"{db_path.resolve().as_uri()}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        raise StoreError(f"cannot open {db_path}: {exc}") from None
    try:
        damage = damaged_pages(con)
    except sqlite3.OperationalError as exc:
        raise StoreError(f"cannot read {db_path}: {exc}") from None
    except sqlite3.DatabaseError as exc:
        raise _unreadable(db_path, exc) from None
    finally:
        con.close()
    if damage is not None:
        raise damaged_database(str(db_path), damage)


def _unreadable(db_path: Path, exc: sqlite3.DatabaseError) -> StoreError:
    """What a read says of a file SQLite refuses: damaged pages (SQLite's "malformed", in a
    results database as often as anywhere: a copy cut short, a disk error) or no database of ours."""
    if "malformed" in str(exc):
        return damaged_database(str(db_path), str(exc))
    return StoreError(f"{db_path} is not an omnitune results database: {exc}")


def _read_query(query: str, con: sqlite3.Connection, params: tuple) -> pd.DataFrame:
    """pd.read_sql_query, raising the sqlite3 error it met: pandas wraps it in an error of its own
    (pandas.errors.DatabaseError, no sqlite3.Error), which read_table's handlers would miss — a
    database whose rows lie on damaged pages (a copy cut short, a disk error) opens, and fails only
    here."""
    import pandas as pd

    try:
        return pd.read_sql_query(query, con, params=params)
    except pd.errors.DatabaseError as exc:
        if isinstance(exc.__cause__, sqlite3.Error):
            raise exc.__cause__ from None
        raise


def _numbers_as_numbers(frame: pd.DataFrame, con: sqlite3.Connection, db_path: Path, table: str) -> pd.DataFrame:
    """`frame` with each cell of a column the schema declares numeric (INTEGER, REAL) that is not
    a number read as missing (NaN), and one warning per such column. SQLite keeps whatever a cell
    is given, so a file changed by hand can hold text there, on which report's and export's
    arithmetic would fail."""
    import pandas as pd

    declared = {row[1]: str(row[2]).upper() for row in con.execute(f'PRAGMA table_info("{table}")')}
    for column in frame.columns:
        if declared.get(column) not in ("INTEGER", "REAL") or pd.api.types.is_numeric_dtype(frame[column]):
            continue  # not numeric, or all numbers (or NULL) already
        numbers = pd.to_numeric(frame[column], errors="coerce")
        bad = int((numbers.isna() & frame[column].notna()).sum())
        if bad:
            log.warning("%s: %d cells of %s.%s are not numbers (changed by hand, or corrupt): read as missing",
                        db_path, bad, table, column)
        frame[column] = numbers
    return frame


def read_trials(db_path: str | Path, kernel: str | None = None) -> pd.DataFrame:
    """The `trials` catalogue (of one kernel if given), with TRIAL_COLUMNS."""
    return read_table(db_path, "trials", TRIAL_COLUMNS, where="kernel", value=kernel)


def read_study_configs(db_path: str | Path, study: str) -> dict[str, str]:
    """The configs (as config_json) the catalogue holds for `study`, with the status of each: what
    a resumed search has measured already. Empty when the file or the table is not there yet.
    Its own read-only connection, so any thread may call it."""
    db_path = Path(db_path)
    if not db_path.is_file():
        return {}
    try:
        con = sqlite3.connect(f"{db_path.resolve().as_uri()}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        raise StoreError(f"cannot open {db_path}: {exc}") from None
    try:
        if not _is_omnitune_database(con, db_path) or not con.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'trials'").fetchone():
            return {}
        return dict(con.execute("SELECT config_json, status FROM trials WHERE study = ?", (study,)).fetchall())
    except sqlite3.OperationalError as exc:  # a database that cannot be read now (I/O, a lock): not a foreign file
        raise StoreError(f"cannot read {db_path}: {exc}") from None
    except sqlite3.DatabaseError as exc:
        raise _unreadable(db_path, exc) from None
    finally:
        con.close()


def read_devices(db_path: str | Path) -> pd.DataFrame:
    """The `devices` table: one row per GPU key, with DEVICE_COLUMNS."""
    return read_table(db_path, "devices", DEVICE_COLUMNS)


def _is_omnitune_database(con: sqlite3.Connection, db_path: Path) -> bool:
    """True for a database omnitune made (it has a migrations table), False for an empty one; a
    StoreError for any other: a foreign file's `trials` table is not ours to read."""
    tables = [name for (name,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    if not tables:
        return False
    if "migrations" not in tables:
        raise StoreError(f"{db_path} is not an omnitune results database: it holds tables "
                         f"({', '.join(sorted(tables)[:5])}) but no migrations table")
    return True


def _require_columns(con: sqlite3.Connection, db_path: Path, table: str, columns: Sequence[str]) -> None:
    # Checked, not trusted: SQLite reads a double-quoted name that is not a column as a string,
    # so a missing column would come back as its own name in every row.
    present = {row[1] for row in con.execute(f'PRAGMA table_info("{table}")')}
    missing = [c for c in columns if c not in present]
    if missing:
        raise StoreError(f"{db_path} is not an omnitune results database: its {table} table lacks "
                         f"{', '.join(missing[:5])}")

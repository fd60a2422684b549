"""The tuned-config file format, shared by the writer (omnitune.export) and the reader (the
runtime). Standard library only: the runtime imports it on a production hot path.

A file is `<dir>/<kernel>/<device_key>.json` holding one kernel's tuned configs for one GPU;
its `entries` are keyed "<dtype>|<problem_key>" (e.g. "bf16|b=1,h=28,hkv=4,lq=1,...").
tuned_configs/README.md documents every field.
"""

from __future__ import annotations

from pathlib import Path

SCHEMA_VERSION = 1
CONFIG_DIR_ENV = "OMNITUNE_CONFIG_DIR"


def entry_key(dtype_name: str, problem_key: str) -> str:
    """The key of one entry: '<dtype>|<problem_key>'."""
    return f"{dtype_name}|{problem_key}"


def split_entry_key(key: str) -> tuple[str, str]:
    """(dtype name, problem key) of an entry key; ('', key) if it has no '|'."""
    dtype_name, sep, problem_key = key.partition("|")
    return (dtype_name, problem_key) if sep else ("", key)


# The times an entry records (export, verify --fix): each is null or a positive number of ms.
RECORDED_TIMES = ("time_ms", "p20_ms", "p80_ms", "default_time_ms", "fallback_time_ms")


def impossible_recorded_time(entry: object) -> str | None:
    """Why a time an entry records is one no measurement gives (zero, negative, not a number),
    else None. The runtime reads no time, but an export from before such trials were left out
    chose the entry's config by one (a trial at -3.6 ms won its key)."""
    if not isinstance(entry, dict):
        return None
    for field in RECORDED_TIMES:
        value = entry.get(field)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0):
            return f"{field} {value!r} is not a positive number of milliseconds"
    return None


def table_path(config_dir: Path, kernel: str, device_key: str) -> Path:
    """Where one kernel's table for one device lives under a config directory."""
    return Path(config_dir) / kernel / f"{device_key}.json"


def search_command(kernel: str, problem_key: str, dtype_name: str) -> str:
    """The command that measures one (problem, dtype) and so fills a gap in a table."""
    return f"omnitune search {kernel} --shape {problem_key} --dtype {dtype_name}"

"""Finding and reading the tables `omnitune verify` checks: `<dir>/<kernel>/<device_key>.json`.

The runtime skips a bad file or entry with a warning (inference must not break); verify instead
reports each as a failure, so the reasons are kept here rather than logged. Entries are read
against the kernel's spec as the runtime reads them: the problem rebuilt from its fields, every
config value one of the parameter's choices, the key the one the problem and dtype give.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from omnitune.errors import OmnituneError
from omnitune.runtime._reading import UnreadableTable, parse_table_json, read_table_text
from omnitune.runtime._tables import parse_entry as runtime_parse_entry
from omnitune.runtime._tables import schema_problem
from omnitune.spec import Config, KernelSpec


@dataclass(frozen=True)
class Entry:
    """One valid entry of a table: the tuned config of one (problem, dtype)."""

    key: str
    problem: Any
    dtype: torch.dtype
    config: Config
    raw: dict[str, Any]


@dataclass
class TableFile:
    """One table file: its document and entries, or why it cannot be used."""

    path: Path
    kernel: str
    """The folder's name, which the runtime takes for the kernel's spec name."""
    device_key: str
    document: dict[str, Any] | None = None
    spec: KernelSpec | None = None
    problem: str | None = None
    """Why the file as a whole is unusable (None when it is readable)."""
    entries: list[Entry] = field(default_factory=list)
    bad_entries: dict[str, str] = field(default_factory=dict)
    """Entry key → why the runtime would ignore it."""

    @property
    def label(self) -> str:
        return f"{self.kernel}/{self.path.name}"


def find_tables(dirs: Iterable[Path], kernels: Sequence[str] | None, specs: dict[str, KernelSpec]) -> list[TableFile]:
    """Every table file under `dirs` (of the `kernels` named, when given), read and validated.
    `specs` maps kernels loaded by the caller (a user's kernel file named by --kernels) by name;
    built-in kernels are looked up in the registry."""
    found: list[TableFile] = []
    seen: set[Path] = set()
    for directory in dirs:
        directory = Path(directory)
        if not directory.is_dir():
            continue
        for path in sorted(directory.glob("*/*.json")):
            try:
                resolved = path.resolve()
            except (OSError, RuntimeError):  # a symlink loop (RuntimeError before Python 3.13): read_table says so
                resolved = Path(os.path.abspath(path))
            # export writes through hidden temporary files beside the table: never tables
            if resolved in seen or path.name.startswith("."):
                continue
            kernel = path.parent.name
            if kernels is not None and kernel not in kernels:
                continue
            seen.add(resolved)
            found.append(read_table(path, kernel, specs))
    return found


def read_table(path: Path, kernel: str, specs: dict[str, KernelSpec]) -> TableFile:
    table = TableFile(path=path, kernel=kernel, device_key=path.stem)
    # Read as the runtime reads it (runtime._reading): a FIFO read plainly blocked verify for
    # ever, and a file past the size the runtime serves passed here while the runtime ignored it.
    try:
        document = parse_table_json(read_table_text(path))
    except FileNotFoundError:
        table.problem = "was removed while verify ran"
        return table
    except UnreadableTable as exc:
        table.problem = f"cannot be used: the file {exc}"
        return table
    table.document = document if isinstance(document, dict) else None
    table.problem = schema_problem(document, kernel, path)
    if table.problem is not None:
        return table
    table.spec = specs.get(kernel) or _registered_spec(kernel)
    if table.spec is None:
        table.problem = (f"kernel {kernel!r} is not known here; name its module or file with --kernels "
                         "to check it")
        return table
    for key in sorted(document["entries"]):
        try:
            table.entries.append(parse_entry(key, document["entries"][key], table.spec))
        except KeyError as exc:
            table.bad_entries[key] = f"it lacks {exc.args[0]!r}"
        except (OmnituneError, TypeError, ValueError) as exc:
            table.bad_entries[key] = str(exc)
    return table


def parse_entry(key: str, raw: Any, spec: KernelSpec) -> Entry:
    """The entry as the runtime would use it, parsed by the runtime's own rules (a config value
    "8" for 8 passed here while the runtime skipped the entry); KeyError, TypeError, ValueError or
    an OmnituneError say why not."""
    entry = runtime_parse_entry(key, raw, spec)
    return Entry(key=key, problem=entry.problem, dtype=entry.dtype, config=entry.config, raw=raw)


def _registered_spec(kernel: str) -> KernelSpec | None:
    from omnitune.registry import BUILTIN_KERNELS, get_spec

    return get_spec(kernel) if kernel in BUILTIN_KERNELS else None

"""The verdict of `omnitune verify`: every check's outcome, the exit code a CI job gates on, the
JSON report and the Rich table.

Each part (compat, numerics, speed, memory, soak) reports Checks: one subject (a table, an entry,
a problem, the soak), a status and a one-line summary, with the figures in `details`. A FAIL
anywhere fails the run (exit 1); WARN is reported and passes (a soft version difference, drift);
SKIP says why a part did not run (no GPU, no --model); NOT_CHECKABLE says why one entry cannot be
checked on this machine at all (under --interpret, a kernel the interpreter cannot run: Gluon),
and passes as a skip does: nothing of it failed. Errors a user made never get here: the
command exits 2 before checking anything (omnitune.cli).

--fix adds no status of its own. A check whose failure --fix repaired in the table file (an entry
replaced by its fallback, a stale table revalidated and re-stamped) becomes WARN: the run passes,
and the file changed, for the user to review and commit; its details say what was done (`fixed`,
`revalidated`). An entry re-stamped as it was keeps the status it measured, the summary saying so.

The JSON report's schema is docs/cli.md's "omnitune verify" section; REPORT_SCHEMA_VERSION changes
whenever a field changes meaning or goes away (tests/test_verify.py checks the shape).
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from omnitune.plain_json import json_safe, plain_json_text, utf8_text

REPORT_SCHEMA = "omnitune-verify"
REPORT_SCHEMA_VERSION = 1
# Keys every report has (as_record): an existing --json file without them is not replaced.
REPORT_KEYS = frozenset({"schema", "verdict", "checks"})
PARTS = ("compat", "numerics", "speed", "memory", "soak")
EXIT_PASS, EXIT_FAILURES, EXIT_USER_ERROR = 0, 1, 2


class Status(str, enum.Enum):
    PASS = "pass"
    WARN = "warn"
    FAIL = "fail"
    SKIP = "skipped"
    NOT_CHECKABLE = "not_checkable"

    def __str__(self) -> str:
        return self.value


# How a part's status is drawn from its checks: the worst present, those that did not run
# (skipped, not checkable) aside.
_RANK = {Status.SKIP: 0, Status.NOT_CHECKABLE: 1, Status.PASS: 2, Status.WARN: 3, Status.FAIL: 4}


def worst(statuses: Sequence[Status]) -> Status:
    """The status a group of checks adds up to: the worst, SKIP or NOT_CHECKABLE only when no
    check ran (NOT_CHECKABLE when any could not be checked)."""
    if not statuses:
        return Status.SKIP
    return max(statuses, key=_RANK.__getitem__)


@dataclass(frozen=True)
class Check:
    """One outcome: which part, of which kernel (None for a whole-run check), about what."""

    part: str
    subject: str
    status: Status
    summary: str
    kernel: str | None = None
    details: Mapping[str, Any] = field(default_factory=dict)

    def as_record(self) -> dict[str, Any]:
        return {
            "part": self.part, "kernel": self.kernel, "subject": self.subject, "status": self.status.value,
            "summary": self.summary, "details": json_safe(dict(self.details)),
        }


def skipped(part: str, reason: str, *, subject: str = "all", kernel: str | None = None) -> Check:
    return Check(part, subject, Status.SKIP, f"skipped ({reason})", kernel)


@dataclass
class Report:
    """Everything one run found."""

    machine: Mapping[str, Any]
    options: Mapping[str, Any]
    started_at: str
    finished_at: str = ""
    checks: list[Check] = field(default_factory=list)

    def add(self, checks: Check | Sequence[Check]) -> None:
        self.checks.extend([checks] if isinstance(checks, Check) else checks)

    def part_status(self, part: str) -> Status:
        return worst([c.status for c in self.checks if c.part == part])

    @property
    def failed(self) -> bool:
        return any(c.status is Status.FAIL for c in self.checks)

    @property
    def exit_code(self) -> int:
        return EXIT_FAILURES if self.failed else EXIT_PASS

    def as_record(self) -> dict[str, Any]:
        counts = Counter(c.status.value for c in self.checks)
        return {
            "schema": REPORT_SCHEMA,
            "schema_version": REPORT_SCHEMA_VERSION,
            "verdict": "fail" if self.failed else "pass",
            "exit_code": self.exit_code,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "machine": json_safe(dict(self.machine)),
            "options": json_safe(dict(self.options)),
            "counts": {s.value: counts.get(s.value, 0) for s in Status},
            "parts": {
                part: {
                    "status": self.part_status(part).value,
                    "counts": {s.value: sum(1 for c in self.checks if c.part == part and c.status is s) for s in Status},
                }
                for part in PARTS
            },
            "checks": [c.as_record() for c in self.checks],
        }

    def to_json(self) -> str:
        return plain_json_text(self.as_record())


_STYLE = {Status.PASS: "green", Status.WARN: "yellow", Status.FAIL: "bold red", Status.SKIP: "dim",
          Status.NOT_CHECKABLE: "cyan"}


def render_table(report: Report):
    """The Rich table of every check, part by part, with the verdict as its caption."""
    from rich.markup import escape
    from rich.table import Table

    verdict = "[bold red]FAIL[/]" if report.failed else "[bold green]PASS[/]"
    machine = report.machine.get("name", "?")
    # A pass that left entries unchecked says so where the verdict is read.
    unchecked = sum(1 for c in report.checks if c.status is Status.NOT_CHECKABLE)
    unchecked_note = f"; {unchecked} not checkable on this machine" if unchecked else ""
    table = Table(title=f"omnitune verify on {escape(str(machine))}", title_justify="left",
                  caption=f"verdict: {verdict} (exit {report.exit_code}){unchecked_note}", caption_justify="left")
    for column in ("part", "kernel", "subject", "status", "summary"):
        table.add_column(column, overflow="fold")
    for part in PARTS:
        for check in (c for c in report.checks if c.part == part):
            style = _STYLE[check.status]
            table.add_row(part, escape(utf8_text(check.kernel or "")), escape(utf8_text(check.subject)),
                          f"[{style}]{check.status.value}[/]", escape(utf8_text(check.summary)))
    return table

"""Durations as people read them, for estimates and progress lines: seconds under two minutes,
minutes under two hours, hours beyond."""

from __future__ import annotations


def human_duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"

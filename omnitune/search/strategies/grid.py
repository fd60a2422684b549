"""Every valid config in the spec's deterministic order: `--sampler grid`, and the enumeration a
search falls to when all the valid configs fit its budget (then nothing is left to chance)."""

from __future__ import annotations

from omnitune.search.strategies.base import FixedList, Setting


class Grid(FixedList):
    def __init__(self, setting: Setting, label: str = "grid"):
        # A space too large to list has no enumeration: the strategy then proposes nothing.
        super().__init__([(c, label) for c in setting.valid or ()])

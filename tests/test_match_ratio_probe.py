"""benchmarks/match_ratio_probe.py's listing (no GPU): which held-out problems a tighter
MatchPolicy sends from the nearest rung to the next one, read from the shipped H200 tables; the
spec's policy and the runtime's answers are as before once it is done."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

probe = pytest.importorskip("match_ratio_probe")


def test_a_tighter_ratio_moves_only_nearest_answers_and_leaves_the_policy_as_it_was():
    import omnitune.runtime as runtime
    from omnitune.registry import get_spec

    spec = get_spec("kv_compress")
    before = probe.answers("kv_compress", None)
    moved = probe.changed("kv_compress", 1.2)
    assert moved, "the shipped table answers some held-out problem from a tuned shape over 1.2x away"
    for row in moved:
        assert row["now"]["rung"] == "nearest" and row["alt"]["rung"] != "nearest"
        assert row["key"].startswith(row["dtype"] + "|")
    # A looser ratio can only add nearest answers, never take them away.
    looser = probe.answers("kv_compress", 8.0)
    assert all(looser[key][0] == "nearest" for key, (rung, _) in before.items() if rung == "nearest")
    assert spec.match.max_ratio == 2.0  # the spec's own, as before
    assert probe.answers("kv_compress", None) == before
    runtime.clear_cache()

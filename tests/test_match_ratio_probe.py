"""benchmarks/match_ratio_probe.py's listing (no GPU): which held-out problems a tighter
MatchPolicy sends from the nearest rung to the next one, read from the shipped H200 tables; the
spec's policy and the runtime's answers are as before once it is done."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

probe = pytest.importorskip("match_ratio_probe")
from conftest import INTERPRETED  # noqa: E402


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


def test_judging_checks_each_distinct_config_and_times_them_together():
    """Under the interpreter on the CPU, or on the GPU (fp16, a tiny paged decode): the three
    roles' configs, two of them equal, are two candidates, both checked against the reference and
    timed."""
    from omnitune.kernels.paged_decode_attention import PagedDecodeProblem
    from omnitune.registry import get_spec

    spec = get_spec("paged_decode_attention")
    problem = PagedDecodeProblem(b=2, h=4, hkv=2, lq=1, ctx=40, d=32, block_size=16)
    one = {"BLOCK_N": 16, "NUM_SPLITS": 2, "num_warps": 1, "num_stages": 2, "PACK_GQA": True, "FUSED_REDUCE": False}
    other = {**one, "NUM_SPLITS": 1, "BLOCK_N": 32}
    row = {"problem": problem, "dtype": "fp16", "now": {"config": one}, "alt": {"config": other}}
    probe.judge(row, spec, one, rounds=2, interpret=INTERPRETED)
    assert set(row["checks"]) == {"now+tuned", "alt"}
    assert all(check["status"] == "ok" for check in row["checks"].values())
    assert set(row["timings"]) == {"now+tuned", "alt"}
    assert row["now_over_tuned"] == 1.0 and row["alt_over_tuned"] > 0

"""The held-out problems of benchmarks/coverage_set.py: at least 30 per kernel, every one a
valid problem of its kernel, none a preset point or an entry of a shipped table (they judge the
tables on shapes nobody tuned), fp16 beside bf16, and the spread the evaluation promises."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from coverage_set import HELD_OUT  # noqa: E402

from omnitune.presets import KERNELS, PRESETS, preset_problems  # noqa: E402
from omnitune.registry import get_spec  # noqa: E402


def _tuned_keys(kernel: str) -> set[str]:
    keys: set[str] = set()
    for path in (ROOT / "tuned_configs" / kernel).glob("*.json"):
        keys |= set(json.loads(path.read_text())["entries"])
    return keys


@pytest.mark.parametrize("kernel", sorted(HELD_OUT))
def test_each_kernel_has_30_distinct_valid_unseen_problems(kernel):
    spec = get_spec(kernel)
    problems = HELD_OUT[kernel]
    assert len(problems) >= 30
    keys = [f"{dtype}|{spec.problem_key(p)}" for p, dtype in problems]
    assert len(set(keys)) == len(keys), "a problem is listed twice"
    for problem, _ in problems:
        assert spec.parse_shape(spec.problem_key(problem)) == problem  # valid for its kernel
    assert {dtype for _, dtype in problems} == {"bf16", "fp16"}
    assert not set(keys) & _tuned_keys(kernel), "a held-out problem is in a shipped table"
    preset_points = {spec.problem_key(pp.problem) for preset in PRESETS.values()
                     for pp in (preset_problems(preset, kernel) if kernel in KERNELS else [])}
    assert not {spec.problem_key(p) for p, _ in problems} & preset_points, "a held-out problem is a preset point"


def test_the_spread_the_evaluation_promises():
    attention = [p for p, _ in HELD_OUT["attention"]]
    assert {16, 24, 32, 40, 64} <= {p.h for p in attention}
    assert {64, 128} <= {p.d for p in attention}
    assert any(p.lq == 32768 and p.lk == 512 for p in attention)
    assert any(p.lq == 512 and p.lk == 32768 for p in attention)
    decode = [p for p, _ in HELD_OUT["paged_decode_attention"]]
    assert {16, 32, 64} <= {p.block_size for p in decode}
    assert min(p.b for p in decode) == 1 and max(p.b for p in decode) >= 128
    assert max(p.ctx for p in decode) >= 128000


def test_the_decode_default_study_picks_its_rule_on_problems_that_are_not_held_out():
    """benchmarks/decode_default_study.py chose paged decode's default: none of its problems may
    be one the held-out evaluation judges that default on; each candidate it times is valid."""
    from decode_default_study import TRAINING, DTYPES, candidates

    spec = get_spec("paged_decode_attention")
    held = {(spec.problem_key(p), dtype) for p, dtype in HELD_OUT["paged_decode_attention"]}
    assert len(TRAINING) >= 20
    assert not {(spec.problem_key(p), dtype) for p, dtype in TRAINING} & held
    for problem, dtype in TRAINING:
        chosen = candidates(problem, DTYPES[dtype])
        assert "default" in chosen and len(set(chosen.values())) == len(chosen)
        assert all(not spec.violations(problem, c, DTYPES[dtype]) for c in chosen.values())

"""benchmarks/training_set.py: each kernel's training problems are valid, distinct, and none is a
held-out problem (the tables they feed are judged on those) or a preset point (the shipped tables
hold those already; once trained, the training problems are shipped entries too)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from coverage_set import HELD_OUT  # noqa: E402
from training_set import TRAINING, shape_arguments  # noqa: E402

from omnitune.presets import KERNELS as PRESET_KERNELS  # noqa: E402
from omnitune.presets import PRESETS, models_problems  # noqa: E402
from omnitune.registry import get_spec  # noqa: E402


@pytest.mark.parametrize("kernel", sorted(TRAINING))
def test_training_problems_are_valid_distinct_and_apart_from_the_held_out_set(kernel):
    spec = get_spec(kernel)
    keys = [f"{dtype}|{spec.problem_key(p)}" for p, dtype in TRAINING[kernel]]
    assert len(set(keys)) == len(keys), "a training problem is listed twice"
    for problem, _ in TRAINING[kernel]:
        assert spec.parse_shape(spec.problem_key(problem)) == problem
    held_out = {spec.problem_key(p) for p, _ in HELD_OUT[kernel]}
    assert not {spec.problem_key(p) for p, _ in TRAINING[kernel]} & held_out, "a held-out problem is in training"
    if kernel in PRESET_KERNELS:  # presets are searched in bf16 and fp16 alike: the shape decides
        presets = {spec.problem_key(p.problem) for p in models_problems(tuple(PRESETS.values()), kernel, spec.problem_key)}
        assert presets and not {spec.problem_key(p) for p, _ in TRAINING[kernel]} & presets, "a preset point"


def test_the_command_line_prints_a_dtypes_problems_as_shape_arguments():
    arguments = shape_arguments("kv_compress", "fp16")
    spec = get_spec("kv_compress")
    assert arguments[::2] == ["--shape"] * (len(arguments) // 2)
    assert [spec.parse_shape(k) for k in arguments[1::2]] == [p for p, d in TRAINING["kv_compress"] if d == "fp16"]
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "training_set.py"), "kv_compress", "bf16"],
                         capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0 and run.stdout.split() == shape_arguments("kv_compress", "bf16")
    bad = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "training_set.py"), "nope", "bf16"],
                         capture_output=True, text=True, timeout=120, check=False)
    assert bad.returncode == 2 and bad.stderr.startswith("usage:")

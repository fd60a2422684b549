"""The contract every registered kernel's spec must honour; a new kernel is picked up here by
being in the registry."""

from __future__ import annotations

import pytest
import torch

from omnitune.registry import get_spec, kernel_names
from omnitune.spec import Config, DeviceLimits

from conftest import DEVICE

CPU_DTYPES = (torch.float32, torch.float16)  # the interpreter gets bf16 wrong; bf16 runs on the GPU


@pytest.fixture(params=kernel_names())
def spec(request):
    return get_spec(request.param)


def _dtypes(spec):
    return [d for d in spec.dtypes if DEVICE == "cuda" or d in CPU_DTYPES]


def test_default_config_is_valid_and_in_space(spec):
    for problem, dtype in ((p, d) for p in _problems(spec) for d in spec.dtypes):
        cfg = spec.default_config(problem, dtype)
        assert spec.violations(problem, cfg, dtype) == []
        assert spec.coerce_config(cfg.as_dict()) == cfg
        assert cfg in set(spec.all_configs())


def test_inputs_deterministic_per_seed_and_not_zero(spec):
    dtype = _dtypes(spec)[0]
    a = spec.make_inputs(spec.example_problem, dtype, DEVICE, 3)
    b = spec.make_inputs(spec.example_problem, dtype, DEVICE, 3)
    c = spec.make_inputs(spec.example_problem, dtype, DEVICE, 4)
    ta = [t for t in vars(a).values() if isinstance(t, torch.Tensor) and t.is_floating_point()]
    tb = [t for t in vars(b).values() if isinstance(t, torch.Tensor) and t.is_floating_point()]
    tc = [t for t in vars(c).values() if isinstance(t, torch.Tensor) and t.is_floating_point()]
    assert ta, "inputs hold no floating-point tensors"
    assert all(torch.equal(x, y) for x, y in zip(ta, tb))
    assert any(not torch.equal(x, y) for x, y in zip(ta, tc))
    assert all(x.abs().sum() > 0 for x in ta)


def _problems(spec):
    return [spec.example_problem, *spec.sample_problems]


def test_kernel_matches_reference_with_default_config(spec):
    for problem, dtype in ((p, d) for p in _problems(spec) for d in _dtypes(spec)):
        inputs = spec.make_inputs(problem, dtype, DEVICE, 11)
        if spec.restore_inputs is not None:
            spec.restore_inputs(inputs)
        out = spec.new_output(inputs)
        spec.launch(inputs, out, spec.default_config(problem, dtype))
        err = spec.compare(out, spec.reference(inputs))
        assert err <= spec.tolerance[dtype], f"{spec.name} {problem} {dtype}: {err}"


def test_unwritten_output_fails_the_check(spec):
    dtype = _dtypes(spec)[0]
    inputs = spec.make_inputs(spec.example_problem, dtype, DEVICE, 5)
    out = spec.new_output(inputs)  # never launched: must not pass as correct
    assert not spec.compare(out, spec.reference(inputs)) <= spec.tolerance[dtype]


def test_model_counts(spec):
    for dtype in spec.dtypes:
        assert spec.bytes_moved(spec.example_problem, dtype) > 0
    assert spec.flops(spec.example_problem) >= 0


def test_every_constraint_can_reject(spec):
    """Each constraint must reject some config of the space for some problem/device; a
    constraint that can never fire is dead code pretending to protect us."""
    problems = _problems(spec)
    limits = [DeviceLimits(), DeviceLimits(shared_memory_per_block_bytes=48 * 1024, compute_capability=(8, 0))]
    fired = set()
    for problem in problems:
        for lim in limits:
            for cfg in spec.all_configs():
                for dtype in spec.dtypes:
                    for name, reason in spec.violations(problem, cfg, dtype, lim):
                        assert reason
                        fired.add(name)
    assert fired == {c.name for c in spec.constraints}


def test_problem_key_round_trips_as_shape(spec):
    for problem in _problems(spec):
        assert spec.parse_shape(spec.problem_key(problem)) == problem


def test_params_have_unique_names_and_choices(spec):
    names = [p.name for p in spec.params]
    assert len(names) == len(set(names))
    for p in spec.params:
        assert len(p.choices) == len(set(p.choices)) >= 1
    assert spec.space_size() == len(list(spec.all_configs()))
    assert all(isinstance(c, Config) for c in spec.all_configs())

"""The contract every kernel spec must honour, as a pytest suite you run on your own kernel.

omnitune's search, report, export and runtime only read the spec, so a spec that breaks one of
these rules breaks them quietly: a default config outside the space, inputs that are the same for
every seed, an output buffer that passes the check without being written, a constraint that never
fires, a problem key that does not parse back. The built-in kernels pass this very suite
(tests/test_spec_contract.py). Subclass `SpecContract` in a test module of yours:

    # test_my_kernel.py
    import os
    os.environ.setdefault("TRITON_INTERPRET", "1")  # no GPU: before the kernel module is imported

    from omnitune.testing import SpecContract

    class TestMyKernel(SpecContract):
        kernel = "my_kernel.py"   # a KernelSpec, or what `omnitune search` takes: a file or module

and run `python -m pytest test_my_kernel.py`. Each rule is one test; a failure says which rule and
which problem. To check several kernels at once, override the `spec` fixture with params instead
of setting `kernel`. Outside pytest, `check_spec(spec)` runs every rule and raises AssertionError
at the first broken one.

On a CUDA GPU the kernel is launched in every dtype of the spec; without one it runs under
Triton's interpreter (TRITON_INTERPRET=1, set before the kernel module is imported) in fp32 and
fp16 only — the interpreter computes bf16 wrongly. Launches use the spec's small problems
(`example_problem` and `sample_problems`), so keep those small: they should make every constraint
fire and every code path run.

This module needs pytest (omnitune's `test` extra).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch

from omnitune.spec import DTYPES, Config, DeviceLimits, KernelSpec, dtype_name

__all__ = [
    "INTERPRETER_DTYPES",
    "STATIC_RULES",
    "SpecContract",
    "check_spec",
    "contract_device",
    "runnable_dtypes",
]

INTERPRETER_DTYPES = (torch.float32, torch.float16)
"""The dtypes launched under Triton's interpreter (it computes bf16 wrongly)."""

# Device limits the constraints are checked against: the defaults (an H100/H200's) and a small
# Ampere-class part, so that shared-memory and architecture constraints get their chance to fire.
CONSTRAINT_LIMITS = (
    DeviceLimits(),
    DeviceLimits(shared_memory_per_block_bytes=48 * 1024, compute_capability=(8, 0)),
)

# Valid configs launched beside the default on the example problem, spread over the space.
SPREAD_CONFIGS = 3

# A kernel name becomes a folder (tuned_configs/<kernel>/) and part of a study name (kernel|...),
# and get_spec reads a name with a dot or a slash as a module or a file.
_NAME = re.compile(r"[A-Za-z0-9_-]+")


def contract_device() -> str:
    """'cuda' when a CUDA GPU is present, else 'cpu' (kernels then run under the interpreter)."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def runnable_dtypes(spec: KernelSpec, device: str) -> list[torch.dtype]:
    """The spec's dtypes that can be launched and checked on `device`."""
    return [d for d in spec.dtypes if device != "cpu" or d in INTERPRETER_DTYPES]


def problems_of(spec: KernelSpec) -> list[Any]:
    """The spec's small problems: example_problem, then sample_problems."""
    return [spec.example_problem, *spec.sample_problems]


def _problem_label(spec: KernelSpec, problem: Any) -> str:
    try:
        return spec.problem_key(problem)
    except Exception:  # noqa: BLE001 - a broken problem is reported by its own rule
        return repr(problem)


def _float_tensors(inputs: Any) -> list[torch.Tensor]:
    if dataclasses.is_dataclass(inputs):
        values = [getattr(inputs, f.name) for f in dataclasses.fields(inputs)]
    else:
        values = list(getattr(inputs, "__dict__", {}).values())
    return [t for t in values if isinstance(t, torch.Tensor) and t.is_floating_point()]


# --- the rules --------------------------------------------------------------------------------


def check_identity(spec: KernelSpec) -> None:
    """Name, module, problems, dtypes and tolerances are what the rest of omnitune expects."""
    assert isinstance(spec, KernelSpec), f"expected a omnitune.spec.KernelSpec, got {type(spec).__name__}"
    assert _NAME.fullmatch(spec.name), (
        f"kernel name {spec.name!r} must be letters, digits, '_' and '-' (it names a folder and a study; "
        "with a '.' or '/' it would read as a module or a file)"
    )
    assert spec.module in sys.modules, (
        f"{spec.name}: module={spec.module!r} is not an imported module; set module=__name__ in the "
        "KernelSpec (the kernel source hash recorded with every result comes from it)"
    )
    assert dataclasses.is_dataclass(spec.problem_type), f"{spec.name}: problem_type must be a dataclass"
    assert spec.example_problem is not None, f"{spec.name}: example_problem is required (a small problem)"
    for problem in problems_of(spec):
        assert isinstance(problem, spec.problem_type), (
            f"{spec.name}: {problem!r} is not a {spec.problem_type.__name__}"
        )
        hash(problem)  # the runtime caches answers per problem: it must be hashable (frozen=True)
    assert spec.dtypes, f"{spec.name}: dtypes is empty"
    for dtype in spec.dtypes:
        assert dtype in DTYPES.values(), f"{spec.name}: dtype {dtype} is not one of {list(DTYPES)}"
        tolerance = spec.tolerance.get(dtype)
        assert tolerance is not None, f"{spec.name}: no tolerance for {dtype_name(dtype)}"
        assert math.isfinite(tolerance) and tolerance >= 0, (
            f"{spec.name}: tolerance {tolerance} for {dtype_name(dtype)}"
        )
    if spec.prepared_baselines:
        named = set(spec.baselines(spec.example_problem)) if spec.baselines is not None else set()
        assert spec.prepared_baselines <= named, (
            f"{spec.name}: prepared_baselines {sorted(spec.prepared_baselines - named)} are not among its "
            f"baselines {sorted(named)}"
        )


def check_params(spec: KernelSpec) -> None:
    """Parameters have unique names and unique choices, and the space enumerates as Configs."""
    names = [p.name for p in spec.params]
    assert names, f"{spec.name}: no parameters to tune"
    assert len(names) == len(set(names)), f"{spec.name}: duplicate parameter names {names}"
    for p in spec.params:
        assert len(p.choices) == len(set(p.choices)) >= 1, f"{spec.name}: {p.name} choices {p.choices}"
        for choice in p.choices:
            assert p.coerce(choice) == choice and p.coerce(str(choice)) == choice, (
                f"{spec.name}: {p.name}={choice!r} does not survive a round trip through text"
            )
    configs = list(spec.all_configs())
    assert spec.space_size() == len(configs)
    assert all(isinstance(c, Config) for c in configs)


def check_default_configs(spec: KernelSpec) -> None:
    """The default config of every small problem, in every dtype, is a valid member of the space."""
    space = set(spec.all_configs())
    for problem in problems_of(spec):
        for dtype in spec.dtypes:
            where = f"{spec.name} {_problem_label(spec, problem)} {dtype_name(dtype)}"
            cfg = spec.default_config(problem, dtype)
            assert isinstance(cfg, Config), f"{where}: default_config returned {type(cfg).__name__}"
            assert cfg in space, f"{where}: default {cfg.label()} is not in the space"
            assert spec.coerce_config(cfg.as_dict()) == cfg
            assert spec.violations(problem, cfg, dtype) == [], f"{where}: default {cfg.label()} is rejected"


def check_partial_configs(spec: KernelSpec) -> None:
    """known_good and rollback_config name real parameters and choices, and complete over the
    default into members of the space."""
    partials = [("known_good", values) for values in spec.known_good]
    if spec.rollback_config is not None:
        partials.append(("rollback_config", spec.rollback_config))
    space = set(spec.all_configs())
    for what, values in partials:
        spec.coerce_config(values, partial_ok=True)
        for dtype in spec.dtypes:
            cfg = spec.complete_config(values, spec.example_problem, dtype)
            assert cfg in space, f"{spec.name}: {what} {dict(values)} completes to {cfg.label()}, not in the space"


def check_match_policy(spec: KernelSpec) -> None:
    """MatchPolicy and aliases name fields the problem has, ratios are ≥ 1, and every problem
    matches itself at distance 0."""
    fields = {f.name for f in spec.problem_fields()}
    for name in spec.match.exact:
        assert name in fields, f"{spec.name}: MatchPolicy.exact names {name!r}; problem fields are {sorted(fields)}"
    for name, ratio in spec.match.ratio_overrides.items():
        assert name in fields, f"{spec.name}: MatchPolicy.ratio_overrides names {name!r}; fields are {sorted(fields)}"
        assert ratio >= 1, f"{spec.name}: ratio_overrides[{name!r}] = {ratio} < 1 matches nothing"
    assert spec.match.max_ratio >= 1, f"{spec.name}: MatchPolicy.max_ratio {spec.match.max_ratio} < 1"
    for alias, targets in spec.aliases.items():
        for name in targets:
            assert name in fields, f"{spec.name}: alias {alias!r} names {name!r}, not a problem field"
    for problem in problems_of(spec):
        assert spec.match.distance(problem, problem) == 0, f"{spec.name}: {problem} does not match itself"


def check_problem_keys(spec: KernelSpec) -> None:
    """A problem's key parses back to the same problem (it is printed as a --shape), and distinct
    problems get distinct keys (tables and studies are keyed by it)."""
    keys = {}
    for problem in problems_of(spec):
        key = spec.problem_key(problem)
        assert spec.parse_shape(key) == problem, f"{spec.name}: {key!r} parses to {spec.parse_shape(key)}"
        assert keys.setdefault(key, problem) == problem, f"{spec.name}: two problems share the key {key!r}"


def check_model_counts(spec: KernelSpec) -> None:
    """The byte model is positive and the FLOP model non-negative, both finite."""
    for problem in problems_of(spec):
        for dtype in spec.dtypes:
            moved = spec.bytes_moved(problem, dtype)
            assert math.isfinite(moved) and moved > 0, (
                f"{spec.name} {_problem_label(spec, problem)} {dtype_name(dtype)}: bytes_moved {moved}"
            )
        flops = spec.flops(problem)
        assert math.isfinite(flops) and flops >= 0, f"{spec.name} {problem}: flops {flops}"


def check_constraints_fire(spec: KernelSpec, limits: Sequence[DeviceLimits] = CONSTRAINT_LIMITS) -> None:
    """Every constraint rejects some config of the space for some small problem and dtype, with a
    reason; a constraint that never fires is dead code pretending to protect the search."""
    names = [c.name for c in spec.constraints]
    assert len(names) == len(set(names)), f"{spec.name}: duplicate constraint names {names}"
    fired = set()
    for problem in problems_of(spec):
        for lim in limits:
            for cfg in spec.all_configs():
                for dtype in spec.dtypes:
                    for name, reason in spec.violations(problem, cfg, dtype, lim):
                        assert isinstance(reason, str) and reason, f"{spec.name}: {name} gave no reason"
                        fired.add(name)
    never = sorted(set(names) - fired)
    assert not never, (
        f"{spec.name}: constraints {never} reject no config for any problem of example_problem and "
        "sample_problems; add a sample problem where they fire, or remove them"
    )


def check_runs_here(spec: KernelSpec, device: str) -> None:
    """Without a GPU, the kernel module's @triton.jit functions are interpreted; otherwise the
    launches below would test nothing (or fail for want of a GPU)."""
    if device != "cpu":
        return
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    module = sys.modules.get(spec.module)
    compiled = [n for n, v in vars(module or object()).items()
                if isinstance(v, JITFunction) and not isinstance(v, InterpretedFunction)]
    assert not compiled, (
        f"{spec.name}: {', '.join(compiled)} were compiled for a GPU, and there is none; set "
        "TRITON_INTERPRET=1 before the kernel module is imported (e.g. at the top of conftest.py)"
    )
    assert os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"), "set TRITON_INTERPRET=1 to run without a GPU"


def check_inputs(spec: KernelSpec, device: str, dtype: torch.dtype) -> None:
    """make_inputs is deterministic per seed, differs between seeds, holds floating-point tensors
    of the requested dtype on the device, and none of them is all zeros (a kernel that writes
    nothing, or only zeros, must not pass the check)."""
    problem = spec.example_problem
    a, b, c = (spec.make_inputs(problem, dtype, device, seed) for seed in (3, 3, 4))
    ta, tb, tc = _float_tensors(a), _float_tensors(b), _float_tensors(c)
    assert ta, f"{spec.name}: the inputs hold no floating-point tensors (a dataclass of tensors is expected)"
    assert all(torch.equal(x, y) for x, y in zip(ta, tb)), f"{spec.name}: make_inputs differs for one seed"
    assert any(not torch.equal(x, y) for x, y in zip(ta, tc)), f"{spec.name}: make_inputs ignores the seed"
    assert all(x.abs().sum() > 0 for x in ta), f"{spec.name}: an input tensor is all zeros"
    assert any(x.dtype == dtype for x in ta), f"{spec.name}: no input tensor is in {dtype_name(dtype)}"
    assert all(x.device.type == torch.device(device).type for x in ta), f"{spec.name}: inputs not on {device}"


def check_unwritten_output_fails(spec: KernelSpec, device: str, dtype: torch.dtype) -> None:
    """new_output is poisoned: compared with the reference before any launch, it fails the
    tolerance (an element a config forgets to write must turn it into a mismatch). It is also a
    fresh buffer each time, of the reference's shape."""
    inputs = spec.make_inputs(spec.example_problem, dtype, device, 5)
    out = spec.new_output(inputs)
    ref = spec.reference(inputs)
    assert tuple(out.shape) == tuple(ref.shape), (
        f"{spec.name}: new_output is {list(out.shape)}, the reference {list(ref.shape)}"
    )
    assert spec.new_output(inputs).data_ptr() != out.data_ptr(), f"{spec.name}: new_output reuses one buffer"
    err = spec.compare(out, ref)
    assert not err <= spec.tolerance[dtype], f"{spec.name}: an output never written passes the check (error {err})"


def _launch_and_compare(spec: KernelSpec, problem: Any, dtype: torch.dtype, device: str, config: Config) -> None:
    inputs = spec.make_inputs(problem, dtype, device, 11)
    if spec.restore_inputs is not None:
        spec.restore_inputs(inputs)
    out = spec.new_output(inputs)
    result = spec.launch(inputs, out, config)  # or the tensor that holds the result
    err = spec.compare(result if isinstance(result, torch.Tensor) else out, spec.reference(inputs))
    assert err <= spec.tolerance[dtype], (
        f"{spec.name} {_problem_label(spec, problem)} {dtype_name(dtype)} {config.label()}: error {err} > "
        f"tolerance {spec.tolerance[dtype]}"
    )


def check_default_matches_reference(spec: KernelSpec, device: str, dtypes: Sequence[torch.dtype]) -> None:
    """With its default config, the kernel matches the reference within tolerance on every small
    problem in every dtype that runs here."""
    for problem in problems_of(spec):
        for dtype in dtypes:
            _launch_and_compare(spec, problem, dtype, device, spec.default_config(problem, dtype))


def spread_configs(spec: KernelSpec, problem: Any, dtype: torch.dtype, most: int = SPREAD_CONFIGS) -> list[Config]:
    """Up to `most` valid configs other than the default, evenly spread over the valid ones (the
    first and the last among them): the corners a default never visits."""
    default = spec.default_config(problem, dtype)
    valid = [c for c in spec.valid_configs(problem, dtype) if c != default]
    if len(valid) <= most:
        return valid
    if most == 1:
        return [valid[0]]
    picks = sorted({round(i * (len(valid) - 1) / (most - 1)) for i in range(most)})
    return [valid[i] for i in picks]


def check_valid_configs_match_reference(
    spec: KernelSpec, device: str, dtype: torch.dtype, most: int = SPREAD_CONFIGS,
) -> None:
    """Valid configs other than the default also match the reference, on the example problem:
    the search relies on every config a constraint lets through being correct (a wrong one only
    becomes a `mismatch` trial, but it is a bug in the kernel)."""
    for config in spread_configs(spec, spec.example_problem, dtype, most):
        _launch_and_compare(spec, spec.example_problem, dtype, device, config)


STATIC_RULES: tuple[Callable[[KernelSpec], None], ...] = (
    check_identity,
    check_params,
    check_default_configs,
    check_partial_configs,
    check_match_policy,
    check_problem_keys,
    check_model_counts,
    check_constraints_fire,
)
"""The rules that launch nothing (no device needed)."""


def check_spec(spec: KernelSpec | str, device: str | None = None, *, spread: int = SPREAD_CONFIGS) -> None:
    """Run every rule on one spec (or a name, module or file that get_spec takes); AssertionError
    at the first broken one. `spread`: valid non-default configs launched on the example problem."""
    spec = _resolve(spec)
    device = device or contract_device()
    for rule in STATIC_RULES:
        rule(spec)
    check_runs_here(spec, device)
    dtypes = runnable_dtypes(spec, device)
    if not dtypes:
        return
    check_inputs(spec, device, dtypes[0])
    check_unwritten_output_fails(spec, device, dtypes[0])
    check_default_matches_reference(spec, device, dtypes)
    check_valid_configs_match_reference(spec, device, dtypes[0], spread)


def _resolve(kernel: KernelSpec | str) -> KernelSpec:
    if isinstance(kernel, KernelSpec):
        return kernel
    from omnitune.registry import get_spec

    return get_spec(kernel)


# --- the pytest suite -------------------------------------------------------------------------


class SpecContract:
    """The contract as pytest tests: subclass it as `Test...` and set `kernel` (a KernelSpec, or
    a name, module or .py file as `omnitune search` takes), or override the `spec` fixture (with
    params, to check several kernels).

    `spread_configs`: valid non-default configs launched on the example problem beside the
    default (0 to skip that test)."""

    kernel: KernelSpec | str | None = None
    spread_configs: int = SPREAD_CONFIGS

    @pytest.fixture
    def spec(self) -> KernelSpec:
        if self.kernel is None:
            raise TypeError(
                f"{type(self).__name__}: set `kernel = SPEC` (or a file or module), or override the spec fixture"
            )
        return _resolve(self.kernel)

    @pytest.fixture
    def contract_device(self) -> str:
        return contract_device()

    @pytest.fixture
    def contract_dtype(self, spec: KernelSpec, contract_device: str) -> torch.dtype:
        """The first of the spec's dtypes that runs here (the suite's single-dtype rules use it)."""
        dtypes = runnable_dtypes(spec, contract_device)
        if not dtypes:
            pytest.skip(f"{spec.name} has no dtype the interpreter runs ({', '.join(map(str, INTERPRETER_DTYPES))})")
        return dtypes[0]

    def test_identity(self, spec):
        check_identity(spec)

    def test_params_have_unique_names_and_choices(self, spec):
        check_params(spec)

    def test_default_config_is_valid_and_in_space(self, spec):
        check_default_configs(spec)

    def test_known_good_and_rollback_configs_are_in_space(self, spec):
        check_partial_configs(spec)

    def test_match_policy_names_problem_fields(self, spec):
        check_match_policy(spec)

    def test_problem_key_round_trips_as_shape(self, spec):
        check_problem_keys(spec)

    def test_model_counts(self, spec):
        check_model_counts(spec)

    def test_every_constraint_can_reject(self, spec):
        check_constraints_fire(spec)

    def test_kernels_run_here(self, spec, contract_device):
        check_runs_here(spec, contract_device)

    def test_inputs_deterministic_per_seed_and_not_zero(self, spec, contract_device, contract_dtype):
        check_inputs(spec, contract_device, contract_dtype)

    def test_unwritten_output_fails_the_check(self, spec, contract_device, contract_dtype):
        check_unwritten_output_fails(spec, contract_device, contract_dtype)

    def test_kernel_matches_reference_with_default_config(self, spec, contract_device, contract_dtype):
        check_runs_here(spec, contract_device)
        check_default_matches_reference(spec, contract_device, runnable_dtypes(spec, contract_device))

    def test_other_valid_configs_match_reference(self, spec, contract_device, contract_dtype):
        if self.spread_configs <= 0:
            pytest.skip("spread_configs = 0")
        check_runs_here(spec, contract_device)
        check_valid_configs_match_reference(spec, contract_device, contract_dtype, self.spread_configs)

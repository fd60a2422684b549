"""A test-only kernel one of whose configs computes a wrong result: the target of the numerics
check of `omnitune verify` (tests/test_verify.py).

The kernel scales a vector by 2 (grid axis 0: blocks of BLOCK elements); the reference is 2·x.
With SKEW=True it scales by 2.5 instead: it runs, writes every element, and is wrong, as a
config that breaks a kernel's arithmetic would be. Named by its file, as a user names a kernel
of their own.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from omnitune.spec import Config, KernelSpec, MatchPolicy, Param, poisoned


@dataclass(frozen=True)
class ScaleProblem:
    n: int


@dataclass(frozen=True)
class ScaleInputs:
    x: torch.Tensor


@triton.jit
def _scale(X, Out, N, BLOCK: tl.constexpr, SKEW: tl.constexpr):
    # axis 0: blocks of BLOCK elements
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < N
    factor = 2.5 if SKEW else 2.0
    tl.store(Out + offsets, tl.load(X + offsets, mask=mask) * factor, mask=mask)


def make_inputs(problem: ScaleProblem, dtype: torch.dtype, device, seed: int) -> ScaleInputs:
    generator = torch.Generator().manual_seed(seed)
    return ScaleInputs(torch.randn(problem.n, generator=generator, dtype=torch.float32).to(device=device, dtype=dtype))


def launch(inputs: ScaleInputs, out: torch.Tensor, config: Config) -> None:
    n = inputs.x.numel()
    _scale[(triton.cdiv(n, config["BLOCK"]),)](inputs.x, out, n, BLOCK=config["BLOCK"], SKEW=config["SKEW"])


SPEC = KernelSpec(
    name="wrong_scale",
    description="test-only: doubles a vector; SKEW=1 computes a wrong result",
    problem_type=ScaleProblem,
    params=(Param("BLOCK", (16, 32, 64)), Param("SKEW", (False, True))),
    constraints=(),
    default_config=lambda problem, dtype: Config(BLOCK=32, SKEW=False),
    make_inputs=make_inputs,
    new_output=lambda inputs: poisoned(inputs.x.shape, inputs.x.dtype, inputs.x.device),
    launch=launch,
    reference=lambda inputs: inputs.x.double() * 2.0,
    tolerance={torch.float32: 1e-6, torch.float16: 1e-3},
    flops=lambda problem: float(problem.n),
    bytes_moved=lambda problem, dtype: 2.0 * problem.n * torch.finfo(dtype).bits / 8,
    match=MatchPolicy(),
    dtypes=(torch.float32, torch.float16),
    example_problem=ScaleProblem(n=100),
    module=__name__,
)

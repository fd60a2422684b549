"""A test-only kernel whose configs fail on purpose: the fault-injection target of
tests/test_worker.py.

The kernel doubles a vector (grid axis 0: blocks of BLOCK elements); the reference is `2 * x`.
Parameter FAULT picks what its launch does before the kernel runs: nothing ("none"), raise
Triton's OutOfResources, raise a CompilationError, sleep forever, os.abort(), dereference NULL,
os._exit(3), or store far out of bounds ("illegal_access": a real illegal memory access on a
GPU, which poisons the process's CUDA context; under the interpreter, which would write to that
address on the host, it dereferences NULL like "segfault"). The lethal ones (hang, abort, segfault, exit) fire only inside an isolated worker
(omnitune.measure.worker sets WORKER_ENV there): measured in-process by accident, they raise an
ordinary error instead of taking pytest down.

A fault fires only at BLOCK=16 (a constraint prunes the others): one faulty config per fault
keeps a sweep short, since every lethal fault costs a worker restart.
"""

from __future__ import annotations

import ctypes
import os
import time
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.compiler.errors import CompilationError
from triton.runtime.errors import OutOfResources

from omnitune.measure.worker import WORKER_ENV
from omnitune.spec import Config, Constraint, KernelSpec, Param, poisoned

FAULTS = ("none", "raise_resources", "compile_error", "hang", "abort", "segfault", "illegal_access", "exit")
LETHAL_FAULTS = ("hang", "abort", "segfault", "illegal_access", "exit")
# Elements past the output that "illegal_access" stores to: 4 TiB of fp32 away, mapped by no allocation.
FAR_OUT_OF_BOUNDS = 1 << 40
FAULT_BLOCK = 16


@dataclass(frozen=True)
class FaultProblem:
    n: int


@dataclass(frozen=True)
class FaultInputs:
    x: torch.Tensor


@triton.jit
def _double(X, Out, N, BLOCK: tl.constexpr):
    # axis 0: blocks of BLOCK elements
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < N
    tl.store(Out + offsets, tl.load(X + offsets, mask=mask) * 2.0, mask=mask)


@triton.jit
def _store_far_out_of_bounds(Out, FAR: tl.constexpr, BLOCK: tl.constexpr):
    # No mask, on purpose: every lane writes FAR elements past the output.
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(Out + FAR + offsets, tl.zeros((BLOCK,), dtype=tl.float32))


def inject(fault: str, out: torch.Tensor | None = None) -> None:
    """Do what FAULT asks; lethal faults only inside a worker."""
    if fault == "none":
        return
    if fault == "raise_resources":
        raise OutOfResources(required=300_000, limit=232_448, name="shared memory")
    if fault == "compile_error":
        raise CompilationError("injected compile error", None)
    if os.environ.get(WORKER_ENV) != "1":
        raise RuntimeError(f"fault {fault!r} fires only inside an isolated worker")
    if fault == "hang":
        while True:
            time.sleep(3600)
    if fault == "abort":
        os.abort()
    if fault == "illegal_access" and out is not None and out.is_cuda:
        _store_far_out_of_bounds[(1,)](out, FAR=FAR_OUT_OF_BOUNDS, BLOCK=FAULT_BLOCK)
        torch.cuda.synchronize()  # the fault surfaces here, as "an illegal memory access"
        return
    if fault in ("segfault", "illegal_access"):
        ctypes.string_at(0)
    if fault == "exit":
        os._exit(3)
    raise ValueError(f"unknown fault {fault!r}; choose one of {', '.join(FAULTS)}")


def make_inputs(problem: FaultProblem, dtype: torch.dtype, device, seed: int) -> FaultInputs:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(problem.n, generator=generator, dtype=torch.float32) + 3.0  # away from zero
    return FaultInputs(x.to(dtype=dtype, device=device))


def launch(inputs: FaultInputs, out: torch.Tensor, config: Config) -> None:
    inject(config["FAULT"], out)
    n = inputs.x.numel()
    _double[(triton.cdiv(n, config["BLOCK"]),)](inputs.x, out, n, BLOCK=config["BLOCK"])


def _faults_at_one_block(problem, config, dtype, limits) -> str | None:
    if config["FAULT"] != "none" and config["BLOCK"] != FAULT_BLOCK:
        return f"faults fire only at BLOCK={FAULT_BLOCK}"
    return None


SPEC = KernelSpec(
    name="fault",
    description="test-only: a vector doubling whose configs fail on purpose",
    problem_type=FaultProblem,
    params=(Param("FAULT", FAULTS), Param("BLOCK", (FAULT_BLOCK, 32))),
    constraints=(Constraint("faults_at_one_block", _faults_at_one_block),),
    default_config=lambda problem, dtype: Config(FAULT="none", BLOCK=FAULT_BLOCK),
    make_inputs=make_inputs,
    new_output=lambda inputs: poisoned(inputs.x.shape, inputs.x.dtype, inputs.x.device),
    launch=launch,
    reference=lambda inputs: inputs.x * 2.0,
    tolerance={torch.float32: 1e-6},
    flops=lambda problem: float(problem.n),
    bytes_moved=lambda problem, dtype: 2.0 * problem.n * torch.finfo(dtype).bits / 8,
    dtypes=(torch.float32,),
    example_problem=FaultProblem(n=100),
    module=__name__,
)

"""A user's own Triton kernel tuned with omnitune: a fused RMSNorm.

    y[i, :] = x[i, :] / sqrt(mean(x[i, :]²) + eps) · weight

One launch reads each row, reduces its sum of squares in fp32, and writes the normalised, scaled
row: PyTorch's eager version takes several kernels and a round trip through memory for each.

This file is everything omnitune needs: the @triton.jit kernel, a launcher, a public function,
a frozen problem dataclass and `SPEC = register(KernelSpec(...))`. Nothing in omnitune names it;
it is given on the command line by its path:

    omnitune search examples/rmsnorm.py --shape m=9,n=96 --dtype fp32 --trials 4 --interpret
    omnitune report
    omnitune export --out tuned_configs
    omnitune lookup examples/rmsnorm.py --shape m=9,n=96 --dtype fp32 --device triton-interpreter

and checked by omnitune's contract suite (tests/test_example_rmsnorm.py):

    from omnitune.testing import SpecContract

    class TestRMSNorm(SpecContract):
        kernel = "examples/rmsnorm.py"

Grid: axis 0 over blocks of BLOCK_M rows. A row that fits in BLOCK_N columns is read once
(ONE_PASS); a longer one is walked twice, BLOCK_N columns at a time: once for the sum of squares,
once to normalise and store.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from omnitune.errors import InputError
from omnitune.registry import register
from omnitune.spec import (
    Config,
    Constraint,
    KernelSpec,
    MatchPolicy,
    Param,
    element_bytes,
    poisoned,
    require_runnable_device,
)

EPS = 1e-6


@triton.jit
def _rms_norm(
    X, W, Y,
    stride_xm, stride_ym,
    M, N, eps,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    ONE_PASS: tl.constexpr,
):
    # axis 0: block of BLOCK_M rows
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < M
    x_rows = X + rows.to(tl.int64)[:, None] * stride_xm
    y_rows = Y + rows.to(tl.int64)[:, None] * stride_ym
    cols = tl.arange(0, BLOCK_N)
    if ONE_PASS:
        mask = row_ok[:, None] & (cols < N)[None, :]
        x = tl.load(x_rows + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / N + eps)
        w = tl.load(W + cols, mask=cols < N, other=0.0).to(tl.float32)
        y = x * rstd[:, None] * w[None, :]
        tl.store(y_rows + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)
    else:
        squares = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for start in range(0, N, BLOCK_N):
            c = start + cols
            mask = row_ok[:, None] & (c < N)[None, :]
            x = tl.load(x_rows + c[None, :], mask=mask, other=0.0).to(tl.float32)
            squares += x * x
        rstd = 1.0 / tl.sqrt(tl.sum(squares, axis=1) / N + eps)
        for start in range(0, N, BLOCK_N):
            c = start + cols
            mask = row_ok[:, None] & (c < N)[None, :]
            x = tl.load(x_rows + c[None, :], mask=mask, other=0.0).to(tl.float32)
            w = tl.load(W + c, mask=c < N, other=0.0).to(tl.float32)
            y = x * rstd[:, None] * w[None, :]
            tl.store(y_rows + c[None, :], y.to(Y.dtype.element_ty), mask=mask)


@dataclass(frozen=True)
class RMSNormProblem:
    """m rows (tokens) of n features (the hidden size)."""

    m: int
    n: int

    def __post_init__(self):
        for name in ("m", "n"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be ≥ 1, got {getattr(self, name)}")


@dataclass
class RMSNormInputs:
    x: torch.Tensor       # [M, N]
    weight: torch.Tensor  # [N]
    eps: float


def _launch(x: torch.Tensor, weight: torch.Tensor, y: torch.Tensor, eps: float, config: Config) -> None:
    m, n = x.shape
    block_m, block_n = int(config["BLOCK_M"]), int(config["BLOCK_N"])
    _rms_norm[(triton.cdiv(m, block_m),)](
        x, weight, y, x.stride(0), y.stride(0), m, n, eps,
        BLOCK_M=block_m, BLOCK_N=block_n, ONE_PASS=block_n >= n,
        num_warps=int(config["num_warps"]),
    )


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = EPS, *, config: Config | dict | None = None):
    """RMSNorm of x [M, N] (rows contiguous in their last dimension) scaled by weight [N].

    config: a launch config; None looks one up in the tuned tables (omnitune.runtime), which
    falls back to the default config when nothing was tuned for this GPU."""
    if x.dim() != 2 or weight.shape != (x.shape[1],):
        raise InputError(f"x must be [M, N] and weight [N]; got {list(x.shape)} and {list(weight.shape)}")
    if x.stride(1) != 1:
        raise InputError("x's rows must be contiguous (stride 1 in the last dimension)")
    require_runnable_device(x)
    problem = RMSNormProblem(m=x.shape[0], n=x.shape[1])
    if config is None:
        from omnitune.runtime import get_config

        cfg = get_config(SPEC.name, problem, dtype=x.dtype)
    else:
        cfg = SPEC.complete_config(config, problem, x.dtype)
        SPEC.require_valid(problem, cfg, x.dtype)
    y = torch.empty_like(x)
    _launch(x, weight.contiguous(), y, eps, cfg)
    return y


# --- the spec's callables --------------------------------------------------------------------


def make_inputs(problem: RMSNormProblem, dtype: torch.dtype, device, seed: int) -> RMSNormInputs:
    """Random rows, and a weight near 1 (never zero), from a CPU generator: the same per seed on
    every device."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn((problem.m, problem.n), generator=gen, dtype=torch.float32)
    weight = 1.0 + 0.25 * torch.rand(problem.n, generator=gen, dtype=torch.float32)
    return RMSNormInputs(x.to(device=device, dtype=dtype), weight.to(device=device, dtype=dtype), EPS)


def new_output(inputs: RMSNormInputs) -> torch.Tensor:
    return poisoned(inputs.x.shape, inputs.x.dtype, inputs.x.device)


def launch(inputs: RMSNormInputs, out: torch.Tensor, config: Config) -> None:
    _launch(inputs.x, inputs.weight, out, inputs.eps, config)


def reference(inputs: RMSNormInputs) -> torch.Tensor:
    """float64 on the CPU, float32 on a GPU."""
    acc = torch.float64 if inputs.x.device.type == "cpu" else torch.float32
    x = inputs.x.to(acc)
    rstd = torch.rsqrt(x.pow(2).mean(dim=1, keepdim=True) + inputs.eps)
    return x * rstd * inputs.weight.to(acc)


def flops(problem: RMSNormProblem) -> float:
    return 4.0 * problem.m * problem.n  # square, add, and two multiplies per element


def bytes_moved(problem: RMSNormProblem, dtype: torch.dtype) -> float:
    return float((2 * problem.m * problem.n + problem.n) * element_bytes(dtype))  # x in, y out, weight


# --- the config space and its constraints ----------------------------------------------------

PARAMS = (
    Param("BLOCK_M", (1, 2, 4, 8), "rows per program"),
    Param("BLOCK_N", (16, 32, 64, 128, 256, 512, 1024, 2048, 4096), "columns per step along a row"),
    Param("num_warps", (1, 2, 4, 8), "warps per program"),
)
_SMALLEST_BLOCK_N = PARAMS[1].choices[0]


def _block_m_exceeds_rows(problem, config, dtype, limits):
    useful = triton.next_power_of_2(problem.m)
    if int(config["BLOCK_M"]) > useful:
        return f"BLOCK_M={config['BLOCK_M']} exceeds the {problem.m} rows (use ≤ {useful})"
    return None


def _block_n_exceeds_row(problem, config, dtype, limits):
    useful = max(_SMALLEST_BLOCK_N, triton.next_power_of_2(problem.n))
    if int(config["BLOCK_N"]) > useful:
        return f"BLOCK_N={config['BLOCK_N']} exceeds the {problem.n} columns (use ≤ {useful})"
    return None


def _tile_registers(problem, config, dtype, limits):
    # Two fp32 tiles live at once (the row and its squares, or the row and the weight).
    threads = int(config["num_warps"]) * 32
    per_thread = 2 * int(config["BLOCK_M"]) * int(config["BLOCK_N"]) // threads
    if per_thread > 128:
        return f"two fp32 tiles need {per_thread} registers per thread (> 128)"
    return None


def _idle_threads(problem, config, dtype, limits):
    # More than one warp for a tile that does not give each thread one 16-byte vector only adds
    # idle threads.
    vectors = int(config["BLOCK_M"]) * int(config["BLOCK_N"]) * element_bytes(dtype) // 16
    if int(config["num_warps"]) > 1 and vectors < int(config["num_warps"]) * 32:
        return f"a tile of {vectors} 16-byte vectors leaves threads idle with {config['num_warps']} warps"
    return None


CONSTRAINTS = (
    Constraint("block_m_exceeds_rows", _block_m_exceeds_rows, "no row block larger than the rows"),
    Constraint("block_n_exceeds_row", _block_n_exceeds_row, "no column block larger than a row"),
    Constraint("tile_registers", _tile_registers, "two fp32 tiles ≤ 128 registers per thread"),
    Constraint("idle_threads", _idle_threads, "several warps only with a 16-byte vector per thread"),
)


def default_config(problem: RMSNormProblem, dtype: torch.dtype) -> Config:
    """A whole row per step (up to 4,096 columns), one row per program, and as many warps (up
    to 8) as give each thread a 16-byte vector; fewer where a constraint says so."""
    block_n = min(max(_SMALLEST_BLOCK_N, triton.next_power_of_2(problem.n)), 4096)
    warps = 8
    while warps > 1:
        cfg = Config(BLOCK_M=1, BLOCK_N=block_n, num_warps=warps)
        if not SPEC.violations(problem, cfg, dtype):
            return cfg
        warps //= 2
    return Config(BLOCK_M=1, BLOCK_N=block_n, num_warps=1)


def _torch_baseline(problem: RMSNormProblem):
    """PyTorch's own RMSNorm, for `omnitune bench`."""

    def run(inputs: RMSNormInputs) -> torch.Tensor:
        return torch.nn.functional.rms_norm(inputs.x, (inputs.x.shape[1],), inputs.weight, inputs.eps)

    return {"torch_rms_norm": run}


SPEC = register(KernelSpec(
    name="rmsnorm",
    description="example user kernel: fused RMSNorm over the rows of x, scaled by a weight",
    problem_type=RMSNormProblem,
    params=PARAMS,
    constraints=CONSTRAINTS,
    default_config=default_config,
    make_inputs=make_inputs,
    new_output=new_output,
    launch=launch,
    reference=reference,
    tolerance={torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2},
    flops=flops,
    bytes_moved=bytes_moved,
    match=MatchPolicy(exact=("n",), max_ratio=4.0),  # the hidden size decides the blocks
    aliases={"rows": ("m",), "tokens": ("m",), "hidden": ("n",)},
    known_good=({"BLOCK_M": 4},),
    example_problem=RMSNormProblem(m=9, n=96),
    sample_problems=(
        RMSNormProblem(m=1, n=5),       # one short row: the smallest block, masked columns
        RMSNormProblem(m=33, n=200),    # rows and columns off powers of two
        RMSNormProblem(m=3, n=4100),    # longer than the largest block: the two-pass loop
    ),
    baselines=_torch_baseline,
    module=__name__,
))

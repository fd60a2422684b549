"""Whole layers for production code, each taking the path its tuned table chose — with rollback.

    from omnitune.kernels.layers import cross_attention_layer, project_kv
    out = cross_attention_layer(x_q, x_kv, wq, wkv, wo, heads=28, kv_heads=4)

    # A decode loop over one image: its K/V are projected once and reused by every step.
    kv = project_kv(x_kv, wkv, bkv)
    for step in steps:
        out = cross_attention_layer(x_q, None, wq, None, wo, bq, None, bo, heads=28, kv_heads=4, kv=kv)

The tuned table (omnitune.runtime.get_config) says per problem whether the fused kernel or the
unfused PyTorch path (cuBLAS + SDPA) won on this GPU; FUSION="none" takes the unfused path
without touching Triton. A fused launch that fails for any reason but bad tensors (a compile
error, too little shared memory, a driver error) falls back to the unfused result, logs ONE
warning per problem (logger "omnitune.runtime"), and that problem is not tried fused again in
this process.

The fused output projection needs a zeroed fp32 workspace that every launch leaves zeroed; it is
allocated once per (device, stream, B, Lq, hidden) and kept here (launch_fused zeroes it
again after a failed launch). Calls on one stream are ordered, so they can share it; another stream gets its own.

Cached K/V: kv is x_kv's projection [B, Lk, 2·kv_heads·d] (K rows, then V rows, bkv applied),
made by project_kv. Given kv, the layer skips the K/V GEMM and looks its path up as a kv_cached
problem (tuned apart from the uncached one: a different mix of work). K/V then come from kv
alone: x_kv, wkv and bkv must be None, since the layer would not read them and checking that they
still agree with kv would cost the GEMM that caching saves.

The layer kernel's module (Triton) and _dispatch are imported on first call, so importing the
layers loads no Triton: a model's code can import them at definition time, and TRITON_INTERPRET
can still be set first.
"""

from __future__ import annotations

import logging
import threading

import torch

from omnitune.errors import InputError, one_line
from omnitune.kernels._library import library_op
from omnitune.spec import Config

# The runtime's logger, not this module's: every serving warning (a missing table, a refused
# backend, a rolled-back launch) goes to the one channel an engine watches and verify's soak counts.
logger = logging.getLogger("omnitune.runtime")

_workspaces: dict[tuple, object] = {}
_broken: set[tuple] = set()
_lock = threading.Lock()


def project_kv(x_kv: torch.Tensor, wkv: torch.Tensor, bkv: torch.Tensor | None = None) -> torch.Tensor:
    """x_kv [B, Lk, hidden] projected to K/V [B, Lk, 2·kv_heads·d] (wkv's K rows, then its V rows,
    plus bkv): the one GEMM the layer runs per call, made once, for cross_attention_layer(kv=...)."""
    from omnitune.kernels import cross_attention_layer as kernel

    for name, t in (("x_kv", x_kv), ("wkv", wkv)):
        if not isinstance(t, torch.Tensor):
            raise InputError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if x_kv.dim() != 3:
        raise InputError(f"x_kv must be 3-D [B, Lk, hidden], got {list(x_kv.shape)}")
    hidden = x_kv.shape[2]
    if wkv.dim() != 2 or wkv.shape[1] != hidden or wkv.shape[0] % 2:
        raise InputError(f"wkv must be [2·kv_heads·d, hidden={hidden}], got {list(wkv.shape)}")
    if bkv is not None and (not isinstance(bkv, torch.Tensor) or tuple(bkv.shape) != (wkv.shape[0],)):
        raise InputError(f"bkv must be None or a tensor of shape [{wkv.shape[0]}]")
    tensors = [t for t in (x_kv, wkv, bkv) if t is not None]
    if len({t.device for t in tensors}) != 1 or len({t.dtype for t in tensors}) != 1:
        raise InputError("x_kv, wkv and bkv must share one device and one dtype")
    if x_kv.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        # The layer refuses such a kv; on the CPU the GEMM made one without a word (on a GPU, torch's
        # "not implemented for 'Int'").
        raise InputError(f"unsupported dtype {x_kv.dtype}; use float16, bfloat16 or float32")
    return kernel.kv_projection(x_kv, wkv, bkv)


def cross_attention_layer(
    x_q: torch.Tensor,
    x_kv: torch.Tensor | None,
    wq: torch.Tensor,
    wkv: torch.Tensor | None,
    wo: torch.Tensor,
    bq: torch.Tensor | None = None,
    bkv: torch.Tensor | None = None,
    bo: torch.Tensor | None = None,
    *,
    heads: int,
    kv_heads: int,
    config: Config | dict | None = None,
    kv: torch.Tensor | None = None,
) -> torch.Tensor:
    """Cross-attention of x_q [B, Lq, hidden] to x_kv [B, Lk, hidden], projections included.

    wq [heads·d, hidden]; wkv [2·kv_heads·d, hidden], the K projection's rows then V's;
    wo [hidden, heads·d]; biases bq, bkv, bo all or none. Head dim d (= wq rows / heads) 64 or
    128. config: None looks the path up in the tuned tables; a (partial) config forces one.
    kv: cached K/V [B, Lk, 2·kv_heads·d] from project_kv, used instead of projecting x_kv; then
    x_kv, wkv and bkv must be None, and bq, bo both or neither.
    Returns [B, Lq, hidden] in the inputs' dtype."""
    if torch.compiler.is_compiling():
        from omnitune.kernels import _dispatch
        from omnitune.kernels import cross_attention_layer as kernel

        kernel.check_head_counts(heads, kv_heads)  # the op's int arguments take True as 1
        return torch.ops.omnitune.cross_attention_layer(x_q, x_kv, wq, wkv, wo, bq, bkv, bo, heads, kv_heads, kv,
                                                        _dispatch.config_to_json(config))
    return _layer(x_q, x_kv, wq, wkv, wo, bq, bkv, bo, heads, kv_heads, config, kv)


def _layer(x_q, x_kv, wq, wkv, wo, bq, bkv, bo, heads, kv_heads, config, kv) -> torch.Tensor:
    from omnitune.kernels import cross_attention_layer as kernel

    problem = kernel.check_inputs(x_q, x_kv, wq, wkv, wo, bq, bkv, bo, heads, kv_heads, kv)
    cfg = _config_for(kernel, problem, config, x_q.dtype)

    workspace = _workspace(kernel, problem, x_q.device) if cfg["FUSION"] == "q_out" else None
    inputs = kernel.LayerInputs(x_q, x_kv, wq, wkv, wo, bq, bkv, bo, heads, kv_heads, workspace,
                                sm_scale=problem.d ** -0.5, kv=kv)
    identity = (problem, x_q.dtype, x_q.device, cfg)
    if cfg["FUSION"] == "none" or identity in _broken:
        return kernel.unfused(inputs)

    out = torch.empty(x_q.shape, dtype=x_q.dtype, device=x_q.device)
    try:
        kernel.launch_fused(inputs, out, cfg)
    except InputError:
        raise
    except Exception as exc:  # noqa: BLE001 — any failure of the fused kernel rolls back
        with _lock:  # (launch_fused has already zeroed the workspace again)
            first = identity not in _broken
            _broken.add(identity)
        if first:
            logger.warning(
                "the fused cross_attention_layer (%s) failed for %s %s: %s; using the unfused "
                "path (cuBLAS+SDPA) for this problem from now on",
                cfg.label(), kernel.SPEC.problem_key(problem), x_q.dtype, one_line(exc, 200),
            )
        return kernel.unfused(inputs)
    return out


_memo = None


def _config_for(kernel, problem, config, dtype) -> Config:
    """The path and launch config for one problem: the tuned table's answer (memoised per
    problem), or the caller's config resolved by KernelSpec.resolve_config — a whole Config
    checked as it is, a mapping laid over the default — which must satisfy the spec's
    constraints (ConfigError: the caller's mistake)."""
    global _memo
    from omnitune.kernels import _dispatch

    if _memo is None:
        _memo = _dispatch.ConfigMemo("cross_attention_layer")
    if isinstance(config, Config):
        # Checked even as a Config: the config picks the path, so a wrong one is the caller's
        # mistake to report, not a launch to attempt and roll back.
        return kernel.SPEC.resolve_config(config, problem, dtype, check_given="all")
    return _memo.get(problem, config, lambda: problem, dtype)


def clear_state() -> None:
    """Forget cached workspaces and the problems whose fused launch failed (for tests)."""
    with _lock:
        _workspaces.clear()
        _broken.clear()


def _workspace(kernel, problem, device: torch.device):
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        # Inside a CUDA graph capture: a workspace of the graph's own (zeroed by a memset node),
        # never shared with eager calls or other graphs.
        return kernel.Workspace.zeroed(problem.b, problem.lq, problem.hidden, device)
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    key = (str(device), stream, problem.b, problem.lq, problem.hidden)
    ws = _workspaces.get(key)
    if ws is None:
        with _lock:
            ws = _workspaces.get(key)
            if ws is None:
                ws = _workspaces[key] = kernel.Workspace.zeroed(problem.b, problem.lq, problem.hidden, device)
    return ws


@library_op("cross_attention_layer")
def _layer_op(x_q: torch.Tensor, x_kv: torch.Tensor | None, wq: torch.Tensor, wkv: torch.Tensor | None,
              wo: torch.Tensor, bq: torch.Tensor | None, bkv: torch.Tensor | None, bo: torch.Tensor | None,
              heads: int, kv_heads: int, kv: torch.Tensor | None, config: str) -> torch.Tensor:
    """cross_attention_layer() as an op (what torch.compile records); config '' means look it up."""
    from omnitune.kernels import _dispatch

    return _layer(x_q, x_kv, wq, wkv, wo, bq, bkv, bo, heads, kv_heads, _dispatch.config_from_json(config), kv)


@_layer_op.register_fake
def _layer_fake(x_q, x_kv, wq, wkv, wo, bq, bkv, bo, heads, kv_heads, kv, config):
    return torch.empty(x_q.shape, dtype=x_q.dtype, device=x_q.device)

"""The production calls the memory and soak parts make: each preset problem through the public
op a user calls, and the mix of calls a preset's traffic implies.

This is the one place that knows the public ops' signatures, so that when they change only
`_CALLS` changes. Each op is called as a serving engine calls it: paged decode through a
PagedDecodePlan made once per batch composition (its run is what a decode graph captures), span
masks as a device tensor, the context length from the host, and check=False: the steady-state
path, which reads no value back from the GPU whatever OMNITUNE_CHECK says (the soak checks the
outputs itself). Inputs come from the kernel's spec (make_inputs), so the reference is the spec's
own; the op picks its config from the tuned tables as production does (omnitune.runtime).

The mix: a request is one prefill followed by DECODE_STEPS_PER_REQUEST decode steps. Every
prefill calls each prefill-time op once (prompt attention, text → image cross-attention, the
prompt's KV-cache write, the prefill or video layer) and every decode step each decode-time op
once; within one op and phase the preset's problems stand for the traffic between them, so each
is picked equally often. An op's share of the calls follows. Decode steps are what an engine
replays from CUDA graphs (`step=True`); prefill runs eagerly, its shapes vary too much to capture.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from omnitune.presets import PresetProblem
from omnitune.registry import get_spec

DECODE_STEPS_PER_REQUEST = 32


@dataclass
class OpCall:
    """One preset problem as production calls it."""

    kernel: str
    problem: Any
    dtype: torch.dtype
    role: str
    step: bool
    """A decode step: run from a CUDA graph, as an engine would."""
    call: Callable[[], torch.Tensor]
    """One call of the public op on fixed inputs; returns what it wrote (the caches, for an
    in-place write), so that the same call can be captured and replayed."""
    inputs: Any

    def reference(self) -> torch.Tensor:
        return get_spec(self.kernel).reference(self.inputs)

    def compare(self, out: torch.Tensor, expected: torch.Tensor) -> tuple[float, float]:
        """(error, tolerance) of an output against the reference."""
        spec = get_spec(self.kernel)
        return spec.compare(out, expected), spec.tolerance[self.dtype]

    @property
    def label(self) -> str:
        return f"{self.kernel} {get_spec(self.kernel).problem_key(self.problem)}"


def is_step(role: str) -> bool:
    """Whether a preset problem's role is a decode step (presets name them "decode…")."""
    return role.startswith("decode")


def build(preset_problem: PresetProblem, dtype: torch.dtype, device: str = "cuda", seed: int = 1) -> OpCall:
    spec = get_spec(preset_problem.kernel)
    inputs = spec.make_inputs(preset_problem.problem, dtype, device, seed)
    call = _CALLS[preset_problem.kernel](inputs, preset_problem.problem)
    return OpCall(preset_problem.kernel, preset_problem.problem, dtype, preset_problem.role,
                  is_step(preset_problem.role), call, inputs)


def weights(problems: Sequence[PresetProblem]) -> list[float]:
    """Each problem's share of the calls (summing to 1), by the request model of the module doc."""
    group = Counter((p.kernel, is_step(p.role)) for p in problems)
    raw = [(DECODE_STEPS_PER_REQUEST if is_step(p.role) else 1) / group[(p.kernel, is_step(p.role))]
           for p in problems]
    total = sum(raw)
    return [w / total for w in raw]


# --- the public ops ---------------------------------------------------------------------------


def _attention(inputs, problem) -> Callable[[], torch.Tensor]:
    from omnitune.kernels.attention import attention

    # span masks as the [B, S, 2] device tensor make_inputs built: read by the kernel, no host work
    return lambda: attention(inputs.q, inputs.k, inputs.v, causal=inputs.causal, sm_scale=inputs.sm_scale,
                             mm_spans=inputs.spans, check=False)


def _paged_decode(inputs, problem) -> Callable[[], torch.Tensor]:
    from omnitune.kernels.paged_decode_attention import PagedDecodePlan

    # Planned once for the batch, as an engine does before capturing its decode step; every
    # sequence of the spec's inputs holds problem.ctx tokens, the longest context planned for.
    i = inputs
    plan = PagedDecodePlan(batch=problem.b, num_heads=problem.h, num_kv_heads=problem.hkv, head_dim=problem.d,
                           block_size=problem.block_size, max_blocks=i.block_tables.shape[1],
                           max_context_len=problem.ctx, dtype=i.q.dtype, device=i.q.device,
                           query_tokens=problem.lq, sm_scale=i.sm_scale, cache_dtype=i.key_cache.dtype)
    return lambda: plan.run(i.q, i.key_cache, i.value_cache, i.block_tables, i.context_lens,
                            k_scale=i.k_scale, v_scale=i.v_scale, check=False)


def _kv_cache_write(inputs, problem) -> Callable[[], torch.Tensor]:
    from omnitune.kernels.kv_cache_write import write_kv_cache

    # Written again and again into one pair of caches: the same tokens to the same slots, so the
    # caches equal the reference after any number of calls.
    caches = inputs.initial_caches.clone()

    def call() -> torch.Tensor:
        write_kv_cache(inputs.key, inputs.value, caches[0], caches[1], inputs.slot_mapping,
                       k_scale=inputs.k_scale, v_scale=inputs.v_scale, check=False)
        return caches

    return call


def _cross_attention_layer(inputs, problem) -> Callable[[], torch.Tensor]:
    from omnitune.kernels.layers import cross_attention_layer

    i = inputs
    if problem.kv_cached:  # a decode loop over one image: K/V projected once (make_inputs did)
        return lambda: cross_attention_layer(i.x_q, None, i.wq, None, i.wo, i.bq, None, i.bo,
                                             heads=i.h, kv_heads=i.hkv, kv=i.kv)
    return lambda: cross_attention_layer(i.x_q, i.x_kv, i.wq, i.wkv, i.wo, i.bq, i.bkv, i.bo,
                                         heads=i.h, kv_heads=i.hkv)


_CALLS: dict[str, Callable[[Any, Any], Callable[[], torch.Tensor]]] = {
    "attention": _attention,
    "paged_decode_attention": _paged_decode,
    "kv_cache_write": _kv_cache_write,
    "cross_attention_layer": _cross_attention_layer,
}

"""The public ops' host (Python) time per call, measured on the CPU with the kernel launch stubbed.

benchmarks/launch_overhead_probe.py measures the same path on a GPU, launch included; this probe
needs no GPU: every DirectLauncher takes its direct path, its "compiled kernel" is a no-op, the
current stream and device are constants, and the tensors stay on the CPU. What it times is what
omnitune adds around the C launcher — the checks, the plan lookups, the launch key — so its
figures are this machine's, not an H200 host's, but they move as the H200's do.

    PYTHONPATH=$PWD python benchmarks/host_path_cpu.py [--calls 20000]
"""

from __future__ import annotations

import argparse
import contextlib
import time

import torch


class _NoOpKernel:
    """What the JIT hands back after a launch: a C launcher that does nothing."""

    function = packed_metadata = None

    @staticmethod
    def run(*args):
        return None


class _NoOpDescriptorRun:
    """A compiled kernel's launcher whose arguments at `positions` are tensor descriptors: Triton's
    own wrapper (wrap_handle_tensordesc) around a C function that does nothing."""

    launch_cooperative_grid = launch_pdl = False
    num_ctas, global_scratch_size, profile_scratch_size = 1, 0, 0

    def __init__(self, positions):
        from triton.backends.nvidia.driver import wrap_handle_tensordesc

        signature = {i: "tensordesc<bf16[64, 128]>" if i in positions else "i32" for i in range(max(positions) + 1)}
        self.launch = wrap_handle_tensordesc(lambda *args: None, signature, [{"swizzle": 3} for _ in positions])


class _NoOpJit:
    """Stands in for a @triton.jit function: `jit[grid](*args, **constexprs)` compiles nothing.
    descriptor_positions: the arguments its kernel takes as tensor descriptors."""

    def __init__(self, descriptor_positions=()):
        self._positions = descriptor_positions
        self._plain, self._with_descriptors = _NoOpKernel(), _NoOpKernel()
        if descriptor_positions:
            self._with_descriptors.run = _NoOpDescriptorRun(descriptor_positions)

    def __getitem__(self, grid):
        # a kernel given ints where it can take descriptors (attention's without USE_TMA) has none
        return lambda *args, **constexprs: (self._with_descriptors if self._positions
                                            and hasattr(args[self._positions[0]], "block_shape") else self._plain)


def _encoded_stand_in(descriptor, meta):
    """make_tensordesc_arg without the CUDA driver: a stand-in for the CUtensorMap, then the shape
    and strides, as the real one returns (cuTensorMapEncodeTiled's own cost is not in the figures)."""
    return [object(), *descriptor.shape, *descriptor.strides]


@contextlib.contextmanager
def stubbed_launches():
    """Every DirectLauncher launches directly into a no-op kernel; the CPU tensors pass the ops'
    device checks (their fast predicates still run in full: only the error path is skipped)."""
    from triton.backends.nvidia import driver

    from omnitune.kernels import _launch
    from omnitune.kernels import attention as attn
    from omnitune.kernels import attention_gluon as gluon
    from omnitune.kernels import cross_attention_layer as layer
    from omnitune.kernels import kv_cache_write as kvw
    from omnitune.kernels import kv_compress as kvc
    from omnitune.kernels import paged_decode_attention as pda

    launchers = [attn._ATTENTION, kvw._WRITE, pda._SPLIT, pda._COMBINE, layer._LAYER, kvc._STATS, kvc._SCORES,
                 gluon._PINGPONG]
    descriptors = {attn._ATTENTION: (5, 6), gluon._PINGPONG: (0, 1, 2, 3)}
    saved = [(launcher.jit, launcher._direct) for launcher in launchers]
    patched = [(_launch, "_raw_stream", lambda device: 0), (_launch, "_current_device", lambda: 0),
               (pda, "_explain_metadata", lambda *a: None), (kvw, "_explain_metadata", lambda *a: None),
               (attn, "_explain_inputs", lambda *a: None), (driver, "make_tensordesc_arg", _encoded_stand_in),
               (attn, "gluon_device_refusal", lambda q: None), (gluon, "gluon_device_refusal", lambda q: None)]
    patched += [(module, "require_runnable_device", lambda t: None) for module in (pda, kvw, attn, layer, kvc)
                if hasattr(module, "require_runnable_device")]
    originals = [(module, name, getattr(module, name)) for module, name, _ in patched]
    for launcher in launchers:
        launcher.jit, launcher._direct = _NoOpJit(descriptors.get(launcher, ())), True
        launcher.__dict__.pop("_bound", None)
    for module, name, stub in patched:
        setattr(module, name, stub)
    try:
        yield
    finally:
        for launcher, (jit, direct) in zip(launchers, saved):
            launcher.jit, launcher._direct = jit, direct
        for module, name, original in originals:
            setattr(module, name, original)


def per_call_us(fn, calls: int, repeats: int = 5) -> float:
    """The best of `repeats` runs of calls/repeats back-to-back calls: a shared machine's noise
    only ever adds time."""
    for _ in range(200):
        fn()
    block = max(1, calls // repeats)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(block):
            fn()
        best = min(best, (time.perf_counter() - t0) / block)
    return best * 1e6


def _decode_case(cache_dtype: torch.dtype, functional: bool = False):
    from omnitune.kernels import _fp8
    from omnitune.kernels import paged_decode_attention as pda

    b, h, hkv, d, block, ctx = 64, 28, 4, 128, 16, 4096
    pages = ctx // block
    fp8 = cache_dtype == _fp8.FP8
    plan = pda.PagedDecodePlan(batch=b, num_heads=h, num_kv_heads=hkv, head_dim=d, block_size=block,
                               max_blocks=pages, max_context_len=ctx, dtype=torch.bfloat16, device="cpu",
                               cache_dtype=cache_dtype)
    q = torch.zeros(b, h, 1, d, dtype=torch.bfloat16)
    cache = torch.zeros(b * pages + 1, block, hkv, d, dtype=torch.bfloat16).to(cache_dtype)
    tables = torch.zeros(b, pages, dtype=torch.int32)
    lens = torch.full((b,), ctx, dtype=torch.int32)
    scale = torch.ones(1, dtype=torch.float32) if fp8 else None
    if functional:
        return lambda: pda.paged_decode_attention(q, cache, cache, tables, lens, max_context_len=ctx,
                                                  k_scale=scale, v_scale=scale, check=False)
    return lambda: plan.run(q, cache, cache, tables, lens, k_scale=scale, v_scale=scale, check=False)


def _kv_write_case():
    from omnitune.kernels import kv_cache_write as kvw

    t, hkv, d = 256, 4, 128
    key = torch.zeros(t, hkv, d, dtype=torch.bfloat16)
    key_cache, value_cache = torch.zeros(2, 4096, 16, hkv, d, dtype=torch.bfloat16)
    slots = torch.arange(t)
    return lambda: kvw.write_kv_cache(key, key, key_cache, value_cache, slots, check=False)


def _attention_case(spans, backend="triton", use_tma=False):
    from omnitune.kernels import attention as attn

    q = torch.zeros(1, 28, 2048, 128, dtype=torch.bfloat16)
    k = torch.zeros(1, 4, 2048, 128, dtype=torch.bfloat16)
    span_tensor = None if spans is None else torch.tensor([spans], dtype=torch.int32)
    config = attn.Config(BACKEND=backend, BLOCK_M=128, BLOCK_N=64 if backend == "triton" else 128, num_warps=8,
                         num_stages=3 if backend == "triton" else 2, PACK_GQA=False, USE_TMA=use_tma)
    return lambda: attn.attention(q, k, k, causal=True, mm_spans=span_tensor, config=config, check=False)


def _layer_case():
    """The fused layer (FUSION q) at a decode step's shape with a small hidden size: its host work
    (checks, config, the kernel's launch) and the output GEMM, which on these CPU tensors is small."""
    from omnitune.kernels import cross_attention_layer as layer
    from omnitune.kernels import layers

    b, lq, lk, hidden, h, hkv, d = 1, 1, 16, 64, 2, 1, 64
    x_q, x_kv = torch.zeros(b, lq, hidden), torch.zeros(b, lk, hidden)
    wq, wkv, wo = torch.zeros(h * d, hidden), torch.zeros(2 * hkv * d, hidden), torch.zeros(hidden, h * d)
    problem = layer.CrossAttentionLayerProblem(b=b, lq=lq, lk=lk, hidden=hidden, h=h, hkv=hkv, d=d)
    config = layer.fused_config(problem, torch.float32, "q").as_dict()  # a mapping: memoised as a table's answer is
    return lambda: layers.cross_attention_layer(x_q, x_kv, wq, wkv, wo, heads=h, kv_heads=hkv, config=config)


def _importance_case():
    from omnitune.kernels import kv_compress as kvc

    q_window, k = torch.zeros(1, 28, 32, 128), torch.zeros(1, 4, 4096, 128)
    return lambda: kvc.kv_importance(q_window, k)


def cases():
    from omnitune.kernels import _fp8

    return {
        "PagedDecodePlan.run bf16 cache": _decode_case(torch.bfloat16),
        "PagedDecodePlan.run fp8 cache": _decode_case(_fp8.FP8),
        "paged_decode_attention bf16 cache": _decode_case(torch.bfloat16, functional=True),
        "write_kv_cache T256": _kv_write_case(),
        "attention causal": _attention_case(None),
        "attention causal + 2 image spans": _attention_case([(300, 556), (1200, 1456)]),
        "attention causal, USE_TMA": _attention_case(None, use_tma=True),
        "attention causal, Gluon": _attention_case(None, backend="gluon_pingpong"),
        "cross_attention_layer fused (q), small": _layer_case(),
        "kv_importance b1 h28/4 window 32 n4096": _importance_case(),
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=20000)
    args = parser.parse_args()
    with stubbed_launches():
        for name, fn in cases().items():
            print(f"{name:36s} {per_call_us(fn, args.calls):6.2f} µs/call")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Where a Triton launch's host time goes (triton 3.6): the JIT's full launch path against its
parts — the argument binder (specialisation), the cache-key computation, and the compiled
kernel's C launcher called directly — on the KV-cache write kernel, one decode step's worth;
the C launcher given the tensors' addresses as ints, and its C function without the Python
wrapper; then our layers on top: the bound launcher, the op's internal launch, the public op; and the
attention op with and without TMA descriptors (host-side descriptors are built per call).

    PYTHONPATH=$PWD python benchmarks/launch_overhead_probe.py --out $OUT/launch_overhead_h200.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import triton
from triton.runtime import jit as triton_jit


def per_call_us(fn, calls=2000) -> float:
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / calls * 1e6


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    from omnitune.kernels import kv_cache_write as kvw

    t, hkv, d = 256, 4, 128
    key = torch.randn(t, hkv, d, device="cuda", dtype=torch.bfloat16)
    value = torch.randn_like(key)
    kc = torch.zeros(4096, 16, hkv, d, device="cuda", dtype=torch.bfloat16)
    vc = torch.zeros_like(kc)
    slots = torch.randperm(4096 * 16, device="cuda")[:t]
    cfg = dict(BLOCK_T=1, BLOCK_H=4, num_warps=1)
    grid = (t, 1)
    jit = kvw._kv_cache_write
    # The kernel's arguments as kv_cache_write._launch passes them (no fp8 scales: the key
    # stands in for the two scale pointers, never read).
    pos = (key, value, kc, vc, slots, key, key, *key.stride(), *value.stride(), *kc.stride(), *vc.stride(), 0, 0,
           t, hkv, 16, 4096 * 16)
    kw = dict(HEAD_DIM=d, BLOCK_D=d, BLOCK_T=1, BLOCK_H=4, QUANTIZE=False, EXACT_ROUNDING=False, num_warps=1)
    kernel = jit[grid](*pos, **kw)
    device = triton.runtime.driver.active.get_current_device()
    kernel_cache, kernel_key_cache, target, backend, binder = jit.device_caches[device]
    bound, specialization, options = binder(*pos, **kw)
    stream = triton.runtime.driver.active.get_current_stream(device)
    values = tuple(bound.values())
    run, function, packed = kernel.run, kernel.function, kernel.packed_metadata
    addressed = tuple(v.data_ptr() if isinstance(v, torch.Tensor) else v for v in values)
    bound = kvw._WRITE.bind(kw, 7)  # as the op's launch plan binds it
    results = {
        "full_jit_launch_us": per_call_us(lambda: jit[grid](*pos, **kw)),
        "binder_only_us": per_call_us(lambda: binder(*pos, **kw)),
        "compute_cache_key_us": per_call_us(lambda: triton_jit.compute_cache_key(kernel_key_cache, specialization,
                                                                                 options)),
        "direct_c_launcher_us": per_call_us(lambda: run(t, 1, 1, stream, function, packed, None, None, None, *values)),
        # The same launch with each tensor passed as its address (the C launcher then neither
        # calls data_ptr() nor asks the driver about the pointer), through the Python wrapper
        # and through the C function itself.
        "direct_c_launcher_int_pointers_us": per_call_us(
            lambda: run(t, 1, 1, stream, function, packed, None, None, None, *addressed)),
        "c_launch_function_int_pointers_us": per_call_us(
            lambda: run.launch(t, 1, 1, stream, function, bool(run.launch_cooperative_grid), bool(run.launch_pdl),
                               None, None, packed, None, None, None, *addressed)),
        "current_stream_query_us": per_call_us(lambda: triton.runtime.driver.active.get_current_stream(device)),
        "torch_empty_us": per_call_us(lambda: torch.empty((64, 28, 1, 128), device="cuda", dtype=torch.bfloat16)),
        "index_copy_us": per_call_us(lambda: kc.view(-1, hkv, d).index_copy_(0, slots, key)),
        "bound_launcher_us": per_call_us(lambda: bound(grid + (1,), pos)),
        "internal_launch_us": per_call_us(lambda: kvw._launch(key, value, kc, vc, slots, kvw.Config(cfg))),
        "public_write_kv_cache_us": per_call_us(lambda: kvw.write_kv_cache(key, value, kc, vc, slots, check=False)),
        "specialization": [str(s) for s in specialization],
    }
    from omnitune.kernels import attention as attn

    q = torch.randn(1, 28, 2048, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, 4, 2048, 128, device="cuda", dtype=torch.bfloat16)
    inputs = attn.AttentionInputs(q, k, k, True, 128 ** -0.5)
    out = torch.empty_like(q)
    for use_tma in (False, True):
        c = attn.Config(BACKEND="triton", BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3, PACK_GQA=False,
                        USE_TMA=use_tma)
        results[f"attention_launch_tma{int(use_tma)}_us"] = per_call_us(lambda c=c: attn.launch(inputs, out, c),
                                                                          calls=500)
    results["attention_public_us"] = per_call_us(lambda: attn.attention(q, k, k, causal=True, check=False), calls=500)
    for k_, v in results.items():
        if k_ == "specialization":
            continue
        print(f"{k_:28s} {v:.2f}")
    args.out.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

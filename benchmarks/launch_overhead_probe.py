"""Where a Triton launch's host time goes (triton 3.6): the JIT's full launch path against its
parts — the argument binder (specialisation), the cache-key computation, and the compiled
kernel's C launcher called directly — on the KV-cache write kernel, one decode step's worth;
the C launcher given the tensors' addresses as ints, and its C function without the Python
wrapper; then our layers on top: the bound launcher, the op's internal launch, the public op; and the
attention op with and without TMA descriptors (host-side descriptors are built per call); and
PagedDecodePlan.run with its two launches taken apart.

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
    results.update(_decode_plan_parts())
    for k_, v in results.items():
        if k_ in ("specialization", "decode_config"):
            continue
        print(f"{k_:28s} {v:.2f}")
    args.out.write_text(json.dumps(results, indent=1))
    return 0


def _decode_plan_parts() -> dict:
    """PagedDecodePlan.run's host time and its parts, at batch 64 with h28/4 and the config the
    table gives for a 4k context, over a 256-token context (a short GPU time, so 200 calls never
    fill the launch queue and block the host): the split kernel's launch through the bound
    launcher, the same launch with its C arguments built once (the floor: the C launcher and the
    driver), the combine's fixed launch, and run with the plan's own output and with the caller's."""
    from omnitune.kernels import paged_decode_attention as pda

    b, h, hkv, ctx = 64, 28, 4, 256
    plan_config = pda.PagedDecodePlan(batch=b, num_heads=h, num_kv_heads=hkv, head_dim=128, block_size=16,
                                      max_blocks=256, max_context_len=4096, dtype=torch.bfloat16,
                                      device="cuda").config
    problem = pda.PagedDecodeProblem(b=b, h=h, hkv=hkv, lq=1, ctx=ctx, d=128, block_size=16)
    inputs = pda.SPEC.make_inputs(problem, torch.bfloat16, "cuda", seed=0)
    tensors = (inputs.q, inputs.key_cache, inputs.value_cache, inputs.block_tables, inputs.context_lens)
    plan = pda.PagedDecodePlan(batch=b, num_heads=h, num_kv_heads=hkv, head_dim=128, block_size=16,
                               max_blocks=problem.pages_per_sequence, max_context_len=ctx, dtype=torch.bfloat16,
                               device="cuda", config=plan_config)
    plan.run(*tensors)
    launch = plan._plan
    split_args = pda._split_args(*tensors, plan._scale_log2, plan.out, plan._scratch, launch.fused, None, None)
    fixed_split = launch.split.fixed(launch.split_grid, split_args)
    own_out = torch.empty_like(plan.out)
    parts = {
        "decode_config": plan_config.label(),
        "decode_plan_run_us": per_call_us(lambda: plan.run(*tensors), calls=200),
        "decode_plan_run_caller_out_us": per_call_us(lambda: plan.run(*tensors, out=own_out), calls=200),
        "decode_split_bound_launch_us": per_call_us(
            lambda: launch.split(launch.split_grid, split_args, plan._split_dtypes), calls=200),
        "decode_split_fixed_launch_us": per_call_us(fixed_split, calls=200),
    }
    if plan._fixed_combine is not None:
        parts["decode_combine_fixed_launch_us"] = per_call_us(plan._fixed_combine, calls=200)
    return parts


if __name__ == "__main__":
    raise SystemExit(main())

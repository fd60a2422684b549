"""fp8 KV caches as users call them: paged decode over an fp8 cache beside the same decode over
a bf16 cache, and the fp8 KV write beside the bf16 write, PyTorch's quantize + index_copy_, and a
plain copy of as many bytes — in one run, with ops_bench's method (public functions eager back
to back with their host time, PagedDecodePlan.run as CUDA-graph replay, interleaved rounds,
medians; benchmarks/ops_bench.py says how).

Decode: the same tokens in both caches (the fp8 cache holds the bf16 cache's values quantized as
write_kv_cache stores them, per-tensor scales, vLLM's default; one implementation runs per-kv-head
scales), configs from the runtime's tables as a user gets them. Reported: time per call, the
fp8 ÷ bf16 speedup, the fp8 result's relative error against the bf16-cache result (what
quantizing the cache costs) and against a float32 reference of the dequantized cache (what the
kernel adds: must be within the bf16 tolerance).

KV write: tokens quantized on write; bytes moved = keys and values read in bf16 and written in
fp8 (+ slots), against this device's copy bandwidth (omnitune.profile.calibrate) and against a
device copy moving the same number of bytes, timed in the same rounds.

    PYTHONPATH=$PWD python benchmarks/fp8_kv_bench.py --out $OUT/fp8_kv_h200.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ops_bench import Case, _rel, run_cases  # noqa: E402

BF16 = torch.bfloat16
FP8 = torch.float8_e4m3fn


def decode_case(device, b=64, h=28, hkv=4, ctx=4096, d=128, block_size=16) -> Case:
    from omnitune.kernels import _fp8
    from omnitune.kernels import paged_decode_attention as pda

    problem = pda.PagedDecodeProblem(b=b, h=h, hkv=hkv, lq=1, ctx=ctx, d=d, block_size=block_size)
    fp8_problem = pda.PagedDecodeProblem(b=b, h=h, hkv=hkv, lq=1, ctx=ctx, d=d, block_size=block_size,
                                         cache_dtype="fp8_e4m3")
    inputs = pda.SPEC.make_inputs(problem, BF16, device, seed=0)
    q, kc, vc, tables, lens = inputs.q, inputs.key_cache, inputs.value_cache, inputs.block_tables, inputs.context_lens
    # Unused slots hold +inf in the factory's caches (a poison for the tests); zero here, so that
    # the scales come from the tokens.
    finite_k, finite_v = kc.masked_fill(kc.isinf(), 0), vc.masked_fill(vc.isinf(), 0)
    k_scale, v_scale = _fp8.kv_cache_scale(finite_k), _fp8.kv_cache_scale(finite_v)
    kc8, vc8 = _fp8.quantize(finite_k, k_scale), _fp8.quantize(finite_v, v_scale)
    k_head, v_head = _fp8.kv_cache_scale(finite_k, per_head=True), _fp8.kv_cache_scale(finite_v, per_head=True)
    kc8h, vc8h = _fp8.quantize(finite_k, k_head), _fp8.quantize(finite_v, v_head)
    del finite_k, finite_v
    shape = dict(batch=b, num_heads=h, num_kv_heads=hkv, head_dim=d, block_size=block_size,
                 max_blocks=tables.shape[1], max_context_len=ctx, dtype=BF16, device=device)
    plan = pda.PagedDecodePlan(**shape)
    plan8 = pda.PagedDecodePlan(**shape, cache_dtype=FP8)
    plan8h = pda.PagedDecodePlan(**shape, cache_dtype=FP8)
    impls = {
        "bf16_cache": lambda: pda.paged_decode_attention(q, kc, vc, tables, lens, max_context_len=ctx),
        "fp8_cache": lambda: pda.paged_decode_attention(q, kc8, vc8, tables, lens, max_context_len=ctx,
                                                        k_scale=k_scale, v_scale=v_scale),
        "bf16_cache_plan_run": lambda: plan.run(q, kc, vc, tables, lens),
        "fp8_cache_plan_run": lambda: plan8.run(q, kc8, vc8, tables, lens, k_scale=k_scale, v_scale=v_scale),
        "fp8_cache_per_head_scales_plan_run": lambda: plan8h.run(q, kc8h, vc8h, tables, lens, k_scale=k_head,
                                                                 v_scale=v_head),
    }
    dequantized = pda.PagedDecodeInputs(q, kc8, vc8, tables, lens, inputs.sm_scale, k_scale, v_scale)

    def check(outs):
        base = outs["bf16_cache"]
        errors = {f"{n}_vs_bf16_cache": _rel(o, base) for n, o in outs.items() if n != "bf16_cache"}
        errors["fp8_cache_vs_dequantized_reference"] = _rel(outs["fp8_cache"], pda.reference(dequantized))
        errors["bf16_cache_vs_reference"] = _rel(base, pda.reference(inputs))
        return errors

    fp8_bytes = pda.SPEC.bytes_moved(fp8_problem, BF16)
    return Case(
        f"paged_decode b{b} h{h}/{hkv} ctx{ctx} d{d} bs{block_size}: bf16 vs fp8 cache", impls, check,
        bytes_moved=pda.SPEC.bytes_moved(problem, BF16),
        impl_bytes={n: fp8_bytes for n in impls if n.startswith("fp8")},
        notes=f"configs: bf16 {plan.config.label()} | fp8 {plan8.config.label()}",
    )


def write_case(device, t=65536, hkv=8, d=128, block_size=16) -> Case:
    from omnitune.kernels import _fp8
    from omnitune.kernels import kv_cache_write as kvw

    gen = torch.Generator().manual_seed(0)
    num_blocks = t // block_size + max(1, t // block_size // 4)
    key = torch.randn((t, hkv, d), generator=gen).to(device=device, dtype=BF16)
    value = (torch.randn((t, hkv, d), generator=gen) * 0.5).to(device=device, dtype=BF16)
    k_scale, v_scale = _fp8.kv_cache_scale(key), _fp8.kv_cache_scale(value)
    shape = (num_blocks, block_size, hkv, d)
    kc, vc = torch.zeros(shape, dtype=BF16, device=device), torch.zeros(shape, dtype=BF16, device=device)
    kc8, vc8 = torch.zeros(shape, dtype=FP8, device=device), torch.zeros(shape, dtype=FP8, device=device)
    kc8t, vc8t = torch.zeros(shape, dtype=torch.uint8, device=device), torch.zeros(shape, dtype=torch.uint8, device=device)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:t].to(device)
    flat_k, flat_v = kc8t.view(-1, hkv, d), vc8t.view(-1, hkv, d)
    fp8_bytes = 2 * t * hkv * d * (2 + 1) + 8 * t
    src = torch.empty(fp8_bytes // 2, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)

    def fp8_write():
        kvw.write_kv_cache(key, value, kc8, vc8, slots, k_scale=k_scale, v_scale=v_scale)
        return kc8

    def bf16_write():
        kvw.write_kv_cache(key, value, kc, vc, slots)
        return kc

    def torch_quantize_index_copy():
        flat_k.index_copy_(0, slots, _fp8.quantize(key, k_scale).view(torch.uint8))
        flat_v.index_copy_(0, slots, _fp8.quantize(value, v_scale).view(torch.uint8))
        return kc8t

    def copy_same_bytes():
        return dst.copy_(src)

    def check(outs):
        ok = torch.equal(kc8.view(torch.uint8), kc8t) and torch.equal(vc8.view(torch.uint8), vc8t)
        return {"fp8_write_bitwise_equal_to_torch": 0.0 if ok else float("inf")}

    impls = {"torch_quantize_index_copy": torch_quantize_index_copy, "omnitune_fp8": fp8_write,
             "omnitune_bf16": bf16_write, "copy_same_bytes_as_fp8_write": copy_same_bytes}
    problem = kvw.KVCacheWriteProblem(t=kvw._dispatch.bucket_up(t), hkv=hkv, d=d, block_size=block_size,
                                      cache_dtype="fp8_e4m3")
    config = kvw._memo.get((problem.t, hkv, d, block_size, "fp8_e4m3"), None, lambda: problem, BF16)
    return Case(f"kv_write t{t} hkv{hkv} d{d}: fp8 cache", impls, check, bytes_moved=fp8_bytes,
                impl_bytes={"omnitune_bf16": 4 * t * hkv * d * 2 + 8 * t},
                notes=f"fp8 config {config.label()}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--quick", action="store_true",
                        help="only the cases the fp8 goals name: decode at batch 64 (4k, 16k) and the large writes")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("fp8_kv_bench needs a CUDA GPU", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    makers = [lambda: decode_case(device, ctx=4096), lambda: decode_case(device, ctx=16384),
              lambda: decode_case(device, b=4, ctx=16384),
              lambda: write_case(device, t=256, hkv=4), lambda: write_case(device, t=8192, hkv=4),
              lambda: write_case(device, t=65536, hkv=8)]
    if args.quick:
        makers = [makers[0], makers[1], makers[4], makers[5]]
    return run_cases(makers, args.out, after=_speedups, device=device)


def _speedups(result: dict) -> None:
    """fp8 over bf16, per timing, where both ran."""
    impls = result["impls"]
    pairs = [("fp8_cache", "bf16_cache"), ("fp8_cache_plan_run", "bf16_cache_plan_run")]
    found = {}
    for fast, slow in pairs:
        if fast in impls and slow in impls:
            for k in ("wall_us", "graph_us"):
                if impls[fast].get(k) and impls[slow].get(k):
                    found[f"{fast}_over_{slow}_{k}"] = impls[slow][k] / impls[fast][k]
    if "omnitune_fp8" in impls and "copy_same_bytes_as_fp8_write" in impls:
        for k in ("wall_us", "graph_us"):
            if impls["omnitune_fp8"].get(k):
                found[f"fp8_write_vs_equal_bytes_copy_{k}"] = impls["copy_same_bytes_as_fp8_write"][k] / impls["omnitune_fp8"][k]
    result["speedups"] = found
    for name, value in found.items():
        print(f"   {name}: {value:.2f}")


if __name__ == "__main__":
    raise SystemExit(main())

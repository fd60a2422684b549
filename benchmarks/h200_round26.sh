#!/usr/bin/env bash
# Twenty-sixth H200 round, one H200:
#   OUT=dir bash benchmarks/h200_round26.sh R1|R2|K|T
# Part R (issues 16 and 15): paged decode with 32-bit row offsets inside a page
# (benchmarks/variants/decode_row_offsets_32.patch). Each K/V row's address was
# page·stride_block + in_page·stride_slot in 64-bit arithmetic, ~8 IMAD an address; the variant
# clamps the page number in 32 bits and multiplies in_page·stride_slot in 32 bits (in_page <
# block_size), leaving one widening multiply per row. Compiled for sm_90 without a GPU: the fp8
# one-warp 16-key loop 36.0 → 34.75 instructions a key, the bf16 4-warp 64-key loop 40.75 → 36.94
# (static counts). The variant is not safe as it stands for a slot stride × (block_size − 1) of
# 2^31 elements or more (a page of ≥ 2 GiB, or a slot-major cache viewed as block-major): if it
# pays, the kernel takes it behind a check of that bound. Compiled offline, it also brings the
# in-launch combine (FUSED_REDUCE) of the default 64-key 4-warp tile from 160 to 121 registers.
# R1: the long-context decode sweep with --fused-reduce (issue 15's three shapes short of 85%,
# bf16, 270 configs through PagedDecodePlan.run as a graph) with the kernel as committed, then the
# variant's GPU tests and the same sweep with it. R2: the fp8 few-warps sweep at 4k and 16k, each
# config also with FUSED_REDUCE (at 16k the public op took 356-366 µs where the split kernel's
# fastest config alone took 328-335 in round 25: the second launch's share is not measured), the
# same way. Each restores the kernel after.
# Part K (issue 16's write at ≥ 90% of copy): the KV write with its page size compiled in and the
# fp8 clamp left to the conversion instruction (cvt.rn.satfinite saturates at ±448 itself)
# (benchmarks/variants/kv_write_block_size_constexpr.patch). Compiled offline
# (write_instructions_offline*.json): at the table's 65,536-token config a thread issues 352
# instead of 544 instructions over fp8 (184 instead of 344 over bf16) for its 16 elements of K and
# of V — a 64-bit division by the page size gone. fp8_kv_bench --quick and a 40-trial search of
# the 65,536-token fp8 write before and after, the variant's GPU tests between.
# Part T: every gpu-marked test with the kernels as committed (after a variant is adopted).
part=${1:?part R1, R2, K or T}
source "$(dirname "$0")/device_steps.sh"  # shell options, output settings, $started, step, left

case $part in
  R1)
    step 200 python benchmarks/long_decode_sweep.py --fused-reduce --out "$OUT/long_decode_sweep_h200_round26_R1_now.json"
    variant_apply benchmarks/variants/decode_row_offsets_32.patch
    step 100 python -m pytest -q -p no:cacheprovider -m gpu tests/test_paged_decode_attention.py \
      tests/test_fp8_kv_cache.py tests/test_paged_decode_fused_reduce.py
    step 200 python benchmarks/long_decode_sweep.py --fused-reduce --out "$OUT/long_decode_sweep_h200_round26_R1_rows32.json"
    variant_restore benchmarks/variants/decode_row_offsets_32.patch
    ;;
  R2)
    few_warps_sweeps round26_R2_now 250 --fused-reduce
    variant_apply benchmarks/variants/decode_row_offsets_32.patch
    few_warps_sweeps round26_R2_rows32 250 --fused-reduce
    variant_restore benchmarks/variants/decode_row_offsets_32.patch
    ;;
  K)
    write_shape="t=65536,hkv=8,d=128,block_size=16,cache_dtype=fp8_e4m3"
    step 90 python benchmarks/fp8_kv_bench.py --quick --out "$OUT/fp8_kv_h200_round26_K_now.json"
    step 150 python -m omnitune search kv_cache_write --shape "$write_shape" --dtype bf16 --trials 40 \
      --db "$OUT/write_now.db"
    variant_apply benchmarks/variants/kv_write_block_size_constexpr.patch
    step 120 python -m pytest -q -p no:cacheprovider tests/test_kv_cache_write.py tests/test_fp8_kv_cache.py
    step 90 python benchmarks/fp8_kv_bench.py --quick --out "$OUT/fp8_kv_h200_round26_K_constexpr.json"
    step 150 python -m omnitune search kv_cache_write --shape "$write_shape" --dtype bf16 --trials 40 \
      --db "$OUT/write_constexpr.db"
    variant_restore benchmarks/variants/kv_write_block_size_constexpr.patch
    ;;
  T)
    gpu_tests
    ;;
esac

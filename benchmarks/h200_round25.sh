#!/usr/bin/env bash
# Twenty-fifth H200 round, one H200:
#   OUT=dir bash benchmarks/h200_round25.sh V|W|X|Y|Z
# Part V (issue 16): the fp8 decode with V unscaled in its loop
# (benchmarks/variants/fp8_decode_v_unscaled.patch): V widened to fp16 and multiplied by a 1.0
# the compiler cannot fold (so Triton keeps staging it as fp16 through shared memory, the layout
# that needs 96-168 registers rather than 168-255), and the whole v_scale applied to the
# accumulator after the loop, in fp32. Offline (decode_registers_offline.py --loop, round 24) the
# key loop drops from 43.7 to 36.0 instructions a key at one warp over 16-key tiles (the config the
# tables now ship for batch 64), from 47.5 to 39.3 at 4 warps over 64-key tiles. Round 8 part B
# measured a similar cut at 4 warps with no change in speed; round 24's Nsight Compute run found the
# one-warp kernel issue-bound (51% of issue slots, 0.75 eligible warps), where fewer instructions
# may count. The probe's few-warps sweep at 4k and 16k with the shipped kernel, then with the
# variant (and its GPU tests), then the shipped kernel restored.
# Part W (issues 16 and 15): lazy rescaling in the decode key loop
# (benchmarks/variants/decode_lazy_rescale.patch, on top of V, now in the kernel): a row's running
# max moves, and the accumulator is rescaled, only when a tile's scores rise past it by more than
# 2^8 — FlashAttention-4's rule. At one warp over 16-key tiles the rescale is 4.5 of the 36
# instructions a key (FMUL of the fp32 accumulator), done on every tile today. The few-warps sweep
# at 4k and 16k (fp8, and the bf16 tuned config beside it) with the kernel as committed, the
# variant's tests on the GPU, the same sweeps with the variant, then the kernel restored.
# Part X: with the kernel as committed, every GPU-marked test, and the test files that build
# runners (interpreted only without a GPU). Part Y: the paged-decode table revalidated for the new
# source (verify --fix, on a copy); fp8 caches as users call them with it.
part=${1:?part V, W, X, Y or Z}
source "$(dirname "$0")/device_steps.sh"  # shell options, output settings, $started, step, left

case $part in
  V)
    few_warps_sweeps round25_V_shipped
    variant_apply benchmarks/variants/fp8_decode_v_unscaled.patch
    step 150 python -m pytest -q -p no:cacheprovider tests/test_fp8_kv_cache.py tests/test_paged_decode_attention.py
    few_warps_sweeps round25_V_unscaled
    variant_restore benchmarks/variants/fp8_decode_v_unscaled.patch
    ;;
  W)
    few_warps_sweeps round25_W_now
    variant_apply benchmarks/variants/decode_lazy_rescale.patch
    step 120 python -m pytest -q -p no:cacheprovider tests/test_fp8_kv_cache.py tests/test_paged_decode_attention.py \
      tests/test_paged_decode_fused_reduce.py
    few_warps_sweeps round25_W_lazy
    variant_restore benchmarks/variants/decode_lazy_rescale.patch
    ;;
  X)
    step 420 python -m pytest -q -p no:cacheprovider -m gpu tests/
    step 60 python -m pytest -q -p no:cacheprovider tests/test_paged_decode_attention.py tests/test_kv_cache_write.py \
      tests/test_match_ratio_probe.py tests/test_distributed.py
    ;;
  Y)
    mkdir -p "$OUT/tc" && cp -r tuned_configs/paged_decode_attention "$OUT/tc/"
    step 240 python -m omnitune verify --kernels paged_decode_attention --tables "$OUT/tc" --fix \
      --json "$OUT/verify_fix_paged_decode_h200_round25.json"
    rm -f "$OUT"/tc/*/.*.lock
    step 120 env OMNITUNE_CONFIG_DIR="$OUT/tc" python benchmarks/fp8_kv_bench.py --quick --out "$OUT/fp8_kv_h200_round25_Y.json"
    step 140 python -m pytest -q -p no:cacheprovider -m gpu tests/test_paged_decode_fused_reduce.py \
      tests/test_production_ops_gpu.py tests/test_paged_decode_attention.py tests/test_fp8_kv_cache.py
    ;;
  Z)  # the gpu-marked tests of the files part X had not reached when its limit ran out
    step 330 python -m pytest -q -p no:cacheprovider -m gpu --durations=25 tests/test_hopper_probe_timing.py \
      tests/test_kv_cache_write.py tests/test_kv_compress.py tests/test_kv_compress_merge.py tests/test_ncu.py \
      tests/test_telemetry.py tests/test_timing.py tests/test_verify.py tests/test_worker.py tests/test_precompile.py \
      tests/test_lanes.py
    ;;
esac

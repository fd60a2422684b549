#!/usr/bin/env bash
# Fifty-fifth round, one call on any card: OUT=dir bash benchmarks/h200_round55.sh
# First the gpu-marked tests round 54's first half did not reach before its step's limit (its log,
# benchmarks/results/h100_round54_gpu_tests.log): the search alone on the GPU sharing its lock with
# its compile workers (the lock's path is now checked before use), paged decode and its fused
# reduce, kv_compress's merge, the quiet re-timing, telemetry, timing and the Hopper probe's timing,
# with their durations. Then, on an H200, issue 16's ratio with both fp8 loop variants applied, as
# round 54 would have (their decode and fp8 gpu tests, the public fp8 ops beside bf16: fp8 ÷ bf16 at
# batch 64, h28/4, ≥ 1.7x asked); on another card, the first half of the gpu suite whole, to time it.
source "$(dirname "$0")/device_steps.sh"  # shell options, output settings, $started, $card, step, left
nvidia-smi -L
step 200 python -m pytest -q -p no:cacheprovider -m gpu --durations=12 tests/test_gpu_lock_shared.py \
  tests/test_paged_decode_attention.py tests/test_paged_decode_fused_reduce.py tests/test_kv_compress_merge.py \
  tests/test_search_quiet_retime.py tests/test_telemetry.py tests/test_timing.py tests/test_hopper_probe_timing.py
if [ "$card" = h200 ]; then fp8_ratio_with_variants round55 400; exit; fi
gpu_tests_first_half "$(left 580)"

#!/usr/bin/env bash
# Twentieth H200 round, one H200:
#   OUT=dir bash benchmarks/h200_round20.sh A
# Issue 20, the GPU's idle time in a whole-model search. In round 19 the lanes' first holdings of
# the GPU lock came with the GPU idle: each lane made its CUDA context (and loaded cuBLAS) with its
# first problem's inputs, under the lock, one lane after another (the lanes held the lock 95% of the
# 5 s after the go, the GPU busy 14% of it). Now a thread of each lane makes them beside the lane's
# last imports and its wait for the go (omnitune.measure.cuda_start), and the lanes report what their
# first holdings were spent on.
# Part A: the preset from an empty Triton cache as the first command on a fresh machine (as round 19
# part E), then the GPU-marked tests of the lanes, the precompile workers and loading ahead, then the preset again from
# another empty Triton cache.
part=${1:?part A}
source "$(dirname "$0")/device_steps.sh"  # shell options, output settings, $started, step, left

case $part in
  A)
    step 175 python benchmarks/search_wall.py --triton-cache /tmp/r20a1_triton --model qwen2.5-omni-7b \
      --trials 50 --db /tmp/a1/omnitune.db --timeout 150 --out "$OUT/search_wall_h200_round20_A_1.json"
    step 120 python -m pytest -q -p no:cacheprovider -m gpu tests/test_lanes.py tests/test_precompile.py tests/test_capture_load.py
    step $(left 560) python benchmarks/search_wall.py --triton-cache /tmp/r20a2_triton --model qwen2.5-omni-7b \
      --trials 50 --db /tmp/a2/omnitune.db --timeout $(left 540) --out "$OUT/search_wall_h200_round20_A_2.json"
    ;;
esac

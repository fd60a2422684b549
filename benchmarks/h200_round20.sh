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
# Part A found the preset searched in 97.4 s and 97.3 s with the GPU busy 73% and 74%, the lanes ready at
# 8.6 s and 6.7-7.0 s; but this machine's clocks were higher (mean SM clock 1,903 and 1,957 MHz against
# 1,800 in round 19 part E) and its compile workers took 538-543 s of CPU against 780-870 s.
# Part B: round 19's code (00b186b, no CUDA context made ahead; extracted to benchmarks/_r20_base,
# not committed: `git archive 00b186b omnitune tuned_configs | tar -x -C benchmarks/_r20_base`) and
# this round's, alternately, twice each, on one machine, each from an empty Triton cache.
# Part B ran this round's code four times, not round 19's (the files named base are this round's too): search_wall.py runs the search with
# the repository root as its working directory, whose omnitune came first (its CUDA contexts were made
# ahead in every run). On one machine, from empty Triton caches: 120.8, 110.3, 114.6, 107.5 s, GPU busy
# 67.0, 70.9, 68.8, 72.0%, the compile workers' CPU 875, 668, 751, 685 s. The lanes' first holdings
# took 0.2-1.1 s (inputs, reference), their second came 2-4 s later (the first config compiling), with
# 0.2-0.5 s of it opening NVML.
# Part C: each lane opens NVML in the same thread, and compiles its first problem's default and
# known-good configs before the go (omnitune.search.prepare_next.ProblemsAhead.prepare_first). The
# preset from an empty Triton cache as the first command on a fresh machine, the GPU-marked tests of
# the lanes, the look-ahead and the precompile workers, then the preset twice more.
# Part C found NVML opened ahead (the second holdings' telemetry 0.0-0.3 s) but the lanes ready later,
# at 10.5-14.1 s (a lane's first submission waits for its fork server's imports), and their first
# checks no earlier after the go: 116.5, 120.7, 111.5 s, GPU busy 67.8, 68.8, 69.3%. The compiling
# before the go was taken out again.
# Part D: the code as it stands (CUDA context and NVML in a thread, nothing compiled before the go),
# the preset once, as the first command on a fresh machine (the session's last ~400 s of device time).
part=${1:?part A|B|C|D}
source "$(dirname "$0")/device_steps.sh"  # shell options, output settings, $started, step, left

case $part in
  A)
    step 175 python benchmarks/search_wall.py --triton-cache /tmp/r20a1_triton --model qwen2.5-omni-7b \
      --trials 50 --db /tmp/a1/omnitune.db --timeout 150 --out "$OUT/search_wall_h200_round20_A_1.json"
    step 120 python -m pytest -q -p no:cacheprovider -m gpu tests/test_lanes.py tests/test_precompile.py tests/test_capture_load.py
    step $(left 560) python benchmarks/search_wall.py --triton-cache /tmp/r20a2_triton --model qwen2.5-omni-7b \
      --trials 50 --db /tmp/a2/omnitune.db --timeout $(left 540) --out "$OUT/search_wall_h200_round20_A_2.json"
    ;;
  B)
    base=$PWD/benchmarks/_r20_base
    for run in 1 2; do
      (cd "$base" && PYTHONPATH=/tmp/site:$base step 150 python ../search_wall.py --triton-cache /tmp/r20b${run}b_triton \
        --model qwen2.5-omni-7b --trials 50 --db /tmp/b${run}b/omnitune.db --timeout 140 \
        --out "$OUT/search_wall_h200_round20_B_base_$run.json")
      step 150 python benchmarks/search_wall.py --triton-cache /tmp/r20b${run}n_triton --model qwen2.5-omni-7b \
        --trials 50 --db /tmp/b${run}n/omnitune.db --timeout 140 --out "$OUT/search_wall_h200_round20_B_new_$run.json"
    done
    ;;
  C)
    step 170 python benchmarks/search_wall.py --triton-cache /tmp/r20c1_triton --model qwen2.5-omni-7b \
      --trials 50 --db /tmp/c1/omnitune.db --timeout 150 --out "$OUT/search_wall_h200_round20_C_1.json"
    step 100 python -m pytest -q -p no:cacheprovider -m gpu tests/test_lanes.py tests/test_precompile.py \
      tests/test_capture_load.py tests/test_prepare_next.py tests/test_compile_ahead.py
    for run in 2 3; do
      step 160 python benchmarks/search_wall.py --triton-cache /tmp/r20c${run}_triton --model qwen2.5-omni-7b \
        --trials 50 --db /tmp/c${run}/omnitune.db --timeout 140 --out "$OUT/search_wall_h200_round20_C_$run.json"
    done
    ;;
  D)
    step 170 python benchmarks/search_wall.py --triton-cache /tmp/r20d_triton --model qwen2.5-omni-7b \
      --trials 50 --db /tmp/d/omnitune.db --timeout 150 --out "$OUT/search_wall_h200_round20_D.json"
    ;;
esac

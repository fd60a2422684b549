#!/usr/bin/env bash
# Nineteenth H200 round, one H200:
#   OUT=dir bash benchmarks/h200_round19.sh A|B|C|D|E
# (parts D and C ran in one call: export started=$(date +%s); ... D; ... C)
# Issue 20, the GPU's idle time in a whole-model search. Round 18 (part C) searched the
# Qwen2.5-Omni-7B preset in 118 s and 114 s with the GPU busy 67% and 69% of the wall: idle for the
# first ~15 s (the lanes' start and first compiles), a lane alone on the GPU for the last ~10 s
# (a 64-sequence 16k-token decode whose inputs took 6.5 s to draw on the CPU), and ~55 s of the
# lanes' time spent drawing inputs on the CPU across the preset. Now the inputs are drawn on the
# GPU (from a device generator seeded from the seed) under the GPU lock, each lane makes its CUDA
# context before the go, and lanes take each kernel's problems longest first.
# Part A: the GPU-marked tests of the lanes, the runner and the precompile workers; the preset from
# an empty Triton cache, twice (the figure).
# Part A found the middle of the search saturated (a lane held the GPU ~100% of 20-95 s, the GPU
# ~95% busy) and the end not: four lanes on short, host-bound problems, the GPU 59-78% busy for the
# last 25 s; 123 s and 127 s, GPU busy 67% and 69%.
# Part B: even lanes take a kernel's problems longest first, odd lanes shortest first; the lanes
# tell when they were ready for the go. The preset from an empty Triton cache, twice.
# Part B found the lanes ready for the go only 14-16 s after the search started, 3-5 s after the
# session's go (round 18's lanes began searching at ~10 s): each lane made its CUDA context before
# the go (since part A), four at once beside the session's own start. The end was better (the GPU
# 91-96% busy up to the last 5 s); 129 s and 123 s, GPU busy 66% both times.
# Part C: every GPU-marked test (the inputs every kernel test draws changed).
# Part D: the lanes make their CUDA contexts where they did before part A (with the first
# problem); the preset from an empty Triton cache, once.
# Part C: 104 passed. Part D found the lanes ready only at 19-20 s (the first command on a fresh
# machine): 127 s, GPU busy 65%.
# Part E: the session starts its lanes before it imports torch (the command line imports none at
# module level); the preset from an empty Triton cache, once, as the first command on a fresh
# machine like part D (the session's last ~200 s of device time).
part=${1:?part A|B|C|D|E}
source "$(dirname "$0")/device_steps.sh"  # shell options, output settings, $started, step, left

case $part in
  A)
    step 100 python -m pytest -q -p no:cacheprovider -m gpu tests/test_lanes.py tests/test_precompile.py \
      tests/test_capture_load.py
    step 180 python benchmarks/search_wall.py --triton-cache /tmp/r19a1_triton --model qwen2.5-omni-7b --trials 50 \
      --db /tmp/a1/omnitune.db --timeout 160 --out "$OUT/search_wall_h200_round19_A_1.json"
    step $(left 560) python benchmarks/search_wall.py --triton-cache /tmp/r19a2_triton --model qwen2.5-omni-7b \
      --trials 50 --db /tmp/a2/omnitune.db --timeout $(left 540) --out "$OUT/search_wall_h200_round19_A_2.json"
    ;;
  B)
    step 60 python -m pytest -q -p no:cacheprovider -m gpu tests/test_lanes.py
    step 200 python benchmarks/search_wall.py --triton-cache /tmp/r19b1_triton --model qwen2.5-omni-7b --trials 50 \
      --db /tmp/b1/omnitune.db --timeout 170 --out "$OUT/search_wall_h200_round19_B_1.json"
    step $(left 570) python benchmarks/search_wall.py --triton-cache /tmp/r19b2_triton --model qwen2.5-omni-7b \
      --trials 50 --db /tmp/b2/omnitune.db --timeout $(left 550) --out "$OUT/search_wall_h200_round19_B_2.json"
    ;;
  C)
    step $(left 580) python -m pytest -q -p no:cacheprovider -m gpu tests/
    ;;
  E)
    step 175 python benchmarks/search_wall.py --triton-cache /tmp/r19e_triton --model qwen2.5-omni-7b \
      --trials 50 --db /tmp/e/omnitune.db --timeout 150 --out "$OUT/search_wall_h200_round19_E.json"
    ;;
  D)
    step 180 python benchmarks/search_wall.py --triton-cache /tmp/r19d_triton --model qwen2.5-omni-7b \
      --trials 50 --db /tmp/d/omnitune.db --timeout 160 --out "$OUT/search_wall_h200_round19_D.json"
    ;;
esac

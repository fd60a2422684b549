#!/usr/bin/env bash
# Eighteenth H200 round, one H200:
#   OUT=dir bash benchmarks/h200_round18.sh A|B|C
# Issue 20, the GPU's idle time in a whole-model search. Round 17's search of the Qwen2.5-Omni-7B
# preset kept the GPU busy 50% of its 159 s: idle for its first 30 s (the session's first line at
# 10 s, the lanes' first problems at 20 s, their first compiles waiting for the compile workers'
# fork server to import torch and the kernels), and a lane held the GPU 72% of the wall against
# 50% busy. Now the lanes start while the session checks its arguments, each lane starts its
# fork server first thing, and each lane tells its GPU lock what it held it for (the reference,
# checking, warm-up, timing, telemetry, re-timing); search_wall lays the holdings beside the
# GPU's utilization.
# Part A: the GPU-marked tests of the lanes, the runner and the timing (host code changed, no kernel
# source); the whole preset, 50 trials a problem, from an empty Triton cache (the figure); then the
# same search again on the cache it filled (nothing to compile: what the GPU side alone allows).
# Part A found telemetry (NVML read at each window's ends, a thread started and joined per trial)
# taking 18.9 of the 104.8 s the lanes held the GPU, and a capture broken by a host sync leaving
# the GPU's random generator in capture mode (test_timing failed after test_lanes).
# Part B: a recorder thread per GPU reads NVML while windows are open (a window costs two reads of
# the energy counter); the generator's state is put back after a broken capture. The GPU-marked
# tests of what changed; where a lane's start goes (imports); the preset from an empty cache in 3
# lanes (the figure) and in 4.
# Part B found the telemetry still holding the GPU 17.0 s: the two reads of the energy counter
# alone (~10 ms a trial). Four lanes searched the preset in 136 s, three in 150 s.
# Part C: the energy counter read by the recorder too (a search's window calls no NVML), four
# lanes by default. The GPU-marked tests of what changed; the preset from an empty cache, twice.
part=${1:?part A|B|C}
source "$(dirname "$0")/device_steps.sh"  # shell options, output settings, $started, step, left

case $part in
  A)
    step 90 python -m pytest -q -p no:cacheprovider -m gpu tests/test_lanes.py tests/test_timing.py tests/test_precompile.py
    step 230 python benchmarks/search_wall.py --triton-cache /tmp/r18_triton --model qwen2.5-omni-7b --trials 50 \
      --db /tmp/fresh/omnitune.db --timeout 205 --out "$OUT/search_wall_h200_round18_A_fresh.json"
    step $(left 590) python benchmarks/search_wall.py --triton-cache /tmp/r18_triton --model qwen2.5-omni-7b --trials 50 \
      --db /tmp/warm/omnitune.db --timeout $(left 565) --out "$OUT/search_wall_h200_round18_A_warm.json"
    ;;
  B)
    step 100 python -m pytest -q -p no:cacheprovider -m gpu tests/test_capture_load.py tests/test_telemetry.py \
      tests/test_lanes.py tests/test_timing.py tests/test_precompile.py
    step 30 python -X importtime -c "import omnitune.cli.search_cmd, omnitune.search.driver, omnitune.kernels.attention" \
      2> /tmp/importtime.txt
    sort -t'|' -k2 -n -r /tmp/importtime.txt | head -25
    step 200 python benchmarks/search_wall.py --triton-cache /tmp/r18b_triton --model qwen2.5-omni-7b --trials 50 \
      --db /tmp/fresh3/omnitune.db --timeout 180 --out "$OUT/search_wall_h200_round18_B_lanes3.json"
    step $(left 590) python benchmarks/search_wall.py --triton-cache /tmp/r18b4_triton --model qwen2.5-omni-7b \
      --trials 50 --db /tmp/fresh4/omnitune.db --timeout $(left 570) --out "$OUT/search_wall_h200_round18_B_lanes4.json" \
      -- --lanes 4
    ;;
  C)
    step 100 python -m pytest -q -p no:cacheprovider -m gpu tests/test_capture_load.py tests/test_telemetry.py \
      tests/test_lanes.py tests/test_timing.py tests/test_precompile.py tests/test_observers.py
    step 180 python benchmarks/search_wall.py --triton-cache /tmp/r18c1_triton --model qwen2.5-omni-7b --trials 50 \
      --db /tmp/c1/omnitune.db --timeout 160 --out "$OUT/search_wall_h200_round18_C_1.json"
    step $(left 450) python benchmarks/search_wall.py --triton-cache /tmp/r18c2_triton --model qwen2.5-omni-7b \
      --trials 50 --db /tmp/c2/omnitune.db --timeout $(left 430) --out "$OUT/search_wall_h200_round18_C_2.json"
    ;;
esac

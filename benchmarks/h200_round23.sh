#!/usr/bin/env bash
# Twenty-third H200 round, one H200:
#   OUT=dir bash benchmarks/h200_round23.sh W|A|B     (B after A's file is copied into benchmarks/results)
# Part W: where a kv_compress search's time goes. In round 22 part A a 40-trial problem took ~222 s
# in four lanes, ~1.2 s of GPU a trial for a 1-9 ms op; search_wall lays each lane's holdings of the
# GPU (checking, warm-up, timing, telemetry) beside the GPU's utilization, for four of its training
# problems searched at once from an empty database and Triton cache.
# Parts A and B (issue 14): kv_compress's held-out set, 20 of 30 judged against the table trained
# in round 22 (17 of 20 >= 95% of tuned); the other 10 problems are searched (40 trials, 49-79 s a
# problem, the first of a call ~3 min). Each call resumes the one results file, which is rewritten
# after every problem; --time-budget stays >= 90 s short of the step's limit so that no problem is
# cut off mid-way.
part=${1:?part W|A|B}
source "$(dirname "$0")/device_steps.sh"  # shell options, output settings, $started, step, left

case $part in
  W)
    step 300 python benchmarks/search_wall.py --model '' --trials 40 --timeout 270 --triton-cache /tmp/r23w_triton \
      --db /tmp/r23w/omnitune.db --out "$OUT/search_wall_kv_compress_h200_round23_W.json" \
      -- kv_compress $(python benchmarks/training_set.py kv_compress bf16 | cut -d' ' -f1-8)
    ;;
  A|B)
    file=coverage_kv_compress_h200_round22_B.json
    cp "benchmarks/results/$file" "$OUT/"
    step $(left 580) python benchmarks/coverage.py --kernel kv_compress --out "$OUT/$file" --trials 40 \
      --work-dir /tmp/cov --time-budget $(left 480) --resume \
      --tuned-from benchmarks/results/coverage_kv_compress_h200_round21.json
    ;;
esac

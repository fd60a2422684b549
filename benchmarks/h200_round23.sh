#!/usr/bin/env bash
# Twenty-third H200 round, one H200:
#   OUT=dir bash benchmarks/h200_round23.sh A|B      (B after A's file is copied into benchmarks/results)
# Issue 14: kv_compress's held-out set, 20 of 30 judged against the table trained in round 22
# (17 of 20 >= 95% of tuned); the other 10 problems are searched (40 trials, 49-79 s a problem, the
# first of a call ~3 min), so two calls of ~420 s each. Each resumes the one results file, which is
# rewritten after every problem; --time-budget stays >= 90 s short of the step's limit so that no
# problem is cut off mid-way.
part=${1:?part A|B}
source "$(dirname "$0")/device_steps.sh"  # shell options, output settings, $started, step, left

file=coverage_kv_compress_h200_round22_B.json
cp "benchmarks/results/$file" "$OUT/"
step $(left 580) python benchmarks/coverage.py --kernel kv_compress --out "$OUT/$file" --trials 40 \
  --work-dir /tmp/cov --time-budget $(left 480) --resume \
  --tuned-from benchmarks/results/coverage_kv_compress_h200_round21.json

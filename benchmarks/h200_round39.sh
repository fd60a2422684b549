#!/usr/bin/env bash
# Thirty-ninth round, one call that branches on the card it is given: OUT=dir bash benchmarks/h200_round39.sh [P]
# First, on any card (issue 15, about 40 s): graph_launch_floor.py --paged — the launch floors, the b1 32k
# call over full and empty contexts, and at b1 32k the cache read through its block table (pages as
# drawn and sorted) beside the library's call and a contiguous read of the same K and V bytes: the
# floor any one-launch paged decode stands on there. Round 38 (H100) stopped at the contiguous read,
# whose tensor held the byte model's query and output elements too, a tail no tile covered.
# Then, on an H200 (issue 16): round 35's call without its launch floor (taken above) — V by default,
# H200_PART=L its short form (about 400 s) when less device time is left, H200_PART=M (about 250 s)
# L without its sweeps. On another card, with P:
# the probe's tests. ONLY_H200=1: nothing at all on another card (the paged step is taken there).
source "$(dirname "$0")/device_steps.sh"  # shell options, output settings, $started, $card, step, left
nvidia-smi -L
if [ "$card" != h200 ] && [ -n "${ONLY_H200:-}" ]; then echo "not an H200: nothing run"; exit 3; fi
step 90 python benchmarks/graph_launch_floor.py --paged --out "$OUT/decode_paged_reads_${card}_round39.json"
if [ "$card" = h200 ] && [ "${H200_PART:-}" = M ]; then
  # M, on an H200 with under 300 s of device time left: round 35's L without its sweeps — both fp8
  # variants applied, the decode gpu tests, the public fp8 ops beside bf16 (issue 16's ratio).
  fp8_variants_applied || exit 2
  step 100 python -m pytest -q -p no:cacheprovider -m gpu tests/test_paged_decode_attention.py tests/test_fp8_kv_cache.py
  step 90 python benchmarks/fp8_kv_bench.py --quick --out "$OUT/fp8_kv_${card}_round39_M.json"
  exit 0
fi
if [ "$card" = h200 ]; then
  export started LAUNCH_FLOOR_TAKEN=1  # round 35's budgets count from this call's start
  exec bash "$(dirname "$0")/h200_round35.sh" "${H200_PART:-V}"
fi
[ "${1:-}" = P ] && step 60 python -m pytest -q -p no:cacheprovider tests/test_graph_launch_floor.py
exit 0

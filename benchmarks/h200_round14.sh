#!/usr/bin/env bash
# Fourteenth H200 round, one H200:
#   OUT=dir bash benchmarks/h200_round14.sh A|B
# Part A: every GPU-marked test (the runner now holds a GPU lock for its GPU work, loads each
# config by capturing its launch when it is a lane, and the lanes' own GPU tests), six processes;
# then a whole model searched in lanes (benchmarks/search_wall.py: omnitune search --model
# qwen2.5-omni-7b -n 50 from an empty database, every kernel, the default three lanes) with the
# GPU's busy fraction over it and, per problem, the shipped table's config as the same search
# timed it beside the search's best.
# Then, with the time left: the two held-out attention problems whose default config the
# query-light rule changed (benchmarks/coverage.py --offset 21 --limit 2, a fresh file).
# Part B: the lanes' GPU tests again (part A's five failures were the tests': a config already
# bound in the test process compiles nothing to watch, and the finalists' re-timings counted as
# trials), then the same whole-model search with one lane (--lanes 1), for the before-and-after in
# one session.
part=${1:?part A|B}
source "$(dirname "$0")/device_steps.sh"  # shell options, output settings, $started, step, left

case $part in
  A)
    step 300 python -m pytest -q -m gpu -n 6 -p no:cacheprovider --durations=15 tests/
    step $(left 590) python benchmarks/search_wall.py --out "$OUT/search_wall_h200_round14_A.json" --timeout $(left 560)
    if [ "$(left 590)" -gt 60 ]; then
      step $(left 590) python benchmarks/coverage.py --kernel attention --offset 21 --limit 2 \
        --out "$OUT/coverage_attention_h200_round14_A.json" --time-budget $(left 570) --trials 40 --work-dir /tmp/cov
    fi
    ;;
  B)
    step 150 python -m pytest -q -m gpu -p no:cacheprovider tests/test_lanes.py
    step $(left 590) python benchmarks/search_wall.py --out "$OUT/search_wall_h200_round14_B_one_lane.json" \
      --timeout $(left 560) -- --lanes 1
    ;;
  *) echo "unknown part $part"; exit 2 ;;
esac

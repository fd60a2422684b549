#!/usr/bin/env bash
# Thirteenth H200 round, one H200:
#   OUT=dir bash benchmarks/h200_round13.sh A|B|C|D|E|F
# Part A: every GPU-marked test (round 12's runtime rules — attention's untuned SDPA answer, SDPA
# serving causal Lq > Lk, the wave-aware carry-over of one-split decode configs — had not run on
# a GPU), six processes; where a batch-1–2 long-context decode call's time goes
# (benchmarks/long_decode_parts.py); paged decode's default on the round-12 problems of many query
# rows and overfilled grids (benchmarks/decode_default_study.py --problems round12; its JSON is
# rewritten after each problem, so a cut-short run keeps what it measured).
# Part B: where the long-context decode's time goes (long_decode_parts.py, its sum fixed), then the
# held-out evaluation of paged decode (benchmarks/coverage.py, a fresh file, the shipped tables,
# warm-started searches of 40 trials) with the default rule part A's study chose.
# Part D: the public ops as users call them (benchmarks/ops_bench.py: attention's untuned shape
# now answered by SDPA), then the held-out evaluation of attention, resumed from the committed
# file of that name where one is (each call judges the problems not yet in it).
# Part E (written after part D; for the next device call): every GPU-marked test — paged
# decode's steady path, attention's TMA default and cuDNN forced through the flags' setters had
# not run on a GPU — then the ops as users call them (the function's host time beside the plan's).
# Part F: the held-out evaluation of attention again, a fresh file, with the rules chosen after
# part D (the TMA default, small non-causal grids to SDPA): all 32 problems.
# Part C: a whole model searched (benchmarks/search_wall.py: omnitune search --model
# qwen2.5-omni-7b -n 50, every kernel, from an empty database) and the GPU's busy fraction over it.
part=${1:?part A|B|C|D|E|F}
source "$(dirname "$0")/device_steps.sh"  # shell options, output settings, $started, step, left

case $part in
  A)
    step 300 python -m pytest -q -m gpu -n 6 -p no:cacheprovider --durations=15 tests/
    step 100 python benchmarks/long_decode_parts.py --out "$OUT/long_decode_parts_h200_round13_A.json"
    step $(left 585) python benchmarks/decode_default_study.py --problems round12 \
      --out "$OUT/decode_default_study_h200_round13_A.json"
    ;;
  B)
    step 60 python benchmarks/long_decode_parts.py --out "$OUT/long_decode_parts_h200_round13_B.json"
    step $(left 590) python benchmarks/coverage.py --kernel paged_decode_attention \
      --out "$OUT/coverage_paged_decode_h200_round13_B.json" --time-budget $(left 530) --trials 40 --work-dir /tmp/cov
    ;;
  D)
    step 90 python benchmarks/ops_bench.py --out "$OUT/ops_bench_h200_round13_D.json"
    cp benchmarks/results/coverage_attention_h200_round13.json "$OUT/" 2>/dev/null || true
    step $(left 545) python benchmarks/coverage.py --kernel attention --resume \
      --out "$OUT/coverage_attention_h200_round13.json" --time-budget $(left 480) --trials 40 --work-dir /tmp/cov
    ;;
  E)
    step 300 python -m pytest -q -m gpu -n 6 -p no:cacheprovider --durations=15 tests/
    step $(left 585) python benchmarks/ops_bench.py --out "$OUT/ops_bench_h200_round13_E.json"
    ;;
  F)
    step $(left 590) python benchmarks/coverage.py --kernel attention \
      --out "$OUT/coverage_attention_h200_round13_F.json" --time-budget $(left 530) --trials 40 --work-dir /tmp/cov
    ;;
  C)
    step $(left 595) python benchmarks/search_wall.py --out "$OUT/search_wall_h200_round13_C.json" --timeout $(left 560)
    ;;
  *) echo "unknown part $part"; exit 2 ;;
esac

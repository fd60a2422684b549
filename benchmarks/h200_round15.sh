#!/usr/bin/env bash
# Fifteenth H200 round, one H200:
#   OUT=dir bash benchmarks/h200_round15.sh A|B
# Part A: the GPU-marked tests of the search's host paths (precompile workers now compile by
# capturing each launch, the runner's capture-loading moved into omnitune.measure.capture_load, a
# lane claims the problem it prepares ahead, the compile workers' CPU time recorded); where a
# long-context decode call's time goes, now beside the fastest pure-read Triton kernel of the same
# bytes (benchmarks/long_decode_parts.py, issue 15); the attention default study on training
# problems (issue 14); then a whole model searched in lanes from an empty database AND an empty
# Triton cache (benchmarks/search_wall.py --fresh-triton-cache), with the host's CPU busy share and
# each problem's compile CPU time beside the GPU's busy share (issue 20).
# Part B: after part A's findings — the compile workers niced and each lane given twice its even
# share of them, each lane starting on another kernel; attention's untuned answer from the
# default study (SDPA from 768 query rows, GQA packing up to 191 rows where it pads fewer): the GPU
# tests of the lanes, the precompile workers and attention; a sweep of paged decode's split and
# tile knobs on issue 15's long-context shapes that fall short (benchmarks/long_decode_sweep.py);
# the whole model searched again as in part A (fresh database and Triton cache).
# Part C: attention's held-out set, all 32 problems, a fresh file, with part B's untuned rules
# (benchmarks/coverage.py: the runtime's pick from the shipped tables against a warm-started
# 40-trial search of each problem, the default config and the best PyTorch path).
# Part D: a probe of paged decode over long contexts in one-tile programs (no loop, as many
# programs as tiles), beside the library's best config of part B's sweep
# (benchmarks/long_decode_probe.py, issue 15).
part=${1:?part A|B|C|D}
source "$(dirname "$0")/device_steps.sh"  # shell options, output settings, $started, step, left

case $part in
  A)
    step 200 python -m pytest -q -m gpu -n 4 -p no:cacheprovider tests/test_lanes.py tests/test_precompile.py \
      tests/test_compile_ahead.py tests/test_prepare_next.py tests/test_cli_search.py tests/test_search_driver.py
    step 120 python benchmarks/long_decode_parts.py --out "$OUT/long_decode_parts_h200_round15_A.json"
    step 150 python benchmarks/attention_default_study.py --out "$OUT/attention_default_study_h200_round15_A.json"
    step $(left 590) python benchmarks/search_wall.py --fresh-triton-cache \
      --out "$OUT/search_wall_h200_round15_A.json" --timeout $(left 560)
    ;;
  B)
    step 200 python -m pytest -q -m gpu -n 4 -p no:cacheprovider tests/test_lanes.py tests/test_precompile.py \
      tests/test_attention.py
    step 170 python benchmarks/long_decode_sweep.py --out "$OUT/long_decode_sweep_h200_round15_B.json"
    step $(left 590) python benchmarks/search_wall.py --fresh-triton-cache \
      --out "$OUT/search_wall_h200_round15_B.json" --timeout $(left 560)
    ;;
  C)
    step $(left 590) python benchmarks/coverage.py --kernel attention --out "$OUT/coverage_attention_h200_round15_C.json" \
      --time-budget $(left 560) --trials 40 --work-dir /tmp/cov
    ;;
  D)
    step 200 python benchmarks/long_decode_probe.py --out "$OUT/long_decode_probe_h200_round15_D.json"
    ;;
  *) echo "unknown part $part"; exit 2 ;;
esac

#!/usr/bin/env bash
# Twelfth H200 round, one H200:
#   OUT=dir bash benchmarks/h200_round12.sh A|B|C
# Part A: every GPU-marked test (the launch key's current device, the combine's fixed launch, the
# KV write's steady path, strided lengths and slot mappings read by their strides: none of them run
# on a GPU before), four processes; then the public ops as users call them (benchmarks/ops_bench.py),
# the KV write's full path beside its steady one and `index_copy_`.
# Part B: paged decode's default on problems that are not held out, of the two kinds where it
# missed on round 11's held-out set — many query rows a program (GQA group × query tokens ≥ 16)
# and grids one split already overfills — with the round-12 candidates
# (benchmarks/decode_default_study.py --problems round12); where a batch-1–2 long-context decode
# call's time goes (benchmarks/long_decode_parts.py).
# Parts C, D, E: the held-out evaluation (benchmarks/coverage.py, fresh files, the shipped tables,
# warm-started searches of 40 trials) of attention, the cross-attention layer and kv_compress —
# the kernels issue 14 has not measured yet — one call each.
# Part F: the public ops as users call them and the end-to-end decoder, in one run.
part=${1:?part A|B|C|D|E|F}
source "$(dirname "$0")/device_steps.sh"  # shell options, output settings, $started, step, left

case $part in
  A)
    step 340 python -m pytest -q -m gpu -n 4 -p no:cacheprovider --durations=15 tests/
    step $(left 585) python benchmarks/ops_bench.py --out "$OUT/ops_bench_h200_round12_A.json"
    ;;
  B)
    step 400 python benchmarks/decode_default_study.py --problems round12 \
      --out "$OUT/decode_default_study_h200_round12_B.json"
    step $(left 585) python benchmarks/long_decode_parts.py --out "$OUT/long_decode_parts_h200_round12_B.json"
    ;;
  C|D|E)
    kernel=$(case $part in C) echo attention;; D) echo cross_attention_layer;; E) echo kv_compress;; esac)
    step $(left 590) python benchmarks/coverage.py --kernel "$kernel" \
      --out "$OUT/coverage_${kernel}_h200_round12_$part.json" --time-budget $(left 560) --trials 40 --work-dir /tmp/cov
    ;;
  F)
    step 150 python benchmarks/ops_bench.py --out "$OUT/ops_bench_h200_round12_F.json"
    step $(left 585) python benchmarks/e2e_decoder.py --batch 1 8 --out "$OUT/e2e_decoder_h200_round12_F.json"
    ;;
  *) echo "unknown part $part"; exit 2 ;;
esac

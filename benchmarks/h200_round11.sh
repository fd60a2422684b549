#!/usr/bin/env bash
# Eleventh H200 round, one H200:
#   OUT=dir bash benchmarks/h200_round11.sh A|B|C|D|E|F   (C ran before B)
# Part A: the GPU-marked tests of the ops whose host path changed (PagedDecodePlan.run launches its
# combine with arguments fixed at planning and reads its split launch's dtypes once; the bound
# launcher takes dtypes from its caller), four processes; where the decode plan's host time goes
# (benchmarks/launch_overhead_probe.py); one launch against two for paged decode as users call it
# (benchmarks/decode_one_launch.py); the public ops as users call them (benchmarks/ops_bench.py).
# Part B: paged decode's batch-64 problems of Qwen2.5-Omni-7B (h28/4, 4k and 16k, bf16 and fp8
# caches) searched again, one split over 3 stages now among the known-good configs (part A: it
# beat the tuned two splits), and issue 15's eight prefill shapes (b1, h32/4 and h24/24, 8k and
# 16k, causal and not), each exported into a copy of the shipped table; then, with those tables,
# the public ops as users call them (ops_bench), the prefill op beside cuDNN (prefill_bench) and
# the end-to-end decoder (e2e_decoder).
# Part C: which default config serves untuned paged-decode problems best, on problems that are
# not held out (benchmarks/decode_default_study.py). (C ran before B, in one call.)
# Part D (paged decode's default now the rule part C chose: 3 stages, splits for one wave of 3
# programs an SM): the GPU-marked tests of paged decode and the production ops; the held-out
# evaluation of paged decode from a fresh results file, with the tables of part B.
# Part E (part D's run had the predictor answer 20 of 30 problems from points measured before
# the default changed, most of them slower than the default: the paged-decode table now ships
# without its stale predictor block, and a predictor compares its candidates with a default the
# neighbours measured or with their own defaults' record): the held-out evaluation of paged
# decode again from a fresh file; the long-context decode shapes of issue 15 as users call them.
# Part F: the public ops as users call them, with the tables as they ship now (part B's run had
# the attention predictor that is not shipped).
# (Part D's results file is committed as coverage_paged_decode_h200_round11_D.json.)
part=${1:?part A|B|C|D|E|F}
source "$(dirname "$0")/device_steps.sh"  # shell options, output settings, $started, step, left

case $part in
  A)
    step 200 python -m pytest -q -m gpu -n 4 -p no:cacheprovider tests/test_production_ops_gpu.py \
      tests/test_paged_decode_attention.py tests/test_paged_decode_fused_reduce.py tests/test_fp8_kv_cache.py \
      tests/test_kv_cache_write.py
    step 60 python benchmarks/launch_overhead_probe.py --out "$OUT/launch_overhead_h200_round11.json"
    step 150 python benchmarks/decode_one_launch.py --out "$OUT/decode_one_launch_h200_round11.json"
    step $(left 585) python benchmarks/ops_bench.py --out "$OUT/ops_bench_h200_round11.json"
    ;;
  B)
    mkdir -p "$OUT/tc" && cp -r tuned_configs/attention tuned_configs/paged_decode_attention "$OUT/tc/"
    fp8=",cache_dtype=fp8_e4m3"
    decode=""
    for c in "" "$fp8"; do for ctx in 4096 16384; do
      decode="$decode --shape b=64,h=28,hkv=4,lq=1,ctx=$ctx,d=128,block_size=16$c"; done; done
    step 150 python -m omnitune search paged_decode_attention $decode -n 50 --timeout 130 --db "$OUT/decode.db"
    step 30 python -m omnitune export --db "$OUT/decode.db" --kernel paged_decode_attention --out "$OUT/tc"
    prefill=""
    for hh in "h=32,hkv=4" "h=24,hkv=24"; do for l in 8192 16384; do for c in 1 0; do
      prefill="$prefill --shape b=1,$hh,lq=$l,lk=$l,d=128,causal=$c"; done; done; done
    step 240 python -m omnitune search attention $prefill -n 12 --timeout 200 --db "$OUT/prefill.db"
    step 40 python -m omnitune export --db "$OUT/prefill.db" --kernel attention --out "$OUT/tc"
    rm -f "$OUT"/*.db* "$OUT"/tc/*/.*.lock
    export OMNITUNE_CONFIG_DIR="$OUT/tc"
    step 90 python benchmarks/ops_bench.py --out "$OUT/ops_bench_h200_round11_B.json"
    step 120 python benchmarks/prefill_bench.py --out "$OUT/prefill_bench_h200_round11.json"
    step 90 python benchmarks/e2e_decoder.py --batch 1 8 --out "$OUT/e2e_decoder_h200_round11.json"
    ;;
  C)
    step $(left 590) python benchmarks/decode_default_study.py --out "$OUT/decode_default_study_h200_round11.json"
    ;;
  D)
    step 120 python -m pytest -q -m gpu -n 4 -p no:cacheprovider tests/test_paged_decode_attention.py \
      tests/test_paged_decode_fused_reduce.py tests/test_production_ops_gpu.py tests/test_fp8_kv_cache.py
    step $(left 590) python benchmarks/coverage.py --kernel paged_decode_attention \
      --out "$OUT/coverage_paged_decode_h200_round11.json" --time-budget $(left 560) --trials 40 --work-dir /tmp/cov
    ;;
  E)
    step $(left 440) python benchmarks/coverage.py --kernel paged_decode_attention \
      --out "$OUT/coverage_paged_decode_h200_round11_E.json" --time-budget $(left 420) --trials 40 --work-dir /tmp/cov
    step $(left 585) python benchmarks/long_decode_bench.py --out "$OUT/long_decode_h200_round11.json"
    ;;
  F)
    step 120 python benchmarks/ops_bench.py --out "$OUT/ops_bench_h200_round11_F.json"
    ;;
  *) echo "unknown part $part"; exit 2 ;;
esac

#!/usr/bin/env bash
# Twenty-ninth H200 round, one H200: OUT=dir bash benchmarks/h200_round29.sh S|A|B|C
# Issue 16: adopt the transposed dots for fp8 caches (benchmarks/variants/decode_fp8_swap_ab.patch,
# applied to the working tree before the call: `git apply benchmarks/variants/decode_fp8_swap_ab.patch`).
# Round 28 U measured its study form on the H200: the fp8 few-warps sweep at batch 64, 4k went from
# 88.9 to 78.9 µs (best config; per config median 0.86x, 3 of 73 slower by ≤ 7%), against the bf16
# cache's 126.6-127.9 µs in the same run: 1.62x where the kernel as committed reached 1.44x
# (fp8_decode_few_warps_h200_round28_U_*_4096.json). The adopted form takes the transposed dots and
# the hoisted row offsets over fp8 caches only; the 16-bit loop compiles as before.
# S: the variant's decode GPU tests; the fp8 sweep at 16k (4k was round 28's); the paged-decode
#    table revalidated for the new source (verify --fix into $OUT/tc, the file to ship); the batch-64
#    fp8 entries searched again, seeded with the sweep's new best tiles (32 keys, one warp), and
#    exported into $OUT/tc; then the public fp8 ops with those tables (fp8_kv_bench --quick).
# A, B (after the patch and S's table are committed): every gpu-marked test, in two halves; A then
#    attention's held-out set (as round 28 D) with the nearest rung's new carry-over rule, which
#    keeps the long-prefill tile above 8,192 rows (round 28 D rescored offline: 28 of 32).
# C (issue 14): paged decode's held-out set with the kernel and default as they then are.
part=${1:?part S, A, B or C}
source "$(dirname "$0")/device_steps.sh"  # shell options, output settings, $started, $card, step, left

case $part in
  S)
    grep -q "SWAP_AB: tl.constexpr" omnitune/kernels/paged_decode_attention.py \
      || { echo "apply benchmarks/variants/decode_fp8_swap_ab.patch first"; exit 2; }
    step 100 python -m pytest -q -p no:cacheprovider -m gpu tests/test_paged_decode_attention.py \
      tests/test_fp8_kv_cache.py tests/test_production_ops.py
    SWEEP_CTXS=16384 few_warps_sweeps round29_S 90
    mkdir -p "$OUT/tc" && cp -r tuned_configs/paged_decode_attention tuned_configs/kv_cache_write "$OUT/tc/"
    step 170 python -m omnitune verify --kernels paged_decode_attention --tables "$OUT/tc" --fix \
      --json "$OUT/verify_fix_paged_decode_${card}_round29_S.json"
    rm -f "$OUT"/tc/*/.*.lock
    one='"num_warps": 1, "PACK_GQA": true, "FUSED_REDUCE": false, "num_stages": 3'
    fp8_b64_entries_searched 10 $(left 500) $(left 470) \
      --try "{\"BLOCK_N\": 32, \"NUM_SPLITS\": 4, $one}" --try "{\"BLOCK_N\": 32, \"NUM_SPLITS\": 8, $one}" \
      --try "{\"BLOCK_N\": 32, \"NUM_SPLITS\": 16, $one}" --try "{\"BLOCK_N\": 16, \"NUM_SPLITS\": 4, $one}"
    step 60 env OMNITUNE_CONFIG_DIR="$OUT/tc" python benchmarks/fp8_kv_bench.py --quick \
      --out "$OUT/fp8_kv_${card}_round29_S.json"
    ;;
  A)
    gpu_tests_first_half 330
    step 150 python benchmarks/coverage.py --kernel attention --out "$OUT/coverage_attention_${card}_round29_A.json" \
      --trials 40 --work-dir /tmp/cov_a --time-budget 130 \
      --tuned-from benchmarks/results/coverage_attention_h200_round22_B_trained_tables.json
    ;;
  B) gpu_tests_second_half ;;
  C)
    step 580 python benchmarks/coverage.py --kernel paged_decode_attention --trials 40 --time-budget 520 \
      --work-dir /tmp/cov --out "$OUT/coverage_paged_decode_${card}_round29_C.json"
    ;;
esac

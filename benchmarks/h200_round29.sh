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
#    On another card (the lender may give an H100 for this kind) S runs the tests, both sweeps and
#    the public ops with default configs, and leaves the H200 table alone.
# A, B (after the patch and S's table are committed): every gpu-marked test, in two halves; A then
#    attention's held-out set (as round 28 D) with the nearest rung's new carry-over rule, which
#    keeps the long-prefill tile above 8,192 rows (round 28 D rescored offline: 28 of 32), then C.
# C (issue 14): paged decode's held-out set with the kernel and default as they then are, each
#    problem's optimum the one round 13 B's 40-trial search found, timed again in this run.
# T (an H100, issue 14): paged decode's held-out set on a GPU that no table ships for, its picks from
#    the H200's tables (the runtime reads a same-chip GPU's tables where a GPU has none), each
#    problem's optimum a fresh 40-trial search on this GPU: how configs tuned on one GPU serve its twin.
# T2 (an H100): the same for the KV write and attention; T3 (an H100): the public fp8 ops with the
#    H200's tables (fp8_kv_bench --quick); T4 (an H100): the same twice in one call, with the
#    same-chip tables and without them (omnitune.trial._SAME_CHIP emptied: the defaults).
# T5 (an H100): the public ops (ops_bench) the same two ways. AC (the H200): A's held-out attention, then C.
part=${1:?part S, A, B, C, AC, T, T2, T3, T4 or T5}
source "$(dirname "$0")/device_steps.sh"  # shell options, output settings, $started, $card, step, left

held_out_attention() {
  step 150 python benchmarks/coverage.py --kernel attention --out "$OUT/coverage_attention_${card}_round29_A.json" \
    --trials 40 --work-dir /tmp/cov_a --time-budget 130 \
    --tuned-from benchmarks/results/coverage_attention_h200_round22_B_trained_tables.json
}

held_out_paged_decode() {  # LIMIT
  step "$1" python benchmarks/coverage.py --kernel paged_decode_attention --trials 40 --time-budget $(( $1 - 20 )) \
    --work-dir /tmp/cov --out "$OUT/coverage_paged_decode_${card}_round29_C.json" \
    --tuned-from benchmarks/results/coverage_paged_decode_h200_round13_B.json
}

twin_on_and_off() {  # LIMIT SCRIPT NAME [ARGS...]: SCRIPT --out ${NAME}_${card}_round29_T*_twin_{on,off}.json,
  # once as shipped (a GPU without tables reads its same-chip twin's), once with no twin (the defaults)
  local limit=$1 script=$2 name=$3 twin
  shift 3
  for twin in on off; do
    step "$limit" python -c "
import sys, runpy, omnitune.trial as t
if sys.argv[1] == 'off': t._SAME_CHIP = ()
sys.argv = [sys.argv[2], *sys.argv[4:], '--out', sys.argv[3]]
runpy.run_path(sys.argv[0], run_name='__main__')" $twin "$script" "$OUT/${name}_${card}_round29_${part}_twin_$twin.json" "$@"
  done
}

case $part in
  S)
    grep -q "SWAP_AB: tl.constexpr" omnitune/kernels/paged_decode_attention.py \
      || { echo "apply benchmarks/variants/decode_fp8_swap_ab.patch first"; exit 2; }
    step 100 python -m pytest -q -p no:cacheprovider -m gpu tests/test_paged_decode_attention.py \
      tests/test_fp8_kv_cache.py tests/test_production_ops.py
    if [ "$card" != h200 ]; then  # no H200 table can be revalidated here
      few_warps_sweeps round29_S 120
      step 90 python benchmarks/fp8_kv_bench.py --quick --out "$OUT/fp8_kv_${card}_round29_S.json"
      exit 0
    fi
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
    held_out_attention
    held_out_paged_decode $(left 585)
    ;;
  B) gpu_tests_second_half ;;
  C) held_out_paged_decode 580 ;;
  T)
    step 585 python benchmarks/coverage.py --kernel paged_decode_attention --trials 40 --time-budget 560 \
      --work-dir /tmp/cov --out "$OUT/coverage_paged_decode_${card}_round29_T.json"
    ;;
  T2)
    step 230 python benchmarks/coverage.py --kernel kv_cache_write --trials 40 --time-budget 210 --work-dir /tmp/cov_w \
      --out "$OUT/coverage_kv_cache_write_${card}_round29_T2.json"
    step 330 python benchmarks/coverage.py --kernel attention --trials 40 --time-budget 300 --work-dir /tmp/cov_a \
      --out "$OUT/coverage_attention_${card}_round29_T2.json"
    ;;
  T3) step 200 python benchmarks/fp8_kv_bench.py --quick --out "$OUT/fp8_kv_${card}_round29_T3.json" ;;
  T4) twin_on_and_off 150 benchmarks/fp8_kv_bench.py fp8_kv --quick ;;
  T5) twin_on_and_off 250 benchmarks/ops_bench.py ops_bench ;;
  AC)  # on the H200 alone: attention's held-out set (as A's), then paged decode's (C), about 350 s
    held_out_attention
    held_out_paged_decode 300
    ;;
esac

#!/usr/bin/env bash
# Twenty-eighth H200 round, one H200 (result files are named by the card that ran them: the lender
# gave an H100 for H13, H2 and the gpu tests, files *_h100_round28_*):
#   OUT=dir bash benchmarks/h200_round28.sh H1|H3|H13|H2|A|B|C|D   (H13: H1 then H3, one device call)
# Part H (issues 16 and 15): the decode loop's row offsets hoisted out of the loop
# (benchmarks/variants/decode_hoisted_rows.patch). A tile starts at a multiple of BLOCK_N, so where
# BLOCK_N and the page size divide one another (both powers of two always do) a row's offset
# inside its page repeats from tile to tile: computed once before the loop, the loop adds a page's
# base to it. A tile no longer than a page lies in one page: its page number is one scalar load,
# not one a row. Compiled for sm_90 without a GPU (decode_loop_offline_round27.json against
# decode_loop_offline_hoisted_rows.json, static counts): fp8 16 keys / 1 warp (the b64 tables'
# config) 34.75 → 30.12 instructions a key, 165 → 168 registers; bf16 64 / 4 warps (the default)
# 36.94 → 29.75, 122 → 113 registers; bf16 16 / 1 warp 35.38 → 22.25. Some configs take more
# registers (bf16 64 / 2 warps 168 → 208). The interpreter's decode tests pass with it, including
# every geometry of 16-key tiles over pages of 4, 16, 32, 48, 12 and 24 slots.
# H1: the fp8 few-warps sweep at 4k and 16k (bf16's tuned configs in the same run) with the
# kernel as committed, then the variant's GPU tests, then the sweep with the variant.
# H3 (on top of H's variant, benchmarks/variants/decode_hoisted_rows_swap_ab.patch): at most 8 query
# rows a program (GQA 7 and 8 at one query token), the dots transposed — keys as the MMA's 16 rows,
# the query rows as its 8 columns (m16n8k16) — so the 9 padded rows of a 16-row tile are neither
# multiplied nor exponentiated nor rescaled. Switched on by OMNITUNE_DECODE_SWAP_AB=1 (a study's
# switch, in the variant only). Compiled for sm_90 (decode_loop_offline_hoisted_swap_ab.json, with
# --block-m 8): fp8 16 keys / 1 warp 30.12 → 24.06 instructions a key, 168 → 158 registers; fp8
# 64 / 2 warps 29.06 → 22.84, 230 → 168 registers; but bf16 64 / 4 warps 29.75 → 33.69 with 185
# registers (V's transposed operand), so the variant takes it over fp8 caches only. The
# interpreter's decode and fp8 tests pass with it switched on. H3 runs the variant's GPU tests
# switched on, then the few-warps sweep switched on (its bf16 configs as in H1's hoisted run).
# H2: issue 15's long-context sweep (bf16, b1 32k / b1 64k / b2 32k, 135 configs each through
# PagedDecodePlan.run as a graph) before and after, then with the combine launched as a
# programmatic dependent of the split kernel instead (benchmarks/variants/decode_combine_pdl.patch,
# OMNITUNE_DECODE_PDL=1): the split programs signal griddepcontrol.launch_dependents as they start,
# the combine's programs wait (griddepcontrol.wait) before reading the partials, so the combine's
# launch overlaps the split grid's tail — at b1 32k the whole call is 23.8 µs against the 15.8 a
# copy of its bytes takes. Compiled for sm_90 offline (both instructions present; the split
# kernel's registers unchanged); the interpreter's tests pass with it (PDL off there). Its GPU
# tests run switched on first.
# A and B, only once a variant is adopted and committed: the paged-decode table revalidated for
# the new kernel source, the public ops (fp8_kv_bench --quick) with it, and every gpu-marked test
# (A: all but the five slow files; B: those). C (issue 14): paged decode's held-out set with the
# adopted kernel, each problem searched afresh (a kernel change moves the optima; 370 s in round 13),
# with the default's new waves for 32- and 128-row tiles (round 28, offline: kv_cache.md, Defaults).
# D (issue 14): attention's held-out set with round 28's default rules (64-row tiles over ≥ 16,000
# keys, the small-grid SDPA rule for query-light tiles only, 128×128 for long causal prefill), the
# optima from round 22 B's searches (the same kernel source, 0922d9a3c56bea5f), as round 24 J did.
# The few-warps sweeps compile their 73 configs first in parallel processes (round 26 compiled
# them one at a time: 190-225 s for the 4k sweep with --fused-reduce, most of it compiling).
# U (this round's card may be an H100: the lender gives either): on an H200, H13's sweeps (the H100's
# sweep, 88% of copy there, could not tell whether fewer instructions pay where the loop runs at
# 71%) then D if time is left; on another card, the gpu-marked verify test that needed an H200 table (it now
# re-addresses the H200's to this GPU) and the public fp8 ops as a user of that card meets them
# (no table ships for it: the defaults); with U_OTHER=ops, every public op (ops_bench.py) instead.
part=${1:?part H1, H3, H13, H2, A, B, C, D or U}
source "$(dirname "$0")/device_steps.sh"  # shell options, output settings, $started, step, left

patch=benchmarks/variants/decode_hoisted_rows.patch
case $part in
  H13)
    bash "$0" H1
    bash "$0" H3
    ;;
  H1)
    few_warps_sweeps round28_H1_now 150
    variant_apply $patch
    step 150 python -m pytest -q -p no:cacheprovider -m gpu tests/test_paged_decode_attention.py \
      tests/test_fp8_kv_cache.py tests/test_production_ops.py
    few_warps_sweeps round28_H1_hoisted 150
    variant_restore $patch
    ;;
  H3)
    variant_apply benchmarks/variants/decode_hoisted_rows_swap_ab.patch
    export OMNITUNE_DECODE_SWAP_AB=1
    step 150 python -m pytest -q -p no:cacheprovider -m gpu tests/test_paged_decode_attention.py \
      tests/test_fp8_kv_cache.py tests/test_production_ops.py
    few_warps_sweeps round28_H3_swap_ab 150
    unset OMNITUNE_DECODE_SWAP_AB
    variant_restore benchmarks/variants/decode_hoisted_rows_swap_ab.patch
    ;;
  H2)
    step 150 python benchmarks/long_decode_sweep.py --out "$OUT/long_decode_sweep_${card}_round28_H2_now.json"
    variant_apply $patch
    step 150 python benchmarks/long_decode_sweep.py --out "$OUT/long_decode_sweep_${card}_round28_H2_hoisted.json"
    variant_restore $patch
    variant_apply benchmarks/variants/decode_combine_pdl.patch
    export OMNITUNE_DECODE_PDL=1
    step 120 python -m pytest -q -p no:cacheprovider -m gpu tests/test_paged_decode_attention.py tests/test_production_ops.py \
      tests/test_production_ops_gpu.py
    step 150 python benchmarks/long_decode_sweep.py --out "$OUT/long_decode_sweep_${card}_round28_H2_pdl.json"
    unset OMNITUNE_DECODE_PDL
    variant_restore benchmarks/variants/decode_combine_pdl.patch
    ;;
  A)
    revalidated_decode_ops round28
    gpu_tests_first_half 280
    ;;
  B)
    gpu_tests_second_half
    ;;
  D)
    step 150 python benchmarks/coverage.py --kernel attention --out "$OUT/coverage_attention_${card}_round28_D.json" \
      --trials 40 --work-dir /tmp/cov_a --time-budget 130 \
      --tuned-from benchmarks/results/coverage_attention_h200_round22_B_trained_tables.json
    ;;
  U)
    echo "### card: $card"
    if [[ $card == h200 ]]; then
      # H13 without its GPU tests (the variants' tests passed on the H100, the same sm_90 code),
      # at 4k alone unless SWEEP_CTXS says otherwise (16k has followed 4k in every round)
      export SWEEP_CTXS=${SWEEP_CTXS:-4096}
      few_warps_sweeps round28_U_now 150
      variant_apply $patch
      few_warps_sweeps round28_U_hoisted 150
      variant_restore $patch
      variant_apply benchmarks/variants/decode_hoisted_rows_swap_ab.patch
      export OMNITUNE_DECODE_SWAP_AB=1
      few_warps_sweeps round28_U_swap_ab 150
      unset OMNITUNE_DECODE_SWAP_AB
      variant_restore benchmarks/variants/decode_hoisted_rows_swap_ab.patch
      [ "$(left ${U_LIMIT:-560})" -gt 160 ] && bash "$0" D  # U_LIMIT: the call's limit
    elif [[ ${U_OTHER:-} == ops ]]; then  # the second call that got an H100: every public op
      step 150 python benchmarks/ops_bench.py --out "$OUT/ops_bench_${card}_round28_U.json"
    else
      step 120 python -m pytest -q -p no:cacheprovider -m gpu tests/test_verify.py
      step 150 python benchmarks/fp8_kv_bench.py --out "$OUT/fp8_kv_${card}_round28_U.json"
    fi
    ;;
  C)
    step 580 python benchmarks/coverage.py --kernel paged_decode_attention --trials 40 --time-budget 520 \
      --work-dir /tmp/cov --out "$OUT/coverage_paged_decode_${card}_round28_C.json"
    ;;
esac

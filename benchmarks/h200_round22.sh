#!/usr/bin/env bash
# Twenty-second H200 round, one H200:
#   OUT=dir bash benchmarks/h200_round22.sh D|A|B|C    (B and C after A's tables are in tuned_configs)
# Issue 14, tables for shapes nobody tuned. The H200 tables hold the presets' points alone (paged
# decode: batch 1-64, one query token, pages of 16; kv_compress: one entry), so most held-out
# problems were answered by the default config: paged decode 26 of 30 and attention 27 of 32 >= 95%
# of tuned (rounds 13 and 15), kv_compress 13 of its first 17 (round 21).
# Part A: the training problems of attention, paged decode and kv_compress (benchmarks/training_set.py,
# apart from the held-out set and the presets) searched, 40 trials a problem, in lanes, and
# exported over a copy of the shipped tables (entries, and the predictor block export fits over
# every stored trial). Only the three tables come back ($OUT/tc).
# Part B: the held-out sets judged against those tables. Attention's and paged decode's problems
# keep the tuned optimum their searches found in rounds 15 and 13 (coverage.py --tuned-from: the new
# pick and the default checked and timed again beside it); so do the 17 kv_compress problems of
# round 21; the other 13 of kv_compress are searched, for the time left. Attention's and paged
# decode's tables shipped without export's predictor block (its answers were unmeasured); part A's
# carry it, so here it is measured (the rows' rung says where it answered).
# Part C: kv_compress's held-out set resumed from part B's file.
# Committed as: part B's attention and paged-decode files judged part A's tables, which were not
# shipped (coverage_{attention,paged_decode}_h200_round22_B_trained_tables.json); part A's trials
# are train_h200_round22_A.db.gz; kv_compress's file holds parts B and C.
# Part D: the tests of what changed on the host (the compile workers, the lanes, the ops compiled
# fullgraph, the dispatch's import), then (issue 20) the whole Qwen2.5-Omni-7B preset, 50 trials a problem, from an empty database and
# an empty Triton cache, as rounds 20-21: the kernels now import without torch._dynamo (a lane's and
# a fork server's imports before their first work: 1.6 -> 0.2 s on the development machine), and the
# compile workers draw their inputs under the lanes' GPU lock.
part=${1:?part A|B|C|D}
source "$(dirname "$0")/device_steps.sh"  # shell options, output settings, $started, step, left

train() {  # train KERNEL DTYPE LIMIT: the kernel's training problems of one dtype searched into $OUT/train.db
  step $3 python -m omnitune search "$1" $(python benchmarks/training_set.py "$1" "$2") -n 40 --dtype "$2" \
    --db "$OUT/train.db" --timeout $(( $3 - 20 ))
}
judge() {  # judge KERNEL NAME [ARGS]: the kernel's held-out set into $OUT/coverage_KERNEL_h200_round22_NAME.json
  local kernel=$1 name=$2; shift 2
  step $(left 580) python benchmarks/coverage.py --kernel "$kernel" --out "$OUT/coverage_${kernel}_h200_round22_$name.json" \
    --trials 40 --work-dir /tmp/cov --time-budget $(left 480) "$@"
}

case $part in
  A)
    mkdir -p "$OUT/tc" && cp -r tuned_configs/* "$OUT/tc/"
    train paged_decode_attention bf16 100
    train paged_decode_attention fp16 50
    train attention bf16 150
    train attention fp16 50
    train kv_compress bf16 $(( $(left 540) > 60 ? $(left 540) - 40 : 20 ))
    train kv_compress fp16 $(( $(left 540) > 40 ? $(left 540) : 20 ))
    step 60 python -m omnitune export --db "$OUT/train.db" --out "$OUT/tc"; rm -f "$OUT"/tc/*/.*.lock
    find "$OUT/tc" -mindepth 1 -maxdepth 1 ! -name attention ! -name paged_decode_attention ! -name kv_compress \
      -exec rm -rf {} +
    ;;
  B)
    judge paged_decode_attention B --tuned-from benchmarks/results/coverage_paged_decode_h200_round13_B.json
    judge attention B --tuned-from benchmarks/results/coverage_attention_h200_round15_C.json
    judge kv_compress B --tuned-from benchmarks/results/coverage_kv_compress_h200_round21.json
    ;;
  D)
    # First, the tests of what changed on the host since round 21: compile workers draw their inputs
    # and make any real launch under the lanes' GPU lock; the kernels import without torch._dynamo
    # (its constant marker spelt out, checked against this torch, and every op compiled fullgraph).
    step 240 python -m pytest -q -p no:cacheprovider -m gpu tests/test_precompile.py tests/test_lanes.py \
      tests/test_production_ops_gpu.py
    step 60 python -m pytest -q -p no:cacheprovider tests/test_dispatch_import.py
    step 170 python benchmarks/search_wall.py --triton-cache /tmp/r22d_triton --model qwen2.5-omni-7b \
      --trials 50 --db /tmp/r22d/omnitune.db --timeout 150 --out "$OUT/search_wall_h200_round22_D.json"
    ;;
  C)
    # As run in round 22: the 180 s of device time left held a shorter call than part B's.
    cp benchmarks/results/coverage_kv_compress_h200_round22_B.json "$OUT/"
    step 290 python benchmarks/coverage.py --kernel kv_compress --out "$OUT/coverage_kv_compress_h200_round22_B.json" \
      --trials 40 --work-dir /tmp/cov --time-budget 170 --resume \
      --tuned-from benchmarks/results/coverage_kv_compress_h200_round21.json
    ;;
esac

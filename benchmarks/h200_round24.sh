#!/usr/bin/env bash
# Twenty-fourth H200 round, one H200:
#   OUT=dir bash benchmarks/h200_round24.sh F|K1|K2
# (K2 after K1's $OUT/train.db.gz is copied to benchmarks/results/train_h200_round24_K1.db.gz)
# Part F (issue 16): paged decode over fp8 with one or two warps a program. Offline
# (benchmarks/results/decode_loop_offline.json) the key loop issues 40-57 instructions a key at any
# warp count, and round 9's Nsight Compute run found its warps waiting rather than issuing; with one
# warp to a tile no warp waits at a barrier for the others. Over fp8, 1-2 warps were measured only
# on 64- and 128-key tiles (round 8's searches: 2.3x the best and slower). 72 configs beside each
# cache's tuned one, b64 h28/4 at 4k and 16k, each config's output compared with the tuned config's.
# Parts K1 and K2 (issue 14): kv_compress's last four training problems (three fp16, one bf16 at
# d=64) searched, 40 trials each (K1); merged with rounds 22-23's training trials
# (benchmarks/merge_trials.py), exported over a copy of the shipped tables and judged on the
# held-out set against round 23 part J's optima (K2). Shipped only if it judges better than
# round 23's table (25 of 30).
part=${1:?part F|K1|K2}
source "$(dirname "$0")/device_steps.sh"  # shell options, output settings, $started, step, left

case $part in
  F)
    for ctx in 4096 16384; do
      step $(( $(left 580) / (ctx == 4096 ? 2 : 1) )) python benchmarks/fp8_decode_probe.py --few-warps --ctx $ctx \
        --out "$OUT/fp8_decode_few_warps_h200_round24_F_$ctx.json" --asm /tmp/asm
    done
    ;;
  K1)
    kv=$(python benchmarks/training_set.py kv_compress bf16 | tr ' ' '\n' | grep -v -- --shape | sed -n 7p)
    step 280 python -m omnitune search kv_compress $(python benchmarks/training_set.py kv_compress fp16) -n 40 \
      --dtype fp16 --db "$OUT/train.db" --timeout 250
    step $(left 570) python -m omnitune search kv_compress --shape "$kv" -n 40 --dtype bf16 --db "$OUT/train.db" \
      --timeout $(left 530)
    gzip -k "$OUT/train.db"
    ;;
  K2)
    mkdir -p /tmp/k2 "$OUT/tc" && cp -r tuned_configs/kv_compress "$OUT/tc/"
    gunzip -c benchmarks/results/train_h200_round24_K1.db.gz > /tmp/k2/merged.db
    for earlier in train_h200_round23_T train_h200_round22_A; do
      gunzip -c "benchmarks/results/$earlier.db.gz" > "/tmp/k2/$earlier.db"
    done
    step 60 python benchmarks/merge_trials.py /tmp/k2/merged.db /tmp/k2/train_h200_round23_T.db \
      /tmp/k2/train_h200_round22_A.db --kernel kv_compress
    step 60 python -m omnitune export --db /tmp/k2/merged.db --kernel kv_compress --out "$OUT/tc"
    rm -f "$OUT"/tc/*/.*.lock
    step $(left 560) python benchmarks/coverage.py --kernel kv_compress --tables "$OUT/tc" \
      --out "$OUT/coverage_kv_compress_h200_round24_K2.json" --trials 40 --work-dir /tmp/cov \
      --time-budget $(left 480) --tuned-from benchmarks/results/coverage_kv_compress_h200_round23_J.json
    ;;
esac

#!/usr/bin/env bash
# Twenty-third H200 round, one H200:
#   OUT=dir bash benchmarks/h200_round23.sh A|B|T|J   (B after A's file is copied into benchmarks/results;
#   J after T's table is in tuned_configs)
# Run in the order A, B, T, J; part W was not run (device time went to T and J).
# Part W: where a kv_compress search's time goes. In round 22 part A a 40-trial problem took ~222 s
# in four lanes, ~1.2 s of GPU a trial for a 1-9 ms op; search_wall lays each lane's holdings of the
# GPU (checking, warm-up, timing, telemetry) beside the GPU's utilization, for four of its training
# problems searched at once from an empty database and Triton cache.
# Parts A and B (issue 14): kv_compress's held-out set, 20 of 30 judged against the table trained
# in round 22 (17 of 20 >= 95% of tuned); the other 10 problems are searched (40 trials, 49-79 s a
# problem, the first of a call ~3 min). Each call resumes the one results file, which is rewritten
# after every problem; --time-budget stays >= 90 s short of the step's limit so that no problem is
# cut off mid-way.
part=${1:?part W|A|B}
source "$(dirname "$0")/device_steps.sh"  # shell options, output settings, $started, step, left

# Part T (issue 14): kv_compress's training problems whose round-22 search stopped at 8-9 trials (four
# of them, shipped as entries on that evidence: one answered a held-out problem through the nearest
# rung at 1.19x its optimum in part B) or never started (four more), searched afresh, 40 trials
# each, in lanes, into a database of their own. Merged offline with round 22's four finished
# problems and exported over a copy of the shipped tables, on the development machine:
#   gunzip -c benchmarks/results/train_h200_round23_T.db.gz > merged.db
#   gunzip -c benchmarks/results/train_h200_round22_A.db.gz > old.db
#   sqlite3 merged.db "attach 'old.db' as old; insert into trials select * from old.trials
#     where kernel='kv_compress' and problem_key not in (select distinct problem_key from trials)"
#   python -m omnitune export --db merged.db --kernel kv_compress --out tuned_configs
# Part J: that table judged on kv_compress's held-out set, each problem's optimum taken from parts A
# and B's file (coverage.py --tuned-from: checked and timed again beside the new pick and the default).
case $part in
  W)
    step 300 python benchmarks/search_wall.py --model '' --trials 40 --timeout 270 --triton-cache /tmp/r23w_triton \
      --db /tmp/r23w/omnitune.db --out "$OUT/search_wall_kv_compress_h200_round23_W.json" \
      -- kv_compress $(python benchmarks/training_set.py kv_compress bf16 | cut -d' ' -f1-8)
    ;;
  A|B)
    file=coverage_kv_compress_h200_round22_B.json
    cp "benchmarks/results/$file" "$OUT/"
    step $(left 580) python benchmarks/coverage.py --kernel kv_compress --out "$OUT/$file" --trials 40 \
      --work-dir /tmp/cov --time-budget $(left 480) --resume \
      --tuned-from benchmarks/results/coverage_kv_compress_h200_round21.json
    ;;
  T)
    shapes=""
    for n in 1 2 9 11 3 6 10 12; do  # training_set.py's bf16 kv_compress problems, by line
      shapes="$shapes --shape $(python benchmarks/training_set.py kv_compress bf16 | tr ' ' '\n' | grep -v -- --shape | sed -n ${n}p)"
    done
    step $(left 570) python -m omnitune search kv_compress $shapes -n 40 --dtype bf16 --db "$OUT/train.db" \
      --timeout $(left 520)
    gzip -k "$OUT/train.db"
    ;;
  J)
    step $(left 350) python benchmarks/coverage.py --kernel kv_compress --out "$OUT/coverage_kv_compress_h200_round23_J.json" \
      --trials 40 --work-dir /tmp/cov --time-budget $(left 290) \
      --tuned-from benchmarks/results/coverage_kv_compress_h200_round22_B.json
    ;;
esac

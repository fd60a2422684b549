#!/usr/bin/env bash
# What waits for an H200, in the order to run it: OUT=dir bash benchmarks/h200_backlog.sh 1|2|3
# One device call a part, each under 600 s; on any other card a part says so and runs nothing
# (every part below has run on an H100 already: docs/results.md, rounds 28–46).
#   1  issue 16 (about 440 s): round 39's part L — the b1 32k paged read floor, then both fp8 loop
#      variants applied (benchmarks/variants/decode_fp8_swap_ab.patch, decode_fp8_pv16.patch), the
#      decode and fp8 gpu tests, the fp8 sweeps at 4k and 16k and the public fp8 ops beside bf16
#      (fp8 ÷ bf16 at batch 64, h28/4: the issue asks ≥ 1.7x). With under 6 minutes of device time
#      left, H200_PART=M (about 340 s) drops the sweeps.
#   2  issue 15 (about 400 s): the Gluon kernel's gpu tests, then attention as users call it
#      (prefill_bench.py --gluon: the op with the Gluon config beside SDPA cuDNN, eager and as
#      CUDA-graph replays, issue 15's eight shapes first: the issue asks ≥ 1.0x and ≥ 600 TFLOP/s),
#      then paged decode over issue 15's batch × context grid as graph replays (≥ 85% of copy asked).
#   3  issue 14 (about 350 s): round 29's AC — attention's and paged decode's held-out sets judged
#      with the shipped tables, each problem's tuned optimum timed again beside the pick.
# After a part that changes a kernel's table (1 applies kernel variants: the paged-decode table must
# then be revalidated with `omnitune verify --fix`, round 29's S), commit the table with the variants.
source "$(dirname "$0")/device_steps.sh"  # shell options, output settings, $started, $card, step, left
nvidia-smi -L
if [ "$card" != h200 ]; then echo "not an H200 ($card): nothing run"; exit 3; fi
case ${1:-} in
  1) H200_PART=${H200_PART:-L} exec bash "$(dirname "$0")/h200_round39.sh" ;;
  2)
    step 240 python -m pytest -q -p no:cacheprovider -m gpu tests/test_attention_gluon.py
    step 150 python benchmarks/prefill_bench.py --gluon --out "$OUT/prefill_gluon_${card}_backlog.json"
    step "$(left 590)" python benchmarks/graph_launch_floor.py --grid --out "$OUT/decode_grid_${card}_backlog.json"
    ;;
  3) exec bash "$(dirname "$0")/h200_round29.sh" AC ;;
  *) echo "part 1, 2 or 3"; exit 2 ;;
esac

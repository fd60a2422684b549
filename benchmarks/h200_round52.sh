#!/usr/bin/env bash
# Fifty-second round, one call that branches on the card it is given: OUT=dir bash benchmarks/h200_round52.sh
# On an H200: issue 16's shortest part (round 39's M, about 250 s; see h200_round49.sh).
# On another card: the decode loop under torch.compile's reduce-overhead mode (its CUDA graph
# trees), whole steps and the decode half alone, ours beside PyTorch's — round 51's attempt failed
# on the benchmark's side (a backend object takes no mode) — then the dispatcher's price per call
# of each registration once more (benchmarks/op_dispatch_overhead.py; round 51's processes moved
# by up to 50% on calls that do not go through the dispatcher at all).
source "$(dirname "$0")/device_steps.sh"  # shell options, output settings, $started, $card, step, left
nvidia-smi -L
if [ "$card" = h200 ]; then
  H200_PART=${H200_PART:-M} exec bash "$(dirname "$0")/h200_round39.sh"
fi
step 150 python benchmarks/compiled_decode_loop.py --backend inductor --mode reduce-overhead \
  --impls omnitune_decode,pytorch_decode,omnitune,pytorch --out "$OUT/compiled_decode_loop_${card}_round52_reduce_overhead.json"
for round in 1 2; do
  step 40 python benchmarks/op_dispatch_overhead.py --out "$OUT/op_dispatch_overhead_${card}_round52_library_$round.json"
  variant_apply benchmarks/variants/ops_registered_by_custom_op.patch || exit 2
  step 40 python benchmarks/op_dispatch_overhead.py --out "$OUT/op_dispatch_overhead_${card}_round52_custom_op_$round.json"
  variant_restore benchmarks/variants/ops_registered_by_custom_op.patch
done

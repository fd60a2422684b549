#!/usr/bin/env bash
# Fifty-first round, one call that branches on the card it is given: OUT=dir bash benchmarks/h200_round51.sh
# On an H200: issue 16's part of round 39 (H200_PART, L by default: about 440 s; see h200_round49.sh).
# On another card: first what one call of each decode-step op costs through the dispatcher
# (benchmarks/op_dispatch_overhead.py), then round 50 again with each loop timed over five passes taking turns with its eager
# twin (round 50's single passes moved by up to 6x between rows of the same loop): a compiled decode
# loop's host cost op by op and backend by backend (benchmarks/compiled_decode_loop.py), the ops
# registered by define/impl as committed, then by @torch.library.custom_op
# (benchmarks/variants/ops_registered_by_custom_op.patch), each in its own process; then the decode
# half alone under torch.compile's reduce-overhead mode (its CUDA graphs). Profiles come back as one
# archive a registration.
source "$(dirname "$0")/device_steps.sh"  # shell options, output settings, $started, $card, step, left
nvidia-smi -L
if [ "$card" = h200 ]; then
  H200_PART=${H200_PART:-L} exec bash "$(dirname "$0")/h200_round39.sh"
fi
loop_args=(--backend eager,aot_eager,inductor
           --impls omnitune,pytorch,omnitune_write,pytorch_write,omnitune_decode,pytorch_decode)
loop() {  # loop NAME: the loop benchmark with its profiles archived
  step 200 python benchmarks/compiled_decode_loop.py "${loop_args[@]}" --profile "$OUT/prof_$1" \
    --out "$OUT/compiled_decode_loop_${card}_round51_$1.json"
  tar czf "$OUT/prof_${card}_round51_$1.tgz" -C "$OUT" "prof_$1" && rm -r "$OUT/prof_$1"
}
step 60 python benchmarks/op_dispatch_overhead.py --out "$OUT/op_dispatch_overhead_${card}_round51_library.json"
loop library
variant_apply benchmarks/variants/ops_registered_by_custom_op.patch || exit 2
step 60 python benchmarks/op_dispatch_overhead.py --out "$OUT/op_dispatch_overhead_${card}_round51_custom_op.json"
loop custom_op
variant_restore benchmarks/variants/ops_registered_by_custom_op.patch
step "$(left 590)" python benchmarks/compiled_decode_loop.py --backend inductor --mode reduce-overhead \
  --impls omnitune_decode,pytorch_decode --out "$OUT/compiled_decode_loop_${card}_round51_reduce_overhead.json"

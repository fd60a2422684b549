#!/usr/bin/env bash
# Fiftieth round, one call that branches on the card it is given: OUT=dir bash benchmarks/h200_round50.sh
# On an H200: issue 16's part of round 39 (H200_PART, L by default: about 440 s; see h200_round49.sh).
# On another card: what a compiled decode loop pays on the host, op by op and backend by backend
# (benchmarks/compiled_decode_loop.py: ours beside PyTorch's, the whole step and each half alone,
# Dynamo alone, AOTAutograd and Inductor, torch.profiler's table of each), the ops registered by
# torch.library's define/impl as committed, then by @torch.library.custom_op
# (benchmarks/variants/ops_registered_by_custom_op.patch), each in its own process; then the ops' gpu tests.
source "$(dirname "$0")/device_steps.sh"  # shell options, output settings, $started, $card, step, left
nvidia-smi -L
if [ "$card" = h200 ]; then
  H200_PART=${H200_PART:-L} exec bash "$(dirname "$0")/h200_round39.sh"
fi
loop_args=(--backend eager,aot_eager,inductor
           --impls omnitune,pytorch,omnitune_write,pytorch_write,omnitune_decode,pytorch_decode)
step 240 python benchmarks/compiled_decode_loop.py "${loop_args[@]}" --profile "$OUT/prof_library" \
  --out "$OUT/compiled_decode_loop_${card}_round50.json"
variant_apply benchmarks/variants/ops_registered_by_custom_op.patch || exit 2
step "$(left 580)" python benchmarks/compiled_decode_loop.py "${loop_args[@]}" --profile "$OUT/prof_custom_op" \
  --out "$OUT/compiled_decode_loop_${card}_round50_custom_op.json"
variant_restore benchmarks/variants/ops_registered_by_custom_op.patch
# The ops' gpu tests with the registration as committed (Inductor, CUDA graphs, opcheck on the GPU).
step "$(left 590)" python -m pytest -q -p no:cacheprovider -m gpu tests/test_production_ops_gpu.py \
  tests/test_production_ops.py tests/test_fp8_kv_cache.py tests/test_compiled.py

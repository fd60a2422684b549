#!/usr/bin/env bash
# Fifty-fourth round, one call on any card: OUT=dir bash benchmarks/h200_round54.sh
# First the gpu-marked tests of the ops whose host paths changed in round 53's session (views whose
# offsets pass 32 bits copied or refused, kv_compress's config judged at its window, counts below
# one refused; device code unchanged) — round 53's first step, never run for want of a card.
# Then, on an H200, issue 16's ratio on the unchanged tables with both fp8 loop variants applied
# (round 39's M without its paged floor): their decode and fp8 gpu tests, and the public fp8 ops
# beside bf16 (fp8 ÷ bf16 at batch 64, h28/4; the issue asks ≥ 1.7x). On another card, the
# dispatcher's price per call with the crossing alone beside it (round 53's second step).
source "$(dirname "$0")/device_steps.sh"  # shell options, output settings, $started, $card, step, left
nvidia-smi -L
step 240 python -m pytest -q -p no:cacheprovider -m gpu tests/test_int32_offsets.py tests/test_production_ops.py \
  tests/test_production_ops_gpu.py tests/test_kv_compress.py tests/test_kv_cache_write.py
if [ "$card" = h200 ]; then fp8_ratio_with_variants round54; exit; fi
step "$(left 570)" python benchmarks/op_dispatch_overhead.py --out "$OUT/op_dispatch_overhead_${card}_round54.json"

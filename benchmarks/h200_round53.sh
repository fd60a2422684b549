#!/usr/bin/env bash
# Fifty-third round, for a short lease on any card: OUT=dir bash benchmarks/h200_round53.sh
# The host paths of every op changed this session (views whose offsets pass 32 bits go to the
# kernels as contiguous copies or are refused, kv_compress judges its config at the window it
# runs, counts below one refused; device code unchanged): the gpu-marked tests of those ops,
# the new real-2^31-view tests first, then the dispatcher's price per call with the crossing
# alone measured beside it (benchmarks/op_dispatch_overhead.py, its *_stubbed ways).
source "$(dirname "$0")/device_steps.sh"  # shell options, output settings, $started, $card, step, left
nvidia-smi -L
step 240 python -m pytest -q -p no:cacheprovider -m gpu tests/test_int32_offsets.py tests/test_production_ops.py \
  tests/test_production_ops_gpu.py tests/test_kv_compress.py tests/test_kv_cache_write.py
step "$(left 330)" python benchmarks/op_dispatch_overhead.py --out "$OUT/op_dispatch_overhead_${card}_round53.json"

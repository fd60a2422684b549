#!/usr/bin/env bash
# Forty-sixth round, one call that branches on the card it is given: OUT=dir bash benchmarks/h200_round46.sh
# On an H200 (issue 16 first, the only part still waiting for that card alone): round 39's part L,
# about 440 s (H200_PART=M, about 250 s, with less device time left).
# On another sm_90 card (issue 15's op as users call it): the Gluon kernel's launches now keep each
# view's encoded TMA tensor map (omnitune/kernels/_tma_launch.py). Its gpu tests (the kernel,
# through the op, on kept maps as tensors come and go), then benchmarks/prefill_bench.py --gluon:
# the op with the Gluon config beside the same config launched with its descriptors built and
# encoded on every call, SDPA cuDNN and the tables' pick, eager back to back (host time) and as
# CUDA-graph replays, about 150 s. G: that part on an H200 too.
source "$(dirname "$0")/device_steps.sh"  # shell options, output settings, $started, $card, step, left
nvidia-smi -L
if [ "$card" = h200 ] && [ "${1:-}" != G ]; then
  H200_PART=${H200_PART:-L} exec bash "$(dirname "$0")/h200_round39.sh"
fi
step 100 python -m pytest -q -p no:cacheprovider tests/test_tma_launch.py
step 300 python -m pytest -q -p no:cacheprovider -m gpu tests/test_attention_gluon.py
step 240 python benchmarks/prefill_bench.py --gluon --out "$OUT/prefill_gluon_${card}_round46.json"

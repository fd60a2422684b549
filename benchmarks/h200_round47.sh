#!/usr/bin/env bash
# Forty-seventh round, one call that branches on the card it is given: OUT=dir bash benchmarks/h200_round47.sh
# On an H200: issue 16 first, round 39's part L (about 440 s; benchmarks/h200_backlog.sh 1).
# On another sm_90 card (an H100): attention's Gluon kernel walks its grid in sections of 8
# (batch·head)s (omnitune/kernels/attention_gluon.py, _sectioned_program), adopted from
# benchmarks/gluon_head_groups.py's two runs: the Gluon kernel's gpu tests (the sections' own
# test among them), the op as users call it on issue 15's eight shapes and b2 h28/4 3,000 causal
# (prefill_bench.py --gluon, beside SDPA cuDNN in the same run), then `omnitune verify --fix` of
# the H100's own attention table, whose Gluon entry's source hash moved with the kernel (about 350 s).
source "$(dirname "$0")/device_steps.sh"  # shell options, output settings, $started, $card, step, left
nvidia-smi -L
if [ "$card" = h200 ]; then
  H200_PART=${H200_PART:-L} exec bash "$(dirname "$0")/h200_round39.sh"
fi
step 300 python -m pytest -q -p no:cacheprovider -m gpu tests/test_attention_gluon.py
step 150 python benchmarks/prefill_bench.py --gluon \
  --only "b1 h32/4 l8192 d128,b1 h32/4 l16384 d128,b1 h24/24 l8192 d128,b1 h24/24 l16384 d128,b2 h28/4 l3000" \
  --out "$OUT/prefill_gluon_${card}_round47.json"
if [ "$card" = h100 ]; then
  mkdir -p /tmp/h100_tables/attention && cp tuned_configs/attention/NVIDIA_H100_80GB_HBM3.json /tmp/h100_tables/attention/
  step "$(left 590)" python -m omnitune verify --kernels attention --tables /tmp/h100_tables --fix \
    --json "$OUT/verify_attention_h100_round47.json"
  cp /tmp/h100_tables/attention/NVIDIA_H100_80GB_HBM3.json "$OUT/"
fi

#!/usr/bin/env bash
# Forty-eighth round, one call that branches on the card it is given: OUT=dir bash benchmarks/h200_round48.sh
# On an H200: issue 16 first, round 39's part L (about 440 s; benchmarks/h200_backlog.sh 1).
# On another sm_90 card (an H100): the first half of every gpu-marked test (device_steps.sh's
# gpu_tests_first_half), which holds round 47's unrun test of a batch past the grid's y bound
# (tests/test_attention.py, 2,100 × 32 heads) and the host launch code changed since the last full run.
source "$(dirname "$0")/device_steps.sh"  # shell options, output settings, $started, $card, step, left
nvidia-smi -L
if [ "$card" = h200 ]; then
  H200_PART=${H200_PART:-L} exec bash "$(dirname "$0")/h200_round39.sh"
fi
gpu_tests_first_half "$(left 580)"

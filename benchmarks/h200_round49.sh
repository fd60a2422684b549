#!/usr/bin/env bash
# Forty-ninth round, one call that branches on the card it is given, for under 10 minutes of device
# time left: OUT=dir bash benchmarks/h200_round49.sh
# On an H200: issue 16's part of round 39, M by default (about 250 s; benchmarks/h200_backlog.sh 1 with
# H200_PART=M), H200_PART=L with the fp8 sweeps too (about 440 s, with a full device budget): both fp8 loop variants applied, the decode and fp8 gpu tests, the public fp8 ops
# beside bf16 (fp8 ÷ bf16 at batch 64, h28/4, 4k and 16k).
# On another sm_90 card (an H100): the second half of every gpu-marked test (device_steps.sh's
# gpu_tests_second_half: verify, worker, lanes, precompile, ncu), round 48 having run the first;
# then benchmarks/compiled_decode_loop.py (a decode loop under torch.compile, ours beside PyTorch's).
source "$(dirname "$0")/device_steps.sh"  # shell options, output settings, $started, $card, step, left
nvidia-smi -L
if [ "$card" = h200 ]; then
  H200_PART=${H200_PART:-M} exec bash "$(dirname "$0")/h200_round39.sh"
fi
gpu_tests_second_half
step "$(left 590)" python benchmarks/compiled_decode_loop.py --out "$OUT/compiled_decode_loop_${card}_round49.json"

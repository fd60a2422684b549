#!/usr/bin/env bash
# Forty-fourth round (issues 15 and 14), on any sm_90 card: OUT=dir bash benchmarks/h200_round44.sh A   (about 250 s)
# Attention's Gluon ping-pong kernel now takes image spans (a causal mask where a row inside a span
# [s, e) also sees up to e, read from the span tensor in the kernel as the Triton kernel does), so
# the presets' multimodal prefill can use it. A: its gpu tests (spans inside a block and across
# its edge, two a sequence, one past Lk, an empty one, Lq ≠ Lk both ways, int32 and int64, two
# configs and the public op, against the float32 reference), then benchmarks/prefill_bench.py
# --gluon on its image-span cases: the public op with the tables' pick (spans run on the Triton
# kernel), and with the Gluon config given, beside SDPA over the dense mask the spans make, called
# the same way (eager back to back with host time, and CUDA-graph replays).
source "$(dirname "$0")/device_steps.sh"  # shell options, output settings, $started, $card, step, left
nvidia-smi -L
case ${1:-} in A) ;; *) echo "A not asked for: nothing run"; exit 3 ;; esac
step 240 python -m pytest -q -p no:cacheprovider -m gpu tests/test_attention_gluon.py
step 120 python benchmarks/prefill_bench.py --gluon --only "image spans" --out "$OUT/prefill_spans_${card}_round44.json"

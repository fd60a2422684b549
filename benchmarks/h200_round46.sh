#!/usr/bin/env bash
# Forty-sixth round, one call that branches on the card it is given: OUT=dir bash benchmarks/h200_round46.sh [B|G]
# On an H200 (issue 16 first, the only part still waiting for that card alone): round 39's part L,
# about 440 s (H200_PART=M, about 250 s, with less device time left).
# On another sm_90 card (an H100), issue 15's op as users call it: attention's launches that take
# TMA descriptors keep each view's encoded tensor map (omnitune/kernels/_tma_launch.py).
#   (none) the Gluon kernel's gpu tests, then benchmarks/prefill_bench.py --gluon: the op with the
#          Gluon config beside the same config launched with its descriptors built and encoded on
#          every call, SDPA cuDNN and the tables' pick, eager back to back (host time) and as CUDA-graph
#          replays (about 300 s).
#   B      the same after the kept maps were made general (the Triton kernel's USE_TMA configs take
#          them too): attention's gpu tests and the Gluon kernel's, prefill_bench --gluon (a USE_TMA
#          pick beside its per-call form), then `omnitune verify --fix` of the H100's own attention
#          table alone, whose Gluon entry's source hash (the Gluon module, launcher included) moved
#          with the launch path (about 550 s).
#   C      on an H200, round 39's part L as without a part; on another card every gpu-marked test of
#          the slow files (the search's lanes, precompile workers, verify, workers, ncu: they launch
#          attention through the kept maps in other processes), about 300 s.
#   D      on an H200, round 39's part M (about 340 s); elsewhere, after the kept maps' launch became
#          one pass over its objects: the descriptor launcher's tests, attention's gpu tests, the
#          Gluon kernel's on the op's paths, and prefill_bench --gluon on three cases (about 220 s).
#   E      the shortest (about 180 s): on an H200, issue 16's two fp8 loop variants applied, the decode
#          and fp8 gpu tests, fp8_kv_bench --quick (fp8 ÷ bf16 at batch 64, 4k and 16k); elsewhere D's tests.
#   G      the first part on an H200 too.
source "$(dirname "$0")/device_steps.sh"  # shell options, output settings, $started, $card, step, left
nvidia-smi -L
part=${1:-}
if [ "$part" = E ]; then
  if [ "$card" = h200 ]; then
    fp8_variants_applied || exit 2
    step 100 python -m pytest -q -p no:cacheprovider -m gpu tests/test_paged_decode_attention.py tests/test_fp8_kv_cache.py
    step 90 python benchmarks/fp8_kv_bench.py --quick --out "$OUT/fp8_kv_${card}_round46_E.json"
    exit 0
  fi
  step 40 python -m pytest -q -p no:cacheprovider tests/test_tma_launch.py
  step 60 python -m pytest -q -p no:cacheprovider -m gpu tests/test_attention.py
  step 120 python -m pytest -q -p no:cacheprovider -m gpu tests/test_attention_gluon.py \
    -k "kept or public_op or captured or image_spans or transposed or torch_compile"
  exit 0
fi
if [ "$card" = h200 ] && [ "$part" = D ]; then
  H200_PART=M exec bash "$(dirname "$0")/h200_round39.sh"
fi
if [ "$card" = h200 ] && [ "$part" != G ]; then
  H200_PART=${H200_PART:-L} exec bash "$(dirname "$0")/h200_round39.sh"
fi
if [ "$part" = D ]; then
  step 60 python -m pytest -q -p no:cacheprovider tests/test_tma_launch.py
  step 90 python -m pytest -q -p no:cacheprovider -m gpu tests/test_attention.py
  step 150 python -m pytest -q -p no:cacheprovider -m gpu tests/test_attention_gluon.py \
    -k "kept or public_op or captured or image_spans or transposed or torch_compile"
  step 60 python benchmarks/prefill_bench.py --gluon --only "l1000,l765,h32/4 l8192 d128 causal" \
    --out "$OUT/prefill_gluon_${card}_round46_D.json"
  exit 0
fi
if [ "$part" = C ]; then
  gpu_tests_second_half
  exit 0
fi
if [ "$part" = B ]; then
  step 60 python -m pytest -q -p no:cacheprovider tests/test_tma_launch.py
  step 150 python -m pytest -q -p no:cacheprovider -m gpu tests/test_attention.py
  step 240 python -m pytest -q -p no:cacheprovider -m gpu tests/test_attention_gluon.py
  step 150 python benchmarks/prefill_bench.py --gluon --out "$OUT/prefill_gluon_${card}_round46_B.json"
  if [ "$card" = h100 ]; then
    mkdir -p /tmp/h100_tables/attention && cp tuned_configs/attention/NVIDIA_H100_80GB_HBM3.json /tmp/h100_tables/attention/
    step "$(left 590)" python -m omnitune verify --kernels attention --tables /tmp/h100_tables --fix \
      --json "$OUT/verify_attention_h100_round46.json"
    cp /tmp/h100_tables/attention/NVIDIA_H100_80GB_HBM3.json "$OUT/"
  fi
  exit 0
fi
step 100 python -m pytest -q -p no:cacheprovider tests/test_tma_launch.py
step 300 python -m pytest -q -p no:cacheprovider -m gpu tests/test_attention_gluon.py
step 240 python benchmarks/prefill_bench.py --gluon --out "$OUT/prefill_gluon_${card}_round46.json"

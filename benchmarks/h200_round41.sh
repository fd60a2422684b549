#!/usr/bin/env bash
# Forty-first round (issue 15), on any card: OUT=dir bash benchmarks/h200_round41.sh G   (about 450 s)
# Attention written by hand in Gluon (benchmarks/gluon_attention_probe.py): FA3's intra-warpgroup
# overlap without warp specialization ("pipelined", and FA2's order as "serial"), and ping-pong of
# two consumer warpgroups fed by a TMA producer ("pingpong") — the one form of ping-pong Triton 3.6
# can express (docs/hopper.md, Findings, row 6). First its gpu tests (every variant at L 256 and
# 512 against SDPA in fp32), then issue 15's eight prefill shapes (b1 h32/4 and h24/24, 8k and 16k,
# causal and not, bf16, d=128), every variant checked on two fresh inputs and timed beside SDPA's
# cuDNN as CUDA-graph replays. The warp-specialized variants (tests and timings) run in steps of their own: a form
# that hangs (as Triton's own warp specialization did over host descriptors in round 9) stops only
# its step, and each step's JSON is rewritten after every shape. GQ: the quick shapes only (b1
# h32/4 8k, causal and not; under 370 s). P and P2: the two calls that followed GQ on the H100
# (about 20 and 40 s): the eight shapes with ping-pong beside form (a)'s best, then with 3 stages
# at 128-key tiles and 15 rounds.
source "$(dirname "$0")/device_steps.sh"  # shell options, output settings, $started, $card, step, left
nvidia-smi -L
case ${1:-} in G|GQ|P|P2) ;; *) echo "none of G, GQ, P, P2 asked for: nothing run"; exit 3 ;; esac
if [ "$1" = P ]; then  # after GQ on the same machine: the eight shapes, ping-pong beside the best of form (a)
  step 240 python benchmarks/gluon_attention_probe.py \
    --variants pingpong_m128_n64_s2,pingpong_m128_n64_s3,pingpong_m128_n128_s2,pipelined_m64_n64_s2,serial_m128_n64_s2 \
    --out "$OUT/gluon_attention_${card}_round41_G.json"
  exit 0
fi
if [ "$1" = P2 ]; then  # then ping-pong at 128-key tiles with 3 stages too (229,712 B), 15 rounds
  step 60 python -m pytest -q -p no:cacheprovider -m gpu -k pingpong_m128_n128_s3 tests/test_gluon_attention_probe.py
  step 150 python benchmarks/gluon_attention_probe.py --rounds 15 \
    --variants pingpong_m128_n128_s2,pingpong_m128_n128_s3,pingpong_m128_n64_s2 \
    --out "$OUT/gluon_attention_${card}_round41_G2.json"
  exit 0
fi
quick="" long=240 ws=150; [ "$1" = GQ ] && quick=--quick long=120 ws=90
step 100 python -m pytest -q -p no:cacheprovider -m gpu -k "not pingpong" tests/test_gluon_attention_probe.py
step $long python benchmarks/gluon_attention_probe.py $quick \
  --variants serial_m128_n64_s2,pipelined_m128_n64_s2,pipelined_m128_n64_s3,pipelined_m128_n128_s2,pipelined_m128_n128_s3,pipelined_m64_n64_s2 \
  --out "$OUT/gluon_attention_${card}_round41_pipelined.json"
step 60 python -m pytest -q -p no:cacheprovider -m gpu -k pingpong tests/test_gluon_attention_probe.py
step $ws python benchmarks/gluon_attention_probe.py $quick \
  --variants pingpong_m128_n64_s2,pingpong_m128_n64_s3,pingpong_m128_n128_s2,pingpong_m128_n128_s3 \
  --out "$OUT/gluon_attention_${card}_round41_pingpong.json"

#!/usr/bin/env bash
# Forty-second round (issues 15 and 14), on any sm_90 card: OUT=dir bash benchmarks/h200_round42.sh A   (about 400 s)
# Attention's Gluon ping-pong kernel (BACKEND=gluon_pingpong) now takes any lengths and Lq ≠ Lk
# (key tails masked, query tails stored from registers, causal bottom-right aligned). A: its gpu
# tests (tails and Lq ≠ Lk against the float32 reference, with a guard behind the output), the
# probe's gpu tests (form (a) shares the softmax step), issue 15's eight shapes through the probe
# beside cuDNN (the kernel's speed after the change), then benchmarks/prefill_bench.py --gluon:
# the public op as users call it (eager back to back with host time, and CUDA-graph replays) with
# the tables' pick and with the Gluon config given, beside SDPA's default and cuDNN, on issue 15's
# shapes and on shapes nobody tuned. T: the tests alone (about 150 s). AS: A, then S: a search of
# 24 trials on three shapes nobody tuned (where the Gluon kernel led the op's calls, and where it
# trailed: 32k queries over 512 keys), exported into $OUT/tc and reported (about 180 s more); S: the search alone.
source "$(dirname "$0")/device_steps.sh"  # shell options, output settings, $started, $card, step, left
nvidia-smi -L
case ${1:-} in A|T|AS|S) ;; *) echo "none of A, T, AS, S asked for: nothing run"; exit 3 ;; esac
if [ "$1" != S ]; then
step 200 python -m pytest -q -p no:cacheprovider -m gpu tests/test_attention_gluon.py
step 150 python -m pytest -q -p no:cacheprovider -m gpu tests/test_gluon_attention_probe.py
[ "$1" = T ] && exit 0
step 90 python benchmarks/gluon_attention_probe.py --variants pingpong_m128_n128_s2,pingpong_m128_n64_s2 \
  --out "$OUT/gluon_attention_${card}_round42.json"
step 240 python benchmarks/prefill_bench.py --gluon --out "$OUT/prefill_gluon_${card}_round42.json"
[ "$1" = A ] && exit 0
fi
db="$OUT/search_${card}_round42.sqlite"
step 200 python -m omnitune search attention --trials 24 --timeout 60 --db "$db" \
  --shape b=1,h=32,hkv=4,lq=6000,lk=6000,d=128,causal=1 --shape b=1,h=24,hkv=24,lq=4680,lk=4680,d=128 \
  --shape b=1,h=32,hkv=32,lq=32768,lk=512,d=128
step 30 python -m omnitune report --db "$db"
step 30 python -m omnitune export --db "$db" --out "$OUT/tc" --kernel attention

#!/usr/bin/env bash
# Issue 6 on one H200: the GPU-marked tests of cross_attention_layer (bf16, Qwen2.5-Omni-7B dims,
# every FUSION), the side-by-side bench of fused against unfused layers, and a short search of two
# shapes exported to $OUT/tuned (with the unfused path's time and the speedup over it per entry).
#   OUT=dir bash benchmarks/h200_fusion.sh        (about 7 minutes at most; each step is capped)
set -uo pipefail
export PYTHONUNBUFFERED=1 COLUMNS=160 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
db=$OUT/fusion.db
source "$(dirname "$0")/device_steps.sh"

step 150 python -m pytest -q -m gpu -p no:cacheprovider tests/test_cross_attention_layer.py
step 260 python benchmarks/fused_layer_bench.py --out "$OUT/fused_layer_h200.json"
step 100 python -m omnitune search cross_attention_layer \
  --shape b=1,lq=16,lk=4096,hidden=3584,h=28,hkv=4,d=128 --shape b=8,lq=512,lk=4096,hidden=3584,h=28,hkv=4,d=128 \
  --dtype bf16 --trials 16 --db "$db" --timeout 90
step 20 python -m omnitune export --db "$db" --out "$OUT/tuned" --kernel cross_attention_layer

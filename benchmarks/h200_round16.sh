#!/usr/bin/env bash
# Sixteenth H200 round, one H200:
#   OUT=dir bash benchmarks/h200_round16.sh A|B|C    (each after the last one's tables are in tuned_configs)
# Tables for every preset in bf16 and fp16 (issue 14): `omnitune plan --model M --coverage` found
# the shipped H200 tables answering 27 of the Qwen2.5-Omni-3B preset's 35 bf16 problems and 21 of
# Qwen3-Omni's 35 with the default config, and every preset's fp16 problems from bf16 entries.
# Each search runs under benchmarks/search_wall.py, which records its wall time, the GPU's and the
# host's busy share and each problem's timings (issue 20), from an empty Triton cache.
# Part A: the 3B and Qwen3-Omni presets in bf16, 50 trials a problem, in one session (a problem two
# presets share is searched once); then every preset in fp16, 30 trials a problem (each search
# warm-starts from the bf16 winners the runtime lends those problems today), as far as the time
# allows; both exported over a copy of the shipped tables.
# Part B: the four preset problems part A left answered by a neighbour, searched and exported;
# every preset's coverage read back from the tables; then the cross-attention layer's held-out set
# (benchmarks/coverage.py, issue 14) for the time that is left.
# Part C: kv_compress's held-out set, never measured before, against the tables as they now stand.
part=${1:?part A|B|C}
source "$(dirname "$0")/device_steps.sh"  # shell options, output settings, $started, step, left

bf16_models=qwen2.5-omni-3b,qwen3-omni-30b-a3b
fp16_models=qwen2.5-omni-7b,qwen2.5-omni-3b,qwen3-omni-30b-a3b,qwen2.5-vl-7b,qwen-image-dit
mkdir -p "$OUT/tc" && cp -r tuned_configs/* "$OUT/tc/"
export_tables() { step 60 python -m omnitune export --db "$1" --out "$OUT/tc"; rm -f "$OUT"/tc/*/.*.lock; }

case $part in
  A)
    db="$OUT/presets.db"
    step $(left 590) python benchmarks/search_wall.py --fresh-triton-cache --model $bf16_models --trials 50 \
      --db "$db" --timeout $(left 380) --out "$OUT/search_wall_h200_round16_A_bf16.json"
    step $(left 590) python benchmarks/search_wall.py --fresh-triton-cache --model $fp16_models --trials 30 \
      --db "$db" --timeout $(left 540) --out "$OUT/search_wall_h200_round16_A_fp16.json" -- --dtype fp16
    export_tables "$db"
    ;;
  B)
    # The four preset problems part A's tables still answer from a neighbour: the VL-7B's and the
    # DiT's own bf16 attention shapes (never searched before) and the Qwen3-Omni layer problem
    # part A's fp16 search had no time left for.
    db="$OUT/rest.db"
    step 150 python -m omnitune search attention --db "$db" -n 50 --timeout 120 \
      --shape b=1,h=28,hkv=4,lq=640,lk=640,d=128,causal=1,spans=1,span_len=256 \
      --shape b=1,h=28,hkv=4,lq=8260,lk=8260,d=128,causal=1,spans=1,span_len=256 \
      --shape b=2,h=24,hkv=24,lq=1280,lk=1280,d=128,causal=0,spans=0,span_len=0
    step 60 python -m omnitune search cross_attention_layer --db "$db" -n 30 --dtype fp16 --timeout 45 \
      --shape b=8,lq=1,lk=4096,hidden=2048,h=32,hkv=4,d=128,bias=0,kv_cached=1
    export_tables "$db"
    (export OMNITUNE_CONFIG_DIR="$OUT/tc"; for dtype in bf16 fp16; do for model in ${fp16_models//,/ }; do
      python -m omnitune plan --model $model --dtype $dtype --coverage --device "NVIDIA H200" | grep "coverage of"
    done; done)
    # Issue 14's held-out set of the cross-attention layer, never measured before, against the
    # tables as they now stand.
    step $(left 590) python benchmarks/coverage.py --kernel cross_attention_layer --tables "$OUT/tc" \
      --out "$OUT/coverage_layer_h200_round16_B.json" --time-budget $(left 560) --trials 40 --work-dir /tmp/cov
    # Only the tables this part changed come back (the device returns a few files).
    rm -rf "$OUT"/tc/kv_cache_write "$OUT"/tc/paged_decode_attention "$OUT"/tc/kv_compress "$OUT"/tc/README.md
    ;;
  C)
    rm -rf "$OUT/tc"
    step $(left 430) python benchmarks/coverage.py --kernel kv_compress \
      --out "$OUT/coverage_kv_compress_h200_round16_C.json" --time-budget $(left 400) --trials 40 --work-dir /tmp/cov
    ;;
esac

#!/usr/bin/env bash
# Ninth H200 round, one H200:
#   OUT=dir bash benchmarks/h200_round9.sh A|B|C
# Part A: where the fp8 decode's warps wait (Nsight Compute's stall sampling of the split kernel,
# over fp8 and bf16 at their best configs, b64 h28/4 ctx 4096); paged decode at batch 1–4 with
# 32k–128k contexts as users call it (the default split that fills one wave, beside more splits
# and SDPA); the Hopper probe kernels launched and timed beside cuDNN (warp specialization,
# descriptors, a persistent grid).
set -uo pipefail
export PYTHONUNBUFFERED=1 COLUMNS=160
part=${1:?part A|B|C}
started=$(date +%s)
source "$(dirname "$0")/device_steps.sh"

decode_stalls() {  # decode_stalls CACHE SHAPE CONFIG_JSON: ncu's details and the top stalls, appended to one file
  local cache=$1 shape=$2 config=$3 report=/tmp/ncu_$1
  step 90 ncu --clock-control none --set full --import-source yes -k regex:_paged_decode_split --launch-skip 1 \
    --launch-count 1 -f -o "$report" python -m omnitune.profile.ncu_target paged_decode_attention "$shape" bf16 \
    "$config" --launches 2
  {
    echo "===== $cache cache: $shape $config"
    python benchmarks/ncu_stall_summary.py <(ncu -i "$report.ncu-rep" --page source --csv --print-source sass) --top 40
    ncu -i "$report.ncu-rep" --page details
  } >> "$OUT/ncu_decode_stalls_h200.txt" 2>&1
}

case $part in
  A)
    shape=b=64,h=28,hkv=4,lq=1,ctx=4096,d=128,block_size=16
    decode_stalls fp8 "$shape,cache_dtype=fp8_e4m3" \
      '{"NUM_SPLITS": 2, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3, "PACK_GQA": true, "FUSED_REDUCE": false}'
    decode_stalls bf16 "$shape" \
      '{"NUM_SPLITS": 2, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2, "PACK_GQA": true, "FUSED_REDUCE": false}'
    step 150 python benchmarks/long_decode_bench.py --out "$OUT/long_decode_h200.json"
    step 120 python benchmarks/hopper_probe_timing.py --out "$OUT/hopper_probe_timing_h200.json"
    ;;
  *) echo "unknown part $part"; exit 2 ;;
esac

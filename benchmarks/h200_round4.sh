#!/usr/bin/env bash
# Fourth H200 round, on a machine with two H200s: two lanes run side by side, one per GPU, each
# with its own results database (no two processes write one SQLite file), then the steps that need
# both GPUs. Part A: GPU tests of the new code, the fused-layer, paged-decode and kv_compress
# benchmarks (GPU 0); the exhaustive sweeps and Nsight Compute profiles (GPU 1). Part B: the
# Qwen2.5-Omni-7B searches for the shipped tables, profiles and the energy bench. Part C, alone on
# the machine: the fused layer's GPU tests and bench again, then the multi-GPU sweep.
#   OUT=dir bash benchmarks/h200_round4.sh A|B|C|D|E    (databases persist in .devdb4/ between parts)
set -uo pipefail
export PYTHONUNBUFFERED=1 COLUMNS=160
part=${1:?part A, B, C, D or E}
dbdir=${DBDIR:-.devdb4}
mkdir -p "$dbdir"
db=$dbdir/main.db        # part A GPU 1, then part B GPU 0
paged_db=$dbdir/paged.db # part B GPU 1
source "$(dirname "$0")/device_steps.sh"
shape() { python -c "import sys; sys.path.insert(0, 'benchmarks'); from attention_shapes import SHAPES; print(SHAPES['$1'])"; }
lane() {  # lane GPU LOG FUNCTION: run FUNCTION on one GPU, its output in LOG
  local gpu=$1 log=$2 fn=$3
  ( export CUDA_VISIBLE_DEVICES=$gpu; $fn ) >"$log" 2>&1
}

part_a_gpu0() {
  step 200 python -m pytest -q -m gpu -p no:cacheprovider tests/test_cross_attention_layer.py \
    tests/test_paged_decode_attention.py tests/test_paged_decode_fused_reduce.py tests/test_kv_compress.py tests/test_kv_compress_merge.py tests/test_worker.py
  step 250 python benchmarks/fused_layer_bench.py --out "$OUT/fused_layer_h200.json"
  step 70 python benchmarks/kv_compress_bench.py --out "$OUT/kv_compress_h200.json"
}

part_a_gpu1() {
  # Two new attention sweeps (with the decode-like sweep of round 2: three) and four KV-write sweeps.
  step 330 python benchmarks/exhaustive_sweep.py --db "$db" --out "$OUT/sweeps_h200.json" --workers 14 \
    --sweep attn_cross_128x256 --sweep attn_short_prefill_765 --sweep kvw_t4 --sweep kvw_t64 --sweep kvw_t1024 --sweep kvw_t16384
  step 150 python benchmarks/paged_decode_bench.py --out "$OUT/paged_decode_h200.json"
  profiles multi_image_spans video_audio_prefill
}

profiles() {  # Nsight Compute on the tuned (shipped table) and default configs of foundation shapes
  for name in "$@"; do
    for cfg in tuned default; do
      step 40 python -m omnitune profile attention --shape "$(shape $name)" --config $cfg --db "$db" --launches 1
    done
  done
}

part_b_gpu0() {
  # Qwen2.5-Omni-7B's problems the sweeps did not cover (the swept ones are complete already).
  step 160 python -m omnitune search --model qwen2.5-omni-7b --kernels attention --trials 20 \
    --db "$db" --timeout 145 --finalists 2
  step 120 python -m omnitune search --model qwen2.5-omni-7b --kernels cross_attention_layer --trials 14 \
    --db "$db" --timeout 105 --finalists 2
  profiles dit_joint decode_like
  args=(); for n in text_over_image multi_image_causal dit_joint decode_like; do args+=(--shape "$(shape $n)"); done
  step 70 python -m omnitune bench attention "${args[@]}" --dtype bf16 --json "$OUT/attention_energy_h200.json"
}

part_b_gpu1() {
  step 280 python -m omnitune search --model qwen2.5-omni-7b --kernels paged_decode_attention --trials 30 \
    --db "$paged_db" --timeout 270 --finalists 2
  step 20 python -m omnitune export --db "$paged_db" --out tuned_configs --kernel paged_decode_attention
  step 60 python -m omnitune bench paged_decode_attention --shape b=64,h=28,hkv=4,lq=1,ctx=4096,d=128,block_size=16 \
    --shape b=4,h=32,hkv=4,lq=1,ctx=16384,d=128,block_size=16 --dtype bf16 --json "$OUT/paged_decode_tuned_h200.json"
}

case $part in
  A)
    nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm --format=csv
    lane 0 "$OUT/lane0.log" part_a_gpu0 & lane 1 "$OUT/lane1.log" part_a_gpu1 & wait
    ;;
  B)
    lane 0 "$OUT/lane0.log" part_b_gpu0 & lane 1 "$OUT/lane1.log" part_b_gpu1 & wait
    ;;
  C)
    # Alone on the machine: nothing else compiles while the launch-bound unfused layer is timed.
    step 100 python -m pytest -q -m gpu -p no:cacheprovider tests/test_cross_attention_layer.py -k "q_out or runtime_layer"
    step 150 python benchmarks/fused_layer_bench.py --out "$OUT/fused_layer_h200.json"
    step 170 python benchmarks/multi_gpu_throughput.py --out "$OUT/multi_gpu_h200.json" --trials 16 --mode-timeout 55
    ;;
  D)
    # After the timing fix (a GPU spin hides host enqueue time): the timing tests, the q_out
    # diagnosis, then the benches again — fused layer, paged decode, attention and KV write with energy.
    step 60 python -m pytest -q -m gpu -p no:cacheprovider tests/test_timing.py tests/test_finalists.py
    step 60 python benchmarks/q_out_diagnosis.py --out "$OUT/q_out_diagnosis_h200.json"
    step 130 python benchmarks/fused_layer_bench.py --out "$OUT/fused_layer_h200.json"
    step 60 python benchmarks/paged_decode_bench.py --out "$OUT/paged_decode_h200.json"
    args=(); for n in text_over_image multi_image_spans multi_image_causal video_audio_prefill dit_joint decode_like; do args+=(--shape "$(shape $n)"); done
    step 80 python -m omnitune bench attention "${args[@]}" --dtype bf16 --json "$OUT/attention_tuned_vs_sdpa_h200.json"
    step 40 python -m omnitune bench kv_cache_write --shape t=65536,hkv=8,d=128,block_size=16 --shape t=64,hkv=4,d=128,block_size=16 --dtype bf16 --json "$OUT/kv_cache_write_h200.json"
    ;;
  E)
    # The exhaustive sweeps again with the timing fix, alone on the machine (part A's ran beside
    # another lane and before the fix: CVs of 17-112% on kernels under 50 µs), then the long-context
    # paged-decode shape that part D's time limit cut.
    step 330 python benchmarks/exhaustive_sweep.py --db "$dbdir/sweeps.db" --out "$OUT/sweeps_h200.json" --workers 14 \
      --sweep attn_cross_128x256 --sweep attn_short_prefill_765 --sweep kvw_t4 --sweep kvw_t64 --sweep kvw_t1024 --sweep kvw_t16384
    step 45 python benchmarks/paged_decode_bench.py --only b4_ctx16384 --out "$OUT/paged_decode_b4_h200.json"
    ;;
esac
tar czf "$OUT/devdb.tgz" "$dbdir"

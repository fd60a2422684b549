#!/usr/bin/env bash
# Second H200 round, on the database of benchmarks/h200_search.sh (copied into $OUT):
# exhaustive sweep of the decode-like attention problem, export, tuned-vs-default-vs-SDPA bench,
# Nsight Compute on the tuned and default configs, then the KV-cache kernels (search, export,
# bench against torch). Each step has its own time limit so the whole fits one 10-minute call.
#   OUT=dir bash benchmarks/h200_round2.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 COLUMNS=160
db=$OUT/omnitune.db
res=$OUT  # tuned_configs/ and the report are re-derived from the database afterwards
source "$(dirname "$0")/device_steps.sh"
shape() { python -c "import sys; sys.path.insert(0, 'benchmarks'); from attention_shapes import SHAPES; print(SHAPES['$1'])"; }

# 1. the whole decode-like space (the TPE study resumes: only configs it did not measure run now)
step 85 python -m omnitune search attention --shape "$(shape decode_like)" --dtype bf16 --sampler grid --trials 1000 --db "$db" --timeout 75
step 20 python -m omnitune export --db "$db" --out tuned_configs --kernel attention
# 2. tuned (from the exported table) vs default vs SDPA, same process, same inputs
args=(); for n in text_over_image multi_image_spans multi_image_causal video_audio_prefill dit_joint decode_like; do args+=(--shape "$(shape $n)"); done
step 110 python -m omnitune bench attention "${args[@]}" --dtype bf16 --json "$res/attention_tuned_vs_sdpa.json"
# 3. Nsight Compute, tuned and default config
for cfg in tuned default; do
  step 35 python -m omnitune profile attention --shape "$(shape multi_image_causal)" --config $cfg --db "$db" --launches 2
done
# 4. KV-cache kernels
step 35 python -m omnitune search kv_cache_write --shape t=65536,hkv=8,d=128,block_size=16 --dtype bf16 --trials 40 --timeout 28 --db "$db"
step 22 python -m omnitune search kv_cache_write --shape t=64,hkv=4,d=128,block_size=16 --dtype bf16 --trials 30 --timeout 16 --db "$db"
step 45 python -m omnitune search paged_decode_attention --shape b=64,h=28,hkv=4,lq=1,ctx=4096,d=128,block_size=16 --dtype bf16 --trials 40 --timeout 35 --db "$db"
step 45 python -m omnitune search paged_decode_attention --shape b=4,h=32,hkv=4,lq=1,ctx=16384,d=128,block_size=16 --dtype bf16 --trials 40 --timeout 35 --db "$db"
step 20 python -m omnitune export --db "$db" --out tuned_configs
step 40 python -m omnitune bench kv_cache_write --shape t=65536,hkv=8,d=128,block_size=16 --shape t=64,hkv=4,d=128,block_size=16 --dtype bf16 --json "$res/kv_cache_write_vs_torch.json"
step 40 python -m omnitune bench paged_decode_attention --shape b=64,h=28,hkv=4,lq=1,ctx=4096,d=128,block_size=16 --shape b=4,h=32,hkv=4,lq=1,ctx=16384,d=128,block_size=16 --dtype bf16 --json "$res/paged_decode_vs_torch.json"

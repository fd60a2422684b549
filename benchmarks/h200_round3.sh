#!/usr/bin/env bash
# Third H200 round: GPU-marked tests of the KV, telemetry, compiled and ncu modules; the prefill
# attention studies resumed so the spec's known-good configs get measured; export; the benches
# of the tuned tables again (attention; paged decode with SDPA over a contiguous cache).
#   OUT=dir bash benchmarks/h200_round3.sh   (database of rounds 1-2 copied into $OUT)
set -uo pipefail
export PYTHONUNBUFFERED=1 COLUMNS=160
db=$OUT/omnitune.db
source "$(dirname "$0")/device_steps.sh"
shape() { python -c "import sys; sys.path.insert(0, 'benchmarks'); from attention_shapes import SHAPES; print(SHAPES['$1'])"; }

step 120 python -m pytest -q -m gpu -p no:cacheprovider tests/test_kv_cache_write.py tests/test_paged_decode_attention.py \
  tests/test_kv_compress.py tests/test_telemetry.py tests/test_compiled.py tests/test_ncu.py
args=(); for n in text_over_image multi_image_spans multi_image_causal video_audio_prefill dit_joint; do args+=(--shape "$(shape $n)"); done
step 95 python -m omnitune search attention "${args[@]}" --dtype bf16 --trials 63 --db "$db" --timeout 85
step 20 python -m omnitune export --db "$db" --out tuned_configs
step 60 python -m omnitune bench attention "${args[@]}" --dtype bf16 --json "$OUT/attention_tuned_vs_sdpa_round3.json"
step 30 python -m omnitune bench paged_decode_attention --shape b=64,h=28,hkv=4,lq=1,ctx=4096,d=128,block_size=16 --shape b=4,h=32,hkv=4,lq=1,ctx=16384,d=128,block_size=16 --dtype bf16 --json "$OUT/paged_decode_vs_sdpa_round3.json"

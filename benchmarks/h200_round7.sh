#!/usr/bin/env bash
# Seventh H200 round, one H200: fp8 KV caches (issue 16), the GPU tests of the changed kernels,
# and the verify soak (issue 17).
#   OUT=dir bash benchmarks/h200_round7.sh A|B|C
# Part A: the KV write and paged decode kernels changed (fp8 caches), so their shipped tables'
# entries are first revalidated on this GPU (verify --fix, on a copy in $OUT/tc); then the fp8
# problems of the Qwen presets are searched and exported into that copy, and the fp8 caches are
# measured as users call them with those tables (benchmarks/fp8_kv_bench.py).
# Part B: the fp8 tests in full on the GPU (the quantizer's rounding bit for bit on the hardware),
# then every GPU-marked test.
# Part C: the attention GPU tests, the ops as called (benchmarks/ops_bench.py), then omnitune verify over the whole
# Qwen2.5-Omni-7B preset (the shipped tables, a copy in $OUT) with a 5-minute soak.
set -uo pipefail
export PYTHONUNBUFFERED=1 COLUMNS=160
part=${1:?part A|B|C}
started=$(date +%s)
step() { local limit=$1; shift; echo "### $* (limit ${limit}s)"; local t=$(date +%s); timeout "$limit" "$@"; echo "### rc=$? in $(( $(date +%s) - t )) s"; }
left() { echo $(( $1 - ($(date +%s) - started) )); }

# The fp8 problems of the Qwen presets (7B and VL-7B share their shapes), as --shape arguments.
fp8_shapes() {
  python - "$1" <<'EOF'
import sys
from omnitune.presets import get_preset, preset_problems
from omnitune.registry import get_spec
kernel = sys.argv[1]
seen = []
for model in ("qwen2.5-omni-7b", "qwen2.5-omni-3b", "qwen3-omni-30b-a3b"):
    for p in preset_problems(get_preset(model), kernel):
        key = get_spec(kernel).problem_key(p.problem)
        if p.problem.cache_dtype != "auto" and key not in seen:
            seen.append(key)
print(" ".join(f"--shape {k}" for k in seen))
EOF
}

case $part in
  A)
    mkdir -p "$OUT/tc"
    cp -r tuned_configs/paged_decode_attention tuned_configs/kv_cache_write "$OUT/tc/"
    step 150 python -m omnitune verify --kernels paged_decode_attention,kv_cache_write --tables "$OUT/tc" --fix \
      --json "$OUT/verify_fix_kv_ops_h200.json"
    # shellcheck disable=SC2046
    step 240 python -m omnitune search paged_decode_attention $(fp8_shapes paged_decode_attention) -n 20 \
      --timeout 220 --db "$OUT/fp8.db"
    # shellcheck disable=SC2046
    step 100 python -m omnitune search kv_cache_write $(fp8_shapes kv_cache_write) -n 24 --timeout 80 --db "$OUT/fp8.db"
    step 30 python -m omnitune export --db "$OUT/fp8.db" --out "$OUT/tc"
    step 30 bash -c "python -m omnitune report --db '$OUT/fp8.db' --format json > '$OUT/fp8_search_report_h200.json'"
    rm -f "$OUT/fp8.db"
    OMNITUNE_CONFIG_DIR="$OUT/tc" step $(left 585) python benchmarks/fp8_kv_bench.py --out "$OUT/fp8_kv_h200.json"
    ;;
  B)
    step 120 python -m pytest -q -p no:cacheprovider tests/test_fp8_kv_cache.py
    step $(left 590) python -m pytest -q -m gpu -p no:cacheprovider tests/
    ;;
  C)
    # The attention kernel's two key loops now share one tile step (same PTX for sm_90, compiled
    # off the GPU): its GPU tests again, before verify --fix revalidates its table.
    step 100 python -m pytest -q -m gpu -p no:cacheprovider tests/test_attention.py \
      tests/test_production_ops_gpu.py::test_attention_with_span_tensor_and_layer_capture_and_replay
    step 60 python benchmarks/ops_bench.py --out "$OUT/ops_bench_h200.json"
    cp -r tuned_configs "$OUT/tuned_configs"
    step $(left 560) python -m omnitune verify --model qwen2.5-omni-7b --tables "$OUT/tuned_configs" --soak 5 --fix \
      --json "$OUT/verify_soak5_h200.json"
    # only the tables verify rewrote come back (at most 8 files from $OUT)
    for f in "$OUT"/tuned_configs/*/*.json "$OUT"/tuned_configs/*.md; do
      rel=${f#"$OUT"/}; cmp -s "$f" "$rel" && rm "$f"
    done
    find "$OUT/tuned_configs" -type d -empty -delete
    ;;
  *) echo "unknown part $part"; exit 2 ;;
esac

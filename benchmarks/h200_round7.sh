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
# Part C: omnitune verify over the whole Qwen2.5-Omni-7B preset (the shipped tables, a copy in
# $OUT) with a 5-minute soak.
# Part D (run between A and C): the fp8 kernels made faster after A; part E: why fp8 decode is
# not faster; part F: the config E found, searched (see below).
set -uo pipefail
export PYTHONUNBUFFERED=1 COLUMNS=160
part=${1:?part A|B|C|D|E|F}
started=$(date +%s)
source "$(dirname "$0")/device_steps.sh"

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
    rm -f "$OUT"/fp8*.db "$OUT"/tc/*/.*.lock  # at most 8 files come back
    OMNITUNE_CONFIG_DIR="$OUT/tc" step $(left 585) python benchmarks/fp8_kv_bench.py --out "$OUT/fp8_kv_h200.json"
    ;;
  B)
    step 120 python -m pytest -q -p no:cacheprovider tests/test_fp8_kv_cache.py
    step $(left 590) python -m pytest -q -m gpu -p no:cacheprovider tests/
    ;;
  D)
    # A measured decode over an fp8 cache 0.86x as fast as over bf16 (widening e4m3 to bf16 in
    # the loop costs several instructions per element), and the fp8 write at 39% of copy (a
    # correctly rounded division per element). Now: tiles widened to fp16 (one instruction per
    # two elements) with the dots in fp16, and one reciprocal per head with the GPU's own
    # rounding conversion. A's paged-decode table did not come back (lock files and the study's
    # database took the places): revalidated again here, with the 7B preset's fp8 decode
    # problems searched again (the KV write's fp8 entries came back from A).
    step 90 python -m pytest -q -p no:cacheprovider tests/test_fp8_kv_cache.py
    step 120 python -m pytest -q -m gpu -p no:cacheprovider tests/test_paged_decode_attention.py \
      tests/test_paged_decode_fused_reduce.py tests/test_kv_cache_write.py tests/test_production_ops_gpu.py -k "not span_tensor"
    mkdir -p "$OUT/tc"
    cp -r tuned_configs/paged_decode_attention tuned_configs/kv_cache_write "$OUT/tc/"
    step 60 python -m omnitune verify --kernels paged_decode_attention,kv_cache_write --tables "$OUT/tc" --fix \
      --json "$OUT/verify_fix_kv_ops_h200.json"
    shapes=$(fp8_shapes paged_decode_attention | tr ' ' '\n' | paste -d' ' - - | grep h=28 | tr '\n' ' ')
    # shellcheck disable=SC2086
    step 110 python -m omnitune search paged_decode_attention $shapes -n 12 --timeout 95 --db "$OUT/fp8.db"
    step 30 python -m omnitune export --db "$OUT/fp8.db" --kernel paged_decode_attention --out "$OUT/tc"
    step 30 bash -c "python -m omnitune report --db '$OUT/fp8.db' --format json > '$OUT/fp8_search_report_h200.json'"
    rm -f "$OUT"/fp8*.db "$OUT"/tc/*/.*.lock
    OMNITUNE_CONFIG_DIR="$OUT/tc" step $(left 585) python benchmarks/fp8_kv_bench.py --quick --out "$OUT/fp8_kv_h200.json"
    ;;
  E)
    # D: the fp8 write reached 93% of copy, but decode over fp8 stayed at 0.87x bf16 whatever the
    # search tried (45% of copy). Where it goes: a sweep of the split kernel's configs over both
    # caches with their registers, spills and shared memory, the IR and PTX of a few, and Nsight
    # Compute's view of one launch over each cache (same config).
    step 200 python benchmarks/fp8_decode_probe.py --out "$OUT/fp8_decode_probe_h200.json" --asm "$OUT/asm"
    step 100 bash -c "ncu --clock-control none -k regex:_paged_decode_split --section SpeedOfLight --section Occupancy \
      --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis --section SchedulerStats \
      python benchmarks/fp8_decode_probe.py --ncu-pair --out /tmp/pair.json --asm /tmp/asm > '$OUT/ncu_fp8_vs_bf16_h200.txt' 2>&1"
    tar czf "$OUT/fp8_decode_asm_h200.tgz" -C "$OUT" asm && rm -r "$OUT/asm"
    ;;
  F)
    # E: the fp8 split kernel takes 168 registers at 4 warps (bf16: 126), so 3 programs fit an SM
    # instead of 4, and each 64-key fp8 tile is half the bytes: 36% of DRAM bandwidth (ncu). Tiles
    # of 128 keys over 3 stages reached 114.8 µs (bf16's best: 132.3). That config is now a
    # known-good config the search measures right after the default; the batch-64 fp8 problems
    # searched again, exported, and the fp8 caches measured as users call them.
    mkdir -p "$OUT/tc" && cp -r tuned_configs/paged_decode_attention "$OUT/tc/"
    step 150 python -m omnitune search paged_decode_attention \
      --shape b=64,h=28,hkv=4,lq=1,ctx=4096,d=128,block_size=16,cache_dtype=fp8_e4m3 \
      --shape b=64,h=28,hkv=4,lq=1,ctx=16384,d=128,block_size=16,cache_dtype=fp8_e4m3 -n 8 --db "$OUT/fp8.db"
    step 30 python -m omnitune export --db "$OUT/fp8.db" --kernel paged_decode_attention --out "$OUT/tc"
    step 30 bash -c "python -m omnitune report --db '$OUT/fp8.db' --format json > '$OUT/fp8_search_report_h200.json'"
    rm -f "$OUT"/fp8*.db "$OUT"/tc/*/.*.lock
    OMNITUNE_CONFIG_DIR="$OUT/tc" step $(left 260) python benchmarks/fp8_kv_bench.py --quick --out "$OUT/fp8_kv_h200.json"
    ;;
  C)
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

# Shared by the H200 round scripts (source it first thing; older ones set `started` before).
# It sets the shell options and output settings every round runs under, and `started` if unset.
# step LIMIT CMD...: run CMD under a time limit, framed by "###" lines (command, exit code, seconds)
# that the committed logs are read by; left BUDGET: seconds of BUDGET not yet spent since $started;
# fp8_shapes KERNEL: the fp8 problems of the Qwen presets (7B and VL-7B share their shapes) as
# --shape arguments. decode_stalls CACHE SHAPE CONFIG_JSON: Nsight Compute's details and top stalls
# of paged decode's split kernel, appended to $OUT/ncu_decode_stalls_${card}.txt. few_warps_sweeps NAME
# [LIMIT]: fp8_decode_probe.py's few-warps sweep at 4k and 16k into
# $OUT/fp8_decode_few_warps_${card}_NAME_{4096,16384}.json. variant_apply PATCH, variant_restore
# PATCH: a kernel variant of benchmarks/variants on the working tree for the steps between them;
# fp8_variants_applied: issue 16's two fp8 loop variants, one on the other.
# fp8_ratio_with_variants ROUND [BUDGET]: those variants applied, their gpu tests, then fp8_kv_bench --quick.
# fp8_b64_entries_searched: the b64 fp8 table entries searched again and exported into $OUT/tc.
# gpu_tests: every gpu-marked test, in two steps (together they took 420+ s in round 25, past
# what one step is given; the second half holds the slow process tests: verify 92 s, worker 49 s),
# gpu_tests_first_half and gpu_tests_second_half each alone (one device call each; round 54's
# first half, on a fresh H100, passed 164 tests in 330 s and did not finish: give it a call alone).
# revalidated_decode_ops ROUND: after a decode kernel change, its shipped table re-verified with
# --fix into $OUT/tc (the file to ship), then fp8_kv_bench --quick with those tables.
set -uo pipefail
export PYTHONUNBUFFERED=1 COLUMNS=160
started=${started:-$(date +%s)}
# The card's short name in result files (h200, h100): the lender may give either for one kind.
card=${card:-$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | grep -o 'H[0-9]00' | tr 'H' 'h')}
card=${card:-h200}

step() { local limit=$1; shift; echo "### $* (limit ${limit}s)"; local t=$(date +%s); timeout "$limit" "$@"; echo "### rc=$? in $(( $(date +%s) - t )) s"; }
left() { echo $(( $1 - ($(date +%s) - started) )); }

decode_stalls() {  # decode_stalls CACHE SHAPE CONFIG_JSON: ncu's details and the top stalls, appended to one file
  local cache=$1 shape=$2 config=$3 report=/tmp/ncu_$1
  step 90 ncu --clock-control none --set full --import-source yes -k regex:_paged_decode_split --launch-skip 1 \
    --launch-count 1 -f -o "$report" python -m omnitune.profile.ncu_target paged_decode_attention "$shape" bf16 \
    "$config" --launches 2
  {
    echo "===== $cache cache: $shape $config"
    python benchmarks/ncu_stall_summary.py <(ncu -i "$report.ncu-rep" --page source --csv --print-source sass) --top 40
    ncu -i "$report.ncu-rep" --page details
  } >> "$OUT/ncu_decode_stalls_${card}.txt" 2>&1
}

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

few_warps_sweeps() {  # few_warps_sweeps NAME [LIMIT [PROBE_ARGS...]]
  local name=$1 limit=${2:-150} ctx
  shift; [ $# -gt 0 ] && shift
  for ctx in ${SWEEP_CTXS:-4096 16384}; do  # SWEEP_CTXS: fewer contexts when time is short
    step "$limit" python benchmarks/fp8_decode_probe.py --few-warps --ctx $ctx "$@" \
      --out "$OUT/fp8_decode_few_warps_${card}_${name}_$ctx.json" --asm "/tmp/asm_$name"
  done
}

fp8_b64_entries_searched() {  # fp8_b64_entries_searched TRIALS LIMIT TIMEOUT [SEARCH_ARGS...]: the Qwen presets'
  # batch-64 fp8 decode problems (h16/2, h28/4, h32/4 at 4k and 16k, bf16 and fp16) searched into
  # $OUT/fp8.db and exported over the tables in $OUT/tc (the caller copies the shipped ones there)
  local trials=$1 limit=$2 timeout=$3 shapes="" hh ctx
  shift 3
  for hh in "h=16,hkv=2" "h=28,hkv=4" "h=32,hkv=4"; do for ctx in 4096 16384; do
    shapes="$shapes --shape b=64,$hh,lq=1,ctx=$ctx,d=128,block_size=16,cache_dtype=fp8_e4m3"; done; done
  step "$limit" python -m omnitune search paged_decode_attention $shapes --dtype bf16,fp16 -n "$trials" \
    --timeout "$timeout" --db "$OUT/fp8.db" "$@"
  step 30 python -m omnitune export --db "$OUT/fp8.db" --kernel paged_decode_attention --out "$OUT/tc" --no-predictor
  gzip -k "$OUT/fp8.db"
  rm -f "$OUT"/tc/*/.*.lock
}

variant_apply() { git apply "$1" || patch -p1 < "$1"; }
variant_restore() { git checkout -- $(git apply --numstat "$1" | cut -f3) 2>/dev/null || patch -R -p1 < "$1"; }
fp8_variants_applied() {  # the transposed dots, then the 16-bit PV operand on top (issue 16)
  variant_apply benchmarks/variants/decode_fp8_swap_ab.patch && variant_apply benchmarks/variants/decode_fp8_pv16.patch
}

fp8_ratio_with_variants() {  # fp8_ratio_with_variants ROUND [TESTS_BUDGET]: issue 16's ratio, both fp8 variants on
  # the shipped tables: their decode and fp8 gpu tests (until TESTS_BUDGET s of the call), then the
  # public fp8 ops beside bf16 (until 570 s)
  fp8_variants_applied || return 2
  step "$(left "${2:-430}")" python -m pytest -q -p no:cacheprovider -m gpu tests/test_paged_decode_attention.py \
    tests/test_fp8_kv_cache.py
  step "$(left 570)" python benchmarks/fp8_kv_bench.py --quick --out "$OUT/fp8_kv_${card}_$1.json"
}

revalidated_decode_ops() {  # revalidated_decode_ops ROUND: paged decode's table re-verified (--fix), then the public ops
  mkdir -p "$OUT/tc" && cp -r tuned_configs/paged_decode_attention tuned_configs/kv_cache_write "$OUT/tc/"
  step 200 python -m omnitune verify --kernels paged_decode_attention --tables "$OUT/tc" --fix \
    --json "$OUT/verify_fix_paged_decode_${card}_$1.json"
  rm -f "$OUT"/tc/*/.*.lock
  step 90 env OMNITUNE_CONFIG_DIR="$OUT/tc" python benchmarks/fp8_kv_bench.py --quick --out "$OUT/fp8_kv_${card}_$1_A.json"
}

_slow_gpu_tests="tests/test_lanes.py tests/test_precompile.py tests/test_verify.py tests/test_worker.py tests/test_ncu.py"
gpu_tests_first_half() {  # [LIMIT]
  step "${1:-300}" python -m pytest -q -p no:cacheprovider -m gpu $(ls tests/test_*.py | grep -v -x -F $(printf -- "-e %s " $_slow_gpu_tests))
}
gpu_tests_second_half() { step 300 python -m pytest -q -p no:cacheprovider -m gpu --durations=10 $_slow_gpu_tests; }
gpu_tests() { gpu_tests_first_half; gpu_tests_second_half; }

#!/usr/bin/env bash
# Thirty-fourth round, one call that branches on the card it is given: OUT=dir bash benchmarks/h200_round34.sh [W|G|WG|X|X2|Y|Y1|Y2|Z|TZ|U|P|V|TV|F]
# On an H200 this call is round 29's S (issue 16), whatever part is asked for (ON_H200_TOO=1 runs the
# part there instead), as rounds 31-33 were (h200_round32.sh without an argument). On any other
# card it is the part asked for (none asked for: exit 3).
# W: issue 15. Round 10's warp-specialized attention was wrong at 16k in the library and right in
#    the probe. benchmarks/ws_attention_check.py takes the differences apart (the kernel as the
#    library had it, with the probe's store, the probe; JIT or bound C launch; scratch fresh per
#    launch or kept; fresh inputs each launch) at b1 h24/24 and h32/4, 8k and 16k, causal and not,
#    64- and 128-key tiles, then times what was right everywhere beside SDPA's cuDNN (CUDA graphs).
#    Warp specialization is sm_90's pass in Triton, so an H100 answers the correctness question
#    as well as an H200; its speed against cuDNN is the H100's. (Round 34's W ran the script of
#    commit 4c6dfe2, which also checked a copy of the kernel with the probe's unmasked store.)
# X and X2 ran on commit 4c6dfe2 and its successor, where the form was in the attention kernel; it
# is now benchmarks/variants/attention_warp_spec.patch, which they apply (and take back) here.
# X: issue 15, after W found the form right: the warp-specialized form back in the attention kernel
#    (omnitune/kernels/attention_ws.py, WARP_SPEC configs, 2 stages) — its gpu tests (16k among
#    them) and the attention kernel's; round 10 part C's search again (issue 15's eight shapes, the
#    WARP_SPEC known-good configs among the first trials, isolated workers, 12 trials each), every
#    trial's time into $OUT/prefill_trials_${card}_round34_X.json (the ablation); the search's
#    winners exported and called through the public op beside SDPA's cuDNN (prefill_bench).
# X2: after X, the two warp-specialized known-good configs made valid (they had taken the default's
#    USE_TMA=True): the form's and the known-good configs' gpu tests, and a search of issue 15's
#    four h24/24 shapes (8 trials each) whose first trials are those configs, its trials into
#    $OUT/prefill_trials_${card}_round34_X2.json.
# Y: X2's search found both warp-specialized configs wrong at h24/24 16k non-causal, in lanes,
#    where W's checks alone were right. Is it other processes on the GPU? W's quick set (h24/24 8k
#    and 16k, 128-key tiles; 8 fresh inputs a case) alone, then beside three processes running the
#    same kernel (its descriptors written to global scratch in every process), then matrix
#    products; X2's search in four lanes again, then its 16k non-causal problem alone.
# Y1: Y's first, third and fourth steps only (W's quick set alone, beside three processes running
#    the same kernel, and X2's search in lanes), for a call with little device time left.
# Y2: after Y1 (wrong beside processes running the same kernel), W's quick set beside three
#    processes running matrix products only: any other context, or kernels that write descriptors?
# Z: after Y2, the attention kernel as it ships (its long-prefill tile over host descriptors and over
#    pointers) checked the same way, alone and beside three processes running matrix products: is
#    what ships safe where the GPU is shared? Then the warp-specialized form again beside them, at
#    both tile sizes and causal too, to see how far the fault reaches.
# TZ: the gpu-marked tests of the ops whose host checks changed after round 34 (sm_scale, max_context_len,
#    fp8 scales, meta tensors), then Z.
# U: every gpu-marked test but the slow process ones (device_steps.sh's first half), after the
#    ops' host checks and the CLI's input checks changed in the session of TZ.
# P: test_precompile's gpu tests (U's second half found the capture test failing: the test, not the
#    code, lacked the worker's one output a problem); on an H200 then round 32's V (S in short: the
#    fp8 transposed-dots variant's few-warps sweeps beside bf16 at batch 64, 4k and 16k).
# V: on an H200 round 32's V (as P's second half); elsewhere ops_bench (the public ops, eager with
#    host time and as graph replays, beside PyTorch called the same way) after the ops' new checks.
# TV: on an H200 round 32's V first; then, on any card, the gpu tests of the ops after their second
#    round of input checks (duplicate slots, causal, bools as counts, empty batches).
# F (issue 16): on any card, benchmarks/variants/decode_fp8_pv16.patch on top of the transposed dots
#    (offline for sm_90: 22.06 -> 17.88 instructions a key at 32 keys over one warp): the fp8 gpu tests
#    with both, then eight one- and two-warp fp8 configs at batch 64, 4k beside bf16's tuned config,
#    with both and with the transposed dots alone (on an H200 at 16k too).
# G: the gpu-marked tests of round 33's change (the session's re-timing after the lanes), not run
#    since its last refactor, and of the lanes.
source "$(dirname "$0")/device_steps.sh"  # shell options, output settings, $started, $card, step, left
nvidia-smi -L
if [ "${1:-}" = P ]; then  # any card: the one gpu test the first half of U left failing
  step 120 python -m pytest -q -p no:cacheprovider -m gpu tests/test_precompile.py
  # On an H200, with too little device time left for S: S's measurement in short (round 32's V).
  [ "$card" = h200 ] && exec bash "$(dirname "$0")/h200_round32.sh" V
  exit 0
fi
if [ "${1:-}" = F ]; then  # any card: the fp8 PV dot's 16-bit layout (decode_fp8_pv16.patch) on top of the transposed dots
  swap=benchmarks/variants/decode_fp8_swap_ab.patch pv16=benchmarks/variants/decode_fp8_pv16.patch
  configs=4/32/1/3,2/32/1/4,4/16/1/4,8/32/1/3,4/64/2/3,8/16/1/3,16/16/1/3,2/64/2/3
  ctxs=4096; [ "$card" = h200 ] && ctxs="4096 16384"  # issue 16 is judged at both, on the H200
  fp8_probes() {  # fp8_probes NAME: the configs at each context, into $OUT/fp8_decode_${card}_round34_F_NAME_CTX.json
    local ctx
    for ctx in $ctxs; do
      step 90 python benchmarks/fp8_decode_probe.py --configs $configs --ctx $ctx \
        --out "$OUT/fp8_decode_${card}_round34_F_$1_$ctx.json" --asm "/tmp/asm_$1"
    done
  }
  variant_apply $swap && variant_apply $pv16 || exit 2
  step 120 python -m pytest -q -p no:cacheprovider -m gpu tests/test_fp8_kv_cache.py
  fp8_probes pv16
  variant_restore $swap && variant_apply $swap || exit 2
  fp8_probes swap_ab
  variant_restore $swap
  exit 0
fi
if [ "${1:-}" = TV ]; then  # the ops' gpu tests after the second round of input checks; on an H200 S in short first
  if [ "$card" = h200 ]; then
    started=$(date +%s) bash "$(dirname "$0")/h200_round32.sh" V
  fi
  step "$(left 560)" python -m pytest -q -p no:cacheprovider -m gpu tests/test_kv_cache_write.py tests/test_attention.py \
    tests/test_kv_compress.py tests/test_cross_attention_layer.py tests/test_paged_decode_attention.py \
    tests/test_production_ops.py tests/test_production_ops_gpu.py
  exit 0
fi
if [ "${1:-}" = V ]; then  # S in short on an H200 (round 32's V); elsewhere the public ops as users call them
  [ "$card" = h200 ] && exec bash "$(dirname "$0")/h200_round32.sh" V
  step 120 python benchmarks/ops_bench.py --out "$OUT/ops_bench_${card}_round34_V.json"
  exit 0
fi
if [ "$card" = h200 ] && [ -z "${ON_H200_TOO:-}" ]; then
  exec bash "$(dirname "$0")/h200_round32.sh"
fi
case ${1:-} in
  W|G|WG|X|X2|Y|Y1|Y2|Z|TZ|U) ;;
  *) echo "not an H200 and none of W, G, WG, X, X2, Y, Y1, Y2, Z, TZ, U asked for: nothing run"; exit 3 ;;
esac
if [[ $1 == *W* ]]; then
  step 330 python benchmarks/ws_attention_check.py --out "$OUT/ws_attention_check_${card}_round34_W.json"
fi
trials_json() {  # trials_json DB: every trial of the database as JSON on stdout
  python - "$1" <<'PY'
import json, sqlite3, sys
db = sqlite3.connect(f"file:{sys.argv[1]}?mode=ro", uri=True)
rows = db.execute("select problem_key, config_label, status, time_ms, p20_ms, p80_ms, detail from trials").fetchall()
print(json.dumps([dict(zip(("problem_key", "config", "status", "time_ms", "p20_ms", "p80_ms", "detail"), r)) for r in rows], indent=1))
PY
}
prefill_shapes() {  # prefill_shapes HEADS...: issue 15's b1 d=128 shapes at 8k and 16k, causal and not, as --shape arguments
  local hh l c
  for hh in "$@"; do for l in 8192 16384; do for c in 1 0; do
    printf -- ' --shape b=1,%s,lq=%s,lk=%s,d=128,causal=%s' "$hh" "$l" "$l" "$c"; done; done; done
}
if [ "$1" = X ] || [ "$1" = X2 ]; then
  variant_apply benchmarks/variants/attention_warp_spec.patch
fi
if [ "$1" = X2 ]; then
  step 150 python -m pytest -q -m gpu -p no:cacheprovider tests/test_attention_warp_spec.py tests/test_known_good.py
  step 200 python -m omnitune search attention $(prefill_shapes h=24,hkv=24) -n 8 --db /tmp/x2.db
  trials_json /tmp/x2.db > "$OUT/prefill_trials_${card}_round34_X2.json"
fi
if [[ $1 == T* ]]; then
  step 240 python -m pytest -q -p no:cacheprovider -m gpu \
    tests/test_paged_decode_attention.py tests/test_kv_cache_write.py tests/test_fp8_kv_cache.py tests/test_attention.py \
    tests/test_kv_compress.py
fi
if [[ $1 == *Z ]]; then
  step 90 python benchmarks/ws_attention_check.py --quick --forms shipped_tma,shipped_ptr --launches 8 \
    --out "$OUT/ws_attention_check_${card}_round34_Z_shipped_alone.json"
  step 90 python benchmarks/ws_attention_check.py --quick --forms shipped_tma,shipped_ptr --launches 8 --busy 3 \
    --out "$OUT/ws_attention_check_${card}_round34_Z_shipped_busy.json"
  step "$(left 590)" python benchmarks/ws_attention_check.py --forms library --launches 4 --busy 3 \
    --out "$OUT/ws_attention_check_${card}_round34_Z_ws_busy.json"
fi
if [[ $1 == Y* ]]; then
  case $1 in Y) kinds="ws matmul" ;; Y1) kinds=ws ;; Y2) kinds=matmul ;; esac
  [ "$1" != Y2 ] && step 60 python benchmarks/ws_attention_check.py --quick --launches 8 \
    --out "$OUT/ws_attention_check_${card}_round34_Y_alone.json"
  for kind in $kinds; do
    step 70 python benchmarks/ws_attention_check.py --quick --launches 8 --busy 3 --busy-kind $kind \
      --out "$OUT/ws_attention_check_${card}_round34_Y_busy_$kind.json"
  done
fi
if [ "$1" = Y ] || [ "$1" = Y1 ]; then
  # The form is a study's variant since X2: the searches run with it applied.
  variant_apply benchmarks/variants/attention_warp_spec.patch
  step 100 python -m omnitune search attention $(prefill_shapes h=24,hkv=24) -n 8 --db /tmp/y_lanes.db
  trials_json /tmp/y_lanes.db > "$OUT/prefill_trials_${card}_round34_Y_lanes.json"
  if [ "$1" = Y ]; then
    step 60 python -m omnitune search attention --shape b=1,h=24,hkv=24,lq=16384,lk=16384,d=128,causal=0 -n 8 \
      --db /tmp/y_alone.db
    trials_json /tmp/y_alone.db > "$OUT/prefill_trials_${card}_round34_Y_alone.json"
  fi
  variant_restore benchmarks/variants/attention_warp_spec.patch
fi
if [ "$1" = X ]; then
  step 200 python -m pytest -q -m gpu -p no:cacheprovider tests/test_attention_warp_spec.py tests/test_attention.py
  step "$(left 420)" python -m omnitune search attention $(prefill_shapes h=32,hkv=4 h=24,hkv=24) -n 12 --isolate --trial-timeout 60 \
    --timeout "$(left 390)" --db /tmp/prefill.db
  trials_json /tmp/prefill.db > "$OUT/prefill_trials_${card}_round34_X.json"
  python -c "import json,sys; [print(r['problem_key'][:48], r['config'][:90], r['status'], r['time_ms']) for r in json.load(open(sys.argv[1])) if 'WARP_SPEC=1' in r['config'] or r['status'] != 'ok']" \
    "$OUT/prefill_trials_${card}_round34_X.json"
  step 40 python -m omnitune export --db /tmp/prefill.db --kernel attention --out "$OUT/tc"
  rm -f "$OUT"/tc/*/.*.lock
  OMNITUNE_CONFIG_DIR="$OUT/tc" step "$(left 590)" python benchmarks/prefill_bench.py \
    --out "$OUT/prefill_bench_${card}_round34_X.json"
fi
if [ "$1" = X ] || [ "$1" = X2 ]; then
  variant_restore benchmarks/variants/attention_warp_spec.patch
fi
if [[ $1 == *G* ]]; then
  step "$(left 590)" python -m pytest -q -p no:cacheprovider -m gpu tests/test_search_quiet_retime.py tests/test_lanes.py
fi
if [ "$1" = U ]; then
  gpu_tests_first_half "$(left 570)"
fi

#!/usr/bin/env bash
# Thirty-second round, one call that branches on the card it is given: OUT=dir bash benchmarks/h200_round32.sh [Q]
# On an H200 without G this call is round 29's S (issue 16), as round 31's was: the fp8 transposed
# dots of benchmarks/variants/decode_fp8_swap_ab.patch applied on the device, the paged-decode table
# revalidated for them. On any other card it is the part asked for (else it stops at once: exit 3).
# G: the gpu-marked tests of this round's host-side changes (search and its compile workers under
#    the shared GPU lock, lanes, finalists, the worker). On an H200 (G or V), first S's measurement in short
#    (~300 s, the time S needs not being left): the variant applied, its decode GPU tests, the fp8
#    few-warps sweep beside bf16 at batch 64, 4k and 16k; then the variant taken off again.
# V: verify's gpu-marked test, verify's compile workers now sharing a GPU lock with its checks.
# Q (round 32's first call): a search now re-times the finalists of an op whose timed call syncs the host (kv_compress:
#    KernelSpec.syncs_host) on a quiet host: its own compile workers settled, the next problem's
#    compiles not begun until after the re-timing. The same three-problem kv_compress search (16 trials each), run
#    twice in one call into two databases: as shipped (quiet), then with both switched off (busy:
#    syncs_host False, as before this round). Each database's finalist rows, with their p20-p80
#    spreads, are written to $OUT/search_retime_${card}_round32_Q_{quiet,busy}.json.
# Q1: Q ran its searches in three lanes (one problem each), where the change had nothing to defer;
#    Q1 runs the same comparison in one lane (--lanes 1) over two of those problems, so that the
#    first problem's re-timing meets its own pool's last compiles and the second problem's first
#    ones: $OUT/search_retime_${card}_round32_Q1_{quiet,busy}.json.
# Q2: Q1 showed a search alone letting its compile workers run kernels beside its timings (a
#    kv_compress launch cannot be captured, so a worker runs it for real, under the lanes' GPU lock,
#    which a search alone did not have): 14 workers spent 1,815-1,821 s of CPU on 16 configs. Now a
#    search alone shares a GPU lock with its workers (gpu_lock.shared_with_compile_workers). Q1's
#    one-lane search again, as shipped (locked) and with that lock off (unlocked, as in Q1):
#    $OUT/search_retime_${card}_round32_Q2_{locked,unlocked}.json.
source "$(dirname "$0")/device_steps.sh"  # shell options, output settings, $started, $card, step, left
nvidia-smi -L
variant=benchmarks/variants/decode_fp8_swap_ab.patch
if [ "$card" = h200 ] && { [ "${1:-}" = G ] || [ "${1:-}" = V ]; }; then
  variant_apply $variant || exit 2
  # V comes with less device time left: the sweeps alone (each output compared with the first config's).
  [ "$1" = G ] && step 110 python -m pytest -q -p no:cacheprovider -m gpu tests/test_paged_decode_attention.py \
    tests/test_fp8_kv_cache.py
  SWEEP_CTXS="4096 16384" few_warps_sweeps round32_S 90
  variant_restore $variant
elif [ "$card" = h200 ] && [ -z "${1:-}" ]; then
  variant_apply $variant || exit 2
  exec bash "$(dirname "$0")/h200_round29.sh" S
fi
case ${1:-} in
  Q) name=Q lanes=3 lines='8p;10p;12p' runs='quiet busy' ;;
  Q1) name=Q1 lanes=1 lines='8p;12p' runs='quiet busy' ;;
  Q2) name=Q2 lanes=1 lines='8p;12p' runs='locked unlocked' ;;
  G)
    step $(left 560) python -m pytest -q -p no:cacheprovider -m gpu tests/test_lanes.py tests/test_precompile.py \
      tests/test_finalists.py tests/test_worker.py tests/test_gpu_lock_shared.py tests/test_search_quiet_retime.py
    exit 0
    ;;
  V)  # verify's compile workers now share a GPU lock with its checks: its gpu-marked test
    step $(left 330) python -m pytest -q -p no:cacheprovider -m gpu tests/test_verify.py
    exit 0
    ;;
  *) echo "not an H200 and none of Q, Q1, Q2, G, V asked for: nothing run"; exit 3 ;;
esac
shapes=$(python benchmarks/training_set.py kv_compress bf16 | tr ' ' '\n' | grep -v -- --shape | sed -n "$lines" \
  | sed 's/^/--shape /' | tr '\n' ' ')
for host in $runs; do
  rm -rf "/tmp/r32q_$host" && mkdir -p "/tmp/r32q_$host"
  TRITON_CACHE_DIR=/tmp/r32q_$host/triton step 250 python -c "
import sys
if sys.argv[1] == 'busy':
    from omnitune.kernels import kv_compress
    object.__setattr__(kv_compress.SPEC, 'syncs_host', False)
if sys.argv[1] == 'unlocked':
    from omnitune.cli import search_cmd
    search_cmd.workers_share_the_gpu_lock = lambda *a, **k: False
from omnitune.cli import main
sys.argv = ['omnitune', 'search', 'kv_compress', *sys.argv[3].split(), '-n', '16', '--dtype', 'bf16',
            '--db', sys.argv[2], '--lanes', sys.argv[4]]
main()" $host "/tmp/r32q_$host/omnitune.db" "$shapes" $lanes
  python benchmarks/finalist_spreads.py "/tmp/r32q_$host/omnitune.db" \
    > "$OUT/search_retime_${card}_round32_${name}_${host}.json"
  python -c "import json,sys; [print(r['problem_key'][:60], r['config'][:50], r['time_ms'], r['spread']) for r in json.load(open(sys.argv[1]))['finalists']]" \
    "$OUT/search_retime_${card}_round32_${name}_${host}.json"
done

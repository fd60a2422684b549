#!/usr/bin/env bash
# Thirty-third round, one call that branches on the card it is given: OUT=dir bash benchmarks/h200_round33.sh [L|G|GL]
# On an H200 this call is round 29's S (issue 16), whatever part is asked for (ON_H200_TOO=1 runs the
# part there instead), as rounds 31 and 32 were (h200_round32.sh without an argument). On any other
# card it is the part asked for (none asked for: exit 3).
# L: round 32's Q found a kv_compress search in lanes re-timing its finalists while the other lanes
#    compiled and launched (finalists' p20-p80 spread 10-21% on two of three problems). Now the
#    lanes leave a host-syncing op's finalists to their session, which re-times them once every
#    lane has ended (search_cmd.deferred_retime_targets). Q's three-problem, three-lane search (16
#    trials each) twice, into two databases: as shipped (session) and with the re-timing back in the
#    lanes (in_lane: finalists_in_lane patched to keep them), each database's finalists with their
#    spreads into $OUT/search_retime_${card}_round33_L_{session,in_lane}.json.
# G: the gpu-marked tests of this round's change (the session's re-timing after the lanes) and of
#    the lanes.
source "$(dirname "$0")/device_steps.sh"  # shell options, output settings, $started, $card, step, left
nvidia-smi -L
if [ "$card" = h200 ] && [ -z "${ON_H200_TOO:-}" ]; then
  exec bash "$(dirname "$0")/h200_round32.sh"
fi
case ${1:-} in
  L|G|GL) ;;
  *) echo "not an H200 and none of L, G, GL asked for: nothing run"; exit 3 ;;
esac
gpu_tests() { step 150 python -m pytest -q -p no:cacheprovider -m gpu tests/test_search_quiet_retime.py tests/test_lanes.py; }
[ "${1}" = G ] && { gpu_tests; exit 0; }
shapes=$(python benchmarks/training_set.py kv_compress bf16 | tr ' ' '\n' | grep -v -- --shape | sed -n '8p;10p;12p' \
  | sed 's/^/--shape /' | tr '\n' ' ')
for where in session in_lane; do
  rm -rf "/tmp/r33l_$where" && mkdir -p "/tmp/r33l_$where/site"
  patched=""
  if [ "$where" = in_lane ]; then
    # The lanes are processes of their own: the patch reaches them through a sitecustomize on their path.
    # The lanes re-time as before this round; the session then has none to re-time.
    cat > "/tmp/r33l_$where/site/sitecustomize.py" <<'PY'
from omnitune.cli import search_cmd
search_cmd.finalists_in_lane = lambda spec, finalists, lane: finalists
search_cmd.deferred_retime_targets = lambda targets, finalists: []
PY
    patched=/tmp/r33l_$where/site:
  fi
  PYTHONPATH=$patched$PYTHONPATH TRITON_CACHE_DIR=/tmp/r33l_$where/triton step 200 python -m omnitune search kv_compress \
    $shapes -n 16 --dtype bf16 --lanes 3 --db "/tmp/r33l_$where/omnitune.db"
  python benchmarks/finalist_spreads.py "/tmp/r33l_$where/omnitune.db" \
    > "$OUT/search_retime_${card}_round33_L_${where}.json"
  python -c "import json,sys; [print(r['problem_key'][:60], r['config'][:50], r['time_ms'], r['spread']) for r in json.load(open(sys.argv[1]))['finalists']]" \
    "$OUT/search_retime_${card}_round33_L_${where}.json"
done
[ "${1}" = GL ] && gpu_tests  # GL: L first, which needs both of its runs, then the tests

#!/usr/bin/env bash
# Thirty-fifth round, one call that branches on the card it is given: OUT=dir bash benchmarks/h200_round35.sh [T]
# On an H200 this call is round 29's S (issue 16) with both fp8 loop variants applied on the device:
# the transposed dots (benchmarks/variants/decode_fp8_swap_ab.patch) and the PV dot's 16-bit operand
# layout on top (decode_fp8_pv16.patch; round 34 part F on an H100: 1-11% faster than the transposed
# dots alone at all nine fp8 configs, bf16 unchanged, the fp8 gpu tests passing). S runs the decode
# gpu tests with them, the 16k few-warps sweep, `verify --fix` of the paged-decode table for the
# changed source, the batch-64 fp8 entries searched again, and the public fp8 ops beside bf16.
# ON_H200_TOO=1 runs the part asked for there instead. On any other card, the part asked for
# (none asked for: exit 3):
# T: the gpu-marked tests of the ops whose host checks changed this round (attention's check= and
#    span-list cache), the production ops and the layer; verify over several presets.
# D (issues 15 and 16): benchmarks/paged_decode_tma_probe.py — each page's K and V fetched by TMA, one
#    page a loop step, beside the library's split kernel, whole calls as CUDA graphs: bf16 at batch
#    1-4 over 32k-128k (issue 15) and fp8 at batch 64, 4k and 16k (issue 16).
# L (an H200, little time left): see below; on another card, V.
# V: benchmarks/graph_launch_floor.py (the fixed cost of a graph-replayed call, issue 15; run first
#    on an H200 too), then the gpu-marked tests of omnitune verify (tests/test_verify.py), after
#    verify took several presets.
source "$(dirname "$0")/device_steps.sh"  # shell options, output settings, $started, $card, step, left
nvidia-smi -L
launch_floor() {  # issue 15: the fixed cost of a graph-replayed call, beside b1 32k's call (about 30 s)
  [ -n "${LAUNCH_FLOOR_TAKEN:-}" ] && return 0  # a later round's call took it already
  step 90 python benchmarks/graph_launch_floor.py --out "$OUT/graph_launch_floor_${card}_round36.json"
}
if [ "$card" = h200 ] && [ "${1:-}" = L ]; then
  # L, on an H200 with little device time left (about 400 s): both fp8 variants applied, the decode
  # gpu tests, the public fp8 ops beside bf16 with the tables as shipped (issue 16's figures; no
  # table rewritten), the few-warps sweeps at 4k and 16k, the launch floor last.
  fp8_variants_applied || exit 2
  step 100 python -m pytest -q -p no:cacheprovider -m gpu tests/test_paged_decode_attention.py tests/test_fp8_kv_cache.py
  step 90 python benchmarks/fp8_kv_bench.py --quick --out "$OUT/fp8_kv_${card}_round35_L.json"
  few_warps_sweeps round35_L 90
  launch_floor
  exit 0
fi
if [ "$card" = h200 ] && [ -z "${ON_H200_TOO:-}" ]; then
  launch_floor
  export started  # S's budgets count this call's time from its start
  fp8_variants_applied || exit 2
  exec bash "$(dirname "$0")/h200_round29.sh" S
fi
[ "${1:-}" = L ] && set -- V  # L given to another card: V's steps
case ${1:-} in
  T|D|TD|V) ;;
  *) echo "not an H200 and none of T, D, TD, V asked for: nothing run"; exit 3 ;;
esac
if [[ $1 == *D* ]]; then
  step "$(left 300)" python benchmarks/paged_decode_tma_probe.py --out "$OUT/paged_decode_tma_${card}_round35_D.json"
fi
if [[ $1 == T* ]]; then
  step "$(left 580)" python -m pytest -q -p no:cacheprovider -m gpu tests/test_attention.py tests/test_production_ops.py \
    tests/test_production_ops_gpu.py tests/test_cross_attention_layer.py tests/test_attention_call_checks.py tests/test_cli_verify_many.py
fi
if [[ $1 == V ]]; then
  launch_floor
  step "$(left 580)" python -m pytest -q -p no:cacheprovider -m gpu tests/test_verify.py
fi

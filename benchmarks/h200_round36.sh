#!/usr/bin/env bash
# Thirty-sixth round, one call that branches on the card it is given: OUT=dir bash benchmarks/h200_round36.sh R|F|G|P
# On an H200: round 35's H200 call (the launch floor, then round 29's S with both fp8 loop variants,
# issue 16; with H200_PART=L its short form), whatever the argument. On any other card (issue 15):
# F: graph_launch_floor.py --forms --grid — the library call over issue 15's grid and b64 4k, and the
#    b1 32k call over full and empty contexts at 16-128 splits
#    and with the in-launch combine (FUSED_REDUCE), beside the table's config; then the same with K and
#    V loaded evict-first (benchmarks/variants/decode_kv_evict_first.patch: the step's small tensors
#    stay in the L2 behind the cache's stream), and the decode gpu tests with it.
# G: F's two grids and its forms, not the tests (about 200 s; on an H200 too).
# P: graph_launch_floor.py --paged — at b1 32k the cache read through its block table (a Triton kernel
#    that makes the decode's page lookups and reads and nothing else: the best of 72 configs reading one
#    kv head a program, as the decode does, and of 32 reading all four, whole cache slots), with the
#    pages as drawn and sorted, beside the library's call each way and a contiguous read of as many
#    bytes: what the paging, the pages' scatter and a head's 256-byte pieces cost. Then
#    benchmarks/decode_all_heads_probe.py: a split kernel whose program takes every kv head of a
#    sequence (whole slots a tile), beside the library's call at b1 32k/64k/128k, b2 and b4 32k (36
#    configs each, every output checked). Then both probes' tests on the GPU.
# R: benchmarks/graph_launch_floor.py --read — the launch
# floors, then per batch 1/2/4 × context 32k/64k/128k (bf16, h28/4, d=128, pages of 16) the fastest
# Triton kernel that only reads the decode's K and V bytes, beside PagedDecodePlan.run at that shape
# with the config the tables give, all as CUDA-graph replays: the ceiling of any one- or two-launch
# decode there. Then the read kernel's gpu test (bf16).
source "$(dirname "$0")/device_steps.sh"  # shell options, output settings, $started, $card, step, left
nvidia-smi -L
if [ "${1:-}" = G ]; then  # G, on any card, little time left: F's grids before and after evict-first, then its forms
  step 70 python benchmarks/graph_launch_floor.py --grid --out "$OUT/decode_grid_${card}_round36.json"
  variant_apply benchmarks/variants/decode_kv_evict_first.patch || exit 2
  step 70 python benchmarks/graph_launch_floor.py --grid --out "$OUT/decode_grid_${card}_round36_evict_first.json"
  variant_restore benchmarks/variants/decode_kv_evict_first.patch
  step 90 python benchmarks/graph_launch_floor.py --forms --out "$OUT/decode_forms_${card}_round36.json"
  exit 0
fi
if [ "$card" = h200 ]; then  # H200_PART=L: round 35's short H200 call (about 400 s), when less time is left
  exec bash "$(dirname "$0")/h200_round35.sh" "${H200_PART:-V}"
fi
case ${1:-} in
  R)
    step 300 python benchmarks/graph_launch_floor.py --read --out "$OUT/read_floor_${card}_round36.json"
    step 120 python -m pytest -q -p no:cacheprovider tests/test_graph_launch_floor.py ;;
  P)
    step 200 python benchmarks/graph_launch_floor.py --paged --out "$OUT/decode_paged_reads_${card}_round37.json"
    step 200 python benchmarks/decode_all_heads_probe.py --out "$OUT/decode_all_heads_${card}_round38.json"
    step 120 python -m pytest -q -p no:cacheprovider tests/test_graph_launch_floor.py tests/test_decode_all_heads_probe.py ;;
  F)
    step 200 python benchmarks/graph_launch_floor.py --forms --grid --out "$OUT/decode_forms_${card}_round36.json"
    variant_apply benchmarks/variants/decode_kv_evict_first.patch || exit 2
    step 200 python benchmarks/graph_launch_floor.py --forms --grid --out "$OUT/decode_forms_${card}_round36_evict_first.json"
    step 150 python -m pytest -q -p no:cacheprovider -m gpu tests/test_paged_decode_attention.py ;;
  *) echo "not an H200 and none of R, F, P asked for: nothing run"; exit 3 ;;
esac

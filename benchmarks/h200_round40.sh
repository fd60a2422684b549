#!/usr/bin/env bash
# Fortieth round (issue 15), on any card: OUT=dir bash benchmarks/h200_round40.sh D   (about 260 s)
# The b1 32k paged read floor (graph_launch_floor.py --paged, as round 39 takes it first), then the
# library's call over issue 15's batch × context grid and b64 4k (graph_launch_floor.py --grid, the
# tables' configs, CUDA-graph replays) as committed, and again with the two decode variants that
# each paid 1.4–1.6 points at b1 32k on an H100 in round 28: the rows' page offsets hoisted out of
# the key loop (benchmarks/variants/decode_hoisted_rows.patch) and the combine launched as a
# programmatic dependent of the split kernel (decode_combine_pdl.patch, switched on by
# OMNITUNE_DECODE_PDL=1); then the decode gpu tests with both. The same card and run for both grids.
# Each output of the second grid must equal the first's bit for bit (--outputs: neither variant changes
# the arithmetic). DS: the two grids alone (about 170 s). ONLY_H200=1: nothing at all on another card.
source "$(dirname "$0")/device_steps.sh"  # shell options, output settings, $started, $card, step, left
nvidia-smi -L
case ${1:-} in D|DS) ;; *) echo "none of D, DS asked for: nothing run"; exit 3 ;; esac
if [ "$card" != h200 ] && [ -n "${ONLY_H200:-}" ]; then echo "not an H200: nothing run"; exit 3; fi
[ "$1" = D ] && step 90 python benchmarks/graph_launch_floor.py --paged --out "$OUT/decode_paged_reads_${card}_round40.json"
rm -rf /tmp/round40_outputs
step 80 python benchmarks/graph_launch_floor.py --grid --outputs /tmp/round40_outputs --out "$OUT/decode_grid_${card}_round40.json"
variant_apply benchmarks/variants/decode_hoisted_rows.patch && variant_apply benchmarks/variants/decode_combine_pdl.patch || exit 2
export OMNITUNE_DECODE_PDL=1
step 80 python benchmarks/graph_launch_floor.py --grid --outputs /tmp/round40_outputs --out "$OUT/decode_grid_${card}_round40_hoisted_pdl.json"
[ "$1" = D ] && step 100 python -m pytest -q -p no:cacheprovider -m gpu tests/test_paged_decode_attention.py
variant_restore benchmarks/variants/decode_combine_pdl.patch
variant_restore benchmarks/variants/decode_hoisted_rows.patch

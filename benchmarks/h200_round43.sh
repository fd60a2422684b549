#!/usr/bin/env bash
# Forty-third round (issue 15's decode), on any card: OUT=dir bash benchmarks/h200_round43.sh C   (about 150 s)
# The combine of paged decode's splits spread over more programs where a decode has few rows
# (benchmarks/variants/decode_combine_columns.patch: a batch-1 decode's 28 rows read their
# partials in 32-column quarters, 112 programs instead of 28). The library's call over issue 15's
# batch × context grid and b64 4k (graph_launch_floor.py --grid, the tables' configs, CUDA-graph
# replays) as committed, with the patch, and with the patch and the rows' page offsets hoisted
# (decode_hoisted_rows.patch), in one run on one card; each output compared with the committed
# one's bit for bit; then the decode gpu tests with the patch (round 43's one run stopped before
# them: this restore step was missing, and the patch did not apply again over its own probes' part).
source "$(dirname "$0")/device_steps.sh"  # shell options, output settings, $started, $card, step, left
nvidia-smi -L
case ${1:-} in C) ;; *) echo "C not asked for: nothing run"; exit 3 ;; esac
rm -rf /tmp/round43_outputs
step 80 python benchmarks/graph_launch_floor.py --grid --outputs /tmp/round43_outputs --out "$OUT/decode_grid_${card}_round43.json"
variant_apply benchmarks/variants/decode_combine_columns.patch || exit 2
step 80 python benchmarks/graph_launch_floor.py --grid --outputs /tmp/round43_outputs --out "$OUT/decode_grid_${card}_round43_columns.json"
variant_apply benchmarks/variants/decode_hoisted_rows.patch || exit 2
step 80 python benchmarks/graph_launch_floor.py --grid --outputs /tmp/round43_outputs --out "$OUT/decode_grid_${card}_round43_columns_hoisted.json"
variant_restore benchmarks/variants/decode_hoisted_rows.patch
variant_restore benchmarks/variants/decode_combine_columns.patch  # (the probes' part: the kernel's went back above)
variant_apply benchmarks/variants/decode_combine_columns.patch || exit 2
step 120 python -m pytest -q -p no:cacheprovider -m gpu tests/test_paged_decode_attention.py tests/test_paged_decode_fused_reduce.py tests/test_decode_all_heads_probe.py
variant_restore benchmarks/variants/decode_combine_columns.patch

#!/usr/bin/env bash
# Seventeenth H200 round, one H200:
#   OUT=dir bash benchmarks/h200_round17.sh A|B
# Issue 20, the search's host work. Round 16's whole-preset searches held the GPU 67% of the lanes'
# time and kept it busy 48%: a trial's choosing and storing took ~65 ms of host time, as long as
# its measuring, and 27 compile processes starting at once kept the cores busy for 20 s before the
# GPU's first work. Now the studies live in an Optuna journal (the default storage) and compile
# workers fork from a server that imported torch, Triton and the kernels once.
# Part A: the trial loop's host work per storage on this host's CPU (no GPU); then the whole
# Qwen2.5-Omni-7B preset, 50 trials a problem, from an empty Triton cache, as `omnitune search`
# runs it now (journal), and again with its studies in SQLite as before (--storage), each under
# benchmarks/search_wall.py (wall, GPU and CPU busy, each problem's timings beside the shipped tables).
# Part A's compile workers all failed: the kernel modules the fork server preloaded asked
# torch.cuda.is_available() on import (a launcher's), which initializes CUDA in the server, and no
# process forked from it can then use CUDA. Launchers now decide that on first use.
# Part B: how each way of starting compile workers fares (benchmarks/compile_worker_start.py), the
# GPU-marked precompile tests, then part A's two searches again.
part=${1:?part A|B}
source "$(dirname "$0")/device_steps.sh"  # shell options, output settings, $started, step, left

case $part in
  A)
    step 90 python benchmarks/search_storage_overhead.py --seeds 1 --out "$OUT/search_storage_overhead_h200_host.json"
    step 240 python benchmarks/search_wall.py --fresh-triton-cache --model qwen2.5-omni-7b --trials 50 \
      --db /tmp/journal/omnitune.db --timeout 220 --out "$OUT/search_wall_h200_round17_A_journal.json"
    step $(left 505) python benchmarks/search_wall.py --fresh-triton-cache --model qwen2.5-omni-7b --trials 50 \
      --db /tmp/sqlite/omnitune.db --timeout $(left 475) --out "$OUT/search_wall_h200_round17_A_sqlite.json" \
      -- --storage sqlite:////tmp/sqlite/omnitune.optuna.db
    ;;
  B)
    step 150 python benchmarks/compile_worker_start.py --out "$OUT/compile_worker_start_h200.json"
    step 60 python -m pytest -q -p no:cacheprovider -m gpu tests/test_precompile.py
    step 230 python benchmarks/search_wall.py --fresh-triton-cache --model qwen2.5-omni-7b --trials 50 \
      --db /tmp/journal/omnitune.db --timeout 205 --out "$OUT/search_wall_h200_round17_B_journal.json"
    step $(left 590) python benchmarks/search_wall.py --fresh-triton-cache --model qwen2.5-omni-7b --trials 50 \
      --db /tmp/sqlite/omnitune.db --timeout $(left 565) --out "$OUT/search_wall_h200_round17_B_sqlite.json" \
      -- --storage sqlite:////tmp/sqlite/omnitune.optuna.db
    exit 0
    ;;
esac
# After the searches, the GPU-marked tests of what this round changed (compile workers, lanes,
# the search's storage): no kernel source changed.
step $(left 595) python -m pytest -q -p no:cacheprovider -m gpu tests/test_precompile.py tests/test_lanes.py \
  tests/test_worker.py tests/test_finalists.py

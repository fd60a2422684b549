#!/usr/bin/env bash
# Sixth H200 round, one H200: the public ops as users call them (production ops).
#   OUT=dir bash benchmarks/h200_round6.sh A|B|...
# Part A: every GPU-marked test (kernels changed: in-kernel bounds, spans read by the attention
# kernel, the paged-decode plan), then benchmarks/ops_bench.py — each public op eager back to back
# (host time per call) and as CUDA-graph replay, beside the PyTorch path called the same way.
set -uo pipefail
export PYTHONUNBUFFERED=1 COLUMNS=160
part=${1:?part A|B|C|D}
step() { local limit=$1; shift; echo "### $* (limit ${limit}s)"; local t=$(date +%s); timeout "$limit" "$@"; echo "### rc=$? in $(( $(date +%s) - t )) s"; }

case $part in
  A)
    step 120 python benchmarks/ops_bench.py --out "$OUT/ops_bench_h200.json"
    step 400 python -m pytest -q -m gpu -p no:cacheprovider tests/
    ;;
  B)
    # A showed Triton's own launch path costs ~45 µs of host time per call on this host (the
    # internal launch of a 256-token KV write: 44.8 µs; index_copy_ 11.6 µs). The ops now launch
    # through DirectLauncher (the compiled kernel's C launcher, keyed by the arguments'
    # specialisation) and check metadata with one predicate. Where the time goes, the ops as
    # called again, then every GPU-marked test.
    step 60 python benchmarks/launch_overhead_probe.py --out "$OUT/launch_overhead_h200.json"
    step 120 python benchmarks/ops_bench.py --out "$OUT/ops_bench_h200.json"
    step 400 python -m pytest -q -m gpu -p no:cacheprovider tests/
    ;;
  *) echo "unknown part $part"; exit 2 ;;
esac

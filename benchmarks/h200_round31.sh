#!/usr/bin/env bash
# Thirty-first round, one call that branches on the card it is given: OUT=dir bash benchmarks/h200_round31.sh [N|N2|G]
# The lender has given H100s (NVIDIA H100 80GB HBM3) for the kind that names the H200 in every call
# of rounds 28-30. On an H200 this call is round 29's S (issue 16: the fp8 transposed dots of
# benchmarks/variants/decode_fp8_swap_ab.patch, applied here, on the device, with the paged-decode
# table revalidated for them); on any other card it is N, N2 or G when asked for (else it stops: exit 3).
# N: `omnitune verify --fix` now times a failing speed verdict twice and replaces an entry only
#    when it is slower in both timings. Round 30's one kv_compress replacement on the H100 came from
#    runs in which the same entries read slower, then passed: kv_compress is verified again here over
#    the shipped tables without the H100's own kv_compress file (the H200's alone, as round 30 saw
#    them), and whatever that --fix writes, or does not, is the H100's kv_compress file to ship.
#    Then verify's gpu-marked test (every part on the GPU, the second timing included).
# N2: verify now times entries once its compile workers are done with every entry's configs (in N,
#    as in round 30, kv_compress's first five entries timed at a CV of 0.24-0.64 beside the compiles
#    and the rest at 0.02-0.09): kv_compress verified over the shipped tables, no --fix, twice in
#    one call: as shipped (quiet), then with the wait switched off (busy: EntriesAhead.finish a no-op).
# G: the gpu-marked tests of what this round changed on the host side (search and worker over the
#    storage checks and the journal's lock, lanes, finalists, the compile workers, verify).
source "$(dirname "$0")/device_steps.sh"  # shell options, output settings, $started, $card, step, left
nvidia-smi -L
if [ "$card" = h200 ]; then
  variant_apply benchmarks/variants/decode_fp8_swap_ab.patch || exit 2
  exec bash "$(dirname "$0")/h200_round29.sh" S
fi
case ${1:-} in
  N) ;;
  N2)
    for host in quiet busy; do
      step 250 python -c "
import sys
from omnitune.verify import ahead
if sys.argv[1] == 'busy': ahead.EntriesAhead.finish = lambda self: None
from omnitune.cli import main
sys.argv = ['omnitune', 'verify', '--kernels', 'kv_compress', '--json', sys.argv[2]]
main()" $host "$OUT/verify_twin_${card}_round31_N2_${host}_kv_compress.json"
    done
    exit 0
    ;;
  G)
    step 400 python -m pytest -q -p no:cacheprovider -m gpu tests/test_lanes.py tests/test_worker.py \
      tests/test_finalists.py tests/test_precompile.py tests/test_verify.py
    exit 0
    ;;
  *) echo "not an H200 and neither N nor N2 asked for: nothing run"; exit 3 ;;
esac
mkdir -p "$OUT/tc" && cp -r tuned_configs/. "$OUT/tc/"
rm -f "$OUT/tc/kv_compress/NVIDIA_H100_80GB_HBM3.json"
step 330 python -m omnitune verify --kernels kv_compress --tables "$OUT/tc" --fix \
  --json "$OUT/verify_fix_twin_${card}_round31_kv_compress.json"
own=$OUT/tc/kv_compress/NVIDIA_H100_80GB_HBM3.json
if [ -f "$own" ]; then cp "$own" "$OUT/kv_compress_NVIDIA_H100_80GB_HBM3.json"; else echo "### no kv_compress entry replaced"; fi
rm -rf "$OUT/tc"
step 200 python -m pytest -q -p no:cacheprovider -m gpu tests/test_verify.py

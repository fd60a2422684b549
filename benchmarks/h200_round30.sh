#!/usr/bin/env bash
# Thirtieth round: OUT=dir bash benchmarks/h200_round30.sh V KERNEL [KERNEL...]
# The lender gave H100s (NVIDIA H100 80GB HBM3) for the kind that names the H200; h200_round29.sh S,
# AC, A and B still wait for an H200. On an H100 the runtime serves the H200's tables (its same-chip
# twin's, below any table of its own: omnitune.trial.same_chip_keys), so this part asks the
# product's own check of them there: `omnitune verify` over the shipped tables, one kernel a step
# (each its own JSON, so a step cut short loses only its own): compat (the H200's name a soft
# difference), every entry's numerics on fresh inputs against the reference, and its speed re-timed
# interleaved against its fallback and PyTorch. No --fix: a twin's table is never rewritten on
# another GPU. The kernels are taken in the order given while the call has time ($BUDGET s, 570 unless set).
part=${1:?part V}
shift
source "$(dirname "$0")/device_steps.sh"  # shell options, output settings, $started, $card, step, left

[ "$part" = V ] || { echo "part V"; exit 2; }
nvidia-smi -L
for kernel in "$@"; do
  budget=$(left ${BUDGET:-570})
  [ "$budget" -gt 60 ] || { echo "### no time left for $kernel"; break; }
  step "$budget" python -m omnitune verify --kernels "$kernel" --json "$OUT/verify_twin_${card}_round30_$kernel.json"
done

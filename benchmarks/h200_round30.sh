#!/usr/bin/env bash
# Thirtieth round: OUT=dir bash benchmarks/h200_round30.sh V KERNEL [KERNEL...] | O
# The lender gave H100s (NVIDIA H100 80GB HBM3) for the kind that names the H200; h200_round29.sh S,
# AC, A and B still wait for an H200. On an H100 the runtime serves the H200's tables (its same-chip
# twin's, below any table of its own: omnitune.trial.same_chip_keys), so this part asks the
# product's own check of them there: `omnitune verify` over the shipped tables, one kernel a step
# (each its own JSON, so a step cut short loses only its own): compat (the H200's name a soft
# difference), every entry's numerics on fresh inputs against the reference, and its speed re-timed
# interleaved against its fallback and PyTorch. With FIX=1: `verify --fix` over a copy of the shipped
# tables in $OUT/tc — the H200's tables are never rewritten there; their entries slower on this GPU
# go, replaced by their fallback, into this GPU's own tables beside them ($OUT/tc/*/NVIDIA_H100_80GB_HBM3.json,
# the files to ship). The kernels are taken in the order given while the call has time ($BUDGET s,
# 570 unless set).
# O (an H100): the public fp8 ops (fp8_kv_bench.py --quick) twice in one call, with the H100's own
#    tables that V's --fix wrote (shipped in tuned_configs/, read before the H200's) and without
#    them (moved aside: the H200's alone, as round 29 served this GPU).
part=${1:?part V or O}
shift
source "$(dirname "$0")/device_steps.sh"  # shell options, output settings, $started, $card, step, left

if [ "$part" = O ]; then
  own=$(ls tuned_configs/*/NVIDIA_H100_80GB_HBM3.json)
  step 150 python benchmarks/fp8_kv_bench.py --quick --out "$OUT/fp8_kv_${card}_round30_O_own_on.json"
  for f in $own; do mv "$f" "$f.aside"; done
  step 150 python benchmarks/fp8_kv_bench.py --quick --out "$OUT/fp8_kv_${card}_round30_O_own_off.json"
  exit 0
fi
[ "$part" = V ] || { echo "part V or O"; exit 2; }
nvidia-smi -L
fix=() suffix=""
if [ "${FIX:-0}" = 1 ]; then
  suffix=_fix
  mkdir -p "$OUT/tc" && cp -r tuned_configs/. "$OUT/tc/"
  fix=(--tables "$OUT/tc" --fix)
fi
for kernel in "$@"; do
  budget=$(left ${BUDGET:-570})
  [ "$budget" -gt 60 ] || { echo "### no time left for $kernel"; break; }
  step "$budget" python -m omnitune verify --kernels "$kernel" "${fix[@]}" \
    --json "$OUT/verify${suffix}_twin_${card}_round30_$kernel.json"
done
rm -f "$OUT"/tc/*/.*.lock 2>/dev/null
true

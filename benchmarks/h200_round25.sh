#!/usr/bin/env bash
# Twenty-fifth H200 round, one H200:
#   OUT=dir bash benchmarks/h200_round25.sh V
# Part V (issue 16): the fp8 decode with V unscaled in its loop
# (benchmarks/variants/fp8_decode_v_unscaled.patch): V widened to fp16 and multiplied by a 1.0
# the compiler cannot fold (so Triton keeps staging it as fp16 through shared memory, the layout
# that needs 96-168 registers rather than 168-255), and the whole v_scale applied to the
# accumulator after the loop, in fp32. Offline (decode_registers_offline.py --loop, round 24) the
# key loop drops from 43.7 to 36.0 instructions a key at one warp over 16-key tiles (the config the
# tables now ship for batch 64), from 47.5 to 39.3 at 4 warps over 64-key tiles. Round 8 part B
# measured a similar cut at 4 warps with no change in speed; round 24's Nsight Compute run found the
# one-warp kernel issue-bound (51% of issue slots, 0.75 eligible warps), where fewer instructions
# may count. The probe's few-warps sweep at 4k and 16k with the shipped kernel, then with the
# variant (and its GPU tests), then the shipped kernel restored.
part=${1:?part V}
source "$(dirname "$0")/device_steps.sh"  # shell options, output settings, $started, step, left

case $part in
  V)
    for ctx in 4096 16384; do
      step 150 python benchmarks/fp8_decode_probe.py --few-warps --ctx $ctx \
        --out "$OUT/fp8_decode_few_warps_h200_round25_V_shipped_$ctx.json" --asm /tmp/asm
    done
    git apply benchmarks/variants/fp8_decode_v_unscaled.patch || patch -p1 < benchmarks/variants/fp8_decode_v_unscaled.patch
    step 150 python -m pytest -q -p no:cacheprovider tests/test_fp8_kv_cache.py tests/test_paged_decode_attention.py
    for ctx in 4096 16384; do
      step 150 python benchmarks/fp8_decode_probe.py --few-warps --ctx $ctx \
        --out "$OUT/fp8_decode_few_warps_h200_round25_V_unscaled_$ctx.json" --asm /tmp/asm_v
    done
    git checkout omnitune/kernels/paged_decode_attention.py 2>/dev/null \
      || patch -R -p1 < benchmarks/variants/fp8_decode_v_unscaled.patch
    ;;
esac

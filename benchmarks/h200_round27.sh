#!/usr/bin/env bash
# Twenty-seventh H200 round, one H200:
#   OUT=dir bash benchmarks/h200_round27.sh A|B
# Round 26 (h200_round26.sh) measured two variants: 32-bit row offsets inside a page took the
# fp8 decode's fastest config from 94.2 to 88.7 µs at batch 64, 4k (329.5 vs 336.8 at 16k), so
# the kernel now takes them (ROWS_32, decided on the host from the caches' slot strides, 64-bit
# rows past 2^31 elements), together with 64-bit head-dim, token and page-index offsets (a view
# with elements 2^31 apart along those read outside the tensor). The write with its page size
# compiled in (kv_write_block_size_constexpr.patch) moved the public op by 0.3%: not taken; its
# searches showed the shipped table answering the 65,536-token, 8-kv-head fp8 write with a
# 2-kv-head config (107 µs) where BLOCK_H=8 BLOCK_T=1 takes 86: that entry is now in the table.
# A: `omnitune verify --fix` of the paged-decode table for the new kernel source, then the
# public ops (fp8_kv_bench --quick) with the revalidated tables, then the first half of every
# gpu-marked test. B: the second half.
part=${1:?part A or B}
source "$(dirname "$0")/device_steps.sh"  # shell options, output settings, $started, step, left

case $part in
  A)
    revalidated_decode_ops round27
    gpu_tests_first_half 380
    ;;
  B)
    gpu_tests_second_half
    ;;
esac

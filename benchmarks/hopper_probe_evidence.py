"""What benchmarks/hopper_features_offline.py reads from a compiled probe (TTGIR and PTX op
counts, warp-specialization partitions, setmaxnreg, shared buffers, registers from the cubin) and
from the installed Triton itself (which warp-specialization and ping-pong passes libtriton holds)."""

from __future__ import annotations

import dataclasses
import mmap
import os
import re

import triton
import triton.language as tl
from cubin import cubin_resources


# Pass names looked for in libtriton: what the NVIDIA backend can run, and whether any of it
# is a ping-pong scheduler (the AMD backend's BlockPingpong is the only one named so).
_PASS_NAMES = ("nvgpu-warp-specialization", "tritongpu-automatic-warp-specialization", "tritongpu-fuse-nested-loops",
               "tritongpu-partition-scheduling", "tritongpu-optimize-partition-warps", "nvws-lower-warp-group",
               "TritonAMDGPUBlockPingpong")
_SOURCE_MARKERS = ("third_party/nvidia/hopper/lib/Transforms/WarpSpecialization/PingPong.cpp",
                   "third_party/amd/lib/TritonAMDGPUTransforms/BlockPingpong.cpp",
                   "third_party/nvidia/hopper/lib/Transforms/WarpSpecialization/WSDataPartition.cpp")


def _library_row() -> dict:
    """Which warp-specialization and ping-pong passes libtriton holds, and which options the sm_90
    pipeline hands the Hopper warp-specialization pass (read from the backend's source)."""
    from triton.backends.nvidia import compiler as nv

    path = os.path.join(os.path.dirname(triton.__file__), "_C", "libtriton.so")
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        passes = {n: data.find(n.encode()) >= 0 for n in _PASS_NAMES}
        sources = {s: data.find(s.encode()) >= 0 for s in _SOURCE_MARKERS}
        nvidia_pingpong = any(data.find(m) >= 0 for m in (b"nvidia/hopper/lib/Transforms/WarpSpecialization/PingPong",
                                                          b"doPingPong", b"pingpongAutoWS"))
    with open(nv.__file__) as f:
        lines = [line.strip() for line in f if "add_hopper_warpspec" in line or "add_warp_specialize(" in line]
    code = tl.range.__init__.__code__
    return {"passes_present": passes, "sources_present": sources, "nvidia_pingpong_present": nvidia_pingpong,
            "pipeline_calls": lines, "cuda_options": [f.name for f in dataclasses.fields(nv.CUDAOptions)],
            "range_arguments": list(code.co_varnames[1:code.co_argcount])}


# What is counted in the TTGIR and the PTX: name in the row → pattern.
_TTGIR_OPS = {
    "ttg.warp_specialize": r"ttg\.warp_specialize\(",
    "ttng.warp_group_dot": r"ttng\.warp_group_dot ",
    "tt.dot": r"tt\.dot ",
    "ttg.async_copy_global_to_local": r"ttg\.async_copy_global_to_local",
    "ttng.async_tma_copy_global_to_local": r"ttng\.async_tma_copy_global_to_local",
    "ttng.async_tma_copy_local_to_global": r"ttng\.async_tma_copy_local_to_global",
    "ttng.wait_barrier": r"ttng\.wait_barrier",
    "ttng.arrive_barrier": r"ttng\.arrive_barrier",
    "ttng.barrier_expect": r"ttng\.barrier_expect",
    "ttng.tensormap_create": r"ttng\.tensormap_create",
}
_PTX_OPS = {
    "wgmma.mma_async": r"wgmma\.mma_async",
    "wgmma.wait_group": r"wgmma\.wait_group",
    "mma.sync": r"\bmma\.sync",
    "cp.async.bulk.tensor": r"cp\.async\.bulk\.tensor",
    "cp.async (non-bulk)": r"cp\.async\.(?:ca|cg)\.shared",
    "mbarrier.try_wait": r"mbarrier\.try_wait",
    "mbarrier.arrive": r"mbarrier\.arrive",
    "setmaxnreg": r"setmaxnreg",
    "tensormap.replace": r"tensormap\.replace",
    "fence.proxy.tensormap": r"fence\.proxy\.tensormap",
}


def _count(text: str, patterns: dict) -> dict:
    return {name: len(re.findall(pattern, text)) for name, pattern in patterns.items()}


def _partitions(ttgir: str) -> list[dict]:
    """The warp_specialize regions of the TTGIR: per region (default, partition0, …) its warps,
    its dots with their accumulator shapes, and its TMA loads and stores."""
    start = ttgir.find("ttg.warp_specialize(")
    if start < 0:
        return []
    text = ttgir[start:]
    marks = [(m.start(), m.group(1)) for m in re.finditer(r"^\s*(default|partition\d+)[ ({]", text, re.M)]
    out = []
    for i, (pos, name) in enumerate(marks):
        body = text[pos:marks[i + 1][0] if i + 1 < len(marks) else len(text)]
        head = body.split("\n", 1)[0]
        warps = re.search(r"num_warps\((\d+)\)", head)
        out.append({
            "region": name,
            "num_warps": int(warps.group(1)) if warps else None,
            "dots": re.findall(r"ttng\.warp_group_dot .*-> tensor<(\d+x\d+)xf32", body),
            "tma_loads": body.count("ttng.async_tma_copy_global_to_local"),
            "tma_stores": body.count("ttng.async_tma_copy_local_to_global"),
            "pointer_stores": body.count("tt.store "),
        })
    return out


def _shared_buffers(ttgir: str) -> dict:
    """The tile buffers the compiler allocated in shared memory (a leading dimension is the number
    of copies a pipelined or warp-specialized loop rotates through), shape → count; barriers
    (i64) left out."""
    found: dict[str, int] = {}
    for m in re.finditer(r"ttg\.local_alloc[^\n]*?-> !ttg\.memdesc<([0-9x]+x(?:bf16|f16|f32|f8E4M3FN))", ttgir):
        found[m.group(1)] = found.get(m.group(1), 0) + 1
    return found


def evidence(kernel) -> dict:
    ttgir, ptx = kernel.asm["ttgir"], kernel.asm["ptx"]
    md = kernel.metadata
    req = re.search(r"requestedRegisters = array<i32: ([\d, ]+)>", ttgir)
    named = sorted({f"{m.group(1)} {m.group(2)},{m.group(3)}" for m in
                    re.finditer(r"\b(bar\.sync|bar\.arrive|barrier\.sync|barrier\.arrive)\s+(\d+),\s*(\d+);", ptx)})
    row = {
        "num_warps_total": md.num_warps,
        "shared_bytes": md.shared,
        "global_scratch_bytes": getattr(md, "global_scratch_size", 0),
        **cubin_resources(kernel),
        "ttgir": _count(ttgir, _TTGIR_OPS),
        "ptx": _count(ptx, _PTX_OPS),
        "wgmma_shapes": sorted(set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)", ptx))),
        "mma_sync_shapes": sorted(set(re.findall(r"mma\.sync\.aligned\.(m\d+n\d+k\d+)", ptx))),
        "setmaxnreg": sorted({f"{m.group(1)} {m.group(2)}" for m in
                              re.finditer(r"setmaxnreg\.(inc|dec)\.sync\.aligned\.u32\s+(\d+)", ptx)}),
        "shared_buffers": _shared_buffers(ttgir),
        "requested_registers": [int(x) for x in req.group(1).split(",")] if req else None,
        "named_barriers": named,
        "maxnreg_directive": (re.search(r"\.maxnreg (\d+)", ptx) or [None, None])[1],
        "cluster_directive": bool(re.search(r"\.reqnctapercluster|\.explicitcluster", ptx)),
        "partitions": _partitions(ttgir),
    }
    return row

"""What Triton 3.6 can express on sm_90, established by compiling for it on a machine without a GPU.

Each probe compiles one kernel for sm_90 (Triton's own compiler, its bundled ptxas; cuobjdump
reads the cubin) and reports whether it compiled (else the compiler's one-line diagnostic), what
the TTGIR and PTX contain (warp specialization and its partitions, wgmma, TMA, mbarriers,
setmaxnreg, named barriers), the registers per thread and the shared memory. Speed is not
measured: that needs the H200. docs/hopper.md reads the result.

The kernels are this file's own: a FlashAttention-style forward (a [BLOCK_M, 128] bf16 query
tile, a loop over K/V tiles with two tl.dot and an online softmax in exp2), a persistent
variant of it, and a plain (persistent or not) GEMM; plus omnitune's attention kernel itself,
compiled as its launcher would call it. As in benchmarks/decode_registers_offline.py the
signatures mimic the real calls' specialisation: pointers, row strides and lengths divisible by
16, unit innermost strides as constants.

Every probe runs in a child process: the compiler's diagnostics (MLIR errors, failed assertions)
go to the C++ stderr, which the parent reads for a failed probe's one line, and a compiler that
aborts takes only the child with it (Triton 3.6's wheel reports its assertions as a failed pass,
RuntimeError "PassManager::run failed"). A probe that fails to compile is a row like any other and
the script still exits 0.

    PYTHONPATH=$PWD python benchmarks/hopper_features_offline.py --out benchmarks/results/hopper_features_offline.json
    PYTHONPATH=$PWD python benchmarks/hopper_features_offline.py --only fa_ptr_m128_w8   # one probe, printed
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import types

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hopper_probe_evidence import _library_row, evidence  # noqa: E402
from hopper_probe_kernels import HEAD_DIM, NUM_SMS, _fa_fwd, _fa_fwd_persistent, _gemm, _gluon_kernel  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)

# How the attention probe reads Q, K, V and writes O: (Q through a descriptor, K/V through
# descriptors, O through a descriptor, descriptors made in the kernel rather than on the host).
LOADS = {
    "ptr": (False, False, False, False),        # pointer loads and stores (the baseline)
    "host_kv": (False, True, False, False),     # K/V through host descriptors (omnitune's USE_TMA)
    "host_qkv": (True, True, False, False),     # Q, K, V through host descriptors, O stored through pointers
    "host_all": (True, True, True, False),      # Q, K, V and O through host descriptors
    "device_qkv": (True, True, False, True),    # Q, K, V through tl.make_tensor_descriptor, O through pointers
    "device_all": (True, True, True, True),     # Q, K, V and O through tl.make_tensor_descriptor
}


# ------------------------------------------------------------------------------------------------
# Probes
# ------------------------------------------------------------------------------------------------


# The problem of omnitune's H200 searches whose compiled registers the probe is checked against
# (benchmarks/results/search_trials_h200_round4.json).
OMNITUNE_PROBLEM = dict(b=1, h=28, hkv=4, lq=128, lk=256, d=HEAD_DIM)


def _probe(name, feature, kernel, **params):
    return dict(name=name, feature=feature, kernel=kernel, params=params)


def _fa(name, feature, loads="ptr", block_m=128, block_n=64, warps=8, stages=2, ws=False, causal=None,
        ws_diag=False, **opts):
    return _probe(name, feature, "fa", loads=loads, block_m=block_m, block_n=block_n, num_warps=warps,
                  num_stages=stages, warp_specialize=ws, causal=causal, ws_diag=ws_diag, **opts)


def _omnitune(name, block_m, warps, stages, use_tma, block_n=64):
    return _probe(name, "omnitune kernel", "omnitune", problem=OMNITUNE_PROBLEM, block_m=block_m, block_n=block_n,
                  num_warps=warps, num_stages=stages, use_tma=use_tma)


def probes() -> list[dict]:
    rows = [
        # 1 + 4. pointer loads: the baseline, and which tiles become wgmma
        _fa("fa_ptr_m128_w8", "baseline / wgmma", block_m=128, warps=8),
        _fa("fa_ptr_m128_w4", "baseline / wgmma", block_m=128, warps=4),
        _fa("fa_ptr_m128_n128_w8", "baseline / wgmma", block_m=128, block_n=128, warps=8),
        _fa("fa_ptr_m64_w4", "baseline / wgmma", block_m=64, warps=4, stages=3),
        _fa("fa_ptr_m64_w8", "baseline / wgmma", block_m=64, warps=8, stages=3),
        _fa("fa_ptr_m32_w4", "baseline / wgmma", block_m=32, warps=4, stages=3),
        _fa("fa_ptr_m16_w4", "baseline / wgmma", block_m=16, warps=4, stages=3),
        _fa("fa_ptr_m128_w8_s1", "baseline / wgmma", block_m=128, warps=8, stages=1),
        # 2. tensor descriptors: host (omnitune's USE_TMA: K/V only; or Q, K, V, O) and in-kernel
        _fa("fa_host_kv_m128_w8", "tensor descriptors (TMA)", loads="host_kv"),
        _fa("fa_host_all_m128_w8", "tensor descriptors (TMA)", loads="host_all"),
        _fa("fa_device_all_m128_w8", "tensor descriptors (TMA)", loads="device_all"),
        _fa("fa_host_kv_m64_w4", "tensor descriptors (TMA)", loads="host_kv", block_m=64, warps=4, stages=3),
        _fa("fa_device_all_m64_w4", "tensor descriptors (TMA)", loads="device_all", block_m=64, warps=4, stages=3),
        _fa("fa_host_kv_m128_w8_s3", "tensor descriptors (TMA)", loads="host_kv", stages=3),
        _fa("fa_device_all_m32_w4", "tensor descriptors (TMA)", loads="device_all", block_m=32, warps=4),
        _fa("fa_device_all_m64_w8", "tensor descriptors (TMA)", loads="device_all", block_m=64, warps=8),
        # 3. tl.range(..., warp_specialize=True)
        _fa("ws_ptr_m128_w4", "warp_specialize", ws=True, warps=4),
        _fa("ws_ptr_m64_w4", "warp_specialize", ws=True, block_m=64, warps=4),
        _fa("ws_host_kv_m128_w4", "warp_specialize", loads="host_kv", ws=True, warps=4),
        _fa("ws_host_qkv_m128_w4", "warp_specialize", loads="host_qkv", ws=True, warps=4),
        _fa("ws_host_all_m128_w4", "warp_specialize", loads="host_all", ws=True, warps=4),
        _fa("ws_host_all_m64_w4", "warp_specialize", loads="host_all", ws=True, block_m=64, warps=4),
        _fa("ws_device_qkv_m128_w4", "warp_specialize", loads="device_qkv", ws=True, warps=4),
        _fa("ws_device_all_m128_w4", "warp_specialize", loads="device_all", ws=True, warps=4),
        _fa("ws_device_all_m64_w4", "warp_specialize", loads="device_all", ws=True, block_m=64, warps=4),
        _fa("ws_device_all_m128_w8", "warp_specialize", loads="device_all", ws=True, warps=8),
        _fa("ws_device_all_m64_w8", "warp_specialize", loads="device_all", ws=True, block_m=64, warps=8),
        _fa("ws_device_all_m128_n128_w4", "warp_specialize", loads="device_all", ws=True, block_n=128, warps=4),
        _fa("ws_device_all_m128_w4_s3", "warp_specialize", loads="device_all", ws=True, warps=4, stages=3),
        _fa("ws_device_all_m128_w4_s1", "warp_specialize", loads="device_all", ws=True, warps=4, stages=1),
        _fa("ws_device_all_m256_w4", "warp_specialize", loads="device_all", ws=True, block_m=256, warps=4),
        _fa("ws_device_all_m32_w4", "warp_specialize", loads="device_all", ws=True, block_m=32, warps=4),
        _fa("ws_device_all_m128_n128_w4_s3", "warp_specialize", loads="device_all", ws=True, block_n=128, warps=4,
            stages=3),
        _fa("fa_device_all_m128_w8_causal", "tensor descriptors (TMA)", loads="device_all", causal="two_loops"),
        _fa("ws_device_all_m128_w4_causal_both", "warp_specialize", loads="device_all", ws=True, ws_diag=True,
            warps=4, causal="two_loops"),
        _fa("ws_device_all_m128_w4_causal_offdiag", "warp_specialize", loads="device_all", ws=True, warps=4,
            causal="two_loops"),
        _fa("ws_device_all_m128_w4_causal_diag", "warp_specialize", loads="device_all", ws_diag=True, warps=4,
            causal="two_loops"),
        _fa("ws_device_all_m128_w4_causal_one_loop", "warp_specialize", loads="device_all", ws=True, warps=4,
            causal="one_loop"),
        _fa("ws_host_kv_m128_w8", "warp_specialize", loads="host_kv", ws=True, warps=8),
        # 5. persistent grids
        _probe("persist_fa_device_all", "persistent", "fa_persistent", loads="device_all", block_m=128, block_n=64,
               num_warps=8, num_stages=2, flatten=False, ws_outer=False, ws_inner=False),
        _probe("persist_fa_device_all_flatten", "persistent", "fa_persistent", loads="device_all", block_m=128,
               block_n=64, num_warps=8, num_stages=2, flatten=True, ws_outer=False, ws_inner=False),
        _probe("persist_fa_device_all_ws_outer_w4", "persistent + warp_specialize", "fa_persistent",
               loads="device_all", block_m=128, block_n=64, num_warps=4, num_stages=2, flatten=False,
               ws_outer=True, ws_inner=False),
        _probe("persist_fa_device_all_flatten_ws_outer_w4", "persistent + warp_specialize", "fa_persistent",
               loads="device_all", block_m=128, block_n=64, num_warps=4, num_stages=2, flatten=True,
               ws_outer=True, ws_inner=False),
        _probe("persist_fa_device_all_ws_inner_w4", "persistent + warp_specialize", "fa_persistent",
               loads="device_all", block_m=128, block_n=64, num_warps=4, num_stages=2, flatten=False,
               ws_outer=False, ws_inner=True),
        _probe("gemm_host", "GEMM", "gemm", loads="host_all", block_m=128, block_n=128, block_k=64, num_warps=8,
               num_stages=3, persistent=False, flatten=False, warp_specialize=False),
        _probe("gemm_host_ws_w4", "GEMM + warp_specialize", "gemm", loads="host_all", block_m=128, block_n=128,
               block_k=64, num_warps=4, num_stages=3, persistent=False, flatten=False, warp_specialize=True),
        _probe("gemm_device_ws_w4", "GEMM + warp_specialize", "gemm", loads="device_all", block_m=128,
               block_n=128, block_k=64, num_warps=4, num_stages=3, persistent=False, flatten=False,
               warp_specialize=True),
        _probe("gemm_persist_host_flatten", "persistent GEMM", "gemm", loads="host_all", block_m=128, block_n=128,
               block_k=64, num_warps=8, num_stages=3, persistent=True, flatten=True, warp_specialize=False),
        _probe("gemm_persist_host_flatten_ws_w4", "persistent GEMM + warp_specialize", "gemm", loads="host_all",
               block_m=128, block_n=128, block_k=64, num_warps=4, num_stages=3, persistent=True, flatten=True,
               warp_specialize=True),
        _probe("gemm_persist_device_flatten_ws_w4", "persistent GEMM + warp_specialize", "gemm",
               loads="device_all", block_m=128, block_n=128, block_k=64, num_warps=4, num_stages=3,
               persistent=True, flatten=True, warp_specialize=True),
        _probe("gemm_persist_device_ws_w4", "persistent GEMM + warp_specialize", "gemm", loads="device_all",
               block_m=128, block_n=128, block_k=64, num_warps=4, num_stages=3, persistent=True, flatten=False,
               warp_specialize=True),
        # 6. anything else: launch options, omnitune's own kernel, Gluon, the compiler's passes
        _fa("opt_maxnreg128_m128_w8", "maxnreg", maxnreg=128),
        _fa("opt_maxnreg168_ws_device_all_m128_w4", "maxnreg + warp_specialize", loads="device_all", ws=True,
            warps=4, maxnreg=168),
        _fa("opt_num_ctas2_m128_w8", "num_ctas (clusters)", num_ctas=2),
        _omnitune("omnitune_attention_m64_w4_s3", 64, 4, 3, use_tma=False),
        _omnitune("omnitune_attention_tma_m64_w4_s3", 64, 4, 3, use_tma=True),
        _omnitune("omnitune_attention_m128_w4_s2", 128, 4, 2, use_tma=False),
        _omnitune("omnitune_attention_m128_w8_s2", 128, 8, 2, use_tma=False),
        _omnitune("omnitune_attention_tma_m128_w8_s2", 128, 8, 2, use_tma=True),
        _probe("gluon_pingpong_skeleton", "Gluon warp_specialize", "gluon", num_warps=4, num_stages=1, turns=4,
               block=128),
        _probe("compiler_passes", "compiler passes", "library"),
    ]
    return rows


# ------------------------------------------------------------------------------------------------
# Compiling one probe (in the child process)
# ------------------------------------------------------------------------------------------------


def _source(fn, pointers: dict, descriptors: dict, scalars: dict, constexprs: dict, aligned: set):
    names = fn.arg_names
    signature = {}
    for n in names:
        if n in constexprs:
            signature[n] = "constexpr"
        elif n in pointers:
            signature[n] = pointers[n]
        elif n in descriptors:
            signature[n] = descriptors[n]
        else:
            signature[n] = scalars.get(n, "i32")
    values = {(names.index(n),): v for n, v in constexprs.items()}
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in names
             if signature[n] != "constexpr" and (n in pointers or n in aligned)}
    return ASTSource(fn=fn, signature=signature, constexprs=values, attrs=attrs)


# The attention probe's masks: none, causal as omnitune splits it (an unmasked loop, then a
# masked one over the diagonal block), causal as one loop with every tile masked.
_CAUSAL = {None: 0, "two_loops": 1, "one_loop": 2}


def _descriptor_types(loads: str, blocks: dict) -> dict:
    """name → signature type: a host descriptor is spelled tensordesc<dtype[block shape]>; an
    unused descriptor argument is an i32 (the launcher passes 0)."""
    q, kv, o, made = LOADS[loads]
    host = set() if made else {n for n, used in (("q_desc", q), ("k_desc", kv), ("v_desc", kv), ("o_desc", o)) if used}
    return {n: (f"tensordesc<bf16[{', '.join(map(str, blocks[n]))}]>" if n in host else "i32") for n in blocks}


def _compile_fa(p: dict, persistent: bool):
    q, kv, o, made = LOADS[p["loads"]]
    bm, bn = p["block_m"], p["block_n"]
    blocks = {"q_desc": (bm, HEAD_DIM), "k_desc": (bn, HEAD_DIM), "v_desc": (bn, HEAD_DIM), "o_desc": (bm, HEAD_DIM)}
    constexprs = dict(HEAD_DIM=HEAD_DIM, BLOCK_M=bm, BLOCK_N=bn, Q_DESC=q, KV_DESC=kv, O_DESC=o, MAKE_DESC=made)
    if persistent:
        fn = _fa_fwd_persistent
        constexprs.update(NUM_SMS=NUM_SMS, FLATTEN=p["flatten"], WS_OUTER=p["ws_outer"], WS_INNER=p["ws_inner"])
    else:
        fn = _fa_fwd
        constexprs.update(WARP_SPEC=p["warp_specialize"], CAUSAL=_CAUSAL[p["causal"]], WS_DIAG=p["ws_diag"])
    pointers = {n: "*bf16" for n in ("Q", "K", "V", "Out")}
    aligned = {"stride_qm", "stride_kn", "stride_vn", "stride_om", "LQ", "LK"}
    return fn, _source(fn, pointers, _descriptor_types(p["loads"], blocks), {"qk_scale": "fp32"}, constexprs, aligned)


def _compile_gemm(p: dict):
    made = LOADS[p["loads"]][3]
    bm, bn, bk = p["block_m"], p["block_n"], p["block_k"]
    if not made:
        descriptors = {"a_desc": f"tensordesc<bf16[{bm}, {bk}]>", "b_desc": f"tensordesc<bf16[{bn}, {bk}]>",
                       "c_desc": f"tensordesc<bf16[{bm}, {bn}]>"}
    else:
        descriptors = {n: "i32" for n in ("a_desc", "b_desc", "c_desc")}
    constexprs = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, MAKE_DESC=made, PERSISTENT=p["persistent"],
                      NUM_SMS=NUM_SMS, FLATTEN=p["flatten"], WARP_SPEC=p["warp_specialize"])
    aligned = {"M", "N", "K", "stride_am", "stride_bn", "stride_cm"}
    return _gemm, _source(_gemm, {n: "*bf16" for n in "ABC"}, descriptors, {}, constexprs, aligned)


def _specialised_source(fn, args: tuple, constexprs: dict):
    """The ASTSource that Triton's JIT would build for these runtime arguments: each argument
    goes through the JIT's own specialiser (a tensor's dtype and 16-byte alignment, an int's
    width, whether it is 1 (then a constant) or divisible by 16, a host descriptor's dtype and
    block shape), as on a launch. Plain CPU tensors stand in for the GPU's: only their dtype and
    alignment count."""
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.nvidia.compiler import CUDABackend

    names = fn.arg_names
    signature, values, attrs = {}, {}, {}
    for i, (name, arg) in enumerate(zip(names, args)):
        kind, spec = native_specialize_impl(CUDABackend, arg, False, True, True)
        signature[name] = kind
        if kind == "constexpr":
            values[(i,)] = spec
        elif isinstance(spec, str) and spec:
            attrs[(i,)] = CUDABackend.parse_attr(spec)
    for name in names[len(args):]:
        signature[name] = "constexpr"
        values[(names.index(name),)] = constexprs[name]
    return ASTSource(fn=fn, signature=signature, constexprs=values, attrs=attrs)


def _compile_omnitune(p: dict):
    """omnitune's _attention_fwd with the arguments its own launcher passes (attention.launch,
    its kernel call intercepted), for the H200 searches' problem b=1, h=28 over hkv=4, lq=128,
    lk=256, d=128, bf16, no mask: the signature is the one a launch on the GPU specialises."""
    import torch

    from omnitune.kernels import attention
    from omnitune.spec import Config

    problem = attention.AttentionProblem(**p["problem"])
    inputs = attention.make_inputs(problem, torch.bfloat16, "cpu", 0)
    out = torch.empty_like(inputs.q)
    config = Config(BACKEND="triton", BLOCK_M=p["block_m"], BLOCK_N=p["block_n"], num_warps=p["num_warps"],
                    num_stages=p["num_stages"], PACK_GQA=p.get("pack_gqa", False), USE_TMA=p["use_tma"])
    calls = []

    class Bound:  # a bound launcher off the direct path: a TmaLaunch hands it built descriptors
        _launcher = types.SimpleNamespace(_direct=False)

        def __init__(self, constexprs, objects):
            self._constexprs, self._objects = constexprs, objects

        def __call__(self, grid, args, dtypes=None):
            calls.append((args, dict(self._constexprs)))

    class Recorder:  # stands in for the kernel's DirectLauncher: what a launch would pass it
        def bind(self, constexprs, objects):
            return Bound(constexprs, objects)

    real = attention._ATTENTION
    attention._ATTENTION = Recorder()
    try:
        attention.launch(inputs, out, config)
    finally:
        attention._ATTENTION = real
    args, constexprs = calls[0]
    for option in ("num_warps", "num_stages"):
        constexprs.pop(option)
    fn = attention._attention_fwd
    return fn, _specialised_source(fn, args, constexprs)


def _compile_gluon(p: dict):
    fn = _gluon_kernel()
    from triton.experimental.gluon._runtime import GluonASTSource

    names = fn.arg_names
    signature = {"A": "*bf16", "B": "*bf16", "Out": "*bf16", "TURNS": "constexpr", "BLOCK": "constexpr"}
    constexprs = {(names.index("TURNS"),): p["turns"], (names.index("BLOCK"),): p["block"]}
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in ("A", "B", "Out")}
    return fn, GluonASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)


def compile_probe(probe: dict):
    p = probe["params"]
    kind = probe["kernel"]
    if kind == "fa":
        fn, src = _compile_fa(p, persistent=False)
    elif kind == "fa_persistent":
        fn, src = _compile_fa(p, persistent=True)
    elif kind == "gemm":
        fn, src = _compile_gemm(p)
    elif kind == "omnitune":
        fn, src = _compile_omnitune(p)
    elif kind == "gluon":
        fn, src = _compile_gluon(p)
    else:
        raise ValueError(kind)
    options = {k: p[k] for k in ("num_warps", "num_stages", "maxnreg", "num_ctas") if k in p}
    return triton.compile(src, target=TARGET, options=options)


def run_one(probe: dict) -> dict:
    """Compile one probe in this process; the row (compiled or not) as a dict."""
    p = probe["params"]
    row = {"name": probe["name"], "feature": probe["feature"], "kernel": probe["kernel"], **p}
    started = time.perf_counter()
    if probe["kernel"] == "library":
        row.update(compiled=None, **_library_row())
        return row
    try:
        kernel = compile_probe(probe)
    except Exception as exc:  # a compile error is the probe's finding
        lines = str(exc).strip().splitlines()
        row.update(compiled=False, error=f"{type(exc).__name__}: {lines[-1] if lines else ''}")
    else:
        row.update(compiled=True, **evidence(kernel))
        for region in row["partitions"]:
            if region["region"] == "default":  # the default region runs on the kernel's own warps
                region["num_warps"] = p.get("num_warps", 4)
    row["compile_s"] = round(time.perf_counter() - started, 2)
    return row


# ------------------------------------------------------------------------------------------------
# Driver (the parent process)
# ------------------------------------------------------------------------------------------------


def _diagnostic(stderr: str) -> str | None:
    """The compiler's first real complaint on stderr: an MLIR error or a failed assertion."""
    for line in stderr.splitlines():
        if "Assertion" in line:
            return re.sub(r"^.*?/(lib|third_party)/", r"\1/", line.strip())
    for line in stderr.splitlines():
        if "error:" in line and "Failures have been detected" not in line:
            return re.sub(r"^\S*/", "", line.strip())
    return None


def run_isolated(probe: dict, timeout: float = 300.0) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    cmd = [sys.executable, os.path.abspath(__file__), "--child", json.dumps(probe)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"name": probe["name"], "feature": probe["feature"], "kernel": probe["kernel"], **probe["params"],
                "compiled": False, "error": f"compile did not finish in {timeout:.0f} s"}
    row = None
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("{"):
            row = json.loads(line)
            break
    if row is None:  # the child died before printing its row
        row = {"name": probe["name"], "feature": probe["feature"], "kernel": probe["kernel"], **probe["params"],
               "compiled": False, "error": f"compiler process exited with {done.returncode}"}
    if row.get("compiled") is False:
        row["diagnostic"] = _diagnostic(done.stderr)
    return row


def summary(row: dict) -> str:
    if row.get("compiled") is None:
        return f"{row['name']}: nvidia ping-pong pass present: {row.get('nvidia_pingpong_present')}"
    if not row.get("compiled"):
        return f"{row['name']}: FAILED {row.get('diagnostic') or row.get('error')}"
    t, x = row["ttgir"], row["ptx"]
    mma = (f"wgmma {x['wgmma.mma_async']} {','.join(row['wgmma_shapes'])}" if x["wgmma.mma_async"]
           else f"mma.sync {x['mma.sync']} {','.join(row['mma_sync_shapes'])}")
    parts = [f"{row['name']}: {row['registers']} reg, {row['shared_bytes'] // 1024} KiB smem, "
             f"{row['num_warps_total']} warps", mma, f"TMA {x['cp.async.bulk.tensor']}",
             f"cp.async {x['cp.async (non-bulk)']}", f"mbarrier waits {x['mbarrier.try_wait']}"]
    if t["ttg.warp_specialize"]:
        regions = "; ".join(f"{p['region']}({p['num_warps']}w dots {'/'.join(p['dots']) or '-'} tma {p['tma_loads']})"
                            for p in row["partitions"])
        parts.append(f"WS [{regions}] setmaxnreg {row['setmaxnreg']}")
    return ", ".join(parts)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="write the rows as JSON here")
    parser.add_argument("--only", action="append", help="run only the probes of these names")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(run_one(json.loads(args.child))))
        return 0
    chosen = [p for p in probes() if not args.only or p["name"] in args.only]
    rows = []
    for probe in chosen:
        row = run_isolated(probe)
        rows.append(row)
        print(summary(row), flush=True)
    if args.out:
        result = {
            "what": "Triton features compiled offline for sm_90 (no GPU); speed not measured (needs the H200)",
            "triton": triton.__version__,
            "target": "cuda sm_90 (GPUTarget('cuda', 90, 32)), warp size 32",
            "notes": "ptx counts are static instruction counts in the PTX text (an unrolled or pipelined loop "
                     "repeats them), not executed counts; registers are ptxas's allocation (cuobjdump -res-usage); "
                     "a warp-specialized kernel starts at that count and setmaxnreg moves each warpgroup's",
            "rows": rows,
        }
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The public ops as users call them, beside the PyTorch path called the same way, in one run.

For each case, every implementation (ours through its public function — and, for paged decode,
PagedDecodePlan.run — the PyTorch baseline, and our internal launch without the public
function's host work, to show what that work costs) is measured three ways:
  - eager, back to back: N calls issued in a loop, then one synchronize. host_us is the time the
    host spent issuing one call (the loop's time / N, before the synchronize); wall_us the time
    per call including the wait for the GPU (what a serving loop sees when the host is the
    bottleneck, host time and launch gaps included); gpu_us the CUDA-event span of the loop / N;
  - as a CUDA graph: GRAPH_CALLS calls captured into one graph, replayed back to back; per-call
    time from CUDA events (what a decode engine runs). A capture failure is recorded, not raised.
Implementations are measured in interleaved rounds (each round every implementation once), and
the medians of the rounds are reported, so clock drift does not rank them. Every implementation
is checked against the first baseline on the same inputs before anything is timed. No L2 flush:
back-to-back calls are what users run (the decode and large-write cases move far more than the
L2 holds; the small ones are served from L2 for every implementation alike).

The copy bandwidth of this device is measured in the same run (omnitune.profile.calibrate) and
memory-bound cases are also reported as % of it, using the kernel spec's byte model.

    PYTHONPATH=$PWD python benchmarks/ops_bench.py --out $OUT/ops_bench_h200.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

ROUNDS = 7
CALLS = 200          # eager calls per round
GRAPH_CALLS = 10     # calls captured per graph
GRAPH_REPLAYS = 20   # replays per round


@dataclass
class Case:
    name: str
    impls: dict[str, Callable[[], torch.Tensor | None]]
    check: Callable[[dict[str, torch.Tensor | None]], dict[str, float]]
    bytes_moved: float = 0.0
    flops: float = 0.0
    notes: str = ""
    results: dict = field(default_factory=dict)
    impl_bytes: dict[str, float] = field(default_factory=dict)
    """Bytes moved per implementation where they differ from bytes_moved (an fp8 cache's)."""
    calls: int = CALLS
    """Eager calls per round (fewer for calls of milliseconds)."""
    graph_replays: int = GRAPH_REPLAYS


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


def _eager(fn, calls: int) -> tuple[float, float, float]:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    start.record()
    for _ in range(calls):
        fn()
    t_issue = time.perf_counter()
    end.record()
    torch.cuda.synchronize()
    t_done = time.perf_counter()
    return ((t_issue - t0) / calls * 1e6, (t_done - t0) / calls * 1e6, start.elapsed_time(end) / calls * 1e3)


def capture(fn, calls: int = GRAPH_CALLS):
    """A CUDA graph of `calls` back-to-back calls of fn (warmed up on a side stream first, as
    capture requires)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    torch.cuda.synchronize()
    return graph


def graph_call_us(graph, calls: int = GRAPH_CALLS, replays: int = GRAPH_REPLAYS) -> float:
    """µs per captured call over `replays` back-to-back replays, between CUDA events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / (replays * calls) * 1e3


def best_graph_us(fn, rounds: int) -> float:
    """µs per call of fn captured (capture) and timed by graph_call_us, the best of `rounds`."""
    graph = capture(fn)
    return min(graph_call_us(graph) for _ in range(rounds))


def copy_bandwidth_report(device: torch.device, **fields) -> tuple[float, dict]:
    """This device's copy bandwidth (TB/s, omnitune.profile.calibrate), and the head of a results
    file that reports against it: device, command, the bandwidth and how it was measured, `fields`."""
    from omnitune.profile.calibrate import measure_copy_tbps

    copy_tbps, copy_detail = measure_copy_tbps(device)
    return copy_tbps, {"device": torch.cuda.get_device_name(device), "command": " ".join(sys.argv),
                       "copy_tbps": copy_tbps, "copy_detail": copy_detail, **fields}


def measure(case: Case, copy_tbps: float) -> dict:
    outputs = {name: fn() for name, fn in case.impls.items()}
    torch.cuda.synchronize()
    errors = case.check(outputs)
    for name, fn in case.impls.items():  # warm every path (compiles, lookups, allocator)
        for _ in range(5):
            fn()
    graphs, capture_errors = {}, {}
    for name, fn in case.impls.items():
        try:
            graphs[name] = capture(fn)
        except Exception as exc:  # noqa: BLE001 — recorded: a capture failure is a result
            capture_errors[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
            torch.cuda.synchronize()
    samples: dict[str, dict[str, list[float]]] = {n: {"host_us": [], "wall_us": [], "gpu_us": [], "graph_us": []}
                                                  for n in case.impls}
    for _ in range(ROUNDS):
        for name, fn in case.impls.items():
            host, wall, gpu = _eager(fn, case.calls)
            samples[name]["host_us"].append(host)
            samples[name]["wall_us"].append(wall)
            samples[name]["gpu_us"].append(gpu)
            if name in graphs:
                samples[name]["graph_us"].append(graph_call_us(graphs[name], replays=case.graph_replays))
    result = {"notes": case.notes, "bytes_moved": case.bytes_moved, "flops": case.flops,
              "max_rel_error_vs_baseline": errors, "impls": {}}
    for name, s in samples.items():
        row = {k: (statistics.median(v) if v else None) for k, v in s.items()}
        row["graph_capture"] = "ok" if name in graphs else capture_errors.get(name)
        moved = case.impl_bytes.get(name, case.bytes_moved)
        if moved:
            row["bytes_moved"] = moved
            for k in ("wall_us", "graph_us"):
                if row[k]:
                    tbps = moved / (row[k] * 1e-6) / 1e12
                    row[k.replace("_us", "_tbps")] = tbps
                    row[k.replace("_us", "_pct_of_copy")] = 100 * tbps / copy_tbps
        if case.flops:
            for k in ("wall_us", "graph_us"):
                if row[k]:
                    row[k.replace("_us", "_tflops")] = case.flops / (row[k] * 1e-6) / 1e12
        result["impls"][name] = row
    return result


# ------------------------------------------------------------------------------------------------
# Cases
# ------------------------------------------------------------------------------------------------


def paged_decode_case(device, b=64, h=28, hkv=4, ctx=4096, d=128, block_size=16, extra_plans=None) -> Case:
    """extra_plans: {name: config}, more PagedDecodePlan.run implementations with those configs."""
    from omnitune.kernels import paged_decode_attention as pda

    problem = pda.PagedDecodeProblem(b=b, h=h, hkv=hkv, lq=1, ctx=ctx, d=d, block_size=block_size)
    inputs = pda.SPEC.make_inputs(problem, torch.bfloat16, device, seed=0)
    q, kc, vc, tables, lens = inputs.q, inputs.key_cache, inputs.value_cache, inputs.block_tables, inputs.context_lens
    # The same context, contiguous, for SDPA: [B, Hkv, ctx, D]
    k_dense, v_dense = (t.contiguous() for t in pda.contiguous_context(inputs, ctx))
    plan = pda.PagedDecodePlan(batch=b, num_heads=h, num_kv_heads=hkv, head_dim=d, block_size=block_size,
                               max_blocks=tables.shape[1], max_context_len=ctx, dtype=torch.bfloat16, device=device)
    config = plan.config
    out = torch.empty_like(q)

    def internal():
        pda._launch(q, kc, vc, tables, lens, inputs.sm_scale, out, config, plan._scratch)
        return out

    impls = {
        "sdpa_contiguous": lambda: F.scaled_dot_product_attention(q, k_dense, v_dense, enable_gqa=True),
        "omnitune": lambda: pda.paged_decode_attention(q, kc, vc, tables, lens, max_context_len=ctx),
        "omnitune_plan_run": lambda: plan.run(q, kc, vc, tables, lens),
        "internal_launch": internal,
    }
    for name, extra in (extra_plans or {}).items():
        other = pda.PagedDecodePlan(batch=b, num_heads=h, num_kv_heads=hkv, head_dim=d, block_size=block_size,
                                    max_blocks=tables.shape[1], max_context_len=ctx, dtype=torch.bfloat16,
                                    device=device, config=extra)
        impls[name] = lambda other=other: other.run(q, kc, vc, tables, lens)

    def check(outs):
        base = outs["sdpa_contiguous"]
        return {n: _rel(o, base) for n, o in outs.items() if n != "sdpa_contiguous"}

    return Case(f"paged_decode b{b} h{h}/{hkv} ctx{ctx} d{d} bs{block_size}", impls, check,
                bytes_moved=pda.SPEC.bytes_moved(problem, torch.bfloat16), notes=f"config {config.label()}")


def kv_write_case(device, t=256, hkv=4, d=128, block_size=16, num_blocks=4096) -> Case:
    from omnitune.kernels import kv_cache_write as kvw

    gen = torch.Generator().manual_seed(0)
    key = torch.randn((t, hkv, d), generator=gen).to(device=device, dtype=torch.bfloat16)
    value = torch.randn((t, hkv, d), generator=gen).to(device=device, dtype=torch.bfloat16)
    kc = torch.randn((num_blocks, block_size, hkv, d), generator=gen).to(device=device, dtype=torch.bfloat16)
    vc = kc.clone()
    kc2, vc2 = kc.clone(), vc.clone()
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:t].to(device)
    flat_k, flat_v = kc2.view(-1, hkv, d), vc2.view(-1, hkv, d)
    problem = kvw.KVCacheWriteProblem(t=_bucket(t), hkv=hkv, d=d, block_size=block_size)
    config = kvw._memo.get((_bucket(t), hkv, d, block_size, "auto"), None, lambda: problem, torch.bfloat16)

    def ours():
        kvw.write_kv_cache(key, value, kc, vc, slots)
        return kc

    def baseline():
        flat_k.index_copy_(0, slots, key)
        flat_v.index_copy_(0, slots, value)
        return kc2

    def internal():
        kvw._launch(key, value, kc, vc, slots, config)
        return kc

    def full_path():
        # A config of the caller's own: every check, lookup and launch key on every call (the
        # path that the steady state's signature stands in for, see kv_cache_write._steady).
        kvw.write_kv_cache(key, value, kc, vc, slots, config=config)
        return kc

    def check(outs):
        ok = torch.equal(kc, kc2) and torch.equal(vc, vc2)
        return {"omnitune_bitwise_equal": 0.0 if ok else float("inf")}

    moved = 4 * t * hkv * d * 2 + 8 * t
    return Case(f"kv_write t{t} hkv{hkv} d{d} bs{block_size}", {"index_copy_": baseline, "omnitune": ours,
                                                               "omnitune_full_path": full_path,
                                                               "internal_launch": internal},
                check, bytes_moved=moved, notes=f"config {config.label()}")


def _bucket(n):
    from omnitune.kernels._dispatch import bucket_up

    return bucket_up(n)


def attention_case(device, b=1, h=28, hkv=4, l=2048, d=128, spans=None, causal=True, calls=CALLS,
                   graph_replays=GRAPH_REPLAYS, lk=None, configs=None) -> Case:
    """Attention over q [b, h, l, d] and k/v [b, hkv, lk (default l), d], bf16: SDPA as it
    dispatches and forced to cuDNN, and the public op with the tables' pick; configs: more
    implementations, the op with each {name: config} given explicitly. With spans: SDPA over a
    dense mask beside the op with its spans as a tensor and as lists."""
    from omnitune.kernels import attention as attn

    lk = l if lk is None else lk
    gen = torch.Generator().manual_seed(0)
    q = torch.randn((b, h, l, d), generator=gen).to(device=device, dtype=torch.bfloat16)
    k = torch.randn((b, hkv, lk, d), generator=gen).to(device=device, dtype=torch.bfloat16)
    v = torch.randn((b, hkv, lk, d), generator=gen).to(device=device, dtype=torch.bfloat16)
    impls: dict[str, Callable] = {}
    if spans is None:
        if causal and lk != l:
            raise ValueError("causal cases have one length (SDPA's is_causal is top-left, the op's bottom-right)")
        from torch.nn.attention import SDPBackend, sdpa_kernel

        gqa = h != hkv
        impls["sdpa_default"] = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)

        def cudnn():
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)

        impls["sdpa_cudnn"] = cudnn
        impls["omnitune"] = lambda: attn.attention(q, k, v, causal=causal)
        op_spans = None
        pairs = l * (l + 1) // 2 if causal else l * lk
        lengths = f"l{l}" if lk == l else f"lq{l} lk{lk}"
        name = f"attention b{b} h{h}/{hkv} {lengths} d{d} {'causal' if causal else 'no mask'}"
    else:
        span_t = torch.tensor([spans] * b, dtype=torch.int32, device=device)
        limits = attn.row_limits(span_t, l, l)
        mask = (torch.arange(l, device=device)[None, None, :] < limits[:, :, None])[:, None]
        impls["sdpa_dense_mask"] = lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        impls["omnitune_spans_tensor"] = lambda: attn.attention(q, k, v, causal=True, mm_spans=span_t)
        impls["omnitune_spans_list"] = lambda: attn.attention(q, k, v, causal=True, mm_spans=[spans] * b)
        causal, op_spans = True, span_t
        pairs = int(limits[0].sum())
        name = f"attention b{b} h{h}/{hkv} l{l} d{d} causal + {len(spans)} image spans"
    for label, config in (configs or {}).items():  # after the baselines: the first impl is the check's reference
        impls[label] = lambda config=config: attn.attention(q, k, v, causal=causal, mm_spans=op_spans, config=config)

    def check(outs):
        base = next(iter(outs.values()))
        return {n: _rel(o, base) for n, o in list(outs.items())[1:]}

    problem = attn.AttentionProblem(b=b, h=h, hkv=hkv, lq=l, lk=lk, d=d, causal=causal)
    picked = attn._memo.get((b, h, hkv, l, lk, d, causal), None, lambda: problem, torch.bfloat16) \
        if spans is None else None
    return Case(name, impls, check, flops=4.0 * b * h * d * pairs, calls=calls, graph_replays=graph_replays,
                notes=f"config {picked.label()}" if picked is not None else "")


def layer_case(device, b=8, lq=1, lk=4096, hidden=3584, h=28, hkv=4, d=128) -> Case:
    from omnitune.kernels import cross_attention_layer as kernel
    from omnitune.kernels import layers

    gen = torch.Generator().manual_seed(0)

    def rand(*shape, scale=1.0):
        return (torch.randn(shape, generator=gen) * scale).to(device=device, dtype=torch.bfloat16)

    x_q, x_kv = rand(b, lq, hidden), rand(b, lk, hidden)
    wq, wkv, wo = rand(h * d, hidden, scale=hidden ** -0.5), rand(2 * hkv * d, hidden, scale=hidden ** -0.5), \
        rand(hidden, h * d, scale=(h * d) ** -0.5)
    inputs = kernel.LayerInputs(x_q, x_kv, wq, wkv, wo, None, None, None, h, hkv, None, sm_scale=d ** -0.5)
    impls = {
        "unfused_pytorch": lambda: kernel.unfused(inputs),
        "omnitune": lambda: layers.cross_attention_layer(x_q, x_kv, wq, wkv, wo, heads=h, kv_heads=hkv),
    }

    def check(outs):
        return {"omnitune": _rel(outs["omnitune"], outs["unfused_pytorch"])}

    problem = kernel.CrossAttentionLayerProblem(b=b, lq=lq, lk=lk, hidden=hidden, h=h, hkv=hkv, d=d)
    return Case(f"cross_attention_layer b{b} lq{lq} lk{lk} hidden{hidden} h{h}/{hkv}", impls, check,
                flops=kernel.SPEC.flops(problem))


def cases(device) -> list[Callable[[], Case]]:
    return [
        lambda: paged_decode_case(device),
        lambda: paged_decode_case(device, b=4, h=32, hkv=4, ctx=16384),
        lambda: kv_write_case(device, t=256),
        lambda: kv_write_case(device, t=8192, num_blocks=8192),
        lambda: attention_case(device),
        lambda: attention_case(device, l=4096, spans=[(512, 768), (1024, 1280)]),
        lambda: layer_case(device),
    ]


def main(argv=None) -> int:
    return cases_main(__doc__.splitlines()[0], "ops_bench", cases, argv)


def cases_main(description: str, name: str, makers_for: Callable[[torch.device], list], argv=None) -> int:
    """The command line of a benchmark made of cases: --out FILE, --only SUBSTRINGS."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--only", default="", help="comma-separated substrings of case names to run")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print(f"{name} needs a CUDA GPU", file=sys.stderr)
        return 2
    return run_cases(makers_for(torch.device("cuda")), args.out, wanted=[w for w in args.only.split(",") if w])


def run_cases(makers: list[Callable[[], Case]], out: Path, *, wanted=(), after: Callable[[dict], None] | None = None,
              device=None) -> int:
    """Measure each case (a case that fails is recorded, not raised), beside this device's copy
    bandwidth measured in the same run, and write the report to `out`. wanted: substrings of the
    case names to keep; after: called on each case's result before it is printed."""
    from omnitune.profile.calibrate import measure_copy_tbps

    device = device or torch.device("cuda")
    copy_tbps, copy_detail = measure_copy_tbps(device)
    report = {
        "device": torch.cuda.get_device_name(device), "torch": torch.__version__,
        "triton": __import__("triton").__version__, "command": " ".join(sys.argv),
        "method": {"rounds": ROUNDS, "eager_calls_per_round": CALLS, "graph_calls": GRAPH_CALLS,
                   "graph_replays_per_round": GRAPH_REPLAYS},
        "copy_tbps": copy_tbps, "copy_detail": copy_detail, "cases": {},
    }
    for make in makers:
        try:
            case = make()
        except Exception as exc:  # noqa: BLE001 — one broken case must not lose the others
            report["cases"][f"case {len(report['cases'])}"] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        if wanted and not any(w in case.name for w in wanted):
            continue
        try:
            report["cases"][case.name] = measure(case, copy_tbps)
            if after is not None:
                after(report["cases"][case.name])
        except Exception as exc:  # noqa: BLE001 — one broken case must not lose the others
            report["cases"][case.name] = {"error": f"{type(exc).__name__}: {exc}"}
        _print_case(case.name, report["cases"][case.name])
        del case
        torch.cuda.empty_cache()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    print(f"copy bandwidth {copy_tbps:.2f} TB/s; wrote {out}")
    return 0


def _print_case(name: str, result: dict) -> None:
    print(f"\n== {name}  {result.get('notes', '')}")
    if "error" in result:
        print("   ERROR", result["error"])
        return
    print(f"   errors vs baseline: {result['max_rel_error_vs_baseline']}")
    for impl, row in result["impls"].items():
        extra = ""
        if "graph_pct_of_copy" in row:
            extra = f" graph {row['graph_pct_of_copy']:.0f}% of copy"
        if "graph_tflops" in row:
            extra = f" graph {row['graph_tflops']:.0f} TFLOP/s"
        graph = f"{row['graph_us']:.1f}" if row["graph_us"] else f"capture failed: {row['graph_capture']}"
        print(f"   {impl:22s} host {row['host_us']:7.1f} µs  wall {row['wall_us']:8.1f} µs  "
              f"gpu {row['gpu_us']:8.1f} µs  graph {graph}{extra}")


if __name__ == "__main__":
    raise SystemExit(main())

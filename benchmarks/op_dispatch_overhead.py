"""What calling an op through torch's dispatcher costs on the host: a decode step's two ops called
back to back, each three ways, on one small shape whose GPU work is far shorter than the call —
  - public:   the public function, eager (write_kv_cache, paged_decode_attention: no dispatcher);
  - function: the function registered as the op, called directly (what the op runs);
  - op:       torch.ops.omnitune.<name>, through the dispatcher (what a compiled graph calls).
op − function is the registration's price per call. Then function and op again with the work
behind them replaced by a stand-in that only allocates the output (`*_stubbed`): their difference
is the crossing alone, with the same arguments — where op − function is larger, the function
itself costs more when the dispatcher calls it. Per-call wall time, host work included, the
median (and fastest) of --repeats runs of --calls calls with one synchronize at the end.

    python benchmarks/op_dispatch_overhead.py --out $OUT/op_dispatch_overhead.json
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

import torch
from _emit import emit

from omnitune.kernels import kv_cache_write as kvw
from omnitune.kernels import paged_decode_attention as pda


def registered_function(op):
    """The Python function behind a registered op: define/impl's LibraryOp keeps it as .fn,
    @torch.library.custom_op's CustomOpDef as ._init_fn."""
    return getattr(op, "fn", None) or op._init_fn


def calls(b=8, h=28, hkv=4, d=128, block_size=16, ctx=64, device="cuda", dtype=torch.bfloat16):
    """{op: {way: a no-argument call}} for the write and the decode of one small step."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    pages = -(-ctx // block_size)
    blocks = b * pages
    table = torch.randperm(blocks, generator=gen).view(b, pages).to(torch.int32).to(device)
    key_cache, value_cache = (torch.randn(blocks, block_size, hkv, d, generator=gen).to(device, dtype)
                              for _ in range(2))
    q = torch.randn(b, h, 1, d, generator=gen).to(device, dtype)
    k, v = (torch.randn(b, hkv, d, generator=gen).to(device, dtype) for _ in range(2))
    lens = torch.full((b,), ctx, dtype=torch.int32, device=device)
    slots = (table[:, -1].to(torch.int64) * block_size + (ctx - 1) % block_size)
    write_fn, decode_fn = registered_function(kvw._write_kv_cache_op), registered_function(pda._paged_decode_op)
    return {
        "write_kv_cache": {
            "public": lambda: kvw.write_kv_cache(k, v, key_cache, value_cache, slots),
            "function": lambda: write_fn(k, v, key_cache, value_cache, slots, ""),
            "op": lambda: torch.ops.omnitune.write_kv_cache(k, v, key_cache, value_cache, slots, ""),
        },
        "paged_decode_attention": {
            "public": lambda: pda.paged_decode_attention(q, key_cache, value_cache, table, lens, max_context_len=ctx),
            "function": lambda: decode_fn(q, key_cache, value_cache, table, lens, -1.0, ctx, ""),
            "op": lambda: torch.ops.omnitune.paged_decode_attention(q, key_cache, value_cache, table, lens, -1.0,
                                                                   ctx, ""),
        },
    }


# What each op's registered function calls to do its work, and a stand-in that only allocates what
# the op returns: the crossing measured without the work.
STAND_INS = {
    "write_kv_cache": (kvw, "_write", lambda *args, **kwargs: None),
    "paged_decode_attention": (pda, "_decode", lambda q, *args, **kwargs: torch.empty(q.shape, dtype=q.dtype,
                                                                                        device=q.device)),
}


@contextlib.contextmanager
def stand_in(op: str):
    module, name, replacement = STAND_INS[op]
    real = getattr(module, name)
    setattr(module, name, replacement)
    try:
        yield
    finally:
        setattr(module, name, real)


def per_call_us(call, n: int, repeats: int, sync) -> list[float]:
    for _ in range(50):  # warm: lookups, the steady path's entry, kernels loaded
        call()
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n):
            call()
        sync()
        times.append((time.perf_counter() - t0) / n * 1e6)
    return sorted(times)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    on_gpu = torch.cuda.is_available()
    device, dtype = ("cuda", torch.bfloat16) if on_gpu else ("cpu", torch.float32)
    sync = torch.cuda.synchronize if on_gpu else (lambda: None)
    shape = dict(b=8, h=28, hkv=4, d=128, block_size=16, ctx=64) if on_gpu else dict(b=1, h=2, hkv=1, d=16,
                                                                                       block_size=4, ctx=8)
    rows = []
    with torch.inference_mode(False):
        for name, ways in calls(**shape, device=device, dtype=dtype).items():
            row = {"op": name}
            for way, call in ways.items():
                times = per_call_us(call, args.calls, args.repeats, sync)
                row[f"{way}_us"], row[f"{way}_us_min"] = statistics.median(times), times[0]
            with stand_in(name):
                for way in ("function", "op"):
                    times = per_call_us(ways[way], args.calls, args.repeats, sync)
                    row[f"{way}_stubbed_us"], row[f"{way}_stubbed_us_min"] = statistics.median(times), times[0]
            row["op_minus_function_us"] = row["op_us"] - row["function_us"]
            row["crossing_alone_us"] = row["op_stubbed_us"] - row["function_stubbed_us"]
            rows.append(row)
    result = {"device": torch.cuda.get_device_name() if on_gpu else "cpu (Triton interpreter)",
              "torch": torch.__version__, "registration": type(kvw._write_kv_cache_op).__name__,
              "shape": shape, "calls": args.calls, "repeats": args.repeats, "rows": rows}
    emit(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

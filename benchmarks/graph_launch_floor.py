"""The fixed cost of a call as a CUDA graph replays it, kernels that read nothing: what any one-
or two-launch paged decode pays before its first key, against issue 15's batch-1 goal.

Issue 15 asks paged decode at batch 1 over 32k keys (bf16, h28/4, d=128: 67 MB) for 85% of copy
bandwidth as a CUDA graph. A call that takes F µs of fixed cost plus the bytes at copy speed B
reaches B / (B + F) at best, so 85% needs F ≤ 0.176·B: 2.8 µs on an H200 (4.26 TB/s copy, B = 15.8
µs), 4.0 µs on an H100 (3.0 TB/s, B = 22.4 µs). Round 35 measured the library's whole call over
empty contexts at 5.5 µs on an H100. This measures the floor under any such call, per call, the way
benchmarks/ops_bench.py times ops (GRAPH_CALLS calls captured back to back in one graph, replayed;
the best of rounds): one Triton kernel that stores one value a program, at 1 program, the split
grid of b1 32k (64 splits × 4 kv heads = 256 programs) and 1,024 programs; two such kernels one
after the other (a split and its combine: 256 then 28 programs); and PagedDecodePlan.run at b1 over
contexts of length 0 and 32k, beside a copy of the same 67 MB.

Round 36 on an H100 put two empty launches at 2.4 µs and the library's empty-context call at 5.6:
the launches alone leave 1.5 µs of the 3.9 allowed. What a call that reads its bytes pays on top —
the memory stream's ramp and drain — the read floors say (--read): one Triton kernel that reads the
decode's K and V bytes and nothing else (each program sums its share of 16-bit blocks, the blocks
dealt out grid-stride; the best of programs per SM, block size, warps and stages), at every batch ×
context of issue 15's grid, beside PagedDecodePlan.run at that shape with the config the tables
give. A call that reads B bytes can be no faster than that kernel plus a second launch, so the
floor's share of copy speed is the ceiling of any one- or two-launch decode on the card. --forms:
the b1 32k call over full and empty contexts at other split counts and with the splits combined in
the same launch (FUSED_REDUCE), each output checked against the table config's. --paged: at b1 32k,
the cache read through its block table by a kernel that makes the decode's page lookups and loads and
no arithmetic (_read_pages, sum-checked; one kv head a program as the decode reads, and every kv head
a program, whole cache slots), pages as drawn and sorted, beside the library's call each way and the
contiguous read floor: what reading through pages, their scatter and the pieces a head reads cost.

    PYTHONPATH=$PWD python benchmarks/graph_launch_floor.py --out $OUT/graph_launch_floor_h200.json
    PYTHONPATH=$PWD python benchmarks/graph_launch_floor.py --read --out $OUT/read_floor_h200.json
    PYTHONPATH=$PWD python benchmarks/graph_launch_floor.py --forms --out $OUT/decode_forms_h200.json
    PYTHONPATH=$PWD python benchmarks/graph_launch_floor.py --paged --out $OUT/decode_paged_reads_h200.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ops_bench import best_graph_us, copy_bandwidth_report

ROUNDS = 7
HEADS, KV_HEADS, HEAD_DIM, PAGE, CONTEXT = 28, 4, 128, 16, 32768


@triton.jit
def _one_store_a_program(X):
    tl.store(X + tl.program_id(0), 1.0)


@triton.jit
def _read_blocks(X, Out, n_blocks, BLOCK: tl.constexpr):
    """Sum of blocks pid, pid + programs, … of X (BLOCK elements each): every byte read once."""
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    block = X + pid * BLOCK + tl.arange(0, BLOCK)  # pointers advance: no 32-bit element offset overflows
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for _ in range(pid, n_blocks, programs):
        acc += tl.load(block).to(tl.float32)
        block += programs * BLOCK
    tl.store(Out + pid, tl.sum(acc, 0))


@triton.jit
def _read_pages(KeyCache, ValueCache, BlockTables, ContextLens, Out,
                stride_kcb, stride_kcs, stride_kch, stride_vcb, stride_vcs, stride_vch, stride_btb, NUM_SPLITS,
                PAGE_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, HEADS: tl.constexpr, BLOCK_N: tl.constexpr):
    """Sum of one (sequence, HEADS kv heads, split)'s K and V rows, found through the block table
    as the decode's split kernel finds them (the same split bounds, page numbers one tile ahead):
    the decode's reads with no arithmetic. HEADS = 1 reads as the decode does, one kv head a program
    (256-byte pieces of each slot at bf16, d=128); HEADS = every kv head reads whole slots."""
    # axis 0: sequence; axis 1: group of HEADS kv heads; axis 2: split of the context
    b = tl.program_id(0)
    group = tl.program_id(1)
    split = tl.program_id(2)
    ctx = tl.load(ContextLens + b)
    tiles = tl.cdiv(ctx, BLOCK_N)
    k_start = tl.cdiv(split * tiles, NUM_SPLITS) * BLOCK_N
    k_end = tl.minimum(tl.cdiv((split + 1) * tiles, NUM_SPLITS) * BLOCK_N, ctx)
    offs_n = tl.arange(0, BLOCK_N)
    cols = tl.arange(0, HEADS * HEAD_DIM)  # column c: kv head group·HEADS + c // HEAD_DIM, dim c % HEAD_DIM
    head = (group * HEADS + cols // HEAD_DIM).to(tl.int64)
    k_cols = (head * stride_kch + cols % HEAD_DIM)[None, :]
    v_cols = (head * stride_vch + cols % HEAD_DIM)[None, :]
    table = BlockTables + b.to(tl.int64) * stride_btb
    first = k_start + offs_n
    page_next = tl.load(table + first // PAGE_SIZE, mask=first < k_end, other=0)
    acc = tl.zeros([HEADS * HEAD_DIM], dtype=tl.float32)
    for start_n in range(k_start, k_end, BLOCK_N):
        n = start_n + offs_n
        valid = (n < k_end)[:, None]
        page = page_next.to(tl.int64)
        ahead = n + BLOCK_N
        page_next = tl.load(table + ahead // PAGE_SIZE, mask=ahead < k_end, other=0)
        in_page = (n % PAGE_SIZE).to(tl.int64)
        k = tl.load(KeyCache + (page * stride_kcb + in_page * stride_kcs)[:, None] + k_cols, mask=valid, other=0.0)
        v = tl.load(ValueCache + (page * stride_vcb + in_page * stride_vcs)[:, None] + v_cols, mask=valid, other=0.0)
        acc += tl.sum(k.to(tl.float32) + v.to(tl.float32), 0)
    tl.store(Out + (b * tl.num_programs(1) + group) * NUM_SPLITS + split, tl.sum(acc, 0))


# The read kernel's configurations: programs per SM, elements a block, warps, stages.
READ_PROGRAMS_PER_SM = (1, 2, 4, 8, 16)
READ_TILES = tuple((block, warps, stages) for block in (2048, 8192) for warps in (4, 8) for stages in (1, 3))
# The paged reader's: (kv heads a program, splits a sequence, keys a tile, warps, stages). One kv
# head a program as the decode reads; every kv head (4 at issue 15's h28/4) in smaller tiles, whose
# loads are 4x as wide.
PAGED_READ_CONFIGS = (
    tuple((1, splits, block_n, warps, stages) for splits in (32, 64, 128, 256) for block_n in (32, 64, 128)
          for warps in (2, 4) for stages in (2, 3, 4))
    + tuple((4, splits, block_n, warps, stages) for splits in (64, 128, 256, 512) for block_n in (16, 32)
            for warps in (4, 8) for stages in (2, 3))
)
# Issue 15's batch-1 grid: (batch, context).
DECODE_GRID = tuple((b, ctx) for b in (1, 2, 4) for ctx in (32768, 65536, 131072))


def _best_graph_us(fn) -> float:
    return best_graph_us(fn, ROUNDS)


def floors(device: torch.device) -> dict:
    scratch = torch.zeros(4096, device=device, dtype=torch.float32)

    def launches(*grids):
        def call():
            for grid in grids:
                _one_store_a_program[(grid,)](scratch)
        return call

    rows = {f"{n} program{'s' if n > 1 else ''}": _best_graph_us(launches(n)) for n in (1, 256, 1024)}
    rows["two launches, 256 then 28 programs"] = _best_graph_us(launches(256, 28))
    return rows


def plan_call(problem, x, device: torch.device, config: dict | None = None):
    """A plan for problem over its inputs x as users make one (the config the tables give, unless
    config) and a call of it."""
    from omnitune.kernels import paged_decode_attention as pda

    plan = pda.PagedDecodePlan(batch=problem.b, num_heads=HEADS, num_kv_heads=KV_HEADS, head_dim=HEAD_DIM,
                               block_size=PAGE, max_blocks=x.block_tables.shape[1], max_context_len=problem.ctx,
                               dtype=torch.bfloat16, device=device, config=config)

    def call():
        return plan.run(x.q, x.key_cache, x.value_cache, x.block_tables, x.context_lens, check=False)

    return plan, call


def decode_call(batch: int, context: int, device: torch.device):
    """Issue 15's problem at batch × context (bf16, h28/4, d=128, pages of 16): the problem, its
    inputs, and plan_call's plan and call."""
    from omnitune.kernels import paged_decode_attention as pda

    problem = pda.PagedDecodeProblem(b=batch, h=HEADS, hkv=KV_HEADS, lq=1, ctx=context, d=HEAD_DIM, block_size=PAGE)
    x = pda.SPEC.make_inputs(problem, torch.bfloat16, device, seed=0)
    return (problem, x, *plan_call(problem, x, device))


def bytes_moved(problem) -> float:
    """The byte model's bytes of a bf16 problem."""
    from omnitune.kernels import paged_decode_attention as pda

    return pda.SPEC.bytes_moved(problem, torch.bfloat16)


def at_copy_us(moved: float, copy_tbps: float) -> float:
    """µs to move `moved` bytes at copy speed."""
    return moved / (copy_tbps * 1e12) * 1e6


def full_and_empty_us(call, context_lens: torch.Tensor) -> tuple[float, float]:
    """The call's graph µs over its contexts, then over contexts of length 0 (restored after)."""
    full = _best_graph_us(call)
    lengths = context_lens.clone()
    context_lens.zero_()
    empty = _best_graph_us(call)
    context_lens.copy_(lengths)
    return full, empty


def decode_calls(device: torch.device, copy_tbps: float) -> dict:
    problem, x, plan, call = decode_call(1, CONTEXT, device)
    moved = bytes_moved(problem)
    at_copy = at_copy_us(moved, copy_tbps)
    full, empty = full_and_empty_us(call, x.context_lens)
    flat = torch.randn(int(moved) // 2, device=device, dtype=torch.bfloat16)
    target = torch.empty_like(flat)
    return {"config": dict(plan.config), "bytes": moved, "bytes_at_copy_us": at_copy, "call_us": full,
            "call_pct_of_copy": 100 * at_copy / full, "empty_context_call_us": empty,
            "copy_same_bytes_us": _best_graph_us(lambda: target.copy_(flat)),
            "fixed_cost_allowed_for_85pct_us": at_copy / 0.85 - at_copy}


def kv_elements(batch: int, context: int, device: torch.device) -> torch.Tensor:
    """Random bf16 elements, as many as the K and V of issue 15's problem at batch × context: the
    contiguous read's input. Not the byte model's count, which also holds the query, the output and
    the block table, a few thousand elements that would leave the reader a tail no tile covers."""
    return torch.randn(2 * batch * KV_HEADS * context * HEAD_DIM, device=device, dtype=torch.bfloat16)


def read_sum_checked(flat: torch.Tensor, programs: int, block: int, warps: int, stages: int,
                     want: torch.Tensor | None = None):
    """A call that reads every element of flat once (its length a multiple of block) with the read
    kernel, and that call's result checked against torch's sum (want, when the caller has it for
    many configs): a reader that skipped bytes would set a floor no decode has."""
    if flat.numel() % block:
        raise ValueError(f"the read kernel takes whole tiles: {flat.numel()} elements is not a multiple of {block}")
    partial = torch.empty(programs, device=flat.device, dtype=torch.float32)
    n_blocks = flat.numel() // block

    def call():
        _read_blocks[(programs,)](flat, partial, n_blocks, BLOCK=block, num_warps=warps, num_stages=stages)

    call()
    if want is None:
        want = flat.sum(dtype=torch.float32)
    got = partial.sum()
    if not torch.allclose(got, want, rtol=1e-3, atol=1e-3 * flat.numel() ** 0.5):
        raise AssertionError(f"read kernel sums {got.item()} where torch sums {want.item()}")
    return call


def read_floor(flat: torch.Tensor, sms: int) -> dict:
    """The fastest graph-replayed read of flat over READ_PROGRAMS_PER_SM × READ_TILES."""
    best = None
    want = flat.sum(dtype=torch.float32)  # once, not per config
    for per_sm in READ_PROGRAMS_PER_SM:
        for block, warps, stages in READ_TILES:
            us = _best_graph_us(read_sum_checked(flat, per_sm * sms, block, warps, stages, want))
            if best is None or us < best["us"]:
                best = {"us": us, "programs": per_sm * sms, "BLOCK": block, "num_warps": warps, "num_stages": stages}
    return best


def paged_context_sum(x) -> tuple[torch.Tensor, int]:
    """torch's float64 sum of the K and V elements of every sequence's context in paged decode
    inputs x, and how many elements that is."""
    from omnitune.kernels import paged_decode_attention as pda

    want = torch.zeros((), dtype=torch.float64, device=x.key_cache.device)
    elements = 0
    for seq in range(x.block_tables.shape[0]):
        ctx = int(x.context_lens[seq])
        for cache in (x.key_cache, x.value_cache):
            rows = pda.gather_context(cache, x.block_tables[seq], ctx)
            want += rows.double().sum()
            elements += rows.numel()
    return want, elements


def paged_read_checked(x, heads: int, splits: int, block_n: int, warps: int, stages: int,
                       want: tuple[torch.Tensor, int] | None = None):
    """A call that reads the K and V rows of every sequence's context in paged decode inputs x
    through their block table (_read_pages, `heads` kv heads a program), checked first against
    torch's sum of the same rows (paged_context_sum(x), or want when the caller has it)."""
    kc, vc = x.key_cache, x.value_cache
    if kc.stride(3) != 1 or vc.stride(3) != 1:
        raise ValueError("the paged reader takes caches whose head dimension is contiguous")
    batch, page, kv_heads, head_dim = x.block_tables.shape[0], kc.shape[1], kc.shape[2], kc.shape[3]
    if kv_heads % heads:
        raise ValueError(f"{heads} kv heads a program do not divide {kv_heads}")
    groups = kv_heads // heads
    partial = torch.empty(batch * groups * splits, device=kc.device, dtype=torch.float32)

    def call():
        _read_pages[(batch, groups, splits)](
            kc, vc, x.block_tables, x.context_lens, partial, kc.stride(0), kc.stride(1), kc.stride(2),
            vc.stride(0), vc.stride(1), vc.stride(2), x.block_tables.stride(0), splits,
            PAGE_SIZE=page, HEAD_DIM=head_dim, HEADS=heads, BLOCK_N=block_n, num_warps=warps, num_stages=stages)

    call()
    total, elements = paged_context_sum(x) if want is None else want
    got = partial.double().sum()
    if not torch.allclose(got, total, rtol=1e-3, atol=1e-3 * elements ** 0.5):
        raise AssertionError(f"paged reader sums {got.item()} where torch sums {total.item()}")
    return call


def paged_read_floors(x) -> dict:
    """The fastest graph-replayed paged read of x over PAGED_READ_CONFIGS, per kv heads a program."""
    best = {}
    want = paged_context_sum(x)  # once, not per config
    for heads, splits, block_n, warps, stages in PAGED_READ_CONFIGS:
        us = _best_graph_us(paged_read_checked(x, heads, splits, block_n, warps, stages, want))
        key = f"{heads} kv head{'s' if heads > 1 else ''} a program"
        if key not in best or us < best[key]["us"]:
            best[key] = {"us": us, "NUM_SPLITS": splits, "BLOCK_N": block_n, "num_warps": warps, "num_stages": stages}
    return best


def paged_reads(device: torch.device, copy_tbps: float) -> dict:
    """At b1 32k: what reading the cache through its pages costs, and what the pages' scatter costs.
    The library's call and the paged reader's floor over the inputs as drawn (each sequence's pages
    at random in the cache) and with each table row sorted (its pages in ascending order, so
    consecutive tiles lie mostly at consecutive addresses), beside the read floor of as many
    contiguous bytes."""
    problem, x, plan, call = decode_call(1, CONTEXT, device)
    at_copy = at_copy_us(bytes_moved(problem), copy_tbps)
    out = {"config": dict(plan.config), "bytes_at_copy_us": at_copy}

    def timed(order: str) -> None:
        library = _best_graph_us(call)
        floors_us = paged_read_floors(x)
        for floor in floors_us.values():
            floor["pct_of_copy"] = 100 * at_copy / floor["us"]
        out[order] = {"library_call_us": library, "library_pct_of_copy": 100 * at_copy / library,
                      "paged_read_floors": floors_us}
        print(f"b1 32k, pages {order}: library {library:.1f} µs ({100 * at_copy / library:.0f}% of copy); paged read, "
              + "; ".join(f"{key}: {f['us']:.1f} µs ({f['pct_of_copy']:.0f}%, {f})" for key, f in floors_us.items()),
              flush=True)

    timed("random")
    want = call().clone()
    # The same pages in ascending order: the cache's rows move with them, so the output stays.
    random_table = x.block_tables[0].long()
    sorted_table = random_table.sort().values
    for cache in (x.key_cache, x.value_cache):
        cache[sorted_table] = cache[random_table].clone()
    x.block_tables[0] = sorted_table
    if not torch.equal(call(), want):
        raise AssertionError("the library's output changed when the pages were sorted")
    timed("sorted")
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    contiguous = read_floor(kv_elements(1, CONTEXT, device), sms)
    out["contiguous_read_floor"] = contiguous
    out["contiguous_read_pct_of_copy"] = 100 * at_copy / contiguous["us"]
    print(f"b1 32k, the same bytes contiguous: read {contiguous['us']:.1f} µs "
          f"({out['contiguous_read_pct_of_copy']:.0f}%)", flush=True)
    return out


def same_output_as_before(out: torch.Tensor, path: Path) -> bool | None:
    """Whether out equals, bit for bit, the output an earlier run saved at path (None: there was
    none, and out is saved there for a later run). A kernel variant that changes no arithmetic,
    timed against the kernel as committed in another process, must give the same bits."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(out.cpu(), path)
        return None
    return torch.equal(torch.load(path), out.cpu())


def grid_calls(device: torch.device, copy_tbps: float, second_launch_us: float | None,
               shapes=DECODE_GRID, outputs: Path | None = None) -> list[dict]:
    """Per (batch, context) of shapes: the library's call and, unless second_launch_us is None, the
    read floor of its K and V bytes. With outputs, each call's output is saved there, or compared
    bit for bit with what an earlier run saved (same_output_as_before)."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    rows = []
    for batch, context in shapes:
        problem, x, plan, call = decode_call(batch, context, device)
        moved = bytes_moved(problem)
        at_copy = at_copy_us(moved, copy_tbps)
        call_us = _best_graph_us(call)
        row = {"batch": batch, "context": context, "bytes": moved, "bytes_at_copy_us": at_copy,
               "library_call_us": call_us, "library_pct_of_copy": 100 * at_copy / call_us,
               "library_config": dict(plan.config)}
        line = f"b{batch} {context // 1024}k: library {call_us:.1f} µs ({row['library_pct_of_copy']:.0f}% of copy)"
        if outputs is not None:
            same = same_output_as_before(call(), outputs / f"b{batch}_{context}.pt")
            row["output_same_as_before"] = same
            line += {None: ", output saved", True: ", output as before", False: ", OUTPUT DIFFERS FROM BEFORE"}[same]
        del x, call
        if second_launch_us is not None:
            flat = kv_elements(batch, context, device)
            floor = read_floor(flat, sms)
            del flat
            row.update(read_floor=floor, read_floor_pct_of_copy=100 * at_copy / floor["us"],
                       two_launch_ceiling_pct_of_copy=100 * at_copy / (floor["us"] + second_launch_us))
            line += (f", a read of its K and V {floor['us']:.1f} µs ({row['read_floor_pct_of_copy']:.0f}%; {floor}), "
                     f"with a second launch at most {row['two_launch_ceiling_pct_of_copy']:.0f}%")
        rows.append(row)
        print(line, flush=True)
        torch.cuda.empty_cache()
    return rows


# The b1 32k call's fixed cost against its form: the table's tile at other split counts, and the
# splits combined in the same launch (FUSED_REDUCE: one launch, the last split of a head combines).
# The last three trade the table tile's pipeline for programs: smaller tiles, more splits, fewer warps,
# so more programs share an SM (the read floor's fastest reader ran 16 programs an SM).
FIXED_COST_FORMS = ({"FUSED_REDUCE": True}, {"NUM_SPLITS": 16}, {"NUM_SPLITS": 32}, {"NUM_SPLITS": 128},
                    {"NUM_SPLITS": 32, "FUSED_REDUCE": True}, {"NUM_SPLITS": 128, "FUSED_REDUCE": True},
                    {"BLOCK_N": 32, "NUM_SPLITS": 128}, {"BLOCK_N": 32, "num_warps": 2, "NUM_SPLITS": 128},
                    {"BLOCK_N": 16, "num_warps": 1, "num_stages": 4, "NUM_SPLITS": 128})


def fixed_cost_forms(device: torch.device, copy_tbps: float) -> list[dict]:
    """PagedDecodePlan.run at b1 32k over full and empty contexts, the table's config and each of
    FIXED_COST_FORMS applied to it; every output checked against the table config's first."""
    from omnitune.tensors import relative_error

    problem, x, plan, call = decode_call(1, CONTEXT, device)
    at_copy = at_copy_us(bytes_moved(problem), copy_tbps)
    want = call().clone()
    rows = []
    for change in ({}, *FIXED_COST_FORMS):
        config = {**plan.config, **change}
        _, run = plan_call(problem, x, device, config)
        error = relative_error(run(), want)
        full, empty = full_and_empty_us(run, x.context_lens)
        row = {"change": change, "config": config, "rel_diff_to_table_config": error, "call_us": full,
               "call_pct_of_copy": 100 * at_copy / full, "empty_context_call_us": empty}
        rows.append(row)
        print(f"b1 32k {change or 'table config'}: {full:.1f} µs ({row['call_pct_of_copy']:.0f}% of copy), "
              f"over empty contexts {empty:.1f}, rel. diff {error:.1e}", flush=True)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--outputs", type=Path,
                        help="with --grid: save each call's output in this folder, or, where an earlier run "
                             "saved one, check the new one is the same bit for bit (a kernel variant's check)")
    parser.add_argument("--read", action="store_true",
                        help="also the read floors and the library's call over issue 15's batch × context grid")
    parser.add_argument("--grid", action="store_true",
                        help="also the library's call alone over issue 15's grid and batch 64 × 4k (no read floors)")
    parser.add_argument("--paged", action="store_true",
                        help="also the b1 32k cache read through its block table, pages as drawn and sorted")
    parser.add_argument("--forms", action="store_true",
                        help="also the b1 32k call's fixed cost at other split counts and with the in-launch combine")
    args = parser.parse_args(argv)
    device = torch.device("cuda")
    copy_tbps, report = copy_bandwidth_report(device)
    report["floors_us"] = floors(device)
    for name, us in report["floors_us"].items():
        print(f"{name}: {us:.2f} µs a call", flush=True)
    report["paged_decode_b1_32k"] = decode = decode_calls(device, copy_tbps)
    print(f"b1 32k: call {decode['call_us']:.1f} µs ({decode['call_pct_of_copy']:.0f}% of copy), over empty contexts "
          f"{decode['empty_context_call_us']:.1f}, the bytes at copy speed {decode['bytes_at_copy_us']:.1f}, a copy "
          f"of them {decode['copy_same_bytes_us']:.1f}; 85% allows {decode['fixed_cost_allowed_for_85pct_us']:.1f} µs "
          "of fixed cost", flush=True)
    if args.read:
        floors_us = report["floors_us"]
        second_launch_us = floors_us["two launches, 256 then 28 programs"] - floors_us["256 programs"]
        report["second_launch_us"] = second_launch_us
        report["read_floors"] = grid_calls(device, copy_tbps, second_launch_us)
    if args.grid:
        report["library_calls"] = grid_calls(device, copy_tbps, None, DECODE_GRID + ((64, 4096),), args.outputs)
    if args.forms:
        report["b1_32k_forms"] = fixed_cost_forms(device, copy_tbps)
    if args.paged:
        report["b1_32k_paged_reads"] = paged_reads(device, copy_tbps)
    report["triton"] = triton.__version__
    args.out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

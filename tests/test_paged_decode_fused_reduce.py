"""Paged decode attention with the splits combined inside the split launch (FUSED_REDUCE: the
last split of each (sequence, head column) to finish reduces them, through a self-resetting
ticket): against position-by-position attention in float64, on ragged batches — odd page counts,
partial last pages, contexts of exactly Lq tokens, more splits than pages (empty splits) — with
GQA ratios 1, 4 and 7, packed and not, Lq 1 and 3; and the tickets left at zero for the next call.
Under the interpreter on the CPU (fp32, fp16), on the GPU when there is one."""

from __future__ import annotations

import math

import pytest
import torch

from omnitune.kernels import paged_decode_attention as pda
from omnitune.kernels.paged_decode_attention import paged_decode_attention
from omnitune.spec import Config, relative_error
from test_paged_decode_attention import TOL, _naive, _paged_case


def _config(splits, pack, fused=True, block_n=16):
    return Config(NUM_SPLITS=splits, BLOCK_N=block_n, num_warps=2, num_stages=1, PACK_GQA=pack,
                  FUSED_REDUCE=fused)


@pytest.mark.parametrize(
    "h,hkv,lq,splits,pack,dtype",
    [
        (4, 1, 1, 2, True, torch.float32),   # GQA 4 packed: one program column per kv head
        (7, 1, 3, 4, True, torch.float16),   # GQA 7, 21 packed rows in a 32-row tile
        (7, 1, 3, 3, False, torch.float32),  # GQA 7 unpacked, a split count that is not a power of two
        (2, 2, 1, 8, False, torch.float16),  # no GQA; 8 splits: more than the short contexts' pages
        (8, 2, 1, 16, True, torch.float32),  # 16 splits of 16 keys over at most 3 pages: most empty
    ],
    ids=lambda v: str(v).replace("torch.", "") if isinstance(v, torch.dtype) else None,
)
def test_fused_reduce_matches_naive_attention_over_ragged_pages(h, hkv, lq, splits, pack, dtype, device):
    # 37 = 4·8 + 5 (odd page count, partial last page), 8 (one full page), 19 = 2·8 + 3, and Lq.
    lens = [37, 8, 19, lq]
    q, kc, vc, tables, ctx = _paged_case(lens, h, hkv, lq, 32, 8, dtype, device, seed=splits)
    want = _naive(q, kc, vc, tables, ctx, 1 / math.sqrt(32))
    out = paged_decode_attention(q, kc, vc, tables, ctx, config=_config(splits, pack))
    assert out.shape == q.shape and out.dtype == dtype
    assert relative_error(out.cpu(), want) <= TOL[dtype]


def test_fused_and_separate_reductions_agree_and_tickets_reset(device):
    # Several calls in a row with different split counts and head columns share the ticket buffer:
    # each must find its tickets at zero, so every output must match.
    q, kc, vc, tables, ctx = _paged_case([45, 30], 8, 2, 2, 32, 8, torch.float32, device, seed=5)
    want = _naive(q, kc, vc, tables, ctx, 1 / math.sqrt(32))
    for splits, pack in ((2, True), (3, False), (4, True), (2, False)):
        fused = paged_decode_attention(q, kc, vc, tables, ctx, config=_config(splits, pack))
        separate = paged_decode_attention(q, kc, vc, tables, ctx, config=_config(splits, pack, fused=False))
        assert relative_error(fused.cpu(), want) <= TOL[torch.float32], (splits, pack)
        assert relative_error(fused.cpu(), separate.cpu()) <= 1e-6, (splits, pack)
    tickets = [t for (dev, _), t in pda._tickets.items() if dev == str(q.device)]
    assert tickets and all(int(t.abs().sum()) == 0 for t in tickets)


def test_fused_reduce_with_a_tile_spanning_pages(device):
    # BLOCK_N = 32 keys over pages of 4: each tile gathers eight pages; 5 splits of a 70-token
    # context leave the last split partial.
    q, kc, vc, tables, ctx = _paged_case([70, 33], 4, 2, 1, 64, 4, torch.float32, device, seed=7)
    out = paged_decode_attention(q, kc, vc, tables, ctx, config=_config(3, True, block_n=32))
    assert relative_error(out.cpu(), _naive(q, kc, vc, tables, ctx, 1 / math.sqrt(64))) <= TOL[torch.float32]


@pytest.mark.gpu
@pytest.mark.parametrize("shape,splits", [
    ("b=4,h=32,hkv=4,lq=1,ctx=16384,d=128,block_size=16", (16, 32, 64, 128)),
    ("b=64,h=28,hkv=4,lq=1,ctx=4096,d=128,block_size=16", (2, 4, 8)),
    ("b=3,h=28,hkv=4,lq=4,ctx=1000,d=128,block_size=16", (2, 4, 8)),
])
def test_gpu_fused_reduce_on_issue_shapes(shape, splits):
    from omnitune.measure.runner import Runner
    from omnitune.trial import TrialStatus

    problem = pda.SPEC.parse_shape(shape)
    runner = Runner(pda.SPEC, problem, torch.bfloat16)
    for s in splits:
        for block_n in (64, 128):
            cfg = Config(NUM_SPLITS=s, BLOCK_N=block_n, num_warps=4, num_stages=2, PACK_GQA=True, FUSED_REDUCE=True)
            if pda.SPEC.violations(problem, cfg, torch.bfloat16):
                continue
            result = runner.measure(cfg)
            assert result.status is TrialStatus.OK, (cfg.label(), result.detail)


@pytest.mark.gpu
def test_gpu_tickets_reset_between_launches_and_under_a_graph():
    # Back-to-back launches of different split counts on one stream, then a CUDA graph replayed
    # twice: every output must match, which needs every ticket back at 0 after each launch.
    q, kc, vc, tables, ctx = _paged_case([300, 517, 64], 8, 2, 1, 128, 16, torch.float16, "cuda", seed=9)
    want = _naive(q, kc, vc, tables, ctx, 1 / math.sqrt(128))
    for splits in (2, 8, 4, 8):
        out = paged_decode_attention(q, kc, vc, tables, ctx, config=_config(splits, True, block_n=32))
        assert relative_error(out.cpu(), want) <= TOL[torch.float16], splits
    # Under capture only the launch (the public function's input checks read values back).
    inputs = pda.PagedDecodeInputs(q, kc, vc, tables, ctx, 1 / math.sqrt(128))
    out = torch.empty_like(q)
    cfg = _config(4, True, block_n=32)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        pda.launch(inputs, out, cfg)  # warm-up: compiles, and makes this stream's tickets outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        pda.launch(inputs, out, cfg)
    for _ in range(2):
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert relative_error(out.cpu(), want) <= TOL[torch.float16]

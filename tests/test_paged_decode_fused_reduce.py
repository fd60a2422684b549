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


def test_default_config_fuses_whenever_it_splits():
    for shape in ("b=4,h=32,hkv=4,lq=1,ctx=16384,d=128", "b=64,h=28,hkv=4,lq=1,ctx=4096,d=128",
                  "b=1,h=4,hkv=1,lq=1,ctx=600,d=64", "b=3,h=2,hkv=2,lq=1,ctx=1,d=32"):
        cfg = pda.SPEC.default_config(pda.SPEC.parse_shape(shape), torch.bfloat16)
        assert bool(cfg["FUSED_REDUCE"]) == (int(cfg["NUM_SPLITS"]) > 1), (shape, cfg)

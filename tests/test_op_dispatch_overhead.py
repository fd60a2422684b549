"""benchmarks/op_dispatch_overhead.py under the interpreter: each op called three ways (public,
the registered function, through the dispatcher), every way timed, and the registered function
found whichever way the op was registered."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

overhead = pytest.importorskip("op_dispatch_overhead")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the tiny shape is the CPU's; the device runs the real one")
def test_each_op_is_timed_three_ways(tmp_path):
    out = tmp_path / "overhead.json"
    assert overhead.main(["--calls", "2", "--repeats", "1", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["registration"] == "LibraryOp"
    assert [row["op"] for row in result["rows"]] == ["write_kv_cache", "paged_decode_attention"]
    for row in result["rows"]:
        assert all(row[f"{way}_us"] > 0 for way in ("public", "function", "op"))
        assert row["op_minus_function_us"] == pytest.approx(row["op_us"] - row["function_us"])


def test_the_three_ways_give_the_same_decode_after_the_same_write():
    ways = overhead.calls(b=2, h=2, hkv=1, d=16, block_size=4, ctx=7, device="cpu", dtype=torch.float32)
    outputs = []
    for way in ("public", "function", "op"):
        ways["write_kv_cache"][way]()  # the same K and V into the same slots each time
        outputs.append(ways["paged_decode_attention"][way]())
    assert torch.isfinite(outputs[0]).all()
    assert torch.equal(outputs[0], outputs[1]) and torch.equal(outputs[1], outputs[2])

"""benchmarks/compiled_decode_loop.py on its tiny shape under Triton's interpreter: a compiled decode
loop whose longest context grows a token a step compiles one graph a bucket of lengths (plus the
first, before Dynamo makes the length dynamic), its outputs equal the eager loop's, and ours equal
PyTorch's; a step that cannot be compiled is a row saying so, not an exception."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

loop = pytest.importorskip("compiled_decode_loop")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the tiny shape is the CPU's; the device runs the real one")
def test_the_tiny_loop_compiles_once_a_bucket_and_matches_eager_and_pytorch(tmp_path):
    out = tmp_path / "loop.json"
    assert loop.main(["--tiny", "--backend", "aot_eager", "--steps", "14", "--repeats", "1", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    ours, theirs = result["rows"]
    assert (ours["impl"], theirs["impl"]) == ("omnitune", "pytorch")
    assert 2 <= result["length_buckets"] and ours["graphs"] <= result["length_buckets"] + 1, result
    assert ours["max_rel_err_compiled_vs_eager"] < 1e-6 and theirs["max_rel_err_compiled_vs_eager"] < 1e-6
    assert ours["max_rel_err_vs_pytorch"] < 1e-5 and "max_rel_err_vs_pytorch" not in theirs


def test_each_half_of_the_step_compiles_alone_and_matches_pytorchs_half(tmp_path):
    out, prof = tmp_path / "halves.json", tmp_path / "prof"
    assert loop.main(["--tiny", "--backend", "eager", "--steps", "3", "--repeats", "1", "--impls",
                      "omnitune_write,pytorch_write,omnitune_decode,pytorch_decode", "--profile", str(prof),
                      "--out", str(out)]) == 0
    rows = {row["impl"]: row for row in json.loads(out.read_text())["rows"]}
    assert set(rows) == {"omnitune_write", "pytorch_write", "omnitune_decode", "pytorch_decode"}
    assert rows["omnitune_write"]["max_rel_err_vs_pytorch"] == 0.0  # the same rows written, bit for bit
    assert rows["omnitune_decode"]["max_rel_err_vs_pytorch"] < 1e-5
    written = {p.name for p in prof.iterdir()}
    assert written == {f"{impl}_{mode}.txt" for impl in rows for mode in ("uncompiled", "eager")}
    assert "Self CPU" in (prof / "omnitune_decode_eager.txt").read_text()


def test_an_unknown_step_is_one_clear_line(capsys):
    with pytest.raises(SystemExit):
        loop.main(["--tiny", "--impls", "omnitune,ours"])
    assert "unknown step 'ours'" in capsys.readouterr().err


def test_a_step_that_cannot_be_compiled_is_a_row_saying_so():
    caches, table, steps_in = loop.loop_inputs(1, 2, 1, 64, 8, 9, 2, torch.float32, "cpu")

    def breaks_fullgraph(q, *rest):
        print("a graph break")  # fullgraph=True refuses it
        return q

    row = loop.measure("breaks", breaks_fullgraph, "aot_eager", caches, table, steps_in, lambda: None)
    assert row["compiled"].startswith("failed: ") and "graphs" not in row

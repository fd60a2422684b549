"""Inputs the CLI used to take without a word, or to answer with a traceback, checked through the
real command line: a --seed numpy cannot take, a --shape that names a dimension twice (itself or
through an alias), and a --json report whose write fails halfway over a good one."""

from __future__ import annotations

import errno
import io
import json
import os
from pathlib import Path

import pytest
import torch
from conftest import assert_one_line_error, write_tuned_table
from typer.testing import CliRunner

from omnitune.cli import app
from omnitune.kernels.attention import SPEC as ATTENTION
from omnitune.kernels.attention import AttentionProblem

ON_GPU = torch.cuda.is_available()
# conftest imports the kernels interpreted without a GPU and compiled with one; --interpret must match.
MODE = [] if ON_GPU else ["--interpret"]
SHAPE = "t=37,hkv=2,d=64,block_size=16"  # kv_cache_write's: the quickest kernel to run interpreted
H200 = "NVIDIA H200"


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


# --- --seed: numpy's RandomState (Optuna's samplers) takes 0..2**32-1 only -------------------------


@pytest.mark.parametrize("command,seed", [
    ("search", "-5"), ("search", str(2**32)), ("worker", "-1"), ("worker", str(2**32)),
])
def test_a_seed_numpy_cannot_take_is_refused_like_any_bad_option(tmp_path, command, seed):
    args = [command, "kv_cache_write", "--shape", SHAPE, *MODE, "--dtype", "fp16", "--trials", "1",
            "--db", tmp_path / "omnitune.db", "--seed", seed]
    if command == "worker":
        args += ["--storage", f"sqlite:///{tmp_path / 'shared.db'}"]
    assert_one_line_error(invoke(*args), "Invalid value for '--seed'")


# --- --shape: a dimension given twice is the user's to settle, not the last one's to win -----------


@pytest.mark.parametrize("shape,message", [
    ("t=1024,hkv=2,d=128,block_size=16,t=4", "t given twice in the shape"),
    ("tokens=1024,hkv=2,d=128,block_size=16,t=4", "tokens and t both give t"),
])
def test_lookup_refuses_a_kv_cache_write_shape_that_names_a_dimension_twice(shape, message):
    result = invoke("lookup", "kv_cache_write", "--shape", shape, "--device", H200)
    assert_one_line_error(result, message)


@pytest.mark.parametrize("shape,message", [
    ("b=1,heads=4,h=8,hkv=4,lq=16,lk=16,d=64", "heads and h both give h"),
    ("b=1,h=4,hkv=4,l=33,lq=20,d=64", "l and lq both give lq"),
    ("b=1,h=4,hkv=4,lq=16,lk=16,d=64,lk=32", "lk given twice in the shape"),
])
def test_lookup_refuses_an_attention_shape_that_names_a_dimension_twice(shape, message):
    assert_one_line_error(invoke("lookup", "attention", "--shape", shape, "--device", H200), message)


@pytest.mark.parametrize("command", ["search", "bench"])
def test_search_and_bench_refuse_a_shape_that_names_a_dimension_twice(tmp_path, command):
    # The one parser behind every command: neither measures a problem the user did not mean.
    extra = ["--trials", "1", "--db", tmp_path / "omnitune.db"] if command == "search" else []
    result = invoke(command, "kv_cache_write", "--shape", SHAPE + ",d=32", *MODE, "--dtype", "fp16", *extra)
    assert_one_line_error(result, "d given twice in the shape")


def test_an_impossible_kv_compress_shape_names_only_the_value_that_is_wrong():
    shape = "b=2,h=4,hkv=2,n=64,d=32,window=8,recent=4,keep_pct=150"
    line = assert_one_line_error(invoke("lookup", "kv_compress", "--shape", shape, "--device", H200),
                                 "keep_pct must be ≤ 100, got 150")
    assert "recent" not in line  # recent=4 is fine


# --- --json: a failed write leaves the previous report whole ---------------------------------------


def fill_disk_under(folder: Path, monkeypatch) -> None:
    """Every text file opened for writing under `folder` takes half of what is written to it, then
    fails as a full disk does. Both Path.write_text and os.fdopen open through io.open."""
    real_open = io.open

    class HalfWritten:
        def __init__(self, file):
            self._file = file

        def write(self, text):
            self._file.write(text[: len(text) // 2])
            self._file.flush()
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        def __getattr__(self, name):
            return getattr(self._file, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc_info):
            self._file.close()

    def under_folder(file) -> bool:
        name = os.readlink(f"/proc/self/fd/{file}") if isinstance(file, int) else os.path.realpath(file)
        return Path(name).parent == folder.resolve()

    def opening(file, mode="r", *args, **kwargs):
        opened = real_open(file, mode, *args, **kwargs)
        return HalfWritten(opened) if "w" in mode and under_folder(file) else opened

    monkeypatch.setattr(io, "open", opening)


def assert_kept_whole(out: Path, before: bytes) -> None:
    assert out.read_bytes() == before
    json.loads(before)
    assert [p.name for p in out.parent.iterdir()] == [out.name]  # no temporary file left beside it


@pytest.mark.skipif(not hasattr(os, "readlink") or not Path("/proc/self/fd").is_dir(), reason="needs /proc")
def test_bench_json_whose_write_fails_keeps_the_previous_report(tmp_path, monkeypatch):
    out = tmp_path / "reports" / "bench.json"
    bench = ["bench", "kv_cache_write", "--shape", SHAPE, *MODE, "--dtype", "fp16", "--json", out]
    assert invoke(*bench).exit_code == 0
    before = out.read_bytes()

    fill_disk_under(out.parent, monkeypatch)
    assert_one_line_error(invoke(*bench), f"cannot write --json {out}")
    assert_kept_whole(out, before)


@pytest.mark.skipif(not hasattr(os, "readlink") or not Path("/proc/self/fd").is_dir(), reason="needs /proc")
def test_verify_json_whose_write_fails_keeps_the_previous_report(tmp_path, tables_dir, monkeypatch):
    # Another GPU's table: verify's quickest full report (compat fails, numerics skipped, exit 1).
    problem = AttentionProblem(b=1, h=2, hkv=1, lq=17, lk=23, d=64, causal=True)
    config = ATTENTION.default_config(problem, torch.float32).as_dict()
    write_tuned_table(tables_dir, ATTENTION, "NVIDIA B200", [(problem, "fp32", config)], time_ms=1.0)
    out = tmp_path / "reports" / "verify.json"
    verify = ["verify", "--tables", tables_dir, *MODE, "--json", out]
    assert invoke(*verify).exit_code in (0, 1)
    before = out.read_bytes()

    fill_disk_under(out.parent, monkeypatch)
    assert_one_line_error(invoke(*verify), f"cannot write --json {out}", after_progress=True)
    assert_kept_whole(out, before)

"""Input mistakes an audit found answered with no word, a wrong word, or a silent wrong reading:
a user's kernel module that calls sys.exit() at import, a folder named like a kernel file, a
dimension of too many digits, a --json path on a filesystem that only os.access thinks writable,
check="no" taken as check mode on, and a bool in an mm_spans list taken as 1.

CLI cases run the real command line on temporary files; op cases run small fp32 shapes on the CPU
(the interpreter) with the check mode on (conftest)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from conftest import DEVICE
from conftest import assert_one_line_error as _one_line_error
from typer.testing import CliRunner

from omnitune.cli import app
from omnitune.errors import InputError
from omnitune.kernels import _dispatch
from omnitune.kernels import attention as attention_module
from omnitune.kernels.attention import attention
from omnitune.kernels.kv_cache_write import write_kv_cache

ON_GPU = torch.cuda.is_available()
MODE = [] if ON_GPU else ["--interpret"]
SHAPE = "b=1,h=2,hkv=1,lq=17,lk=23,d=64,causal=1"


def assert_one_line_error(result, message: str) -> str:
    # The runtime's note that no table is tuned for a GPU may come before the error.
    return _one_line_error(result, message, after_progress=True)


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


# --- 1. a user's kernel module that calls sys.exit() while imported ------------------------------


@pytest.mark.parametrize("code", ["3", "0", "'bye'"])
def test_a_kernel_file_that_exits_at_import_is_one_line(code, tmp_path, monkeypatch):
    # Was: the CLI exited with the module's code (3, or 0 as if it had worked) and said nothing.
    monkeypatch.chdir(tmp_path)
    path = tmp_path / f"exits_{abs(hash(code))}.py"
    path.write_text(f"import sys\nsys.exit({code})\n")
    line = assert_one_line_error(invoke("lookup", path, "--shape", "a=1", "--device", "NVIDIA H200"), "SystemExit")
    assert f"cannot import kernel {str(path)!r}" in line


# --- 2. a folder named like a kernel file --------------------------------------------------------


def test_a_folder_named_like_a_kernel_file_is_called_a_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.py").mkdir()
    line = assert_one_line_error(invoke("lookup", "./x.py", "--shape", "a=1", "--device", "X"),
                                 "is a folder, not a kernel file")
    assert "does not exist" not in line
    # A path with nothing there still says so.
    assert_one_line_error(invoke("lookup", "./missing.py", "--shape", "a=1", "--device", "X"), "does not exist")


# --- 3. a dimension of too many digits -----------------------------------------------------------


@pytest.mark.parametrize("value", ["12345678901234567890123", "+" + "9" * 40, "-" + "1" * 25, "7" * 100_000])
def test_a_dimension_of_too_many_digits_is_called_too_large(value):
    shape = f"t={value},hkv=2,d=64,block_size=16"
    line = assert_one_line_error(invoke("lookup", "kv_cache_write", "--shape", shape, "--device", "X"), "too large")
    assert "ASCII digits" not in line and len(line) < 300


@pytest.mark.parametrize("value", ["1_0", "１６", "12a", "0x10", "1" * 30 + "_"])
def test_a_dimension_that_is_not_digits_is_still_called_so(value):
    shape = f"t={value},hkv=2,d=64,block_size=16"
    line = assert_one_line_error(invoke("lookup", "kv_cache_write", "--shape", shape, "--device", "X"),
                                 "not an integer written in ASCII digits")
    assert "too large" not in line


# --- 4. --json on a filesystem where os.access says yes but nothing can be made --------------------


@pytest.fixture
def bench_runs(monkeypatch) -> list:
    """The problems bench ran: none, where it refused first."""
    from omnitune.profile import bench

    ran = []
    monkeypatch.setattr(bench, "run_bench", lambda spec, problem, *a, **k: ran.append(problem) or [])
    return ran


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs /proc")
@pytest.mark.parametrize("target", ["/proc/x.json", "/proc/sub/x.json"])
def test_bench_json_under_proc_is_refused_before_the_bench_runs(target, bench_runs, monkeypatch):
    # os.access says yes to root under /proc; made to say yes here for any user, so that only a
    # real attempt to make a file can find out.
    from omnitune.cli import preflight

    monkeypatch.setattr(preflight.os, "access", lambda *a, **k: True)
    result = invoke("bench", "attention", "--shape", SHAPE, "--dtype", "fp32", *MODE, "--json", target)
    assert_one_line_error(result, "cannot create a file in /proc")
    assert bench_runs == []


def test_bench_json_in_a_writable_folder_still_runs_and_leaves_no_probe(tmp_path, bench_runs):
    target = tmp_path / "out" / "bench.json"
    (tmp_path / "out").mkdir()
    result = invoke("bench", "attention", "--shape", SHAPE, "--dtype", "fp32", *MODE, "--json", target)
    assert result.exit_code == 0, result.output
    assert len(bench_runs) == 1 and target.is_file()
    assert sorted(os.listdir(tmp_path / "out")) == ["bench.json"]


# --- 5. check= takes None, True, False (0/1), nothing else -----------------------------------------


def test_checking_reads_the_accepted_values(monkeypatch):
    monkeypatch.setenv(_dispatch.CHECK_ENV, "0")
    assert _dispatch.checking(None) is False
    assert [_dispatch.checking(v) for v in (True, False, 1, 0)] == [True, False, True, False]


@pytest.mark.parametrize("value, on", [("0", False), ("", False), ("false", False), (" Off ", False), ("NO", False),
                                       ("1", True), ("true", True), ("yes", True)])
def test_the_check_variable_reads_the_words_for_off_as_off(value, on, monkeypatch):
    monkeypatch.setenv(_dispatch.CHECK_ENV, value)  # OMNITUNE_CHECK=false turned the check mode on
    assert _dispatch.checking(None) is on
    monkeypatch.delenv(_dispatch.CHECK_ENV)
    assert _dispatch.checking(None) is False


@pytest.mark.parametrize("check", ["no", "false", "", 2, -1, 0.0, 1.0, [], torch.tensor(True)],
                         ids=repr)
def test_check_of_another_value_is_an_input_error_naming_check(check):
    with pytest.raises(InputError, match=r"^check must be None, True or False, got ") as caught:
        _dispatch.checking(check)
    assert "\n" not in str(caught.value) and len(str(caught.value)) < 200


def test_write_kv_cache_refuses_check_no_before_writing():
    # Was: check="no" is a non-empty string, so bool() switched the check mode ON.
    key, value = torch.randn(5, 2, 32, device=DEVICE), torch.randn(5, 2, 32, device=DEVICE)
    caches = torch.randn(2, 3, 4, 2, 32, device=DEVICE)
    before = caches.clone()
    slots = torch.tensor([0, 1, 2, 3, 4], device=DEVICE)
    with pytest.raises(InputError, match="check must be None, True or False, got 'no'"):
        write_kv_cache(key, value, caches[0], caches[1], slots, check="no")
    assert torch.equal(caches, before)
    write_kv_cache(key, value, caches[0], caches[1], slots, check=False)  # the accepted values still run
    write_kv_cache(key, value, caches[0], caches[1], slots, check=1)


# --- 6. a bool in an mm_spans list ----------------------------------------------------------------


@pytest.mark.parametrize("spans", [[[(True, 5)]], [[(0, 3), (False, 5)]], [[(torch.tensor(True), 5)]]], ids=str)
def test_a_bool_in_a_span_list_is_an_input_error(spans, monkeypatch):
    monkeypatch.setattr(attention_module, "_span_tensors", {})  # a miss: where lists are converted
    q, k, v = (torch.randn(1, 2, 8, 64, device=DEVICE) for _ in range(3))
    with pytest.raises(InputError, match="mm_spans must hold .* not booleans"):
        attention(q, k, v, causal=True, mm_spans=spans)
    # The same spans in ints are taken.
    ints = [[tuple(int(x) for x in pair) for pair in seq] for seq in spans]
    assert attention(q, k, v, causal=True, mm_spans=ints).shape == q.shape


# --- bench's dtype: as a search takes it --------------------------------------------------------


@pytest.mark.skipif(ON_GPU, reason="the interpreter's default: the CPU path")
def test_bench_under_the_interpreter_takes_fp16_unless_told():
    # Its default was bf16, which the interpreter refuses: `bench --interpret` failed unless given --dtype.
    result = invoke("bench", "kv_cache_write", "--shape", "t=37,hkv=2,d=64,block_size=16", "--interpret")
    assert result.exit_code == 0, result.output
    assert "t=37,hkv=2,d=64,block_size=16 fp16" in " ".join(result.output.split())
    refused = invoke("bench", "kv_cache_write", "--shape", "t=37,hkv=2,d=64,block_size=16", "--interpret",
                     "--dtype", "bf16")
    _one_line_error(refused, "computes bf16 wrongly")


# --- kernels: each example key on one line ----------------------------------------------------------


def test_kernels_prints_each_example_key_whole_on_its_line_however_narrow_the_terminal(monkeypatch):
    # A key longer than the terminal was moved whole onto the next line ("shape: --shape" alone).
    from omnitune.registry import get_spec

    monkeypatch.setenv("COLUMNS", "60")
    result = invoke("kernels")
    assert result.exit_code == 0, result.output
    lines = [line.strip() for line in result.output.splitlines() if line.strip().startswith("shape: --shape")]
    assert len(lines) >= 5
    for line in lines:
        key = line.removeprefix("shape: --shape").strip()
        assert key, result.output
        assert any(_parses(get_spec(name), key) for name in ("attention", "cross_attention_layer", "kv_cache_write",
                                                             "kv_compress", "paged_decode_attention"))


def _parses(spec, key: str) -> bool:
    try:
        return spec.problem_key(spec.parse_shape(key)) == key
    except Exception:  # noqa: BLE001 — another kernel's key
        return False


# --- a whole Config from the caller: launched as given, but never with a count below one ----------


@pytest.mark.parametrize("bad", [0, -2, 2.0, True, "4"], ids=repr)
def test_a_config_object_with_a_count_no_launch_takes_is_a_config_error(bad, device):
    from omnitune.errors import ConfigError
    from omnitune.kernels import paged_decode_attention as pda

    gen = torch.Generator().manual_seed(3)
    q = torch.randn(1, 2, 1, 32, generator=gen).to(device)
    kc, vc = (torch.randn(2, 8, 1, 32, generator=gen).to(device) for _ in range(2))
    tables = torch.tensor([[0, 1]], dtype=torch.int32, device=device)
    lens = torch.tensor([12], dtype=torch.int32, device=device)
    problem = pda.PagedDecodeProblem(b=1, h=2, hkv=1, lq=1, ctx=12, d=32, block_size=8)
    config = pda.SPEC.default_config(problem, torch.float32)
    # NUM_SPLITS=0 launched nothing and returned uninitialised memory
    with pytest.raises(ConfigError, match=r"^NUM_SPLITS=.*is a count, a positive integer"):
        pda.paged_decode_attention(q, kc, vc, tables, lens, config=config.replace(NUM_SPLITS=bad))
    # a count outside the tuned choices still runs as given (the kernels' tests drive them so)
    out = pda.paged_decode_attention(q, kc, vc, tables, lens, config=config.replace(NUM_SPLITS=3, FUSED_REDUCE=False))
    assert torch.isfinite(out).all()

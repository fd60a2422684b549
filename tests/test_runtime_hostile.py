"""omnitune.runtime against hostile tables and hostile problems: one regression test per case the
fuzzing found (issue 19). A lookup never raises over a table and never hangs; a caller's bad
problem is a clear InputError; no answer breaks a constraint of the problem asked."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import threading
from pathlib import Path

import pytest
import torch

import omnitune.runtime as runtime
from omnitune.errors import InputError, ShapeError
from omnitune.kernels.attention import SPEC, AttentionProblem
from omnitune.kernels.kv_cache_write import SPEC as KV_WRITE
from omnitune.kernels.kv_cache_write import KVCacheWriteProblem
from omnitune.profile.device import device_key
from omnitune.runtime import Rung, _tables
from omnitune.runtime._reading import MAX_TABLE_BYTES
from test_runtime import GPU, OTHER, PREFILL, TUNED, _document, _entry, _write

REPO_TABLES = Path(__file__).resolve().parents[1] / "tuned_configs"
H200 = "NVIDIA H200"
FAR = dataclasses.replace(PREFILL, lq=8192, lk=8192)  # a second, good entry, far from PREFILL


@pytest.fixture
def warnings_seen(caplog):
    caplog.set_level(logging.WARNING, logger="omnitune.runtime")
    return lambda: [r.getMessage() for r in caplog.records
                    if r.name == "omnitune.runtime" and r.levelno >= logging.WARNING]


def _finishes(call, seconds=20.0):
    """call() in a thread: its result, or a failure if it has not returned within `seconds`."""
    outcome = {}

    def run():
        try:
            outcome["value"] = call()
        except BaseException as exc:  # noqa: BLE001 — re-raised below, in the test's thread
            outcome["error"] = exc

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), f"still running after {seconds} s: it hangs"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def _with_raw_value(path_in_entry: tuple[str, str], raw: str) -> str:
    """A table of PREFILL (its value at path_in_entry replaced by the raw JSON text `raw`, e.g.
    Infinity or a 400-digit integer) and the good entry FAR."""
    key, bad = _entry(PREFILL, TUNED)
    bad[path_in_entry[0]][path_in_entry[1]] = "@@RAW@@"
    text = json.dumps(_document([(key, bad), _entry(FAR, OTHER)]), indent=2)
    return text.replace('"@@RAW@@"', raw)


# --- numbers no entry may hold ------------------------------------------------------------------

RAW_NUMBERS = ["Infinity", "-Infinity", "NaN", "1e999", "-1e999", "1" + "0" * 400, "-" + "9" * 5000, "64.0", "1e2"]
PATHS = [("config", "BLOCK_M"), ("config", "num_warps"), ("problem", "lq"), ("problem", "b")]


@pytest.mark.parametrize("raw", RAW_NUMBERS)
@pytest.mark.parametrize("where", PATHS, ids=".".join)
def test_a_non_finite_or_huge_number_skips_its_entry_only(tables_dir, warnings_seen, where, raw):
    _write(tables_dir, _with_raw_value(where, raw))
    good = runtime.lookup("attention", FAR, torch.float16, GPU)
    assert (good.rung, good.config) == (Rung.EXACT, OTHER)  # the rest of the file still serves
    bad = runtime.lookup("attention", PREFILL, torch.float16, GPU)
    assert bad.config != TUNED and not SPEC.violations(PREFILL, bad.config, torch.float16)
    seen = warnings_seen()
    assert len(seen) == 1 and "ignoring 1 of the 2 entries" in seen[0], seen


@pytest.mark.parametrize("raw", ["1" + "0" * 400, "-1" + "0" * 400, "Infinity", "NaN"])
def test_a_huge_merge_threshold_skips_its_entry(tables_dir, warnings_seen, raw):
    shipped = (REPO_TABLES / "kv_compress" / "NVIDIA_H200.json").read_text()
    (tables_dir / "kv_compress").mkdir()
    (tables_dir / "kv_compress" / "NVIDIA_H200.json").write_text(
        shipped.replace('"merge_threshold": 0.85', f'"merge_threshold": {raw}'))
    doc = json.loads(shipped)
    from omnitune.kernels.kv_compress import SPEC as COMPRESS

    problem = COMPRESS.problem_from_mapping(next(iter(doc["entries"].values()))["problem"])
    answer = runtime.lookup("kv_compress", problem, torch.bfloat16, H200)
    assert answer.rung is Rung.DEFAULT  # every entry (and predictor point) has the threshold: none serves
    entries = len(doc["entries"])
    assert any(f"ignoring {entries} of the {entries} entries" in w and "merge_threshold" in w for w in warnings_seen())


@pytest.mark.parametrize("raw", ["1.0", "1", "0", '"true"', "null"])
def test_a_flag_that_is_not_true_or_false_skips_its_entry(tables_dir, warnings_seen, raw):
    key, entry = _entry(PREFILL, TUNED)
    entry["config"]["USE_TMA"] = "@@RAW@@"
    _write(tables_dir, json.dumps(_document([(key, entry)])).replace('"@@RAW@@"', raw))
    answer = runtime.lookup("attention", PREFILL, torch.float16, GPU)
    assert answer.rung is Rung.DEFAULT  # neither read as False (1.0 once was) nor as True
    assert "USE_TMA" in warnings_seen()[0]


@pytest.mark.parametrize("odd", ["\nCRITICAL forged: all good\n", "\ud800"])
def test_a_bad_key_with_a_newline_or_a_lone_surrogate_stays_inside_its_one_warning_line(tables_dir, warnings_seen,
                                                                                          odd):
    """The warning's "to tune this shape" command was built from the first bad key's parts as
    they were: a newline in the key wrote lines of its own into the log (a forged record), a lone
    surrogate failed a UTF-8 log handler."""
    key, entry = _entry(PREFILL, TUNED)
    dtype_name, problem_key = key.split("|")
    _write(tables_dir, _document([(f"{dtype_name}|{odd}{problem_key}", entry), _entry(FAR, OTHER)]))
    assert runtime.lookup("attention", FAR, torch.float16, GPU).config == OTHER
    seen = warnings_seen()
    assert len(seen) == 1 and "ignoring 1 of the 2 entries" in seen[0], seen
    assert "\n" not in seen[0] and "CRITICAL forged" not in seen[0].replace(repr(odd)[1:-1], "")
    seen[0].encode("utf-8")  # no lone surrogate left to fail a handler


def test_many_bad_entries_are_one_warning(tables_dir, warnings_seen):
    entries = [_entry(FAR, OTHER)]
    for lq in range(1, 41):
        key, entry = _entry(dataclasses.replace(PREFILL, lq=lq, lk=lq), TUNED)
        entry["config"]["BLOCK_M"] = 7
        entries.append((key, entry))
    _write(tables_dir, _document(entries))
    for lq in (1, 5, 9):
        runtime.lookup("attention", dataclasses.replace(PREFILL, lq=lq, lk=lq), torch.float16, GPU)
    assert runtime.lookup("attention", FAR, torch.float16, GPU).config == OTHER
    seen = warnings_seen()
    assert len(seen) == 1, seen
    assert "ignoring 40 of the 41 entries" in seen[0] and "and 37 more" in seen[0]
    assert len(seen[0]) < 1500


# --- what can be at a table path ----------------------------------------------------------------


def _table_path(tables_dir: Path) -> Path:
    path = tables_dir / "attention" / f"{device_key(GPU)}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def test_a_fifo_at_the_table_path_does_not_hang(tables_dir, warnings_seen):
    os.mkfifo(_table_path(tables_dir))
    answer = _finishes(lambda: runtime.lookup("attention", PREFILL, torch.float16, GPU))
    assert answer.rung is Rung.DEFAULT
    assert "is not a regular file (it is a FIFO)" in warnings_seen()[0]


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero")
def test_a_symlink_to_dev_zero_is_not_read(tables_dir, warnings_seen):
    os.symlink("/dev/zero", _table_path(tables_dir))
    answer = _finishes(lambda: runtime.lookup("attention", PREFILL, torch.float16, GPU), seconds=5)
    assert answer.rung is Rung.DEFAULT
    assert "it is a character device" in warnings_seen()[0]


def test_a_file_larger_than_a_table_may_be_is_not_read(tables_dir, warnings_seen):
    with open(_table_path(tables_dir), "wb") as f:  # sparse: costs no disk
        f.truncate(MAX_TABLE_BYTES + 1)
    assert _finishes(lambda: runtime.lookup("attention", PREFILL, torch.float16, GPU), seconds=5).rung is Rung.DEFAULT
    assert "more than a table may hold" in warnings_seen()[0]


def test_a_directory_or_a_dangling_symlink_at_the_table_path(tables_dir, tmp_path, warnings_seen):
    _table_path(tables_dir).mkdir()
    assert runtime.lookup("attention", PREFILL, torch.float16, GPU).rung is Rung.DEFAULT
    assert "it is a directory" in warnings_seen()[0]


def test_a_slow_table_read_does_not_block_other_threads(tables_dir, monkeypatch):
    """The tables' lock is not held while a file is read: a lookup stuck on one kernel's file
    (a hung network filesystem) leaves another kernel's cold lookups free."""
    _write(tables_dir, _document([_entry(PREFILL, TUNED)]))
    kv_dir = tables_dir / "kv_cache_write"
    kv_dir.mkdir()
    shutil.copy(REPO_TABLES / "kv_cache_write" / "NVIDIA_H200.json", kv_dir / f"{device_key(GPU)}.json")
    text = (kv_dir / f"{device_key(GPU)}.json").read_text().replace('"NVIDIA_H200"', f'"{device_key(GPU)}"')
    (kv_dir / f"{device_key(GPU)}.json").write_text(text)

    release, reading = threading.Event(), threading.Event()
    real_read = _tables.read_table_text

    def read(path):
        if "attention" in str(path):
            reading.set()
            release.wait(30)
        return real_read(path)

    monkeypatch.setattr(_tables, "read_table_text", read)
    stuck = threading.Thread(target=runtime.lookup, args=("attention", PREFILL, torch.float16, GPU), daemon=True)
    stuck.start()
    try:
        assert reading.wait(10)
        problem = KVCacheWriteProblem(t=256, hkv=4, d=128)
        answer = _finishes(lambda: runtime.lookup("kv_cache_write", problem, torch.bfloat16, GPU), seconds=10)
        assert answer.rung is not Rung.DEFAULT and stuck.is_alive()
    finally:
        release.set()
        stuck.join(10)


# --- hostile problems: a clear InputError -------------------------------------------------------

HOSTILE = {
    "inf": float("inf"), "nan": float("nan"), "1e400": "1e400", "Infinity": "Infinity",
    "a megabyte of digits": "7" * 1_000_000, "bytes": b"16", "fullwidth": "１６", "underscore": "1_0",
    "2**31": 2**31, "2**40": 2**40, "10**400": 10**400, "a list": [16],
}


@pytest.mark.parametrize("form", ["mapping", "shape", "dataclass"])
@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_problem_is_an_input_error(tables_dir, name, form):
    value = HOSTILE[name]
    if form == "shape" and not isinstance(value, str):
        pytest.skip("a shape string holds strings")
    if form == "mapping":
        problem = {**dataclasses.asdict(PREFILL), "lk": value}
    elif form == "shape":
        problem = SPEC.problem_key(PREFILL).replace("lk=512", f"lk={value}")
    else:
        problem = dataclasses.replace(PREFILL)
        object.__setattr__(problem, "lk", value)  # as a caller's own code could build one
    for _ in range(2):  # the second time the bucket of PREFILL is cached: still an error
        with pytest.raises(InputError, match="lk=.* is not a valid int") as raised:
            runtime.lookup("attention", problem, torch.float16, GPU)
        assert isinstance(raised.value, ShapeError) and len(str(raised.value)) < 300
        runtime.lookup("attention", PREFILL, torch.float16, GPU)


def test_the_largest_dimension_is_answered_and_one_more_is_an_error(tables_dir):
    largest = KVCacheWriteProblem(t=2**31 - 1, hkv=4, d=128)
    config = runtime.get_config("kv_cache_write", largest, torch.float16, GPU)
    assert not KV_WRITE.violations(largest, config, torch.float16)
    beyond = dataclasses.replace(largest)
    object.__setattr__(beyond, "t", 2**31)  # the same bucket as 2**31 - 1, now cached
    with pytest.raises(InputError, match="out of range"):
        runtime.get_config("kv_cache_write", beyond, torch.float16, GPU)


def test_a_dtype_given_by_name_is_a_clear_error(tables_dir):
    with pytest.raises(InputError, match=r"dtype must be a torch.dtype .*got 'bf16'"):
        runtime.get_config("attention", PREFILL, dtype="bf16", device_name=GPU)
    with pytest.raises(InputError, match="attention does not support torch.float64"):
        runtime.get_config("attention", PREFILL, dtype=torch.float64, device_name=GPU)


# --- never a config against a constraint --------------------------------------------------------


@pytest.mark.parametrize("d", [32769, 40000, 65536])
def test_kv_cache_write_with_a_huge_head_dim_gets_a_valid_config(tables_dir, warnings_seen, d):
    """The spec's default breaks its own register constraint from d = 32,769 (it never goes past
    8 warps); the runtime answers with the first config that breaks nothing (16 warps)."""
    problem = KVCacheWriteProblem(t=16, hkv=8, d=d)
    assert KV_WRITE.violations(problem, KV_WRITE.default_config(problem, torch.float16), torch.float16)
    answer = runtime.lookup("kv_cache_write", problem, torch.float16, GPU)
    assert answer.rung is Rung.DEFAULT and answer.config["num_warps"] == 16
    assert not KV_WRITE.violations(problem, answer.config, torch.float16)
    assert any("the default kv_cache_write config breaks tile_registers" in w for w in warnings_seen())


def test_a_problem_no_config_can_run_is_an_input_error(tables_dir):
    problem = KVCacheWriteProblem(t=16, hkv=8, d=32769)  # fp32 tiles need 256 registers even at 16 warps
    for _ in range(2):  # also once the answer is cached
        with pytest.raises(InputError, match="kv_cache_write cannot run .*d=32769.* in fp32: no config"):
            runtime.get_config("kv_cache_write", problem, torch.float32, GPU)
    with pytest.raises(InputError, match="no config"):  # no dtype: checked at the widest, fp32
        runtime.get_config("kv_cache_write", problem, None, GPU)


def test_without_a_gpu_the_default_is_checked_too(tables_dir, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    problem = KVCacheWriteProblem(t=16, hkv=8, d=40000)
    config = runtime.get_config("kv_cache_write", problem, torch.float16)
    assert not KV_WRITE.violations(problem, config, torch.float16)


def test_a_neighbours_config_that_breaks_a_constraint_is_never_returned(tables_dir):
    """An entry tuned at lq=lk=64 with BLOCK_M=64 serves 55..64 nowhere it would be too large."""
    tuned_for = dataclasses.replace(PREFILL, lq=64, lk=64)
    _write(tables_dir, _document([_entry(tuned_for, TUNED.replace(BLOCK_M=64))]))
    for lq in range(1, 80):
        problem = dataclasses.replace(PREFILL, lq=lq, lk=64)
        config = runtime.get_config("attention", problem, torch.float16, GPU)
        assert not SPEC.violations(problem, config, torch.float16), (lq, config)


def test_a_default_outside_the_space_is_never_returned(tables_dir, warnings_seen):
    """kv_cache_write's default takes BLOCK_H=32 for 17..32 kv heads of a small head dim, and
    BLOCK_H stops at 16: the runtime answers with a config of the space instead."""
    problem = KVCacheWriteProblem(t=24, hkv=17, d=32, block_size=5)
    assert KV_WRITE.default_config(problem, torch.float16)["BLOCK_H"] == 32
    config = runtime.get_config("kv_cache_write", problem, torch.float16, GPU)
    assert KV_WRITE.coerce_config(config.as_dict(), strict=True) == config
    assert not KV_WRITE.violations(problem, config, torch.float16)
    assert any("breaks the config space" in w for w in warnings_seen())

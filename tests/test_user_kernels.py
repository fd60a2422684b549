"""Bring your own kernel: the example user kernel (examples/rmsnorm.py, loaded by its path as a
user names it) passes the shipped contract suite and goes through search → report → export →
runtime lookup; a user kernel may not take a built-in's name (or another user kernel's), and the
same file named two ways is one kernel."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from omnitune import runtime
from omnitune.cli import app
from omnitune.errors import KernelNameError
from omnitune.profile.device import current_device_facts
from omnitune.registry import get_spec, register
from omnitune.testing import SpecContract, check_spec

from conftest import DEVICE

EXAMPLE = str(Path(__file__).resolve().parent.parent / "examples" / "rmsnorm.py")
SHAPE = "m=9,n=96"
ON_GPU = torch.cuda.is_available()
MODE = [] if ON_GPU else ["--interpret"]


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


class TestExampleKernelContract(SpecContract):
    kernel = EXAMPLE


def test_check_spec_runs_the_whole_contract_outside_pytest():
    check_spec(EXAMPLE, spread=1)


def test_the_example_is_searched_reported_exported_and_looked_up(tmp_db, tables_dir):
    spec = get_spec(EXAMPLE)
    problem = spec.parse_shape(SHAPE)

    searched = invoke("search", EXAMPLE, "--shape", SHAPE, "--dtype", "fp32", "--trials", "3", *MODE,
                      "--db", str(tmp_db))
    assert searched.exit_code == 0, searched.output
    summary = [line for line in searched.stdout.splitlines() if line.startswith(f"rmsnorm {SHAPE} fp32: best")]
    assert len(summary) == 1 and "3 measured (3 new)" in summary[0], searched.stdout

    reported = invoke("report", "--db", str(tmp_db), "--format", "json")
    assert reported.exit_code == 0, reported.output
    (row,) = json.loads(reported.stdout)
    assert (row["kernel"], row["problem_key"], row["dtype"]) == ("rmsnorm", SHAPE, "fp32") and row["ok_trials"] >= 3

    exported = invoke("export", "--db", str(tmp_db), "--out", str(tables_dir))
    assert exported.exit_code == 0, exported.output
    device = current_device_facts(interpret=not ON_GPU)
    table = tables_dir / "rmsnorm" / f"{device.key}.json"
    assert f"wrote {table}: 1 entries" in exported.stdout
    entry = json.loads(table.read_text())["entries"][f"fp32|{SHAPE}"]
    tuned = spec.coerce_config(entry["config"])
    assert tuned.label() == row["best_config"]

    # The runtime finds a user kernel's table by the spec's name, as the example's own rms_norm asks.
    answer = runtime.lookup(spec.name, problem, torch.float32, device_name=device.name)
    assert (answer.rung, answer.config, answer.source) == (runtime.Rung.EXACT, tuned, table)
    assert runtime.get_config(EXAMPLE, problem, torch.float32, device_name=device.name) == tuned
    looked_up = invoke("lookup", EXAMPLE, "--shape", SHAPE, "--dtype", "fp32", "--device", device.name)
    assert looked_up.exit_code == 0, looked_up.output
    assert f"config: {tuned.label()}" in looked_up.stdout and "rung: exact" in looked_up.stdout

    # The tuned config drives the example's public function, and its answer is right.
    module = sys.modules[spec.module]
    inputs = spec.make_inputs(problem, torch.float32, DEVICE, 0)
    expected = spec.reference(inputs)
    for config in (tuned, None):
        out = module.rms_norm(inputs.x, inputs.weight, config=config)
        assert spec.compare(out, expected) <= spec.tolerance[torch.float32]


def _user_file(tmp_path, stem: str, name: str) -> str:
    """A user kernel file whose SPEC is the kv_cache_write kernel's under another name."""
    path = tmp_path / f"{stem}.py"
    path.write_text(
        "import dataclasses\n"
        "from omnitune.kernels.kv_cache_write import SPEC as _WRITE\n"
        f"SPEC = dataclasses.replace(_WRITE, name={name!r}, module=__name__)\n"
    )
    return str(path)


def test_a_user_kernel_named_like_a_built_in_is_refused_in_one_line(tmp_path, tmp_db):
    path = _user_file(tmp_path, "my_attention", "attention")
    result = invoke("search", path, "--shape", "t=4,hkv=1,d=64", "--dtype", "fp32", *MODE, "--db", str(tmp_db))
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "'attention', the name of a built-in kernel" in lines[0] and path in lines[0]
    assert not tmp_db.exists()
    with pytest.raises(KernelNameError, match="built-in"):
        get_spec(path)
    assert get_spec("attention").module == "omnitune.kernels.attention"  # not shadowed


def test_a_built_in_named_by_its_module_is_itself_and_user_names_are_unique(tmp_path, monkeypatch):
    assert get_spec("omnitune.kernels.kv_cache_write") is get_spec("kv_cache_write")
    first = get_spec(_user_file(tmp_path, "first_write", "my_write"))
    monkeypatch.chdir(tmp_path)
    assert get_spec("./first_write.py") is first  # the same file named another way: one import
    with pytest.raises(KernelNameError, match="already the name of the kernel in"):
        get_spec(_user_file(tmp_path, "second_write", "my_write"))
    assert get_spec("my_write") is first
    with pytest.raises(KernelNameError, match="built-in"):
        register(dataclasses.replace(first, name="kv_cache_write"))


def test_the_example_module_refuses_a_second_kernel_of_its_name(tmp_path):
    example = get_spec(EXAMPLE)
    with pytest.raises(KernelNameError, match="'rmsnorm', already the name of the kernel in"):
        get_spec(_user_file(tmp_path, "another_rmsnorm", "rmsnorm"))
    assert get_spec("rmsnorm") is example

"""User kernels in the registry: a user kernel may not take a built-in's name (or another user
kernel's), and the same file named two ways is one kernel."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from typer.testing import CliRunner

from omnitune.cli import app
from omnitune.errors import KernelNameError
from omnitune.registry import get_spec, register

ON_GPU = torch.cuda.is_available()
MODE = [] if ON_GPU else ["--interpret"]


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


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

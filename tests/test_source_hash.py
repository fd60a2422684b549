"""omnitune.source_hash: the provenance hash covers the @triton.jit sources and what they call —
not docstrings, comments, launchers or baselines — reads the same interpreted or compiled, and
export translates the whole-module hashes of older searches."""

from __future__ import annotations

import importlib.util
import sys
import textwrap

import pytest

from omnitune.provenance import provenance_hash
from omnitune.source_hash import (
    jit_functions,
    kernel_source_hash,
    module_source_hash,
    normalized_source,
    source_matches,
)

BASE = '''
"""A kernel module: this docstring is not device code."""
import triton
import triton.language as tl

SCALE = 2.0
UNUSED = 7


@triton.jit
def _helper(x):
    return x * SCALE


@triton.jit
def _kernel(X, Out, N, BLOCK: tl.constexpr):
    """Doubles X."""
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)  # axis 0: blocks
    mask = offsets < N
    tl.store(Out + offsets, _helper(tl.load(X + offsets, mask=mask)), mask=mask)


def launch(x, out):
    _kernel[(1,)](x, out, x.numel(), BLOCK=16)
'''

_counter = [0]


def load(tmp_path, source: str, interpret: str = "1", monkeypatch=None):
    """Import `source` as a fresh module (from a file: inspect needs one)."""
    _counter[0] += 1
    name = f"hash_case_{_counter[0]}"
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(source))
    if monkeypatch is not None:
        monkeypatch.setenv("TRITON_INTERPRET", interpret)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_the_jit_functions_and_their_callees_are_found(tmp_path):
    module = load(tmp_path, BASE)
    assert sorted(k.rsplit(".", 1)[1] for k in jit_functions(module)) == ["_helper", "_kernel"]


@pytest.mark.parametrize("edit", [
    ('"""A kernel module: this docstring is not device code."""', '"""Reworded."""'),
    ('"""Doubles X."""', '"""Doubles X, elementwise."""'),
    ("# axis 0: blocks", "# one program per block"),
    ("UNUSED = 7", "UNUSED = 8"),
    ("BLOCK=16)", "BLOCK=32)"),  # the launcher
    ("    mask = offsets < N\n", "    mask = offsets < N   \n\n"),  # trailing spaces, a blank line
])
def test_edits_outside_the_device_code_keep_the_hash(tmp_path, edit):
    old, new = edit
    assert old in BASE
    assert kernel_source_hash(load(tmp_path, BASE)) == kernel_source_hash(load(tmp_path, BASE.replace(old, new)))


@pytest.mark.parametrize("edit", [
    ("return x * SCALE", "return x * SCALE + 0.0"),  # a callee's body
    ("SCALE = 2.0", "SCALE = 3.0"),                  # a constant the device code reads
    ("mask = offsets < N", "mask = offsets <= N"),   # the kernel itself
])
def test_edits_to_the_device_code_change_the_hash(tmp_path, edit):
    old, new = edit
    assert kernel_source_hash(load(tmp_path, BASE)) != kernel_source_hash(load(tmp_path, BASE.replace(old, new)))


def test_interpreted_and_compiled_jit_functions_hash_alike(tmp_path, monkeypatch):
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    interpreted = load(tmp_path, BASE, "1", monkeypatch)
    compiled = load(tmp_path, BASE, "0", monkeypatch)
    assert isinstance(interpreted._kernel, InterpretedFunction) and isinstance(compiled._kernel, JITFunction)
    assert kernel_source_hash(interpreted) == kernel_source_hash(compiled)


def test_a_module_without_jit_functions_is_hashed_whole(tmp_path):
    module = load(tmp_path, "def launch():\n    return 1\n")
    assert jit_functions(module) == {}
    assert kernel_source_hash(module) == module_source_hash(module)


def test_comments_and_docstring_are_dropped_from_a_function():
    source = 'def f(x):\n    """Doc\n    more."""\n    # a comment\n    return x  # trailing\n'
    assert normalized_source(source) == "def f(x):\n    return x"


def test_the_specs_hash_is_the_jit_hash_and_older_module_hashes_are_translated():
    from omnitune.kernels import attention

    spec = attention.SPEC
    assert spec.source_hash() == kernel_source_hash(attention) != module_source_hash(attention)
    assert source_matches(attention, spec.source_hash()) == "jit"
    assert source_matches(attention, module_source_hash(attention)) == "module"
    assert source_matches(attention, "0123456789abcdef") is None
    # export: a search recorded the module hash of today's source → today's jit hash
    assert provenance_hash("attention", module_source_hash(attention)) == spec.source_hash()
    # anything else is written as recorded: the truth about what was measured
    assert provenance_hash("attention", "0123456789abcdef") == "0123456789abcdef"
    assert provenance_hash("no_such_kernel", "0123456789abcdef") == "0123456789abcdef"
    assert provenance_hash("attention", None) is None

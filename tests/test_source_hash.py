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
    UNKNOWN,
    jit_functions,
    kernel_source_hash,
    module_file,
    module_source_hash,
    normalized_module_source,
    normalized_source,
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
    today = kernel_source_hash(attention, spec.extra_source_modules)
    assert spec.source_hash() == today != module_source_hash(attention)
    assert spec.source_matches(spec.source_hash()) == "jit"
    assert spec.source_matches(module_source_hash(attention)) == "module"
    assert spec.source_matches("0123456789abcdef") is None
    # export: a search recorded the module hash of today's source → today's jit hash
    assert provenance_hash("attention", module_source_hash(attention)) == spec.source_hash()
    # anything else is written as recorded: the truth about what was measured
    assert provenance_hash("attention", "0123456789abcdef") == "0123456789abcdef"
    assert provenance_hash("no_such_kernel", "0123456789abcdef") == "0123456789abcdef"
    assert provenance_hash("attention", None) is None


# --- a kernel's extra source modules: attention's Gluon kernel --------------------------------------

GLUON_MODULES = ("omnitune.kernels.attention_gluon", "omnitune.kernels._gluon_target")
TRITON = {"BACKEND": "triton", "BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3, "PACK_GQA": False,
          "USE_TMA": True}
GLUON = {"BACKEND": "gluon_pingpong", "BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 4, "num_stages": 2,
         "PACK_GQA": False, "USE_TMA": False}


@pytest.fixture
def gluon_copies(tmp_path, monkeypatch):
    """The attention spec's extra source modules read from copies in tmp_path (name → copy)."""
    from omnitune.kernels import attention

    assert attention.SPEC.extra_source_modules == GLUON_MODULES
    copies = {}
    for name in GLUON_MODULES:
        copies[name] = tmp_path / module_file(name).name
        copies[name].write_text(module_file(name).read_text(encoding="utf-8"), encoding="utf-8")
    monkeypatch.setattr("omnitune.source_hash.module_file", copies.__getitem__)
    return copies


def test_the_attention_hash_covers_the_gluon_kernel_and_its_facts():
    from omnitune.kernels import attention

    # more than the Triton kernel's jit functions, and the same read again
    assert attention.SPEC.source_hash() not in (kernel_source_hash(attention), UNKNOWN)
    assert attention.SPEC.source_hash() == attention.SPEC.source_hash()


@pytest.mark.parametrize("name", GLUON_MODULES)
def test_an_edit_to_the_gluon_code_stales_the_tables_with_gluon_configs_only(gluon_copies, name):
    from omnitune.kernels import attention

    spec = attention.SPEC
    today, own_code = spec.source_hash(), kernel_source_hash(attention)
    gluon_copies[name].write_text(gluon_copies[name].read_text() + "\nLATE_CONSTANT = 1\n")
    edited = spec.source_hash()
    assert edited not in (today, UNKNOWN)
    # a table holding a Gluon config, tuned before the edit, is then tuned on other code: verify's
    # compat fails it; one of Triton configs alone is good for the kernel's own code, unchanged
    assert spec.source_matches(today, [GLUON]) is None and spec.source_matches(edited, [GLUON]) == "jit"
    assert spec.source_matches(today, [TRITON]) is None  # recorded with the old Gluon code in it
    assert spec.source_matches(own_code, [TRITON]) == "jit"


def test_a_table_without_gluon_configs_matches_the_kernels_own_code():
    from omnitune.kernels import attention

    spec, own_code = attention.SPEC, kernel_source_hash(attention)
    assert spec.source_matches(own_code, [TRITON, {"BACKEND": "sdpa_cudnn"}]) == "jit"
    assert spec.source_matches(own_code, [TRITON, GLUON]) is None  # a Gluon config ran other code too
    assert spec.source_matches(own_code) is None  # configs not known: only today's whole hash
    assert spec.source_matches(spec.source_hash(), [TRITON, GLUON]) == "jit"


@pytest.mark.parametrize("edit", [
    lambda source: source.replace('"""', '"""Reworded. ', 1),  # the module's docstring
    lambda source: source + "\n# a closing comment\n\n",
])
@pytest.mark.parametrize("name", GLUON_MODULES)
def test_comments_and_docstrings_of_the_gluon_code_keep_the_attention_hash(gluon_copies, name, edit):
    from omnitune.kernels import attention

    today = attention.SPEC.source_hash()
    gluon_copies[name].write_text(edit(gluon_copies[name].read_text()))
    assert attention.SPEC.source_hash() == today


def test_an_extra_module_that_cannot_be_read_makes_the_hash_unknown(gluon_copies):
    from omnitune.kernels import attention

    gluon_copies[GLUON_MODULES[0]].unlink()
    assert attention.SPEC.source_hash() == UNKNOWN


def test_an_extra_module_that_does_not_exist_makes_the_hash_unknown():
    from omnitune.kernels import attention

    assert kernel_source_hash(attention, ("omnitune.kernels.no_such_module",)) == UNKNOWN


def test_a_module_is_normalized_to_its_code():
    source = ('"""Module doc."""\nX = 1  # why\n"""X\'s doc."""\n\n\nclass K:\n    """Doc."""\n\n    def f(self):\n'
              '        """Doc."""\n        return X   \n')
    assert normalized_module_source(source) == "X = 1\nclass K:\n    def f(self):\n        return X"

"""The kernel modules import without torch._dynamo (~1.3 s of their ~1.5 s on the development
machine; a lane and a compile worker's fork server import them before their first work, a serving
process before its first op): the one decorator that loaded it is spelt out in _dispatch, and must
mark a function exactly as torch.compiler.assume_constant_result does."""

from __future__ import annotations

import torch

from omnitune.kernels import _dispatch
from tests.test_cli_startup import _run


def test_our_marker_is_what_assume_constant_result_does():
    def theirs():
        return ""

    def ours():
        return ""

    torch.compiler.assume_constant_result(theirs)
    _dispatch._constant_when_traced(ours)
    assert vars(theirs) == vars(ours) == {"_dynamo_marked_constant": True}
    assert getattr(_dispatch.config_to_json, "_dynamo_marked_constant", False)


def test_importing_every_kernel_loads_no_dynamo():
    code = ("import sys, importlib\n"
            "from omnitune.registry import BUILTIN_KERNELS\n"
            "for module in BUILTIN_KERNELS.values():\n"
            "    importlib.import_module(module)\n"
            "print('torch._dynamo' in sys.modules)\n")
    assert _run(code) == "False"

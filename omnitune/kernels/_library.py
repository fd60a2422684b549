"""The torch.library ops (torch.ops.omnitune.*) that torch.compile records for the public functions.

Registered with torch.library's define/impl, the way serving engines register theirs, rather than
@torch.library.custom_op: custom_op wraps every call in Python layers (an autograd kernel that
redispatches, aliasing checks on the outputs, a version bump for mutated arguments) that a
compiled graph pays on each call of the op, host time a decode loop spends at every step and
layer (through the dispatcher the cache write costs 8.2 µs over its function, against 20.5 with
custom_op; the decode 17.8 against 19.8: an H100, docs/results.md round 51). The ops are
inference ops: none has a backward, and their outputs are fresh tensors, so the checks those
layers make have nothing to find. Each op's fake (its output's metadata, for tracing) is
registered beside it. Imports torch only, so that every kernel module can use it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

NAMESPACE = "omnitune"
# Every backend (CUDA; the CPU under Triton's interpreter, the CPU tests), as custom_op registers
# it: a tensor on any other device reaches the function and its checks, not the dispatcher's
# error on a kernel it lacks. The Meta key takes the fake (register_fake).
BACKEND = "CompositeExplicitAutograd"
_LIBRARY = torch.library.Library(NAMESPACE, "FRAGMENT")


class LibraryOp:
    """A registered op: its name, the function behind it, and register_fake for its fake."""

    def __init__(self, name: str, fn: Callable):
        self.name, self.fn = name, fn

    def register_fake(self, fake: Callable) -> Callable:
        torch.library.register_fake(f"{NAMESPACE}::{self.name}", fake, lib=_LIBRARY)
        return fake


def library_op(name: str, *, mutates_args: Sequence[str] = ()) -> Callable[[Callable], LibraryOp]:
    """Register the decorated function as torch.ops.omnitune.<name>, its schema read from its type
    hints (as custom_op reads it), arguments it writes in place named in mutates_args."""

    def register(fn: Callable) -> LibraryOp:
        _LIBRARY.define(name + torch.library.infer_schema(fn, mutates_args=tuple(mutates_args)))
        _LIBRARY.impl(name, fn, BACKEND)
        return LibraryOp(name, fn)

    return register

"""What a compiled Triton kernel's cubin uses per thread, read with the cuobjdump Triton bundles:
no GPU needed (the offline compile probes share it)."""

from __future__ import annotations

import os
import re
import subprocess
import tempfile

import triton

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")


def cuobjdump(kernel, flag: str) -> str:
    """What `cuobjdump FLAG` prints of kernel's cubin (-res-usage, -sass)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        return subprocess.run([os.path.join(BIN, "cuobjdump"), flag, f.name], capture_output=True, text=True).stdout


def cubin_resources(kernel) -> dict:
    """{"registers", "stack_bytes"} per thread of kernel's cubin (None where cuobjdump says nothing)."""
    text = cuobjdump(kernel, "-res-usage")
    found = re.search(r"REG:(\d+) STACK:(\d+)", text)
    return {"registers": int(found.group(1)) if found else None, "stack_bytes": int(found.group(2)) if found else None}

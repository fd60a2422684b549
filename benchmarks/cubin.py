"""What a compiled Triton kernel's cubin uses per thread, read with the cuobjdump Triton bundles,
and a kernel compiled for sm_90 as a real launch specialises it: no GPU needed (the offline
compile probes share it)."""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from collections import Counter

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")


def compile_sm90(fn, pointers: dict, constexprs: dict, warps: int, stages: int, *, aligned: tuple = (),
                 floats: tuple = ()):
    """fn compiled for sm_90 as a real call specialises it: `pointers` typed as given,
    `constexprs` fixed, the `floats` fp32 and every other argument i32; pointers, strides and the
    `aligned` integers divisible by 16."""
    names = fn.arg_names
    signature = {n: "constexpr" if n in constexprs else pointers.get(n, "fp32" if n in floats else "i32")
                 for n in names}
    values = {(names.index(n),): v for n, v in constexprs.items()}
    divisible = [n for n in names if signature[n] != "constexpr"
                 and (n in pointers or n.startswith("stride_") or n in aligned)]
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in divisible}
    source = ASTSource(fn=fn, signature=signature, constexprs=values, attrs=attrs)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages})


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


def sass_instructions(kernel) -> list[tuple[int, str]]:
    """(address, instruction) of each instruction in kernel's SASS (cuobjdump -sass), without the
    encodings, comments and labels around them (which line info adds or moves)."""
    sass = cuobjdump(kernel, "-sass")
    return [(int(m.group(1), 16), m.group(2).strip()) for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]


def opcode(instruction: str) -> str:
    """An SASS instruction's opcode with its modifiers (QGMMA.64x16x32.F32.E4M3.E4M3), its guard
    predicate (@P0, @!UP1) dropped."""
    return re.sub(r"^@!?U?P\w+\s+", "", instruction).split()[0]


def loop_counts(kernel) -> dict:
    """The first backward branch's body in kernel's SASS (a decode split kernel's key loop): its
    instructions, CTA barriers, shuffles, shared loads and stores, and the instructions by opcode
    (without predicate and modifiers: IMAD.MOV.U32 counts as IMAD), most frequent first."""
    instructions = sass_instructions(kernel)
    for address, text in instructions:
        target = re.search(r"BRA\s+(?:\S+\s+)?0x([0-9a-f]+)", text)
        if target and int(target.group(1), 16) < address:
            body = [t for a, t in instructions if int(target.group(1), 16) <= a <= address]
            opcodes = Counter(opcode(t).split(".")[0] for t in body)
            return {"instructions": len(body), "barriers": sum("BAR.SYNC" in t for t in body),
                    "shuffles": sum("SHFL" in t for t in body),
                    "shared_loads": sum(re.search(r"\bLDS", t) is not None for t in body),
                    "shared_stores": sum(re.search(r"\bSTS", t) is not None for t in body),
                    "opcodes": dict(opcodes.most_common())}
    return {}

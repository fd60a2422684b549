"""Every shipped table was measured on the kernel code of this revision.

A table records the hash of the device code it was tuned on (`kernel_source_hash`, written by
`omnitune export` through omnitune.provenance from `KernelSpec.source_hash()`); the runtime
treats a table whose hash differs as tuned on other code. Host-side edits to a kernel module
(launchers, references, docstrings, helpers) must leave that hash alone: this test fails as
soon as one does not, instead of the tables going stale silently."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from omnitune.registry import get_spec

TABLES = sorted((Path(__file__).resolve().parent.parent / "tuned_configs").glob("*/*.json"))


def test_tables_are_shipped():
    assert TABLES, "no tuned_configs/*/*.json found"


@pytest.mark.parametrize("path", TABLES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_shipped_table_hash_matches_current_code(path: Path):
    doc = json.loads(path.read_text())
    spec = get_spec(doc["kernel"])
    assert doc["kernel"] == path.parent.name
    assert doc["kernel_source_hash"] == spec.source_hash(), (
        f"{path.parent.name}/{path.name} was tuned on device code with hash {doc['kernel_source_hash']}, "
        f"the code here hashes to {spec.source_hash()}: a change reached a @triton.jit function, a "
        f"constant one reads, or the code of an extra source module ({', '.join(spec.extra_source_modules) or 'none'})"
    )


# The Gluon kernel's code, which the attention hash does not cover (one hash per kernel: covering
# it would stale every Triton-only attention table at each Gluon edit; docs/ops.md), hashed as
# omnitune.source_hash hashes an extra module, at the revision the shipped gluon_pingpong entries
# were measured on (tuned_configs/attention/NVIDIA_H100_80GB_HBM3.json, docs/results.md round 45).
GLUON_MODULES = ("omnitune.kernels.attention_gluon", "omnitune.kernels._gluon_target")
GLUON_CODE_MEASURED = "a379a335df6b322d"


def _gluon_code_hash() -> str:
    from omnitune.source_hash import module_file, normalized_module_source

    text = "\n\f\n".join(normalized_module_source(module_file(name).read_text(encoding="utf-8"))
                         for name in GLUON_MODULES)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def test_shipped_gluon_entries_were_measured_on_this_gluon_code():
    holding = [f"{p.parent.name}/{p.name}" for p in TABLES
               if any(isinstance(e, dict) and isinstance(e.get("config"), dict)
                      and e["config"].get("BACKEND") == "gluon_pingpong"
                      for e in json.loads(p.read_text())["entries"].values())]
    if not holding:
        pytest.skip("no shipped table holds a gluon_pingpong entry")
    assert _gluon_code_hash() == GLUON_CODE_MEASURED, (
        f"the Gluon kernel's code changed since the gluon_pingpong entries of {', '.join(holding)} were "
        f"measured: re-measure them on their GPU (omnitune verify --kernels attention --fix), then set "
        f"GLUON_CODE_MEASURED to {_gluon_code_hash()}")

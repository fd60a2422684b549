"""Every shipped table was measured on the kernel code of this revision.

A table records the hash of the device code it was tuned on (`kernel_source_hash`, written by
`omnitune export` through omnitune.provenance from `KernelSpec.source_hash()`); the runtime
treats a table whose hash differs as tuned on other code. Host-side edits to a kernel module
(launchers, references, docstrings, helpers) must leave that hash alone: this test fails as
soon as one does not, instead of the tables going stale silently."""

from __future__ import annotations

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
    configs = [spec.coerce_config(e["config"]) for e in doc["entries"].values()]
    # today's hash, or — for a table none of whose configs runs the spec's extra modules (the
    # Gluon kernel) — today's hash of the kernel's own code (KernelSpec.runs_extra_sources)
    assert spec.source_matches(doc["kernel_source_hash"], configs) == "jit", (
        f"{path.parent.name}/{path.name} was tuned on device code with hash {doc['kernel_source_hash']}, "
        f"the code here hashes to {spec.source_hash()}: a change reached a @triton.jit function, a "
        f"constant one reads, or the code of an extra source module ({', '.join(spec.extra_source_modules) or 'none'})"
    )


"""The predictor block fuzzed: a table exported from the synthetic sweep (tests/predictor_sweep.py)
with one value of its predictor block replaced by a hostile one, or deleted. Whatever the block
holds, a lookup raises nothing, returns a config of the kernel's space that breaks none of its
constraints, and the file's problems are logged in at most two warnings (its entries', its
block's). Derandomized and bounded, as tests/test_runtime_fuzz.py."""

from __future__ import annotations

import copy
import json
import logging

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import omnitune.runtime as runtime
from omnitune import export
from omnitune.kernels.kv_cache_write import SPEC, KVCacheWriteProblem
from predictor_sweep import FP16, sweep_rows
from test_runtime_fuzz import _json_paths
from trial_rows import H200, results_db

FUZZ = settings(derandomize=True, database=None, deadline=None, max_examples=150, print_blob=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
HOSTILE_JSON = [
    "Infinity", "-Infinity", "NaN", "1e999", "1" + "0" * 400, "-1", "0", "0.5", "1.0", "64.0", "true", "false",
    "null", '""', '"1"', '"BLOCK_H=4 BLOCK_T=3 num_warps=1"', '"１６"', "[]", "[1, 2]", "{}",
    '{"BLOCK_H=4 BLOCK_T=1 num_warps=1": 1.0}', '{"a": {"b": []}}', "[" * 50 + "]" * 50,
]
QUERIES = [KVCacheWriteProblem(t=t, hkv=hkv, d=d, block_size=16)
           for t, hkv, d in ((1, 8, 128), (300, 8, 128), (5000, 2, 128), (70_000, 16, 64), (1024, 4, 128))]


@pytest.fixture(scope="module")
def good_document(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fuzz")
    db = results_db(folder / "results.db", sweep_rows(tokens=(256, 1024, 4096)))
    export.export_tables(db, folder / "tables")
    return json.loads((folder / "tables" / "kv_cache_write" / "NVIDIA_H200.json").read_text())


@st.composite
def hostile_blocks(draw, document):
    """The document's text with one value at or under "predictor" replaced or deleted (a key of
    time_ratios renamed too: labels are keys)."""
    doc = copy.deepcopy(document)
    path = ("predictor", *draw(st.sampled_from(list(_json_paths(doc["predictor"])))))
    parent = doc
    for step in path[:-1]:
        parent = parent[step]
    kind = draw(st.sampled_from(["replace", "delete", "rename"]))
    if kind == "delete" and isinstance(parent, (dict, list)):
        del parent[path[-1]]
        return json.dumps(doc)
    if kind == "rename" and isinstance(parent, dict) and path[-2:-1] == ("time_ratios",):
        parent[draw(st.sampled_from(["BLOCK_H=4 BLOCK_T=3 num_warps=1", "BLOCK_H=true BLOCK_T=1 num_warps=1",
                                     "NOPE=1", "", "BLOCK_T=1 BLOCK_H=4 num_warps=1"]))] = parent.pop(path[-1])
        return json.dumps(doc)
    parent[path[-1]] = "@@HOSTILE@@"
    return json.dumps(doc).replace('"@@HOSTILE@@"', draw(st.sampled_from(HOSTILE_JSON)))


@FUZZ
@given(data=st.data())
def test_no_hostile_predictor_block_breaks_a_lookup(tables_dir, good_document, caplog, data):
    text = data.draw(hostile_blocks(good_document))
    path = tables_dir / "kv_cache_write" / "NVIDIA_H200.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    runtime.clear_cache()
    caplog.clear()
    caplog.set_level(logging.WARNING, logger="omnitune.runtime")
    for problem in QUERIES:
        answer = runtime.lookup("kv_cache_write", problem, FP16, H200)
        assert SPEC.coerce_config(answer.config.as_dict(), strict=True) == answer.config
        assert SPEC.violations(problem, answer.config, FP16) == [], (problem, answer)
    warnings = [r for r in caplog.records if r.name == "omnitune.runtime" and r.levelno >= logging.WARNING]
    assert len(warnings) <= 2, [r.getMessage() for r in warnings]

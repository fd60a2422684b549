"""benchmarks/tables_gain.py without a GPU: the earlier tables' answer for each problem of a small
database a real interpreted search wrote, that answer's time in the search, and the search's best."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "tables_gain.py"
_spec = importlib.util.spec_from_file_location("tables_gain", _PATH)
tables_gain = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tables_gain)

KEYS = ("t=9,hkv=2,d=16,block_size=4", "t=5,hkv=1,d=32,block_size=8")


def test_each_problem_gets_the_earlier_answer_and_its_time_in_the_search(tmp_path, monkeypatch):
    import omnitune.runtime as runtime
    from omnitune.registry import get_spec
    from search_wall import search_times

    db = str(tmp_path / "r.db")
    shapes = [arg for key in KEYS for arg in ("--shape", key)]
    subprocess.run([sys.executable, "-m", "omnitune", "search", "kv_cache_write", *shapes, "-n", "4", "--interpret",
                    "--dtype", "fp32", "--db", db], check=True, capture_output=True, cwd=tables_gain.ROOT)
    study = f"kv_cache_write|{KEYS[0]}|fp32|triton_interpreter"
    times = search_times(db, study)
    spec = get_spec("kv_cache_write")
    default = json.dumps(dict(spec.default_config(spec.parse_shape(KEYS[0]), torch.float32)), sort_keys=True)
    other = next(config for config in times if config != default)  # a config the search measured after the default
    tables = tmp_path / "tables"  # the database's own export, with the first problem's entry changed
    subprocess.run([sys.executable, "-m", "omnitune", "export", "--db", db, "--out", str(tables),
                    "--kernel", "kv_cache_write"], check=True, capture_output=True, cwd=tables_gain.ROOT)
    (path,) = (tables / "kv_cache_write").glob("*.json")
    document = json.loads(path.read_text())
    document["entries"] = {f"fp32|{KEYS[0]}": dict(document["entries"][f"fp32|{KEYS[0]}"], config=json.loads(other))}
    document.pop("predictor", None)
    path.write_text(json.dumps(document))
    monkeypatch.setattr(runtime, "config_dirs", runtime.config_dirs)  # gains() narrows it: put it back after
    rows = tables_gain.gains(db, tables, None)
    runtime.clear_cache()
    assert [r["problem"] for r in rows] == list(KEYS)
    exact, untuned = rows
    assert exact["rung"] == "exact" and json.dumps(exact["earlier_config"], sort_keys=True) == other
    assert exact["earlier_ms"] == times[other] and exact["best_ms"] == min(times.values())
    assert exact["earlier_over_best"] == pytest.approx(times[other] / min(times.values()))
    assert exact["earlier_over_best"] >= 1
    assert untuned["rung"] == "default" and untuned["earlier_over_best"] >= 1
    assert tables_gain.gains(db, tables, "fp16") == []  # no problem searched in fp16
    summary = tables_gain.summarize(rows)
    assert summary["problems"] == 2 and summary["earlier_measured"] == 2
    assert summary["rungs"] == {"exact": 1, "default": 1}
    assert "earlier ÷ best median" in tables_gain.report_lines(rows, summary)[-1]


def test_the_earlier_tables_come_from_git(tmp_path):
    folder = tables_gain.checkout_tables("HEAD", tmp_path)
    shipped = tables_gain.ROOT / "tuned_configs" / "kv_cache_write" / "NVIDIA_H200.json"
    assert (folder / "kv_cache_write" / "NVIDIA_H200.json").is_file() and shipped.is_file()

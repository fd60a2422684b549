"""benchmarks/search_wall.py without a GPU: the busy fraction from samples, the per-problem rows
read back from a small database a real interpreted search wrote, and a sampler without NVML."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "search_wall.py"
_spec = importlib.util.spec_from_file_location("search_wall", _PATH)
search_wall = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(search_wall)

KEYS = ("t=9,hkv=2,d=16,block_size=4", "t=5,hkv=1,d=32,block_size=8")


def test_the_busy_fraction_is_the_mean_utilization_within_the_search():
    samples = [{"t": t, "util": u} for t, u in ((0.0, 100), (1.0, 50), (2.0, 100), (3.0, 0), (9.0, 100))]
    assert search_wall.busy_fraction(samples, 1.0, 3.0) == pytest.approx(0.5)
    assert search_wall.busy_fraction(samples, 4.0, 5.0) is None


def test_the_hosts_cpu_share_comes_from_proc_stat_and_bins_into_a_timeline(tmp_path):
    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal guest guest_nice
    stat.write_text("cpu  100 0 50 800 50 0 0 0 7 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n")
    assert search_wall.cpu_counters(str(stat)) == (150, 1000)  # idle and iowait are not busy; guest is in user
    assert search_wall.cpu_counters(str(tmp_path / "absent")) is None
    samples = [{"t": t, "busy": b} for t, b in ((0.5, 1.0), (4.0, 0.5), (6.0, 0.2), (14.9, 0.4), (99.0, 1.0))]
    assert search_wall.timeline(samples, "busy", 0.0, 15.0, bin_s=5.0) == [0.75, 0.2, 0.4]  # 99.0: after the end
    assert search_wall.timeline(samples, "busy", 0.0, 21.0, bin_s=5.0) == [0.75, 0.2, 0.4, None, None]


def test_the_search_is_followed_line_by_line_and_its_problem_lines_timed(capsys):
    lines = ["searching in 2 lanes", "0│ searching attention b=1 bf16: up to 3 trials", "0│   trial 1/3: ...",
             "0│ attention b=1 bf16: best 0.01 ms", "2 lanes: 3.0 s in all"]
    script = "import sys, time\nfor line in sys.argv[1:]:\n    print(line, flush=True); time.sleep(0.05)\nsys.exit(3)"
    started = time.monotonic()
    code, events = search_wall.run_following([sys.executable, "-c", script, *lines], {}, started)
    assert code == 3
    assert [e["line"] for e in events] == [lines[0], lines[1], lines[3], lines[4]]  # the trial line is not an event
    assert all(0 <= a["t"] <= b["t"] for a, b in zip(events, events[1:]))
    assert capsys.readouterr().out.splitlines() == lines  # passed through as it came


def test_without_nvml_the_sampler_says_why_and_takes_no_samples(monkeypatch):
    from omnitune.profile import telemetry

    monkeypatch.setitem(sys.modules, "pynvml", None)  # importing it fails, as where it is not installed
    monkeypatch.setattr(telemetry, "_opened", {})  # NVML is opened once per process: not from a cache here
    sampler = search_wall.GpuSampler(period_s=0.01)
    sampler.start()
    time.sleep(0.05)
    sampler.stop()
    assert sampler.samples == [] and sampler.unavailable.startswith("NVML not available")


def test_the_rows_come_from_the_database_with_the_shipped_tables_beside_them(tmp_path):
    db = str(tmp_path / "r.db")
    since = "2000-01-01T00:00:00+00:00"
    shapes = [arg for key in KEYS for arg in ("--shape", key)]
    subprocess.run([sys.executable, "-m", "omnitune", "search", "kv_cache_write", *shapes, "-n", "3", "--interpret",
                    "--dtype", "fp32", "--db", db], check=True, capture_output=True, cwd=search_wall.REPO)
    tables = tmp_path / "tables"
    (tables / "kv_cache_write").mkdir(parents=True)
    (tables / "kv_cache_write" / "NVIDIA_H200.json").write_text(json.dumps({"entries": {
        f"fp32|{KEYS[0]}": {"speedup_vs_default": 2.0, "time_ms": 0.01, "default_time_ms": 0.02,
                            "config": {"BLOCK_T": 8}}}}))
    rows = search_wall.problem_rows(db, since, tables)
    assert [r["problem"] for r in rows] == list(KEYS)
    first, second = rows
    assert first["measured_this_run"] == 3 and first["trials_total"] == 3 and first["wall_s"] > 0
    assert first["cpu_s"] > 0 and first["compile_cpu_s"] is None  # interpreted: no compile workers
    assert first["best_ms"] <= first["default_ms"] and first["speedup_vs_default"] >= 1
    assert first["shipped"]["speedup_vs_default"] == 2.0 and second["shipped"] is None
    assert search_wall.problem_rows(db, "2999-01-01T00:00:00+00:00", tables) == []  # not this run's
    text = search_wall.summary({"problems": rows, "wall_s": 12.0, "returncode": 0,
                                "gpu": {"busy_fraction": None, "unavailable": "NVML not available: no"}})
    assert "2 problems in 12 s" in text and "unknown (NVML not available" in text and "mean ratio over 1" in text
    # The shipped config beside the search's best, both as this search timed them: here the
    # shipped config is the default, which every search measures first.
    from omnitune.registry import get_spec
    import torch

    spec = get_spec("kv_cache_write")
    default = dict(spec.default_config(spec.parse_shape(KEYS[1]), torch.float32))
    (tables / "kv_cache_write" / "NVIDIA_H200.json").write_text(json.dumps({"entries": {
        f"fp32|{KEYS[1]}": {"speedup_vs_default": 1.0, "config": default}}}))
    second = search_wall.problem_rows(db, since, tables)[1]
    side = second["side_by_side"]
    times = search_wall.search_times(db, second["kernel"] + "|" + KEYS[1] + "|fp32|triton_interpreter")
    assert len(times) == 3 and side["best_search_ms"] == min(times.values())
    assert side["shipped_config_search_ms"] == times[json.dumps(default, sort_keys=True)]
    assert side["shipped_over_best"] == pytest.approx(side["shipped_config_search_ms"] / side["best_search_ms"])
    assert side["shipped_over_best"] >= 1
    assert "the shipped config as this search timed it" in search_wall.summary(
        {"problems": [second], "wall_s": 1.0, "returncode": 0, "gpu": {"busy_fraction": 0.5}})


def test_the_command_is_the_model_search_with_its_timeout_and_the_extra_arguments():
    args = search_wall.parse_args(["--trials", "7", "--", "--sampler", "random"])
    command = search_wall.search_command(args, "x.db", "lanes.json")
    assert command[1:] == ["-m", "omnitune", "search", "--model", "qwen2.5-omni-7b", "-n", "7",
                           "--db", "x.db", "--lane-stats", "lanes.json", "--timeout", "540.0", "--sampler", "random"]
    # No preset: the extra arguments name the kernel and its problems.
    args = search_wall.parse_args(["--model", "", "--trials", "7", "--", "kv_compress", "--shape", "b=1"])
    command = search_wall.search_command(args, "x.db", "lanes.json")
    assert "--model" not in command and command[3] == "search" and command[-3:] == ["kv_compress", "--shape", "b=1"]


def test_the_lanes_holdings_are_laid_beside_the_gpus_utilization(tmp_path):
    assert search_wall.merged([[3.0, 4.0], [0.0, 1.0], [0.5, 2.0]]) == [[0.0, 2.0], [3.0, 4.0]]
    union = search_wall.merged([[0.0, 2.0], [3.0, 4.0]])
    assert search_wall.covered(union, 1.0, 3.0) == pytest.approx(0.5)
    assert search_wall.covered(union, 5.0, 5.0) == 0.0
    # Held from 0 to 2 s and 3 to 4 s of a 6 s search; busy 80% while held, 10% while not.
    samples = [{"t": t / 10, "util": 80 if (t <= 20 or 32 <= t <= 40) else 10} for t in range(2, 61)]
    found = search_wall.held_analysis([[0.0, 2.0], [3.0, 4.0]], samples, 0.0, 6.0, window_s=0.2, bin_s=2.0)
    assert found["held_fraction"] == pytest.approx(0.5)
    assert found["busy_while_held"] == pytest.approx(0.8) and found["busy_while_not_held"] == pytest.approx(0.1)
    assert found["held_timeline"] == [1.0, 0.5, 0.0]
    stats = tmp_path / "lanes.json"
    stats.write_text(json.dumps({"lanes": 2, "wall_s": 6.0, "stats": [
        {"lane": 0, "gpu_lock_held_s": 2.0, "gpu_lock_acquisitions": 3,
         "gpu_lock_phase_s": {"timing": 1.5, "checking": 0.25}, "gpu_lock_holdings": [[0.0, 2.0]],
         "ready_at": 100.5, "go_at": 101.25, "cuda_start_began": 100.25, "cuda_start_ended": 101.0,
         "gpu_lock_first_phases": [{"inputs": 0.25}]},
        {"lane": 1, "gpu_lock_held_s": 1.0, "gpu_lock_acquisitions": 2,
         "gpu_lock_phase_s": {"timing": 0.5}, "gpu_lock_holdings": [[3.0, 4.0]]}]}))
    summed = search_wall.lanes_accounting(stats, samples, 0.0, 6.0)
    assert summed["held_s"] == 3.0 and summed["acquisitions"] == 5
    assert summed["phase_s"] == {"timing": 2.0, "checking": 0.25}
    assert summed["held_fraction"] == pytest.approx(0.5)
    # When each lane was ready and saw the go, from the search's start (lane 1 wrote no times).
    later = search_wall.lanes_accounting(stats, samples, 100.0, 106.0)
    assert later["ready_s"] == [0.5, None] and later["go_s"] == [1.25, None]
    assert later["cuda_start_s"] == [[0.25, 1.0], [None, None]]
    # Each lane's first holdings, paired with what they were spent on (lane 1 wrote no phases).
    assert summed["first_holdings"] == [[{"from_s": 0.0, "to_s": 2.0, "phases": {"inputs": 0.25}}], []]
    text = search_wall.summary({"problems": [], "wall_s": 6.0, "returncode": 0, "gpu": {"busy_fraction": 0.5},
                                "lanes": later})
    assert "the lanes were ready for the go at 0.5-0.5 s and saw it at 1.2-1.2 s" in text
    assert "their CUDA contexts were made by 1.0-1.0 s" in text
    holdings_text = search_wall.summary({"problems": [], "wall_s": 6.0, "returncode": 0,
                                         "gpu": {"busy_fraction": 0.5}, "lanes": summed})
    assert "their first holdings of the GPU: 0.0-2.0 s (inputs 0.25 s)" in holdings_text
    assert search_wall.lanes_accounting(tmp_path / "absent.json", samples, 0.0, 6.0) is None  # no lanes ran

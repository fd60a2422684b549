"""`omnitune search` end to end through the CLI: the attention kernel on a tiny shape — under
Triton's interpreter on the CPU, for real on a GPU — a temporary results database, resume, and
the user errors."""

from __future__ import annotations

import re
import sqlite3

import pytest
import torch
from typer.testing import CliRunner

from omnitune.cli import app
from omnitune.profile.device import current_device_facts
from omnitune.measure.runner import Runner
from omnitune.trial import TrialResult, TrialStatus

SHAPE = "b=1,h=2,hkv=1,lq=17,lk=23,d=64,causal=1"
ON_GPU = torch.cuda.is_available()
# conftest imports the kernels interpreted without a GPU and compiled with one; --interpret must match.
MODE = [] if ON_GPU else ["--interpret"]


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def search_args(db, *extra: str) -> list[str]:
    return ["search", "attention", "--shape", SHAPE, "--dtype", "fp32", *MODE, "--db", str(db), *extra]


def rows(db, where: str = "1", retimings: bool = False) -> list[dict]:
    """Catalogue rows; without the finalists' re-timings (on a GPU) unless asked."""
    if not retimings:
        where = f"({where}) AND extra_json NOT LIKE '%\"finalist\"%'"
    conn = sqlite3.connect(db)
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute(f"SELECT * FROM trials WHERE {where} ORDER BY trial_number")]
    finally:
        conn.close()


def test_search_stores_the_trials_default_first_and_resumes(tmp_db):
    from omnitune.registry import get_spec

    spec = get_spec("attention")
    problem = spec.parse_shape(SHAPE)

    first = invoke(*search_args(tmp_db, "--trials", "4"))
    assert first.exit_code == 0, first.output
    measured = rows(tmp_db, "status != 'pruned'")
    assert len(measured) == 4
    assert measured[0]["trial_number"] == 0 and measured[0]["is_default"] == 1
    assert measured[0]["config_label"] == spec.default_config(problem, torch.float32).label()
    assert sum(r["is_default"] for r in rows(tmp_db)) == 1
    device_key = current_device_facts(interpret=not ON_GPU).key
    assert {r["device_key"] for r in measured} == {device_key}
    assert {r["representative"] for r in measured} == {int(ON_GPU)}
    assert all(r["status"] == "ok" for r in measured)  # the kernel is right for every config
    # The run's timing, for `omnitune plan`: its trials and its fixed costs within its wall time.
    conn = sqlite3.connect(tmp_db)
    (run,) = conn.execute("SELECT measured, wall_s, setup_s, retime_s, device_key, cpu_s, compile_cpu_s "
                          "FROM search_runs").fetchall()
    conn.close()
    assert run[0] == 4 and run[4] == device_key and 0 < run[2] + run[3] < run[1]
    # The searching process's own CPU time; compile workers' only where they ran (none interpreted).
    assert run[5] > 0 and (run[6] is None) == (not ON_GPU)
    summary = [line for line in first.stdout.splitlines() if line.startswith("attention ")]
    assert len(summary) == 1
    # where the trial loop's time went, each phase within the run's wall time
    (phases,) = [line for line in first.stdout.splitlines() if "trial loop:" in line]
    seconds = {name: float(value) for name, value in re.findall(r"(choosing|waiting for compiles|measuring|storing) "
                                                                  r"([\d.]+) s", phases)}
    assert set(seconds) == {"choosing", "waiting for compiles", "measuring", "storing"}, phases
    assert seconds["measuring"] > 0 and sum(seconds.values()) <= run[1] + 0.1
    assert "4 measured (4 new)" in summary[0]
    assert ("not representative" in summary[0]) is not ON_GPU
    assert (tmp_db.parent / "omnitune.optuna.log").is_file()  # the default storage: a journal beside --db
    conn = sqlite3.connect(tmp_db)
    assert conn.execute("SELECT key FROM devices").fetchall() == [(device_key,)]
    conn.close()

    before = rows(tmp_db)
    again = invoke(*search_args(tmp_db, "--trials", "4"))
    assert again.exit_code == 0, again.output
    assert "4 measured (0 new)" in again.stdout
    assert rows(tmp_db) == before

    more = invoke(*search_args(tmp_db, "--trials", "6"))
    assert more.exit_code == 0, more.output
    assert "6 measured (2 new)" in more.stdout
    after = rows(tmp_db, "status != 'pruned'")
    assert len(after) == 6
    assert after[:4] == measured  # the first four untouched: not measured again
    assert len({r["config_json"] for r in after}) == 6


def test_ctrl_c_keeps_finished_trials_and_exits_130(tmp_db, monkeypatch):
    calls = []
    real_measure = Runner.measure

    def measure_then_interrupt(self, config):
        calls.append(config)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real_measure(self, config)

    monkeypatch.setattr(Runner, "measure", measure_then_interrupt)
    result = invoke(*search_args(tmp_db, "--trials", "5"))
    assert result.exit_code == 130, result.output
    assert "rerun the same command to resume" in result.stderr
    assert "2 measured (2 new)" in result.stdout
    assert len(rows(tmp_db, "status != 'pruned'")) == 2


def test_a_crashed_gpu_context_stops_with_a_message_to_rerun(tmp_db, monkeypatch):
    def crash(self, config):
        self.context_lost = True
        return TrialResult(config, TrialStatus.CRASHED, detail="RuntimeError: an illegal memory access")

    monkeypatch.setattr(Runner, "measure", crash)
    result = invoke(*search_args(tmp_db, "--trials", "5"))
    assert result.exit_code == 1, result.output
    assert "illegal memory access" in result.stderr and "rerun the same command" in result.stderr
    assert [r["status"] for r in rows(tmp_db)] == ["crashed"]


def test_the_timeout_covers_all_shapes_and_says_how_to_continue(tmp_db):
    second_shape = "b=1,h=2,hkv=2,lq=9,lk=9,d=64"
    result = invoke(*search_args(tmp_db, "--trials", "4", "--timeout", "0.001", "--shape", second_shape))
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stdout.splitlines() if line.startswith("attention ")]
    assert len(lines) == 2
    # the first shape starts (or, on a slow machine, finds the millisecond already gone)
    assert "stopped at the timeout, rerun to continue" in lines[0] or "not started" in lines[0]
    assert "lq=9" in lines[1] and "not started, the timeout has passed" in lines[1]


def test_search_help_explains_every_option():
    result = invoke("search", "--help")
    assert result.exit_code == 0
    for option in ("--shape", "--dtype", "--trials", "--timeout", "--sampler", "--seed", "--db", "--storage",
                   "--finalists", "--profile-top", "--interpret", "--try"):
        assert option in result.stdout


def test_try_configs_are_measured_right_after_the_default_in_the_order_given(tmp_db, tmp_path):
    import json

    from omnitune.registry import get_spec
    from omnitune.store import config_json

    spec = get_spec("attention")
    problem = spec.parse_shape(SHAPE)
    default = spec.default_config(problem, torch.float32)
    # Two partial configs unlike the default, the second from a file; the third repeats the first.
    first = {"BLOCK_M": 16, "BLOCK_N": 16 if default["BLOCK_N"] != 16 else 32}
    second = {"num_stages": 1 if default["num_stages"] != 1 else 2}
    (tmp_path / "second.json").write_text(json.dumps(second))
    expected = [spec.complete_config(values, problem, torch.float32) for values in (first, second)]
    assert default not in expected and expected[0] != expected[1]
    result = invoke(*search_args(tmp_db, "--trials", "4", "--try", json.dumps(first),
                                 "--try", str(tmp_path / "second.json"), "--try", json.dumps(first)))
    assert result.exit_code == 0, result.output
    measured = rows(tmp_db)
    assert len(measured) == 4
    assert measured[0]["is_default"] == 1
    assert [r["config_json"] for r in measured[1:3]] == [config_json(c) for c in expected]
    assert measured[3]["config_json"] not in {config_json(c) for c in [default, *expected]}
    # The progress lines (not a terminal here) say who chose each config.
    chosen = re.findall(r"^  trial \d+/4: .* \(([\w-]+)\) → ", result.stdout, re.MULTILINE)
    assert chosen[:3] == ["default", "given", "given"] and chosen[3] not in {"default", "given"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["search", "nosuch", "--shape", SHAPE, *MODE], "unknown kernel 'nosuch'; choose one of"),
        (["search", "attention", "--shape", "b=1,h=2,zz=3", *MODE], "no dimension 'zz'"),
        (["search", "attention", "--shape", SHAPE, "--dtype", "fp8", *MODE],
         "unknown dtype 'fp8'; choose one of fp32, fp16, bf16"),
        (["search", "attention", "--shape", SHAPE, "--dtype", "fp32"], "no CUDA GPU here"),
        (["search", "attention", "--shape", SHAPE, "--sampler", "anneal", *MODE],
         "unknown sampler 'anneal'; choose one of tpe, random, grid, cmaes"),
        (["search", "attention", *MODE], "give at least one --shape"),
        (["search", "attention", "--shape", SHAPE, "--dtype", "fp32", *MODE, "--try", '{"BLOCK_Q": 16}'],
         "attention has no parameter 'BLOCK_Q'"),
        (["search", "attention", "--shape", SHAPE, "--dtype", "fp32", *MODE, "--try", '{"BLOCK_M": 24}'],
         "BLOCK_M"),
        (["search", "attention", "--shape", SHAPE, "--dtype", "fp32", *MODE, "--try", "nosuch.json"],
         "--try nosuch.json: no such file"),
        (["search", "attention", "--shape", SHAPE, "--dtype", "fp32", *MODE, "--try", "[16]"],
         "--try must be a JSON object"),
    ],
    ids=["unknown-kernel", "bad-shape", "bad-dtype", "no-gpu", "bad-sampler", "no-shape", "try-unknown-name",
         "try-bad-value", "try-no-file", "try-not-an-object"],
)
def test_user_mistakes_exit_2_with_one_line(args, message, tmp_db, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert_user_error(invoke(*args, "--db", str(tmp_db)), message)
    assert not tmp_db.exists()  # nothing was started


@pytest.mark.skipif(ON_GPU, reason="with a GPU, conftest imports the kernels compiled, so --interpret cannot apply")
def test_bf16_under_the_interpreter_is_refused(tmp_db):
    result = invoke("search", "attention", "--shape", SHAPE, "--dtype", "bf16", "--interpret", "--db", str(tmp_db))
    assert_user_error(result, "use --dtype fp16 or fp32 with --interpret")
    assert not tmp_db.exists()


def assert_user_error(result, message: str) -> None:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], result.stderr


# --- after the search: finalists and Nsight Compute ---------------------------------------------


def test_profile_top_without_ncu_says_so_in_one_line_and_the_search_succeeds(tmp_db, monkeypatch):
    from omnitune.profile import ncu

    monkeypatch.setattr(ncu, "find_ncu", lambda: None)
    result = invoke(*search_args(tmp_db, "--trials", "1", "--profile-top", "2"))
    assert result.exit_code == 0, result.output
    said = [line for line in result.stdout.splitlines() if line.startswith("--profile-top:")]
    # Under --interpret (the CPU) that is the reason given: installing ncu would change nothing.
    reason = "Nsight Compute (ncu) is not installed" if ON_GPU else "skipped under --interpret"
    assert len(said) == 1 and reason in said[0]
    assert len(rows(tmp_db)) >= 1
    conn = sqlite3.connect(tmp_db)
    assert conn.execute("SELECT COUNT(*) FROM profiles").fetchone() == (0,)
    conn.close()


@pytest.mark.skipif(ON_GPU, reason="with a GPU, conftest imports the kernels compiled, so --interpret cannot apply")
def test_finalists_and_profiles_are_skipped_under_the_interpreter_with_a_message(tmp_db, monkeypatch):
    from omnitune.profile import ncu

    monkeypatch.setattr(ncu, "find_ncu", lambda: "/opt/ncu/bin/ncu")  # present, but there is no GPU to profile
    result = invoke(*search_args(tmp_db, "--trials", "1", "--finalists", "2", "--profile-top", "1"))
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert any(line.startswith("finalists not re-timed under --interpret") for line in lines)
    assert any(line.startswith("--profile-top: skipped under --interpret") for line in lines)
    assert rows(tmp_db, retimings=True) == rows(tmp_db)  # nothing re-timed


def test_profile_best_stores_one_profile_per_config_and_stops_at_an_ncu_failure(tmp_path, capsys):
    from omnitune.cli.profile_top import profile_best
    from omnitune.profile.ncu import NcuError, NcuProfile
    from omnitune.registry import get_spec
    from omnitune.store import open_db

    spec = get_spec("attention")
    problem = spec.parse_shape(SHAPE)
    default = spec.default_config(problem, torch.float32)
    others = [c for c in spec.valid_configs(problem, torch.float32) if c != default][:2]
    configs = [others[0], default, others[1]]
    profiled = []

    def fake_ncu(kernel_arg, spec_, problem_, dtype, config):
        profiled.append(config)
        l2 = 90.0 + len(profiled)
        return NcuProfile(kernel_name="_attention_fwd", launches=3, duration_us=100.0 * len(profiled), l1_hit_pct=1.0,
                          l2_hit_pct=l2, dram_pct_of_peak=10.0, achieved_occupancy_pct=12.0, metrics={"x": l2})

    db = open_db(tmp_path / "results.db")
    stored = profile_best(spec, "attention", problem, torch.float32, configs, database=db, device_key="NVIDIA_H200",
                          profiler=fake_ncu)
    assert stored == 3 and profiled == configs
    found = [(r["config_label"], r["which"], r["l2_hit_pct"], r["device_key"]) for r in
             db.query("SELECT * FROM profiles ORDER BY id")]
    assert found == [
        (others[0].label(), "tuned", 91.0, "NVIDIA_H200"),
        (default.label(), "default", 92.0, "NVIDIA_H200"),
        (others[1].label(), "custom", 93.0, "NVIDIA_H200"),
    ]

    def failing_ncu(*args):
        raise NcuError("ncu may not read this GPU's performance counters (ERR_NVGPUCTRPERM)")

    capsys.readouterr()
    assert profile_best(spec, "attention", problem, torch.float32, configs, database=db, device_key="NVIDIA_H200",
                        profiler=failing_ncu) == 0
    said = capsys.readouterr().err.strip().splitlines()
    assert len(said) == 1 and "ERR_NVGPUCTRPERM" in said[0] and "results stand" in said[0]
    assert db.execute("SELECT COUNT(*) FROM profiles").fetchone()[0] == 3


# --- --model: every problem of a model preset ---------------------------------------------------


@pytest.mark.parametrize(
    "args, message",
    [
        (["search", "attention", "--shape", SHAPE, "--model", "qwen2.5-omni-7b"], "not both"),
        (["search"], "give at least one --shape (with a KERNEL) or a --model preset"),
        (["search", "--model", "llama-9"], "unknown model 'llama-9'; choose one of qwen2.5-omni-7b"),
        (["search", "--model", "qwen2.5-omni-7b", "--kernels", "attention,matmul"], "no traffic for kernel 'matmul'"),
        (["search", "attention", "--model", "qwen2.5-omni-7b", "--kernels", "attention"], "not both"),
        (["search", "--shape", SHAPE], "--shape needs a KERNEL"),
        (["search", "--model", "qwen2.5-omni-3b,llama-9"], "unknown model 'llama-9'"),
        (["search", "--model", " , "], "no model named"),
        (["search", "--model", "qwen2.5-omni-3b", "--dtype", "fp32,int3"], "int3"),
        (["search", "--model", "qwen2.5-omni-3b", "--dtype", ","], "names no dtype"),
        (["search", "--model", "qwen-image-dit", "--kernels", "kv_cache_write"], "nothing to search"),
    ],
    ids=["shape-and-model", "neither", "unknown-model", "unknown-kernel", "kernel-twice", "shape-no-kernel",
         "one-of-two-models-unknown", "no-model", "one-of-two-dtypes-unknown", "no-dtype", "nothing-to-search"],
)
def test_model_mistakes_exit_2_with_one_line(args, message, tmp_db):
    assert_user_error(invoke(*args, *MODE, "--db", str(tmp_db)), message)
    assert not tmp_db.exists()


def test_search_model_searches_every_preset_problem_of_the_chosen_kernels(tmp_db, monkeypatch):
    from omnitune.cli import search_cmd
    from omnitune.presets import get_preset, preset_problems

    searched = []
    monkeypatch.setattr(search_cmd, "search_problems",
                        lambda spec, problems, dtype, **kw: searched.append((spec.name, problems, kw["kernel_arg"])))
    result = invoke("search", "--model", "qwen2.5-omni-3b", "--kernels", "paged_decode_attention,kv_cache_write",
                    *MODE, "--db", str(tmp_db))
    assert result.exit_code == 0, result.output
    preset = get_preset("qwen2.5-omni-3b")
    assert searched == [
        (k, [p.problem for p in preset_problems(preset, k)], k) for k in ("paged_decode_attention", "kv_cache_write")
    ]
    searched.clear()
    result = invoke("search", "--model", "qwen-image-dit", *MODE, "--db", str(tmp_db))
    assert result.exit_code == 0, result.output
    assert [name for name, *_ in searched] == ["attention"]  # a DiT has no KV cache
    assert "kv_cache_write: " in result.output and "skipped" in result.output


def test_several_models_and_dtypes_search_each_problem_once_per_dtype(tmp_db, monkeypatch):
    from omnitune.cli import search_cmd
    from omnitune.presets import get_preset, preset_problems
    from omnitune.registry import get_spec

    searched = []
    monkeypatch.setattr(search_cmd, "search_problems",
                        lambda spec, problems, dtype, **kw: searched.append((spec.name, problems, dtype)))
    # The 7B and VL-7B send the KV write the same problems (same heads); the 3B others.
    result = invoke("search", "--model", "qwen2.5-omni-7b, qwen2.5-vl-7b,qwen2.5-omni-3b,qwen2.5-omni-7b",
                    "--kernels", "kv_cache_write", "--dtype", "fp16,fp32,fp16", *MODE, "--db", str(tmp_db))
    assert result.exit_code == 0, result.output
    spec = get_spec("kv_cache_write")
    keys = {m: [spec.problem_key(p.problem) for p in preset_problems(get_preset(m), "kv_cache_write")]
            for m in ("qwen2.5-omni-7b", "qwen2.5-vl-7b", "qwen2.5-omni-3b")}
    assert keys["qwen2.5-omni-7b"] == keys["qwen2.5-vl-7b"]
    assert set(keys["qwen2.5-omni-3b"]).isdisjoint(keys["qwen2.5-omni-7b"])
    expected = list(dict.fromkeys(keys["qwen2.5-omni-7b"] + keys["qwen2.5-omni-3b"]))
    assert [(name, dtype) for name, _, dtype in searched] == [("kv_cache_write", torch.float16),
                                                               ("kv_cache_write", torch.float32)]
    for _, problems, _ in searched:
        assert [spec.problem_key(p) for p in problems] == expected


def test_several_dtypes_apply_to_shapes_too(tmp_db, monkeypatch):
    from omnitune.cli import search_cmd

    searched = []
    monkeypatch.setattr(search_cmd, "search_problems",
                        lambda spec, problems, dtype, **kw: searched.append((len(problems), dtype)))
    result = invoke("search", "attention", "--shape", SHAPE, "--dtype", "fp32,fp16", *MODE, "--db", str(tmp_db))
    assert result.exit_code == 0, result.output
    assert searched == [(1, torch.float32), (1, torch.float16)]


def test_precompile_workers_default_on_a_gpu_and_off_under_the_interpreter():
    from omnitune.cli.search_cmd import _precompile_workers

    assert _precompile_workers(None, interpret=True) == 0
    assert _precompile_workers(6, interpret=True) == 0
    assert _precompile_workers(None, interpret=False) >= 1
    assert _precompile_workers(0, interpret=False) == 0
    assert _precompile_workers(3, interpret=False) == 3

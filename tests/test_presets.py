"""Model presets: dimensions, problem lists, and that the runtime's nearest-match rule covers the
traffic between the preset problems."""

from __future__ import annotations

import itertools

import pytest
import torch

from omnitune.errors import OmnituneError
from omnitune.kernels.attention import AttentionProblem
from omnitune.kernels.cross_attention_layer import CrossAttentionLayerProblem
from omnitune.kernels.kv_cache_write import KVCacheWriteProblem
from omnitune.kernels.paged_decode_attention import PagedDecodeProblem
from omnitune.presets import (
    KERNELS,
    PRESETS,
    ModelKind,
    get_preset,
    parse_kernels,
    preset_problems,
)
from omnitune.registry import get_spec

LANGUAGE_MODELS = [p for p in PRESETS.values() if p.kind is ModelKind.LANGUAGE]


def test_dimensions_match_the_design_table():
    omni7 = get_preset("Qwen2.5-Omni-7B")
    assert (omni7.hidden, omni7.heads, omni7.kv_heads, omni7.head_dim, omni7.layers) == (3584, 28, 4, 128, 28)
    assert (omni7.image_tokens_448, omni7.image_tokens_512, omni7.audio_tokens_per_s) == (256, 324, 25)
    qwen3 = get_preset("qwen3-omni-30b-a3b")
    assert (qwen3.heads, qwen3.kv_heads, qwen3.layers) == (32, 4, 48)
    assert (qwen3.image_tokens_448, qwen3.image_tokens_512, qwen3.audio_tokens_per_s) == (196, 256, 13)
    assert get_preset("qwen2.5-vl-7b").audio_tokens(10) == 0
    dit = get_preset("qwen-image-dit")
    assert dit.image_tokens(1024) == 4096 and dit.kv_heads == dit.heads == 24


def test_unknown_model_lists_the_presets():
    with pytest.raises(OmnituneError, match="qwen2.5-omni-7b") as info:
        get_preset("llama")
    assert "\n" not in str(info.value)


def test_parse_kernels():
    assert parse_kernels(None) == KERNELS
    assert parse_kernels("paged_decode_attention, attention") == ("paged_decode_attention", "attention")
    with pytest.raises(OmnituneError, match="kv_cache_write"):
        parse_kernels("attention,matmul")


@pytest.mark.parametrize("name", list(PRESETS))
def test_problem_lists_are_small_distinct_and_have_valid_defaults(name):
    preset = PRESETS[name]
    for kernel in KERNELS:
        problems = preset_problems(preset, kernel)
        spec = get_spec(kernel)
        if preset.kind is ModelKind.DIT and kernel != "attention":
            assert problems == []  # a DiT has no KV cache
            continue
        assert 2 <= len(problems) <= 12
        assert len({spec.problem_key(p.problem) for p in problems}) == len(problems)
        for p in problems:
            assert isinstance(p.problem, spec.problem_type) and p.role
            assert p.problem.h == preset.heads if hasattr(p.problem, "h") else p.problem.hkv == preset.kv_heads
            assert not spec.violations(p.problem, spec.default_config(p.problem, torch.bfloat16), torch.bfloat16)


def _nearest(spec, problem, presets) -> float | None:
    """The runtime's rule: the smallest MatchPolicy distance among the preset problems."""
    distances = [d for d in (spec.match.distance(problem, p) for p in presets) if d is not None]
    return min(distances) if distances else None


def _traffic(preset) -> dict[str, list]:
    """Realistic problems between (and beyond) the preset points, built independently of the presets'
    own choice of points."""
    h, hkv, d = preset.heads, preset.kv_heads, preset.head_dim
    if preset.kind is ModelKind.DIT:
        return {"attention": [
            AttentionProblem(b=b, h=h, hkv=hkv, lq=n, lk=n, d=d)
            for b, side, text in itertools.product((1, 2, 4), (512, 640, 768, 1024), (32, 256, 1024))
            for n in [preset.image_tokens(side) + text]
        ]}
    attention = []
    for b, text, side, audio_s, images in itertools.product(
        (1, 2, 4), (32, 200, 900, 2500, 6000, 12000, 31000), (448, 512), (0, 2, 30), (1, 2, 4)
    ):
        span = preset.image_tokens(side)
        n = text + images * span + preset.audio_tokens(audio_s)
        if n <= 32768:
            attention.append(AttentionProblem(b=b, h=h, hkv=hkv, lq=n, lk=n, d=d, causal=True,
                                              spans=images, span_len=span))
    for b, text, side in itertools.product((1, 2, 4), (32, 100, 300, 700, 2000, 4096), (448, 512)):
        attention.append(AttentionProblem(b=b, h=h, hkv=hkv, lq=text, lk=preset.image_tokens(side), d=d))
    decode = list(itertools.product((1, 2, 3, 8, 12, 24, 48, 100, 150, 256), (1024, 1500, 3000, 6000, 9000, 20000, 32768)))
    attention += [AttentionProblem(b=b, h=h, hkv=hkv, lq=1, lk=ctx, d=d) for b, ctx in decode]
    paged = [PagedDecodeProblem(b=b, h=h, hkv=hkv, lq=1, ctx=ctx, d=d) for b, ctx in decode]
    writes = [KVCacheWriteProblem(t=t, hkv=hkv, d=d) for t in (1, 2, 7, 16, 33, 100, 256, 300, 1000, 2500, 5000,
                                                               9000, 20000, 40000, 65536)]
    layers = [CrossAttentionLayerProblem(b=b, lq=lq, lk=lk, hidden=preset.hidden, h=h, hkv=hkv, d=d)
              for grid in (itertools.product((1, 2, 4, 8), (1, 2, 4, 8, 16), (1024, 2048, 4096)),  # decode-like
                           itertools.product((2, 4, 8), (256, 512), (2048, 4096)),               # prefill
                           itertools.product((1, 2), (128, 256, 512), (8192, 16384)))             # long video
              for b, lq, lk in grid]
    layers += [CrossAttentionLayerProblem(b=b, lq=lq, lk=lk, hidden=preset.hidden, h=h, hkv=hkv, d=d, kv_cached=True)
               for b, lq, lk in itertools.product((1, 2, 4, 8), (1, 2, 4, 8, 16), (1024, 2048, 4096))]  # decode steps
    return {"attention": attention, "paged_decode_attention": paged, "kv_cache_write": writes,
            "cross_attention_layer": layers}


@pytest.mark.parametrize("name", list(PRESETS))
def test_the_match_policy_covers_realistic_traffic_between_the_preset_problems(name):
    preset = PRESETS[name]
    for kernel, traffic in _traffic(preset).items():
        spec = get_spec(kernel)
        presets = [p.problem for p in preset_problems(preset, kernel)]
        uncovered = [spec.problem_key(t) for t in traffic if _nearest(spec, t, presets) is None]
        assert not uncovered, f"{name} {kernel}: no preset problem within policy for {uncovered[:5]}"


def test_coverage_check_can_fail():
    # Traffic outside the covered range is reported as uncovered: a 128k-token decode context.
    preset = get_preset("qwen2.5-omni-7b")
    spec = get_spec("paged_decode_attention")
    presets = [p.problem for p in preset_problems(preset, "paged_decode_attention")]
    far = PagedDecodeProblem(b=1, h=28, hkv=4, lq=1, ctx=131072, d=128)
    assert _nearest(spec, far, presets) is None


def test_plan_prints_problems_space_trials_time_and_files():
    from typer.testing import CliRunner

    from omnitune.cli import app
    from omnitune.cli.plan_cmd import SECONDS_PER_TRIAL, plan_kernel

    result = CliRunner().invoke(app, ["plan", "--model", "qwen2.5-omni-7b", "--kernels", "kv_cache_write", "-n", "30",
                                      "--db", "/nonexistent/omnitune.db"])
    assert result.exit_code == 0, result.output
    preset = get_preset("qwen2.5-omni-7b")
    spec = get_spec("kv_cache_write")
    planned = plan_kernel("kv_cache_write", preset_problems(preset, "kv_cache_write"), torch.bfloat16, 30)
    for p, problem in zip(planned, preset_problems(preset, "kv_cache_write")):
        assert p.valid_configs == len(spec.valid_configs(problem.problem, torch.bfloat16))
        assert p.trials == min(p.valid_configs, 30)
        assert p.problem_key in result.output and f"{p.valid_configs} valid configs, {p.trials} trials" in result.output
    assert any(p.trials < 30 for p in planned)  # a small space is measured whole, not 30 times
    assert f"assumed {SECONDS_PER_TRIAL:g} s per trial (measured on the H200" in result.output
    assert "no results database at /nonexistent/omnitune.db" in result.output
    assert "tuned_configs/kv_cache_write/" in result.output and "attention" not in result.output


def test_plan_unknown_model_is_one_line():
    from typer.testing import CliRunner

    from omnitune.cli import app

    result = CliRunner().invoke(app, ["plan", "--model", "gpt-9"])
    assert result.exit_code == 2
    assert result.stderr.strip().count("\n") == 0 and "choose one of qwen2.5-omni-7b" in result.stderr


def test_plan_estimates_from_the_searches_a_database_measured(tmp_path):
    from typer.testing import CliRunner

    from omnitune.cli import app
    from omnitune.store import SearchRunRecord, open_db, record_search_run

    db = open_db(tmp_path / "results.db")
    # Two H200 searches: 60 trials in 40 s of trials, 10 s of fixed cost each; an interpreter run ignored.
    for measured, wall_s in ((50, 45.0), (10, 15.0)):
        record_search_run(db, SearchRunRecord("k|p|bf16|NVIDIA_H200", "NVIDIA_H200", "NVIDIA H200", "2026-12-01",
                                              "budget", measured, wall_s, setup_s=6.0, retime_s=4.0))
    record_search_run(db, SearchRunRecord("k|p|fp32|triton-interpreter", "triton-interpreter", "triton-interpreter", "2026-12-01",
                                          "budget", 500, 5000.0, 1.0, 0.0))
    result = CliRunner().invoke(app, ["plan", "--model", "qwen2.5-omni-7b", "--kernels", "kv_cache_write", "-n", "30",
                                      "--db", str(tmp_path / "results.db")])
    assert result.exit_code == 0, result.output
    assert "0.67 s per trial, from 60 trials measured on NVIDIA H200 + ~10 s per problem" in result.output
    assert "assumed" not in result.output

    empty = tmp_path / "empty.db"
    open_db(empty)
    result = CliRunner().invoke(app, ["plan", "--model", "qwen2.5-omni-7b", "--kernels", "kv_cache_write",
                                      "--db", str(empty)])
    assert result.exit_code == 0, result.output
    assert "assumed 0.22 s per trial" in result.output and f"no searches on a GPU in {empty}" in result.output


def _two_searches_recorded(path, **measured) -> None:
    """A results database at `path` holding two searches of one problem on the H200, 50 trials
    each, 2 s of setup and 1 s of re-timing, with `measured`'s wall and GPU/CPU figures."""
    from omnitune.store import SearchRunRecord, open_db, record_search_run

    db = open_db(path)
    for _ in range(2):
        record_search_run(db, SearchRunRecord("k|p|bf16|NVIDIA_H200", "NVIDIA_H200", "NVIDIA H200", "2026-12-03",
                                              "budget", 50, setup_s=2.0, retime_s=1.0, **measured))
    db.conn.close()


def _plan_output(path) -> str:
    from typer.testing import CliRunner

    from omnitune.cli import app

    result = CliRunner().invoke(app, ["plan", "--model", "qwen2.5-omni-7b", "--kernels", "kv_cache_write", "-n", "30",
                                      "--db", str(path)])
    assert result.exit_code == 0, result.output
    return result.output


def _drop_search_run_columns(path, *columns: str) -> None:
    """The database as an older schema left it: without `columns` in search_runs."""
    import sqlite3

    con = sqlite3.connect(path)
    for column in columns:
        con.execute(f"ALTER TABLE search_runs DROP COLUMN {column}")
    con.commit()
    con.close()


def test_plan_says_how_long_the_lanes_take_from_the_gpu_time_the_searches_held(tmp_path):
    import re

    from omnitune.cli.plan_rates import measured_rates

    path = tmp_path / "results.db"
    # Two lanes' searches: 40 s of wall each, 10 s of it waiting behind the other lane, 12 s on the GPU.
    _two_searches_recorded(path, wall_s=40.0, gpu_s=12.0, lock_wait_s=10.0)
    rates = measured_rates(path, "NVIDIA_H200")
    assert rates.per_trial_s == pytest.approx((30.0 - 3.0) / 50)  # the wait is not the problem's own cost
    assert rates.gpu_share == pytest.approx(24.0 / 60.0)
    assert rates.in_lanes_s(300.0, 3) == pytest.approx(120.0)  # the GPU's share bounds it, not 300 / 3
    assert rates.in_lanes_s(300.0, 5) == pytest.approx(120.0)
    from omnitune.cli.search_lanes import DEFAULT_LANES

    assert re.search(rf"in {DEFAULT_LANES} lanes \(`omnitune search`'s default on a GPU\) ~.*held the GPU 40% of "
                     "their own time", _plan_output(path))
    # A database from before the GPU time was recorded: its rates all the same, no lanes line.
    _drop_search_run_columns(path, "gpu_s", "lock_wait_s")
    older = measured_rates(path, "NVIDIA_H200")
    assert older.per_trial_s == pytest.approx((40.0 - 3.0) / 50) and older.gpu_share is None


def test_plan_counts_a_re_timing_run_after_the_lanes_in_its_problems_cost(tmp_path):
    from omnitune.cli.plan_rates import measured_rates
    from omnitune.store import SearchRunRecord, open_db, record_search_run

    path = tmp_path / "results.db"
    _two_searches_recorded(path, wall_s=40.0)
    before = measured_rates(path, "NVIDIA_H200")
    assert before.per_problem_s == pytest.approx(3.0)
    db = open_db(path)
    # The session re-times one problem's finalists after its lanes (4 s: inputs, then the re-timing);
    # a finished study rerun that re-timed nothing adds no cost.
    for wall_s, retime_s in ((4.0, 2.5), (1.0, 0.0)):
        record_search_run(db, SearchRunRecord("k|p|bf16|NVIDIA_H200", "NVIDIA_H200", "NVIDIA H200", "2026-12-06",
                                              "budget", 0, wall_s=wall_s, setup_s=1.5, retime_s=retime_s))
    db.conn.close()
    after = measured_rates(path, "NVIDIA_H200")
    assert after.per_problem_s == pytest.approx((3.0 + 3.0 + 4.0) / 2)
    assert after.per_trial_s == before.per_trial_s


def test_the_lanes_estimate_is_bounded_by_the_cpu_the_searches_took(tmp_path):
    import re

    from omnitune.cli.plan_rates import measured_rates

    path = tmp_path / "results.db"
    # 30 s of own time each, 6 s on the GPU, 60 s of CPU (15 its own, 45 its compile workers'): 2 cores.
    _two_searches_recorded(path, wall_s=30.0, gpu_s=6.0, lock_wait_s=0.0, cpu_s=15.0, compile_cpu_s=45.0)
    rates = measured_rates(path, "NVIDIA_H200")
    assert rates.gpu_share == pytest.approx(0.2) and rates.cores_busy == pytest.approx(2.0)
    assert rates.in_lanes_s(300.0, 3, cores=16) == pytest.approx(100.0)  # three lanes at a time
    assert rates.in_lanes_s(300.0, 3, cores=4) == pytest.approx(150.0)  # 600 s of CPU on 4 cores
    assert rates.in_lanes_s(300.0, 3) == pytest.approx(100.0)  # cores unknown: not a bound
    assert re.search(r"held the GPU 20% of their own time and kept 2\.0 CPU cores busy \(this host has \d+\)",
                     _plan_output(path))
    # A database from before the CPU time was recorded (schema 4): the GPU's bound alone.
    _drop_search_run_columns(path, "cpu_s", "compile_cpu_s")
    older = measured_rates(path, "NVIDIA_H200")
    assert older.cores_busy is None and older.gpu_share == pytest.approx(0.2)


@pytest.mark.parametrize("wall_s", [-5.0, 0.0, 1e308, 2.5])
def test_plan_leaves_out_search_runs_with_times_no_search_gives(tmp_path, wall_s):
    """A corrupt search_runs row made the plan estimate ~-40 s, ~inf h or NaN (with a numpy
    warning on stderr); a run whose setup and re-timing (3 s) exceed its wall is impossible too."""
    import warnings

    from omnitune.cli.plan_rates import measured_rates

    path = tmp_path / "results.db"
    _two_searches_recorded(path, wall_s=40.0)
    good = measured_rates(path, "NVIDIA_H200")
    _two_searches_recorded(path, wall_s=wall_s)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no RuntimeWarning of a division by zero
        rates = measured_rates(path, "NVIDIA_H200")
    assert (rates.per_trial_s, rates.per_problem_s) == (good.per_trial_s, good.per_problem_s)
    assert "2 with impossible times left out" in rates.source
    output = _plan_output(path)
    assert "~-" not in output and "inf" not in output and "nan" not in output, output

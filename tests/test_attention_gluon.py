"""Attention's BACKEND=gluon_pingpong (omnitune/kernels/attention_gluon.py): the spec's constraints
keep its configs to the problems and devices it runs on, before anything is compiled; the search
and the runtime see its configs only where they are valid; the attention module does not import
Gluon. On an sm_90 GPU (`gpu` marker) the public op runs it right — captured in a CUDA graph
too — and falls back to the Triton kernel for tensors it cannot take."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys

import pytest
import torch
from conftest import DEVICE, capture_graph, write_tuned_table

from omnitune import runtime
from omnitune.kernels import attention as attn
from omnitune.kernels.attention import SPEC, AttentionInputs, AttentionProblem
from omnitune.runtime import Rung
from omnitune.search.prepare_next import first_configs
from omnitune.spec import Config, DeviceLimits

WINNER = {"BACKEND": "gluon_pingpong", "BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 4, "num_stages": 2,
          "PACK_GQA": False, "USE_TMA": False}
WINNER_CONFIG = Config(WINNER)
# The measured problem (benchmarks/results/gluon_attention_h100_round41_G2.json)
PREFILL = AttentionProblem(b=1, h=32, hkv=4, lq=8192, lk=8192, d=128, causal=True)
# What the H100 and H200 report: 227 KiB of shared memory per block (opt-in), sm_90, 132 SMs.
H100 = DeviceLimits(shared_memory_per_block_bytes=232_448, compute_capability=(9, 0), multiprocessors=132)
H200 = DeviceLimits(shared_memory_per_block_bytes=232_448, compute_capability=(9, 0), multiprocessors=132)
GPU = "NVIDIA H100 80GB HBM3"
GLUON_CONSTRAINTS = {"backend_parks_the_rest", "gluon_needs_sm90", "gluon_16_bit", "gluon_head_dim_128",
                     "gluon_shared_memory"}
# Every config of the backend: one per (BLOCK_N, num_stages), the rest fixed
GLUON_CONFIGS = {WINNER_CONFIG.replace(BLOCK_N=n, num_stages=s) for n in (64, 128) for s in (2, 3)}


GLUON_MODULE = "omnitune.kernels.attention_gluon"


def _is_gluon(config: Config) -> bool:
    return config.get("BACKEND", "triton") == "gluon_pingpong"


@pytest.fixture
def gluon_module():
    """omnitune.kernels.attention_gluon (it imports Gluon: skipped where this Triton has none)."""
    pytest.importorskip("triton.experimental.gluon", reason="this Triton has no Gluon")
    import omnitune.kernels.attention_gluon as gluon

    return gluon


# --- constraints ----------------------------------------------------------------------------------


@pytest.mark.parametrize("limits", [H100, H200], ids=["H100", "H200"])
def test_the_constraints_accept_the_measured_winner_where_it_was_measured(limits):
    for causal in (True, False):
        for hkv in (4, 32):
            problem = dataclasses.replace(PREFILL, hkv=hkv, causal=causal)
            assert SPEC.violations(problem, WINNER_CONFIG, torch.bfloat16, limits) == []
    assert SPEC.violations(PREFILL, WINNER_CONFIG, torch.float16, limits) == []
    assert WINNER_CONFIG in SPEC.known_good_configs(PREFILL, torch.bfloat16, limits)


@pytest.mark.parametrize("problem, dtype, limits, config, name, words", [
    (dataclasses.replace(PREFILL, d=64), torch.bfloat16, H100, WINNER_CONFIG, "gluon_head_dim_128", "head dim 128"),
    (PREFILL, torch.float32, H100, WINNER_CONFIG, "gluon_16_bit", "fp16 or bf16"),
    (PREFILL, torch.bfloat16, dataclasses.replace(H100, compute_capability=(8, 0)), WINNER_CONFIG,
     "gluon_needs_sm90", "sm_90"),
    (PREFILL, torch.bfloat16, dataclasses.replace(H100, compute_capability=(10, 0)), WINNER_CONFIG,
     "gluon_needs_sm90", "sm_90"),
    (PREFILL, torch.bfloat16, H100, WINNER_CONFIG.replace(BLOCK_M=64), "backend_parks_the_rest", "BLOCK_M=128"),
    (PREFILL, torch.bfloat16, H100, WINNER_CONFIG.replace(num_warps=8), "backend_parks_the_rest", "num_warps=4"),
    (PREFILL, torch.bfloat16, H100, WINNER_CONFIG.replace(PACK_GQA=True), "backend_parks_the_rest", "PACK_GQA"),
    (PREFILL, torch.bfloat16, H100, WINNER_CONFIG.replace(USE_TMA=True), "backend_parks_the_rest", "USE_TMA"),
    (PREFILL, torch.bfloat16, H100, WINNER_CONFIG.replace(BLOCK_N=32), "backend_parks_the_rest", "BLOCK_N in"),
    (PREFILL, torch.bfloat16, H100, WINNER_CONFIG.replace(num_stages=4), "backend_parks_the_rest", "num_stages in"),
    (PREFILL, torch.bfloat16, dataclasses.replace(H100, shared_memory_per_block_bytes=101_376),
     WINNER_CONFIG.replace(num_stages=3), "gluon_shared_memory", "shared memory"),
], ids=["d64", "fp32", "sm80", "sm100", "block_m64", "warps8", "pack_gqa", "use_tma",
        "block_n32", "stages4", "smem"])
def test_the_constraints_refuse_what_the_kernel_does_not_run_each_with_its_reason(problem, dtype, limits, config,
                                                                                    name, words):
    broken = SPEC.violations(problem, config, dtype, limits)
    assert name in [n for n, _ in broken], broken
    reason = dict(broken)[name]
    assert words in reason and "gluon_pingpong" in reason and "\n" not in reason
    # only the backend's own constraints judge it: none of the Triton kernel's
    assert {n for n, _ in broken} <= GLUON_CONSTRAINTS, broken


def test_the_shared_memory_bound_counts_the_q_tile_the_kv_ring_and_the_barriers():
    # 128·128 + 3 stages · 2 · 128·128 bf16 elements, + 1 KiB: under 227 KiB, over 224 KiB
    n128_s3 = WINNER_CONFIG.replace(num_stages=3)
    need = 2 * (128 * 128 + 3 * 2 * 128 * 128) + 1024
    fits, short = (dataclasses.replace(H100, shared_memory_per_block_bytes=b) for b in (need, need - 1))
    assert not SPEC.violations(PREFILL, n128_s3, torch.bfloat16, fits)
    assert [n for n, _ in SPEC.violations(PREFILL, n128_s3, torch.bfloat16, short)] == ["gluon_shared_memory"]


def test_parking_keeps_the_tunables_and_fixes_the_rest():
    loose = WINNER_CONFIG.replace(BLOCK_M=16, num_warps=8, PACK_GQA=True, USE_TMA=True, BLOCK_N=64, num_stages=3)
    assert attn.park_ignored(loose) == WINNER_CONFIG.replace(BLOCK_N=64, num_stages=3)
    # a partial config naming the backend completes to one of its configs
    assert SPEC.complete_config({"BACKEND": "gluon_pingpong", "BLOCK_N": 64, "num_stages": 2}, PREFILL,
                                torch.bfloat16) == WINNER_CONFIG.replace(BLOCK_N=64)


def test_the_measured_winner_is_known_good_but_no_pytorch_backend():
    assert WINNER in SPEC.known_good
    # spec.backends are PyTorch's paths (verify's "never slower than PyTorch", nothing to compile)
    assert all(values["BACKEND"] != "gluon_pingpong" for values in SPEC.backends)


# --- the search's space -------------------------------------------------------------------------


@pytest.mark.parametrize("problem, dtype, limits, expected", [
    (PREFILL, torch.bfloat16, H100, GLUON_CONFIGS),
    (dataclasses.replace(PREFILL, causal=False, hkv=32, lq=1024, lk=1024), torch.float16, H200, GLUON_CONFIGS),
    (dataclasses.replace(PREFILL, d=64), torch.bfloat16, H100, set()),
    # any lengths: tails are masked, and Lq ≠ Lk is causal bottom-right as the Triton kernel
    (dataclasses.replace(PREFILL, lk=4096), torch.bfloat16, H100, GLUON_CONFIGS),
    (dataclasses.replace(PREFILL, lq=1000, lk=1000), torch.bfloat16, H100, GLUON_CONFIGS),
    (dataclasses.replace(PREFILL, lq=1, lk=77, causal=False), torch.bfloat16, H100, GLUON_CONFIGS),
    (dataclasses.replace(PREFILL, spans=2, span_len=256), torch.bfloat16, H100, GLUON_CONFIGS),  # image spans
    (PREFILL, torch.float32, H100, set()),
    (PREFILL, torch.bfloat16, dataclasses.replace(H100, compute_capability=(8, 0)), set()),
])
def test_the_search_space_holds_gluon_configs_only_where_they_are_valid(problem, dtype, limits, expected):
    valid = SPEC.valid_configs(problem, dtype, limits)  # what the search enumerates and samples from
    assert {c for c in valid if _is_gluon(c)} == expected
    assert any(not _is_gluon(c) for c in valid)  # the Triton kernel still serves every problem
    first = first_configs(SPEC, problem, dtype, limits, warm_start=())  # measured before any result
    assert (WINNER_CONFIG in first) == bool(expected)
    assert all(not _is_gluon(c) or c in expected for c in first)


def test_every_other_gluon_config_of_the_box_is_pruned_before_any_compile():
    # what a sampler may propose outside the valid set: a constraint rejects it, naming why
    gluon = [c for c in SPEC.all_configs() if _is_gluon(c)]
    assert {c for c in gluon if not SPEC.violations(PREFILL, c, torch.bfloat16, H100)} == GLUON_CONFIGS
    for config in gluon:
        if config not in GLUON_CONFIGS:
            assert "backend_parks_the_rest" in dict(SPEC.violations(PREFILL, config, torch.bfloat16, H100))


# --- the runtime: a gluon entry carried where it does not fit is refused ----------------------


@pytest.mark.parametrize("asked", [
    AttentionProblem(b=1, h=32, hkv=4, lq=1024, lk=1024, d=128, causal=True),   # its own problem
    AttentionProblem(b=1, h=32, hkv=4, lq=1000, lk=1000, d=128, causal=True),   # a tail
    AttentionProblem(b=2, h=32, hkv=4, lq=1024, lk=2048, d=128, causal=True),   # lq ≠ lk
])
def test_a_gluon_entry_never_answers_where_it_does_not_fit(tables_dir, monkeypatch, asked):
    # an entry measured where its 3-stage ring fit, read on a device with less shared memory per block
    small = dataclasses.replace(H100, shared_memory_per_block_bytes=101_376)
    monkeypatch.setattr(runtime, "_device_limits", lambda: small)
    tuned = AttentionProblem(b=1, h=32, hkv=4, lq=1024, lk=1024, d=128, causal=True)
    three_stages = WINNER_CONFIG.replace(num_stages=3)
    write_tuned_table(tables_dir, SPEC, GPU, [(tuned, "bf16", dict(three_stages))], time_ms=1.0)
    # within the match policy's reach, and the kernel's rule carries the entry over unchanged:
    # the constraint refuses it, and the chain falls through
    assert SPEC.match.distance(asked, tuned) is not None
    assert SPEC.adapt(tuned, asked, three_stages) == three_stages
    assert "gluon_shared_memory" in dict(SPEC.violations(asked, three_stages, torch.bfloat16, small))
    for dtype in (torch.bfloat16, torch.float16):  # fp16 borrows bf16 entries
        answer = runtime.lookup("attention", asked, dtype, GPU)
        assert not _is_gluon(answer.config), answer
        assert not SPEC.violations(asked, answer.config, dtype, small)


def test_a_gluon_entry_answers_its_own_problem_only_on_an_sm90_gpu(tables_dir, monkeypatch):
    monkeypatch.setattr(runtime, "_device_limits", lambda: H100)  # whatever GPU runs the test
    tuned = AttentionProblem(b=1, h=32, hkv=4, lq=1024, lk=1024, d=128, causal=True)
    write_tuned_table(tables_dir, SPEC, GPU, [(tuned, "bf16", WINNER)], time_ms=1.0)
    answer = runtime.lookup("attention", tuned, torch.bfloat16, GPU)
    assert answer.rung is Rung.EXACT and answer.config == WINNER_CONFIG
    # a neighbour (its bucket of lengths, 1,025-1,280, any of which the kernel takes) borrows it
    neighbour = dataclasses.replace(tuned, lq=1100, lk=1100)
    answer = runtime.lookup("attention", neighbour, torch.bfloat16, GPU)
    assert answer.rung is not Rung.EXACT and answer.config == WINNER_CONFIG
    # the runtime checks constraints against the GPU it runs on: an sm_80 one never gets it
    monkeypatch.setattr(runtime, "_device_limits", lambda: DeviceLimits(compute_capability=(8, 0)))
    runtime.clear_cache()
    assert not _is_gluon(runtime.lookup("attention", tuned, torch.bfloat16, GPU).config)


# --- imports --------------------------------------------------------------------------------------


def test_the_attention_module_and_a_lookup_answering_gluon_do_not_import_gluon(tmp_path):
    write_tuned_table(tmp_path, SPEC, GPU, [(PREFILL, "bf16", WINNER)], time_ms=1.0)
    code = (
        "import json, sys, torch\n"
        "import omnitune.kernels.attention as attn\n"
        "def gluon(): return sorted(m for m in sys.modules if m.startswith('triton.experimental.gluon')"
        " or m == 'omnitune.kernels.attention_gluon')\n"
        "after_import = gluon()\n"
        "from omnitune import runtime\n"
        f"answer = runtime.lookup('attention', attn.{PREFILL!r}, torch.bfloat16, {GPU!r})\n"
        "print(json.dumps({'after_import': after_import, 'after_lookup': gluon(), 'config': dict(answer.config)}))\n"
    )
    # no GPU in the child: the runtime checks constraints against an H100's limits, whatever runs the test
    env = dict(os.environ, TRITON_INTERPRET="1", OMNITUNE_CONFIG_DIR=str(tmp_path), CUDA_VISIBLE_DEVICES="")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["config"] == WINNER  # the table was read, and answered the Gluon kernel
    assert report["after_import"] == [] and report["after_lookup"] == []


# --- the op's fallback, without a GPU ---------------------------------------------------------------


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU tensors: the interpreter's case")
def test_without_an_sm90_gpu_the_op_runs_the_triton_kernel_with_one_warning(caplog):
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 1, 128, 128, generator=gen).to(torch.float16) for _ in range(3))
    attn._refusals_logged.clear()
    gluon_was_loaded = GLUON_MODULE in sys.modules  # another test's import, or none
    with caplog.at_level("WARNING", logger="omnitune.runtime"):
        for length in (128, 128, 64):  # one line for the reason, not one per shape it holds for
            inputs = AttentionInputs(q[:, :, :length], k[:, :, :length], v[:, :, :length], True, 1 / math.sqrt(128))
            out = attn.attention(inputs.q, inputs.k, inputs.v, causal=True, config=WINNER)
            assert SPEC.compare(out, SPEC.reference(inputs)) <= SPEC.tolerance[torch.float16]
    refusals = [r.getMessage() for r in caplog.records if "gluon_pingpong refused" in r.getMessage()]
    assert len(refusals) == 1 and "sm_90" in refusals[0], refusals
    # the search's path measures what its config names: it fails instead of timing a stand-in
    with pytest.raises(ValueError, match="sm_90"):
        SPEC.launch(AttentionInputs(q, k, v, True, 0.1), torch.empty_like(q), WINNER_CONFIG)
    # and nothing here imported Gluon: it cannot run on this machine
    assert (GLUON_MODULE in sys.modules) == gluon_was_loaded


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU tensors: the interpreter's case")
def test_a_search_under_the_interpreter_records_a_refused_gluon_config_as_a_failed_trial():
    from omnitune.measure.runner import Runner
    from omnitune.trial import TrialStatus

    problem = AttentionProblem(b=1, h=1, hkv=1, lq=128, lk=128, d=128)
    runner = Runner(SPEC, problem, torch.float16, interpret=True)
    result = runner.measure(WINNER_CONFIG)  # not an OmnituneError, which would end the search
    assert result.status is not TrialStatus.OK and "sm_90" in result.detail, result


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU tensors: the interpreter's case")
def test_under_torch_compile_the_op_reaches_the_same_fallback(caplog):
    # the custom op torch.compile records runs the eager path: the Gluon kernel asked, refused here
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 2, 128, 128, generator=gen).to(torch.float16) for _ in range(3))
    attn._refusals_logged.clear()
    torch._dynamo.reset()
    compiled = torch.compile(lambda q, k, v: attn.attention(q, k, v, causal=False, config=WINNER), fullgraph=True,
                             backend="aot_eager")
    with caplog.at_level("WARNING", logger="omnitune.runtime"):
        out = compiled(q, k, v)
    assert SPEC.compare(out, SPEC.reference(AttentionInputs(q, k, v, False, 1 / math.sqrt(128)))) <= 5e-3
    assert any("gluon_pingpong refused" in r.getMessage() for r in caplog.records)


def test_the_kernel_refuses_what_it_cannot_read_before_any_gpu_work(gluon_module):
    gluon = gluon_module

    def qkv(h=4, hkv=2, L=256, d=128, dtype=torch.bfloat16):
        return (torch.zeros(1, h, L, d, dtype=dtype), torch.zeros(1, hkv, L, d, dtype=dtype),
                torch.zeros(1, hkv, L, d, dtype=dtype))

    for inputs, words in ((qkv(d=64), "head dim"), (qkv(h=6, hkv=4), "multiple of kv heads"),
                          (qkv(dtype=torch.float32), "bf16 or all fp16"), (qkv(L=0), "must not be empty")):
        assert words in gluon.shape_refusal(*inputs)
    q, k, v = qkv()
    assert gluon.shape_refusal(q, k, v) is None
    assert gluon.shape_refusal(q[:, :, :200], k[:, :, :77], v[:, :, :77]) is None  # any lengths, Lq ≠ Lk
    assert gluon.shape_refusal(q, k[:, :, :128], v).startswith("k and v must be")
    assert gluon.shape_refusal(q, torch.cat([k, k]), torch.cat([v, v])).startswith("k and v must be")
    if not torch.cuda.is_available():
        assert "sm_90" in gluon.refusal(q, k, v, torch.empty_like(q), 0.1)
        with pytest.raises(gluon.PingpongRefused, match="sm_90"):
            gluon.launch_pingpong(q, k, v, torch.empty_like(q), True, 0.1, 128, 2)


# --- on an sm_90 GPU ----------------------------------------------------------------------------------


def _need_sm90():
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the Gluon kernel is written for sm_90")


@pytest.fixture
def launches(monkeypatch, gluon_module):
    """The Gluon kernel's launches through the op, each 'ran' or the refusal's message."""
    _need_sm90()
    gluon = gluon_module
    seen: list[str] = []
    real = gluon.launch_pingpong

    def spy(*args, **kwargs):
        try:
            real(*args, **kwargs)
        except gluon.PingpongRefused as exc:
            seen.append(str(exc))
            raise
        seen.append("ran")

    monkeypatch.setattr(gluon, "launch_pingpong", spy)
    attn._gluon_failed.clear()
    return seen


def _inputs(b, h, hkv, L, dtype, seed, causal, sm_scale=None, lk=None):
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    q = torch.randn(b, h, L, 128, generator=gen, device=DEVICE, dtype=dtype)
    k, v = (torch.randn(b, hkv, L if lk is None else lk, 128, generator=gen, device=DEVICE, dtype=dtype)
            for _ in range(2))
    return AttentionInputs(q, k, v, causal, 1 / math.sqrt(128) if sm_scale is None else sm_scale)


def _check(out, inputs):
    assert torch.isfinite(out).all()
    err = SPEC.compare(out, SPEC.reference(inputs))
    assert err <= SPEC.tolerance[inputs.q.dtype], err


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("L", [256, 512])
@pytest.mark.parametrize("h, hkv", [(4, 2), (4, 4)], ids=["h4kv2", "h4kv4"])
def test_gpu_the_public_op_runs_the_gluon_kernel_right(launches, h, hkv, L, causal, dtype):
    for seed in (L + causal, L + causal + 100):  # fresh random inputs: a race shows on one and not the other
        inputs = _inputs(1, h, hkv, L, dtype, seed, causal)
        out = attn.attention(inputs.q, inputs.k, inputs.v, causal=causal, config=WINNER)
        torch.cuda.synchronize()
        _check(out, inputs)
    assert launches == ["ran", "ran"]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("lq, lk", [(200, 200), (1000, 1000), (1, 77), (77, 1), (300, 700), (700, 300), (64, 1000),
                                    (1000, 64), (129, 129)])
def test_gpu_tails_and_lq_other_than_lk_are_right(launches, lq, lk, causal, dtype):
    # A key tail is masked out of the softmax; a query tail writes only its rows; causal is
    # bottom-right aligned, and with Lq > Lk the rows that see no key are zeros. The output is the
    # head of a poisoned buffer: an unwritten element fails the check, and a row stored past the
    # last head's Lq would land in the guard behind it.
    for seed in (lq + lk + causal, lq + lk + causal + 100):
        inputs = _inputs(2, 4, 2, lq, dtype, seed, causal, lk=lk)
        for n, stages in ((128, 2), (64, 3)):
            size = inputs.q.numel()
            buffer = torch.full((size + 64 * 128,), float("nan"), dtype=dtype, device=DEVICE)
            out = buffer[:size].view(inputs.q.shape)
            assert SPEC.launch(inputs, out, WINNER_CONFIG.replace(BLOCK_N=n, num_stages=stages)) is None
            torch.cuda.synchronize()
            _check(out, inputs)
            assert buffer[size:].isnan().all(), "a row was stored past the output's end"
        out = attn.attention(inputs.q, inputs.k, inputs.v, causal=causal, config=WINNER)
        torch.cuda.synchronize()
        _check(out, inputs)
    assert launches and set(launches) == {"ran"}


@pytest.mark.gpu
@pytest.mark.parametrize("config", sorted(GLUON_CONFIGS, key=Config.label), ids=Config.label)
def test_gpu_every_config_the_search_can_measure_is_right(config):
    _need_sm90()
    for causal in (False, True):
        inputs = _inputs(2, 4, 2, 384, torch.bfloat16, 7, causal)
        out = SPEC.new_output(inputs)  # poisoned: an unwritten element fails the check
        assert SPEC.launch(inputs, out, config) is None
        torch.cuda.synchronize()
        _check(out, inputs)


@pytest.mark.gpu
def test_gpu_a_captured_call_replayed_on_new_values_gives_the_new_answer(launches):
    first = _inputs(1, 4, 2, 512, torch.bfloat16, 11, True)
    q, k, v = (t.clone() for t in (first.q, first.k, first.v))
    graph, out = capture_graph(lambda: attn.attention(q, k, v, causal=True, config=WINNER))
    second = _inputs(1, 4, 2, 512, torch.bfloat16, 12, True)
    for values in (first, second):
        q.copy_(values.q)
        k.copy_(values.k)
        v.copy_(values.v)
        graph.replay()
        torch.cuda.synchronize()
        _check(out, values)
    assert launches and set(launches) == {"ran"}


@pytest.mark.gpu
def test_gpu_calls_on_kept_tensor_maps_stay_right_as_tensors_come_and_go(launches, gluon_module):
    # The op keeps each view's encoded tensor map by address and shape (omnitune/kernels/
    # _tma_launch.py): tensors freed and drawn again (the allocator hands the same addresses
    # back), new values written into the same tensors, and a shape in between must each be read
    # afresh.
    q = k = v = None
    for step, L in enumerate((256, 256, 384, 256, 256)):
        del q, k, v
        inputs = _inputs(1, 4, 2, L, torch.bfloat16, 40 + step, True)
        q, k, v = inputs.q, inputs.k, inputs.v
        out = attn.attention(q, k, v, causal=True, config=WINNER)
        torch.cuda.synchronize()
        _check(out, inputs)
        again = _inputs(1, 4, 2, L, torch.bfloat16, 80 + step, True)
        for mine, theirs in ((q, again.q), (k, again.k), (v, again.v)):
            mine.copy_(theirs)
        out = attn.attention(q, k, v, causal=True, config=WINNER)
        torch.cuda.synchronize()
        _check(out, again)
    assert launches == ["ran"] * 10
    kept = gluon_module._launcher(WINNER["BLOCK_N"], WINNER["num_stages"], 1)._kernels
    assert any(kernel is not None and kernel.maps for kernel in kept.values()), "no call took the kept maps"


@pytest.mark.gpu
def test_gpu_a_transposed_view_falls_back_to_the_triton_kernel_and_is_right(launches, caplog):
    inputs = _inputs(1, 4, 2, 256, torch.bfloat16, 13, True)
    q = inputs.q.transpose(1, 2).contiguous().transpose(1, 2)  # [b, h, L, d] strided as [b, L, h, d]
    assert not q.is_contiguous() and torch.equal(q, inputs.q)
    attn._refusals_logged.clear()
    with caplog.at_level("WARNING", logger="omnitune.runtime"):
        for _ in range(2):
            out = attn.attention(q, inputs.k, inputs.v, causal=True, config=WINNER)
            torch.cuda.synchronize()
            _check(out, inputs)
    assert len(launches) == 2 and all("contiguous" in why for why in launches), launches
    assert len([r for r in caplog.records if "gluon_pingpong refused" in r.getMessage()]) == 1


@pytest.mark.gpu
@pytest.mark.parametrize("span_dtype", [torch.int32, torch.int64], ids=["int32", "int64"])
@pytest.mark.parametrize("lq, lk, spans", [
    (256, 256, [[[40, 90]], [[100, 230]]]),                      # inside one block, across the 128-row edge
    (1000, 1000, [[[120, 700], [900, 990]], [[0, 64], [5, 2000]]]),  # two spans a sequence; one past Lk (clamped)
    (300, 700, [[[500, 650]], [[0, 0]]]),                        # Lq < Lk (bottom-right), an empty span
    (700, 300, [[[0, 128]], [[250, 300]]]),                      # Lq > Lk: rows that see no key stay zeros
], ids=["256", "1000", "300x700", "700x300"])
def test_gpu_image_spans_run_on_the_gluon_kernel_and_are_right(launches, lq, lk, spans, span_dtype):
    for seed in (lq + lk, lq + lk + 100):
        inputs = _inputs(2, 4, 2, lq, torch.bfloat16, seed, True, lk=lk)
        span_t = torch.tensor(spans, dtype=span_dtype, device=DEVICE)
        expected = dataclasses.replace(inputs, spans=span_t)
        for n, stages in ((128, 2), (64, 3)):
            out = SPEC.new_output(expected)  # poisoned: an unwritten element fails the check
            assert SPEC.launch(expected, out, WINNER_CONFIG.replace(BLOCK_N=n, num_stages=stages)) is None
            torch.cuda.synchronize()
            _check(out, expected)
        # check=False: the check mode refuses a span past Lk, which the kernel clamps
        out = attn.attention(inputs.q, inputs.k, inputs.v, causal=True, config=WINNER, mm_spans=span_t, check=False)
        torch.cuda.synchronize()
        _check(out, expected)
    assert launches and set(launches) == {"ran"}


@pytest.mark.gpu
@pytest.mark.parametrize("b, h, hkv", [(3, 6, 3), (1, 20, 4), (2, 8, 8)], ids=["b3h6kv3", "b1h20kv4", "b2h8kv8"])
@pytest.mark.parametrize("mask", ["none", "causal", "spans"])
def test_gpu_every_tile_of_every_section_of_the_launch_order_is_right(launches, gluon_module, b, h, hkv, mask):
    # The launch order walks L2_SECTION (batch·head)s at a time (_sectioned_program): several
    # sections and a last one of fewer heads (18 = 8 + 8 + 2, 20 = 8 + 8 + 4), and exactly two
    # (16), each with three query blocks (the last a tail), and spans that differ by sequence
    # (a span read through the wrong program's batch shows). Poisoned output: an unwritten tile fails.
    assert b * h > gluon_module.L2_SECTION.value
    lq = 300
    for seed in (b * h + lq, b * h + lq + 100):
        inputs = _inputs(b, h, hkv, lq, torch.bfloat16, seed, mask != "none")
        if mask == "spans":
            spans = [[[17 + 40 * i, 140 + 50 * i]] for i in range(b)]
            inputs = dataclasses.replace(inputs, spans=torch.tensor(spans, dtype=torch.int32, device=DEVICE))
        out = SPEC.new_output(inputs)
        assert SPEC.launch(inputs, out, WINNER_CONFIG) is None
        torch.cuda.synchronize()
        _check(out, inputs)
    assert launches == ["ran", "ran"]


@pytest.mark.gpu
@pytest.mark.parametrize("sm_scale", [0.02, 0.3])
def test_gpu_a_softmax_scale_other_than_one_over_sqrt_d_is_right(launches, sm_scale):
    for causal in (False, True):
        inputs = _inputs(1, 4, 2, 256, torch.bfloat16, 15, causal, sm_scale=sm_scale)
        out = attn.attention(inputs.q, inputs.k, inputs.v, causal=causal, sm_scale=sm_scale, config=WINNER)
        torch.cuda.synchronize()
        _check(out, inputs)
    assert launches == ["ran", "ran"]


@pytest.mark.gpu
def test_gpu_under_torch_compile_the_op_runs_the_gluon_kernel(launches):
    inputs = _inputs(1, 4, 2, 256, torch.bfloat16, 16, True)
    torch._dynamo.reset()
    compiled = torch.compile(lambda q, k, v: attn.attention(q, k, v, causal=True, config=WINNER), fullgraph=True,
                             backend="aot_eager")
    out = compiled(inputs.q, inputs.k, inputs.v)
    torch.cuda.synchronize()
    _check(out, inputs)
    assert "ran" in launches

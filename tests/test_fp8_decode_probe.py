"""benchmarks/fp8_decode_probe.py's recording of the split kernel: the launch it records computes
what the library's does (the reference, over an fp8 cache, output poisoned first), and the calls
after it bind the library's own launcher again. Under Triton's interpreter on the CPU in fp16 (the
interpreter gets bf16 wrong), bf16 on a GPU."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from omnitune.kernels import paged_decode_attention as pda  # noqa: E402
from omnitune.kernels._launch import BoundLauncher  # noqa: E402
from omnitune.spec import Config  # noqa: E402

probe = pytest.importorskip("fp8_decode_probe")


def test_the_recorded_launch_matches_the_reference_and_leaves_the_launcher_in_place(device):
    dtype = torch.float16 if device == "cpu" else torch.bfloat16
    problem = pda.PagedDecodeProblem(b=2, h=8, hkv=2, lq=1, ctx=150, d=32, block_size=16, cache_dtype="fp8_e4m3")
    inputs = pda.SPEC.make_inputs(problem, dtype, device, 5)
    expected = pda.SPEC.reference(inputs)
    config = Config(NUM_SPLITS=2, BLOCK_N=16, num_warps=1, num_stages=2, PACK_GQA=True, FUSED_REDUCE=False)
    launcher = pda._SPLIT
    out = torch.full_like(inputs.q, float("nan"))
    kernel = probe._recorded_kernel(pda, lambda: pda._launch(
        inputs.q, inputs.key_cache, inputs.value_cache, inputs.block_tables, inputs.context_lens, inputs.sm_scale,
        out, config, None, inputs.k_scale, inputs.v_scale))
    assert not out.isnan().any()
    assert pda.SPEC.compare(out, expected) <= pda.SPEC.tolerance[dtype]
    if device != "cpu":  # the interpreter compiles nothing
        assert kernel.n_regs > 0
    assert pda._SPLIT is launcher
    plan, _ = pda._launch(inputs.q, inputs.key_cache, inputs.value_cache, inputs.block_tables, inputs.context_lens,
                          inputs.sm_scale, out, config, None, inputs.k_scale, inputs.v_scale)
    assert isinstance(plan.split, BoundLauncher)


@pytest.mark.parametrize("fused", [False, True])
def test_the_few_warps_sweep_times_each_cache_tuned_config_first_then_its_grid(fused):
    """The configs are listed before anything runs (they are compiled first, in parallel): the
    cache's tuned config first, unfused, then over fp8 the 72 few-warps configs (each twice with
    --fused-reduce), all valid for the probe's problem."""
    args = probe.argparse.Namespace(quick=False, few_warps=True, fused_reduce=fused, configs=None)
    for cache in ("bf16", "fp8"):
        configs = probe._configs(cache, args)
        first = configs[0]
        assert (first["NUM_SPLITS"], first["BLOCK_N"], first["num_warps"], first["num_stages"]) == probe.TUNED[cache]
        assert first["FUSED_REDUCE"] is False
        grid = len(probe.FEW_WARPS_GRID) if cache == "fp8" else 0
        assert len(configs) == 1 + grid * (2 if fused and cache == "fp8" else 1)
        assert len(set(configs)) == len(configs)
        problem = probe._problem(4096, cache)
        assert problem.cache_dtype == ("fp8_e4m3" if cache == "fp8" else "auto")
        assert all(not pda.SPEC.violations(problem, c, torch.bfloat16) for c in configs)


def test_configs_names_the_fp8_configs_swept_beside_each_cache_tuned_one():
    args = probe.argparse.Namespace(quick=False, few_warps=False, fused_reduce=False,
                                    configs=probe._config_list("4/32/1/3, 8/16/1/4"))
    assert [tuple(c[k] for k in ("NUM_SPLITS", "BLOCK_N", "num_warps", "num_stages"))
            for c in probe._configs("fp8", args)] == [probe.TUNED["fp8"], (4, 32, 1, 3), (8, 16, 1, 4)]
    assert len(probe._configs("bf16", args)) == 1
    for bad in ("", "4/32/1", "4/32/one/3"):
        with pytest.raises(probe.argparse.ArgumentTypeError):
            probe._config_list(bad)

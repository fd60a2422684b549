"""The warp-specialized attention kernel (WARP_SPEC configs, omnitune/kernels/attention_ws.py): against
the reference on fresh random inputs with poisoned outputs — under Triton's interpreter on the CPU
(fp16; the interpreter gets bf16 wrong), on a Hopper GPU at real shapes in bf16 and fp16 (16k
included: round 10's search found it wrong there on the H200), as a CUDA graph replayed on new
values — the constraint that keeps it to the one form that compiled and ran right on sm_90, and
the runtime's rule that carries it to no other problem."""

from __future__ import annotations

import pytest
import torch
from conftest import DEVICE

from omnitune.kernels import attention as attn
from omnitune.kernels.attention import SPEC, AttentionInputs, AttentionProblem, adapt_config
from omnitune.spec import Config, DeviceLimits

WS = Config(BACKEND="triton", BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=2, PACK_GQA=False, USE_TMA=False,
            WARP_SPEC=True)
CPU_DTYPE = torch.float16 if DEVICE == "cpu" else torch.bfloat16


def _error(problem: AttentionProblem, dtype: torch.dtype, config: Config, seed: int, layout=None) -> float:
    inputs = SPEC.make_inputs(problem, dtype, DEVICE, seed)
    if layout is not None:
        inputs = layout(inputs)
    out = SPEC.new_output(inputs)
    assert torch.isnan(out).all()
    assert not SPEC.violations(problem, config, dtype), SPEC.violations(problem, config, dtype)
    assert SPEC.launch(inputs, out, config) is None
    return SPEC.compare(out, SPEC.reference(inputs))


@pytest.mark.parametrize("shape", [
    "b=1,h=4,hkv=2,lq=130,lk=200,d=64,causal=1",    # GQA, a query tail, an uneven last key tile
    "b=2,h=2,hkv=1,l=256,d=64",                      # even tiles: no mask at all
    "b=1,h=2,hkv=2,lq=70,lk=300,d=64",               # fewer queries than a block
    "b=1,h=2,hkv=1,lq=300,lk=100,d=64,causal=1",     # rows that see no key write zeros
    "b=1,h=3,hkv=1,lq=140,lk=140,d=128,causal=1",
])
@pytest.mark.parametrize("block_n", [64, 128])
def test_matches_the_reference(shape, block_n):
    problem = SPEC.parse_shape(shape)
    err = _error(problem, CPU_DTYPE, WS.replace(BLOCK_N=block_n), seed=block_n)
    assert err <= SPEC.tolerance[CPU_DTYPE], err


def test_views_that_are_not_contiguous_are_read_right():
    # [B, L, H, D] storage seen as [B, H, L, D]: the kernel's descriptors need it contiguous, so
    # the launch copies; the answer must not change.
    def transposed(inputs: AttentionInputs) -> AttentionInputs:
        def relaid(t):
            return t.transpose(1, 2).contiguous().transpose(1, 2)
        return AttentionInputs(relaid(inputs.q), relaid(inputs.k), relaid(inputs.v), inputs.causal, inputs.sm_scale)

    problem = SPEC.parse_shape("b=1,h=4,hkv=2,lq=129,lk=129,d=64,causal=1")
    assert _error(problem, CPU_DTYPE, WS, seed=3, layout=transposed) <= SPEC.tolerance[CPU_DTYPE]


@pytest.mark.parametrize("change, problem_shape, dtype, limits, reason", [
    ({"num_warps": 8}, "b=1,h=2,hkv=2,l=256,d=128", torch.bfloat16, DeviceLimits(), "num_warps=4"),
    ({"BLOCK_M": 64}, "b=1,h=2,hkv=2,l=256,d=128", torch.bfloat16, DeviceLimits(), "BLOCK_M=128"),
    ({"BLOCK_N": 32}, "b=1,h=2,hkv=2,l=256,d=128", torch.bfloat16, DeviceLimits(), "BLOCK_N 64 or 128"),
    ({"num_stages": 3}, "b=1,h=2,hkv=2,l=256,d=128", torch.bfloat16, DeviceLimits(), "num_stages=2"),
    ({"USE_TMA": True}, "b=1,h=2,hkv=2,l=256,d=128", torch.bfloat16, DeviceLimits(), "USE_TMA=False"),
    ({}, "b=1,h=2,hkv=2,l=256,d=128", torch.bfloat16, DeviceLimits(compute_capability=(8, 0)), "Hopper"),
    ({}, "b=1,h=2,hkv=2,l=256,d=128", torch.float32, DeviceLimits(), "fp16 and bf16"),
    ({}, "b=1,h=2,hkv=2,l=256,d=80", torch.bfloat16, DeviceLimits(), "head dim"),
    ({}, "b=1,h=2,hkv=2,l=256,d=128,causal=1,spans=1,span_len=32", torch.bfloat16, DeviceLimits(), "spans"),
    ({"BLOCK_N": 128}, "b=1,h=2,hkv=2,l=256,d=128", torch.bfloat16,
     DeviceLimits(shared_memory_per_block_bytes=160 * 1024), "shared memory"),
])
def test_only_its_one_form_is_in_the_space(change, problem_shape, dtype, limits, reason):
    problem = SPEC.parse_shape(problem_shape)
    broken = SPEC.violations(problem, WS.replace(**change), dtype, limits)
    assert broken and reason in broken[0][1], broken


def test_the_space_holds_warp_specialized_configs_only_where_they_run():
    long = SPEC.parse_shape("b=1,h=32,hkv=4,l=8192,d=128,causal=1")
    ws = [c for c in SPEC.valid_configs(long, torch.bfloat16) if c["WARP_SPEC"]]
    assert {(c["BLOCK_N"], c["num_stages"]) for c in ws} == {(64, 2), (128, 2)}
    spans = SPEC.parse_shape("b=1,h=32,hkv=4,l=8192,d=128,causal=1,spans=2,span_len=256")
    assert not [c for c in SPEC.valid_configs(spans, torch.bfloat16) if c["WARP_SPEC"]]
    # Tables exported before the parameter existed mean the kernel without it.
    assert SPEC.coerce_config({k: v for k, v in WS.items() if k != "WARP_SPEC"})["WARP_SPEC"] is False


def test_the_runtime_carries_it_to_no_other_problem():
    tuned = SPEC.parse_shape("b=1,h=32,hkv=4,l=16384,d=128")
    ws = WS.replace(BLOCK_N=128)
    assert adapt_config(tuned, tuned, ws) == ws
    other = SPEC.parse_shape("b=1,h=32,hkv=4,l=12000,d=128")
    carried = adapt_config(tuned, other, ws)
    assert not carried["WARP_SPEC"] and (carried["BLOCK_M"], carried["num_warps"]) == (64, 4)
    assert not SPEC.violations(other, carried, torch.bfloat16), SPEC.violations(other, carried, torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [
    "b=1,h=32,hkv=4,l=8192,d=128,causal=1",
    "b=1,h=24,hkv=24,l=8192,d=128",
    "b=1,h=32,hkv=4,l=16384,d=128",
    "b=1,h=24,hkv=24,l=16384,d=128,causal=1",
    "b=2,h=28,hkv=4,lq=1000,lk=3001,d=128,causal=1",
    "b=1,h=16,hkv=2,lq=4096,lk=700,d=64",
])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_real_shapes(shape, dtype):
    problem = SPEC.parse_shape(shape)
    for config in (WS, WS.replace(BLOCK_N=128)):
        assert not SPEC.violations(problem, config, dtype)
        for seed in (11, 12):  # fresh inputs at new addresses: the descriptors are made anew
            err = _error(problem, dtype, config, seed=seed)
            assert err <= SPEC.tolerance[dtype], f"{config.label()} seed {seed} err={err:.3g}"


@pytest.mark.gpu
def test_gpu_graph_replay_follows_new_values():
    problem = SPEC.parse_shape("b=1,h=8,hkv=2,l=2048,d=128,causal=1")
    inputs = SPEC.make_inputs(problem, torch.bfloat16, "cuda", seed=5)
    out = SPEC.new_output(inputs)
    attn.launch(inputs, out, WS)  # compiled and planned outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        attn.launch(inputs, out, WS)
    for seed in (6, 7):
        fresh = SPEC.make_inputs(problem, torch.bfloat16, "cuda", seed=seed)
        for mine, new in ((inputs.q, fresh.q), (inputs.k, fresh.k), (inputs.v, fresh.v)):
            mine.copy_(new)
        out.fill_(float("nan"))
        graph.replay()
        assert SPEC.compare(out, SPEC.reference(inputs)) <= SPEC.tolerance[torch.bfloat16]

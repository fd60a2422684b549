"""benchmarks/gluon_attention_probe.py: its Gluon kernels (the ping-pong form the library's,
omnitune/kernels/attention_gluon.py) compile for sm_90 without a GPU (in a child process without
TRITON_INTERPRET, as the offline probes run), its entry point refuses what it does not compute
before touching a GPU, and on a GPU every variant matches SDPA in fp32."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from conftest import compile_for_sm90

ROOT = Path(__file__).resolve().parents[1]
PROBE = ROOT / "benchmarks" / "gluon_attention_probe.py"
sys.path.insert(0, str(ROOT / "benchmarks"))

pytest.importorskip("triton.experimental.gluon._runtime", reason="this Triton has no Gluon to compile offline")
probe = pytest.importorskip("gluon_attention_probe")  # imports its ping-pong form from the library


@pytest.fixture(scope="module")
def offline_rows(tmp_path_factory) -> dict:
    """The probe's --offline-compile rows for one variant of each form, by (variant, causal)."""
    names = "pipelined_m128_n64_s3,pingpong_m128_n64_s2"
    out = tmp_path_factory.mktemp("gluon") / "offline.json"
    done = compile_for_sm90([str(PROBE), "--offline-compile", "--variants", names, "--out", str(out)])
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]  # 1: no variant compiled
    return {(r["variant"], r["causal"]): r for r in json.loads(out.read_text())["rows"]}


@pytest.mark.parametrize("causal", [False, True])
def test_the_pipelined_form_compiles_for_sm90_to_wgmma_and_tma(offline_rows, causal):
    row = offline_rows[("pipelined_m128_n64_s3", causal)]
    assert row["compiled"], row.get("error")
    assert row["registers"] > 0 and row["stack_bytes"] == 0 and not row["local_memory"]
    assert 0 < row["shared_bytes"] <= probe.SMEM_LIMIT
    assert row["num_warps_total"] == 8
    assert row["wgmma"] > 0 and row["tma_loads"] > 0 and row["mbarrier_waits"] > 0
    assert row["wgmma_wait_groups"] == ["0", "1"]  # S retired under an in-flight P·V GEMM
    assert row["ptxas_notes"] == []


def test_the_pingpong_form_compiles_to_a_producer_and_two_consumers(offline_rows):
    row = offline_rows[("pingpong_m128_n64_s2", True)]
    assert row["compiled"], row.get("error")
    assert row["num_warps_total"] == 12 and row["stack_bytes"] == 0 and not row["local_memory"]
    assert "inc 232" in row["setmaxnreg"]
    assert row["wgmma"] > 0 and row["tma_loads"] > 0


def _qkv(h=4, hkv=2, L=256, d=128):
    return (torch.zeros(1, h, L, d, dtype=torch.bfloat16), torch.zeros(1, hkv, L, d, dtype=torch.bfloat16),
            torch.zeros(1, hkv, L, d, dtype=torch.bfloat16))


@pytest.mark.parametrize("inputs, message", [
    (_qkv(L=200), "multiple of 128"),
    (_qkv(d=64), "head dim"),
    (_qkv(h=6, hkv=4), "multiple of kv heads"),
])
def test_it_refuses_what_it_does_not_compute_before_any_gpu_work(inputs, message):
    """CPU tensors: the checks come before anything that needs a GPU."""
    with pytest.raises(ValueError, match=message):
        probe.gluon_attention(*inputs, True, block_m=128, block_n=64, stages=3, form="pipelined")


def test_it_refuses_an_unknown_form_and_a_pingpong_tile_it_does_not_split():
    with pytest.raises(ValueError, match="form"):
        probe.gluon_attention(*_qkv(), False, block_m=128, block_n=64, stages=3, form="persistent")
    with pytest.raises(ValueError, match="pingpong"):
        probe.gluon_attention(*_qkv(), False, block_m=64, block_n=64, stages=2, form="pingpong")


@pytest.mark.gpu
@pytest.mark.parametrize("variant", probe.VARIANTS, ids=lambda v: v.name)
@pytest.mark.parametrize("L", [256, 512])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_every_variant_matches_sdpa_in_fp32(variant, L, causal):
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the kernels are written for sm_90")
    shape = probe.Shape(1, 4, L, causal, hkv=2)
    q, k, v = probe.make_inputs(shape, seed=L + causal)
    out = torch.full_like(q, float("nan"))
    probe.run_variant(variant, q, k, v, out, causal)
    torch.cuda.synchronize()
    errors = probe.check(out, probe.reference(q, k, v, causal))
    assert errors["nonfinite"] == 0, errors
    assert errors["rel_rms_err"] < 1e-2, errors

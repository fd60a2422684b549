"""benchmarks/hopper_probe_timing.py's launcher: every probe variant it times, launched with its
arguments (views, strides, grid, host descriptors' block shapes, qk_scale = sm_scale·log2 e for
the probe's exp2 softmax) on a small shape, against SDPA in fp32 math. Without a GPU the kernels
run under Triton's interpreter (fp16: the interpreter's bf16 is not trusted); the output is
poisoned with NaN before each launch and the input is fresh per test, so a variant that writes
nothing, writes the wrong rows or scales the scores wrongly fails. Tolerance: the script's own
(max abs err <= 2e-2 and relative RMS err <= 2e-2, every element finite)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import hopper_probe_timing as timing  # noqa: E402

ALL = [(v, False) for v in timing.FULL_VARIANTS] + [(v, True) for v in timing.CAUSAL_VARIANTS]


def _dtype(device):
    return torch.bfloat16 if device == "cuda" else torch.float16


def _run(variant, causal, device, seed, num_sms=3):
    """(output, reference) for b=1, h=2, L=256; num_sms=3 makes a persistent program walk two tiles."""
    shape = timing.Shape(1, 2, 256, causal)
    q, k, v = timing.make_inputs(shape, _dtype(device), device, seed)
    out = torch.full_like(q, float("nan"))
    timing.launch(variant, q, k, v, out, causal, num_sms)
    return out, timing.reference(q, k, v, causal)


@pytest.mark.parametrize("variant,causal", ALL, ids=[v.name for v, _ in ALL])
def test_variant_matches_sdpa(variant, causal, device):
    out, ref = _run(variant, causal, device, seed=zlib.crc32(variant.name.encode()) % 10_000)
    check = timing.compare(out, ref)
    assert check["correct"], check


def test_check_rejects_a_wrong_scale_and_an_unwritten_output(device, monkeypatch):
    variant = timing.Variant("qkv", 64, 4, 2, warp_spec=True)
    monkeypatch.setattr(timing, "LOG2E", 1.0)  # the scale of an exp softmax, not exp2's
    out, ref = _run(variant, False, device, seed=7)
    assert not timing.compare(out, ref)["correct"]
    unwritten = timing.compare(torch.full_like(out, float("nan")), ref)
    assert not unwritten["correct"] and unwritten["nonfinite"] == out.numel()


def test_variant_lists_keep_to_what_compiles_on_sm90():
    """docs/hopper.md: warp specialization only at 4 warps, BLOCK_M 128, Q/K/V through
    descriptors and one key loop; the persistent probe has no mask; at most 15 per shape."""
    for shape in timing.SHAPES:
        chosen = timing.variants_for(shape, quick=False, try_warp_spec=True)
        assert len(chosen) <= 15 and len({v.name for v in chosen}) == len(chosen)
        for v in chosen:
            assert shape.L % v.block_m == 0 and shape.L % v.block_n == 0
            assert (v.causal_mode != 0) == shape.causal and not (shape.causal and v.persistent)
            if v.warp_spec:
                assert v.num_warps == 4 and v.block_m == 128 and v.loads in ("qkv", "dev") and v.causal_mode != 1
    assert {s.name for s in timing.select_shapes(False, "h24_L16384")} == {"b1_h24_L16384_causal",
                                                                            "b1_h24_L16384_full"}


def test_warp_specialization_over_host_descriptors_is_left_out_unless_asked_for_and_reported_as_such():
    # It hung on the H200 (timing.WARP_SPEC_HANGS): a default run launches none of it, but does
    # launch warp specialization over descriptors made in the kernel (which completed there).
    for shape in timing.SHAPES:
        default = timing.variants_for(shape, quick=False)
        assert not any(v.warp_spec and v.loads != "dev" for v in default)
        assert any(v.warp_spec and v.loads == "dev" for v in default)
        assert timing.warp_spec_rows_skipped(shape, False) == [
            v.name for v in timing.variants_for(shape, False, try_warp_spec=True) if v.warp_spec and v.loads != "dev"]
        assert timing.warp_spec_rows_skipped(shape, False)


def test_flops_halve_under_a_causal_mask():
    full, causal = timing.Shape(1, 32, 8192, False), timing.Shape(1, 32, 8192, True)
    assert full.flops == 4 * 32 * 8192 ** 2 * 128 == 2 * causal.flops


def _nvidia_bin() -> Path:
    import triton

    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin"


def test_warp_specialized_variant_compiles_for_sm90_offline():
    """The launcher's arguments, specialised as a launch would, compile for sm_90 into the
    producer + two consumers form (12 warps) — in a child process without the interpreter."""
    if not (_nvidia_bin() / "ptxas").exists():
        pytest.skip("Triton's bundled ptxas not found: cannot compile for sm_90 here")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "hopper_probe_timing.py"), "--offline-compile",
                           "--quick", "--shapes", "b1_h32_L8192_causal"],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = {r["variant"]: r for r in map(json.loads, done.stdout.splitlines())}
    assert all(r["compiled"] for r in rows.values()), rows
    ws = rows["qkv_ws_n64_w4_s2_1loop"]
    assert ws["warp_specialize"] and ws["warps"] == 12 and ws["tma"]
    assert not rows["ptr_n64_w8_s2_2loops"]["tma"]


@pytest.mark.gpu
def test_quick_run_on_the_gpu(tmp_path):
    # In a process of its own: a hung launch ends the process that made it (see HANG_S).
    out = tmp_path / "timing.json"
    script = Path(timing.__file__)
    done = subprocess.run([sys.executable, str(script), "--quick", "--shapes", "b1_h32_L8192_causal", "--rounds", "1",
                           "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert any(r["status"] == f"skipped: {timing.WARP_SPEC_HANGS}" for r in rows)
    timed = [r for r in rows if r.get("ms")]
    assert any(r["variant"] == "sdpa_cudnn" for r in timed)
    assert all(r["status"] in ("ok", "wrong") or r["status"].startswith(("failed", "skipped")) for r in rows)
    assert any(r["kind"] == "triton" and r["status"] == "ok" for r in rows)

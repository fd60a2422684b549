"""benchmarks/hopper_features_offline.py on the CPU: one cheap probe (the pointer-load attention
baseline) compiles for sm_90 with Triton's bundled ptxas and reports its registers and shared
memory. The probe runs in a child process without TRITON_INTERPRET (the suite interprets kernels
when there is no GPU; the probe compiles them for real)."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import compile_for_sm90

ROOT = Path(__file__).resolve().parents[1]
PROBE = ROOT / "benchmarks" / "hopper_features_offline.py"


def _probe_rows(name: str, tmp_path: Path) -> list[dict]:
    """The rows the probe writes for `--only name`, run as a user runs it (skipped without the
    compiler's tools)."""
    out = tmp_path / "probe.json"
    done = compile_for_sm90([str(PROBE), "--only", name, "--out", str(out)])
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(out.read_text())["rows"]


def test_baseline_probe_reports_registers_and_shared_memory(tmp_path):
    rows = _probe_rows("fa_ptr_m64_w4", tmp_path)
    assert [row["name"] for row in rows] == ["fa_ptr_m64_w4"]
    row = rows[0]
    assert row["compiled"], row.get("diagnostic") or row.get("error")
    assert row["registers"] > 0
    assert row["shared_bytes"] > 0


def test_the_probe_of_omnitunes_attention_kernel_compiles_it_as_its_launcher_calls_it(tmp_path):
    """The probe takes the kernel's arguments from the library's own launch (its launcher stood in
    for): a change to how the kernel is launched must not leave the probe failing unseen."""
    (row,) = _probe_rows("omnitune_attention_tma_m64_w4_s3", tmp_path)
    assert row["compiled"], row.get("diagnostic") or row.get("error")
    assert row["registers"] > 0 and row["shared_bytes"] > 0


def test_an_fp8_dot_runs_in_fp8_from_16_columns_on_a_warpgroup_and_widened_at_8(tmp_path):
    """docs/hopper.md's fp8 finding, for the Triton installed: an e4m3 x e4m3 dot of 64 keys by 16
    query columns over 4 warps compiles to wgmma in fp8 (QGMMA, no unpacks); 32 keys by 8 columns
    over one warp (the decode loop's transposed dots) to mma.sync with both operands widened —
    the same instructions as widening them by hand."""
    out = tmp_path / "fp8_dots.json"
    done = compile_for_sm90([str(ROOT / "benchmarks" / "fp8_dot_forms_offline.py"), "--shape", "64x16x4",
                             "--shape", "32x8x1", "--out", str(out)])
    assert done.returncode == 0, done.stderr[-2000:]
    rows = {(r["M"], r["N"], r["operands"], r["q_transposed"]): r for r in json.loads(out.read_text())["rows"]}
    wide = rows[(64, 16, "e4m3", True)]
    assert wide["native_fp8"] and wide["f2fp"] == 0 and any(op.startswith("QGMMA") for op in wide["mma"])
    narrow, widened = rows[(32, 8, "e4m3", True)], rows[(32, 8, "widened to fp16", True)]
    assert not narrow["native_fp8"] and narrow["f2fp"] > 0
    assert (narrow["mma"], narrow["mma_count"], narrow["f2fp"]) == (widened["mma"], widened["mma_count"], widened["f2fp"])

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

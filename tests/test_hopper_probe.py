"""benchmarks/hopper_features_offline.py on the CPU: one cheap probe (the pointer-load attention
baseline) compiles for sm_90 with Triton's bundled ptxas and reports its registers and shared
memory. The probe runs in a child process without TRITON_INTERPRET (the suite interprets kernels
when there is no GPU; the probe compiles them for real)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROBE = ROOT / "benchmarks" / "hopper_features_offline.py"


def _nvidia_bin() -> Path | None:
    try:
        import triton
    except ImportError:
        return None
    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin"


def _probe_rows(name: str, tmp_path: Path) -> list[dict]:
    """The rows the probe writes for `--only name`, run as a user runs it (skipped without the
    compiler's tools)."""
    bin_dir = _nvidia_bin()
    missing = [tool for tool in ("ptxas", "cuobjdump") if bin_dir is None or not (bin_dir / tool).exists()]
    if missing:
        pytest.skip(f"Triton's bundled {' and '.join(missing)} not found: the probe cannot compile for sm_90 here")
    out = tmp_path / "probe.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, str(PROBE), "--only", name, "--out", str(out)],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=300, check=False)
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

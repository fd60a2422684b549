"""What `omnitune` imports before it does anything: the command line itself imports no torch
(~1-1.6 s on the development machine, ~2.7 s on the H200's host), so `--help` answers at once and a
search starts its lanes before the session imports torch."""

import subprocess
import sys

from omnitune.cli.search_lanes import DEFAULT_LANES

HEAVY = ("torch", "triton", "numpy", "pandas", "optuna", "sqlite_utils", "sqlalchemy")


def _run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_command_line_imports_none_of_the_heavy_libraries():
    loaded = _run(f"import sys, omnitune.cli; print(sorted(m for m in {HEAVY!r} if m in sys.modules))")
    assert loaded == "[]"


def test_a_search_starts_its_lanes_before_it_imports_torch(tmp_path):
    # The lanes' start is patched to say what the session had imported by then, and to end it.
    code = f"""
import sys
from omnitune.cli import app, search_cmd

def start_lanes(argv, lanes):
    print(lanes, "torch" in sys.modules, "triton" in sys.modules)
    raise SystemExit(0)

search_cmd.start_lanes = start_lanes
app(["search", "--model", "qwen2.5-omni-7b", "--trials", "2", "--db", {str(tmp_path / "o.db")!r}])
"""
    assert _run(code) == f"{DEFAULT_LANES} False False"


def test_the_worker_server_module_imports_no_torch_and_preloads_every_builtin_kernel():
    loaded = _run("import sys, omnitune.measure.worker_server as w; print('torch' in sys.modules)")
    assert loaded == "False"
    from omnitune.measure.worker_server import WORKER_PRELOAD
    from omnitune.registry import BUILTIN_KERNELS

    assert set(BUILTIN_KERNELS.values()) <= set(WORKER_PRELOAD)
    assert {"torch", "triton"} <= set(WORKER_PRELOAD)

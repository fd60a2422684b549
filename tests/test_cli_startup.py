"""What `omnitune` imports before it does anything: the command line itself imports no torch
(~1-1.6 s on the development machine, ~2.7 s on the H200's host), so `--help` answers at once and a
search starts its lanes before the session imports torch."""

import os
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


def test_a_columns_variable_no_console_can_use_is_dropped_and_the_output_still_printed():
    from omnitune.cli.common import drop_unusable_columns

    for junk in ("0", "-5", "abc", "", " ", "999999999999999", "１２０"):
        environ = {"COLUMNS": junk, "HOME": "/x"}
        drop_unusable_columns(environ)
        assert environ == {"HOME": "/x"}, junk
    environ = {"COLUMNS": "120"}
    drop_unusable_columns(environ)
    assert environ == {"COLUMNS": "120"}
    # For real: with COLUMNS=0 Rich printed nothing at all.
    env = {**os.environ, "COLUMNS": "0"}
    done = subprocess.run([sys.executable, "-m", "omnitune", "kernels"], capture_output=True, text=True,
                          timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert "attention" in done.stdout and "kv_cache_write" in done.stdout


def test_output_that_cannot_be_written_is_one_line_not_a_traceback(tmp_path):
    if not os.path.exists("/dev/full"):
        import pytest

        pytest.skip("no /dev/full here")
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "omnitune", "kernels"], stdout=full, stderr=subprocess.PIPE,
                              text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == ["error: cannot write the output: No space left on device"]


def test_only_a_failed_write_to_stdout_or_stderr_counts_as_the_output_failing(tmp_path):
    from omnitune.cli import _failed_writing_output

    def write(file):
        raise OSError(28, "No space left on device")

    with open(tmp_path / "f", "w") as own_file:
        for file, expected in ((sys.stdout, True), (sys.stderr, True), (own_file, False)):
            try:
                write(file)
            except OSError as exc:
                assert _failed_writing_output(exc) is expected

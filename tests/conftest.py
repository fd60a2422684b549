"""Test setup. Kernels run under Triton's interpreter on the CPU unless a CUDA GPU is present
(then the same tests, and the `gpu`-marked ones, run on the GPU: how the suite runs on the
device machine). TRITON_INTERPRET must be set before any kernel module is imported."""

from __future__ import annotations

import os

import pytest

try:
    import torch

    _HAS_CUDA = torch.cuda.is_available()
except Exception:  # pragma: no cover
    _HAS_CUDA = False

if not _HAS_CUDA:
    os.environ["TRITON_INTERPRET"] = "1"

DEVICE = "cuda" if _HAS_CUDA else "cpu"
# Whether kernels run under the interpreter: what a Runner or probe built in a test must be told.
INTERPRETED = not _HAS_CUDA

# The public ops' check mode (values validated up front, clear InputErrors): the suite runs in
# it; tests of the production path (no sync, bounds enforced in the kernels) pass check=False.
os.environ.setdefault("OMNITUNE_CHECK", "1")


def pytest_collection_modifyitems(config, items):
    if _HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run on the device machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def _kernels_are_interpreted_without_gpu():
    """Fail loudly if, without a GPU, the kernels were compiled for real instead of interpreted:
    every kernel test would then be testing nothing."""
    if _HAS_CUDA:
        yield
        return
    from triton.runtime.interpreter import InterpretedFunction

    from omnitune.kernels import attention

    assert isinstance(attention._attention_fwd, InterpretedFunction), "TRITON_INTERPRET was not set before import"
    yield


@pytest.fixture
def device() -> str:
    return DEVICE


@pytest.fixture
def tmp_db(tmp_path, monkeypatch):
    path = tmp_path / "omnitune.db"
    monkeypatch.setenv("OMNITUNE_DB", str(path))
    return path


def assert_registered_with_valid_defaults(spec, problems) -> None:
    """A kernel's spec is in the registry under its name, and its default config is a valid
    member of its space for each of these problems in every dtype."""
    from omnitune.registry import get_spec, kernel_names

    assert spec.name in kernel_names() and get_spec(spec.name) is spec
    for problem in problems:
        for dtype in spec.dtypes:
            cfg = spec.default_config(problem, dtype)
            assert spec.violations(problem, cfg, dtype) == [], (problem, dtype, cfg)
            assert spec.coerce_config(cfg.as_dict()) == cfg


def assert_constraint_case(spec, cases, name, limits=None) -> None:
    """cases[name] = (problem, a config that breaks constraint `name`): the constraint rejects
    that config, and does not reject the kernel's default for the same problem. Every constraint
    of the spec must have a case."""
    import torch

    assert set(cases) == {c.name for c in spec.constraints}
    problem, bad = cases[name]
    assert name in [n for n, _ in spec.violations(problem, bad, torch.float16, limits)]
    good = spec.default_config(problem, torch.float16)
    assert name not in [n for n, _ in spec.violations(problem, good, torch.float16)]


@pytest.fixture
def tables_dir(tmp_path, monkeypatch):
    """An OMNITUNE_CONFIG_DIR of our own, and no shipped tables (a fake package location), so
    that tables committed to the repository cannot change what a runtime test sees."""
    import omnitune
    from omnitune import runtime

    fake_package = tmp_path / "site" / "omnitune"
    fake_package.mkdir(parents=True)
    monkeypatch.setattr(omnitune, "__file__", str(fake_package / "__init__.py"))
    directory = tmp_path / "tables"
    directory.mkdir()
    monkeypatch.setenv("OMNITUNE_CONFIG_DIR", str(directory))
    runtime.clear_cache()
    yield directory
    runtime.clear_cache()


def write_tuned_table(folder, spec, device_name: str, entries, **entry_fields):
    """A current table of `spec` for `device_name` under `folder` (a tables_dir), one entry per
    (problem, dtype name, config) of `entries`, each with `entry_fields` beside its time."""
    import dataclasses
    import json

    import omnitune
    from omnitune.trial import device_key

    doc = {"schema_version": 1, "kernel": spec.name,
           "device": {"name": device_name, "key": device_key(device_name), "compute_capability": "9.0",
                      "driver": "575.51"},
           "software": {"torch": "2.11", "triton": "3.6", "omnitune": omnitune.__version__},
           "kernel_source_hash": spec.source_hash(), "exported_at": "2026-12-01T12:00:00+00:00",
           "representative": True,
           "entries": {f"{dtype}|{spec.problem_key(problem)}": {"problem": dataclasses.asdict(problem), "dtype": dtype,
                                                               "config": dict(config), **entry_fields}
                       for problem, dtype, config in entries}}
    path = folder / spec.name / f"{device_key(device_name)}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


def capture_graph(fn):
    """fn captured in a CUDA graph (warmed up once on a side stream first, as capture requires):
    (graph, what the captured call returned)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        result = fn()
    return graph, result


def compile_for_sm90(argv: list[str], timeout: float = 300):
    """`python argv...` run in the repository as a user runs the offline probes: kernels compiled
    for sm_90 with Triton's bundled ptxas and read with its cuobjdump, not interpreted (the child
    runs without TRITON_INTERPRET). The test is skipped where Triton brings neither tool."""
    import subprocess
    import sys
    from pathlib import Path

    import triton

    tools = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    missing = [tool for tool in ("ptxas", "cuobjdump") if not (tools / tool).exists()]
    if missing:
        pytest.skip(f"Triton's bundled {' and '.join(missing)} not found: nothing can compile for sm_90 here")
    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=env, cwd=root,
                          timeout=timeout, check=False)


def assert_one_line_error(result, message: str = "", *, after_progress: bool = False) -> str:
    """A CLI result that failed as a user mistake should: exit code 2, one line on stderr that
    starts with 'error: ' and holds `message`, no traceback. after_progress: lines before it
    (verify's progress, the runtime's note that no table is tuned for this GPU) are allowed."""
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    if after_progress:
        assert [line for line in lines if line.startswith("error")] == lines[-1:], result.stderr
        lines = lines[-1:]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert message in lines[0], lines[0]
    return lines[0]


def json_paths(value, prefix=()):
    """Every path into a JSON value, the root's () first: where the table fuzzers mutate."""
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from json_paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from json_paths(item, (*prefix, index))

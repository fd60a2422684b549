"""The runtime fuzzed, as a hostile or careless user would (issue 19), in the suite: a seeded
property test over hostile tables built from the shipped ones, and over hostile problems.

Whatever the table, a lookup of a valid problem returns a config inside the kernel's space that
breaks none of its constraints, and raises nothing; a problem with a value no tensor could have
raises InputError (the documented error) and nothing else; no lookup takes long (an alarm fails
any that does: a FIFO waited on, /dev/zero read). Derandomized and bounded, so CI runs the same
few hundred examples in seconds."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import shutil
import signal
from pathlib import Path

import pytest
import torch
from conftest import json_paths as _json_paths
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import omnitune.runtime as runtime
from omnitune import registry
from omnitune.errors import InputError
from omnitune.runtime import Lookup
from omnitune.runtime._reading import MAX_TABLE_BYTES
from omnitune.spec import DTYPES

REPO_TABLES = Path(__file__).resolve().parents[1] / "tuned_configs"
H200 = "NVIDIA H200"
KERNELS = sorted(registry.BUILTIN_KERNELS)
SHIPPED = {k: (REPO_TABLES / k / "NVIDIA_H200.json").read_text() for k in KERNELS}
DOCS = {k: json.loads(text) for k, text in SHIPPED.items()}
SECONDS_PER_LOOKUP = 10

FUZZ = settings(
    derandomize=True, database=None, deadline=None, max_examples=400, print_blob=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# Raw JSON text put where a value was: wrong types, non-finite and huge numbers, near misses.
HOSTILE_JSON = [
    "Infinity", "-Infinity", "NaN", "1e999", "-1e999", "1" + "0" * 400, "-" + "9" * 5000, "2147483648",
    "-1", "0", "1", "1.0", "0.5", "64.0", "true", "false", "null", '""', '"16"', '"１６"', '"1_0"',
    '"' + "x" * 10_000 + '"', "[]", "[1, 2]", "{}", '{"a": {"b": []}}', "[" * 100 + "]" * 100,
]
# Values a caller's code could put in a problem: each must be an InputError, never anything else.
HOSTILE_VALUES = [
    float("inf"), float("-inf"), float("nan"), "1e400", "Infinity", "7" * 1_000_000, b"16", "１６", "1_0",
    2**31, 2**63, 10**400, -(10**400), 16.5, None, [16], {"n": 1}, "",
]
SPECIAL_FILES = ["fifo", "dev_zero", "directory", "huge_sparse", "dangling_symlink", "symlink_loop"]


class Hang(Exception):
    pass


def _alarm(signum, frame):
    raise Hang(f"a lookup took more than {SECONDS_PER_LOOKUP} s")


PATHS = {k: list(_json_paths(doc)) for k, doc in DOCS.items()}


def _replaced(doc, path, raw: str) -> str:
    doc = copy.deepcopy(doc)
    if not path:
        return raw
    target = doc
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = "@@HOSTILE@@"
    return json.dumps(doc, indent=2).replace('"@@HOSTILE@@"', raw)


def _deleted(doc, path) -> str:
    doc = copy.deepcopy(doc)
    target = doc
    for step in path[:-1]:
        target = target[step]
    del target[path[-1]]
    return json.dumps(doc)


@st.composite
def hostile_tables(draw, kernel):
    """(kind, content): the text of a damaged table, or a special file's kind."""
    text = SHIPPED[kernel]
    kind = draw(st.sampled_from(["truncate", "bit_flips", "replace", "delete", "padded", *SPECIAL_FILES]))
    if kind == "truncate":
        return kind, text[: draw(st.integers(0, len(text)))]
    if kind == "bit_flips":
        data = bytearray(text.encode())
        for _ in range(draw(st.integers(1, 8))):
            i = draw(st.integers(0, len(data) - 1))
            data[i] ^= 1 << draw(st.integers(0, 7))
        return kind, bytes(data)
    if kind == "replace":
        path = draw(st.sampled_from(PATHS[kernel]))
        return kind, _replaced(DOCS[kernel], path, draw(st.sampled_from(HOSTILE_JSON)))
    if kind == "delete":
        return kind, _deleted(DOCS[kernel], draw(st.sampled_from(PATHS[kernel][1:])))
    if kind == "padded":  # large but under the cap: read and used
        return kind, text + " " * draw(st.sampled_from([1, 1 << 20]))
    return kind, None


def _put(path: Path, kind: str, content) -> None:
    if path.is_symlink() or path.is_file() or path.is_fifo():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev_zero":
        os.symlink("/dev/zero", path)
    elif kind == "directory":
        path.mkdir()
    elif kind == "huge_sparse":
        with open(path, "wb") as f:
            f.truncate(MAX_TABLE_BYTES + 1)
    elif kind == "dangling_symlink":
        os.symlink(path.parent / "nowhere.json", path)
    elif kind == "symlink_loop":
        os.symlink(path, path)
    else:
        path.write_bytes(content if isinstance(content, bytes) else content.encode())


def _problems(kernel):
    spec = registry.get_spec(kernel)
    from_table = [(spec.problem_from_mapping(e["problem"]), DTYPES[e["dtype"]]) for e in DOCS[kernel]["entries"].values()]
    samples = [(p, torch.float16) for p in (spec.example_problem, *spec.sample_problems)]
    return from_table + samples


PROBLEMS = {k: _problems(k) for k in KERNELS}


def _check(kernel, problem, dtype):
    """Look `problem` up under the alarm and assert what the runtime promises."""
    spec = registry.get_spec(kernel)
    try:
        valid = _canonical(spec, problem)
    except InputError:
        valid = None
    signal.setitimer(signal.ITIMER_REAL, SECONDS_PER_LOOKUP)
    try:
        answer = runtime.lookup(kernel, problem, dtype, H200)
    except InputError:
        assert valid is None or "no config of its space" in _last_error(kernel, problem, dtype), (problem, dtype)
        return
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    assert valid is not None, f"{problem!r} was accepted"
    assert isinstance(answer, Lookup)
    assert spec.coerce_config(answer.config.as_dict(), strict=True) == answer.config  # inside the space
    check_dtype = dtype if dtype is not None else torch.float32
    assert spec.violations(valid, answer.config, check_dtype) == [], (valid, answer)
    assert answer.distance is None or 0.0 <= answer.distance < 1e6


def _canonical(spec, problem):
    if isinstance(problem, spec.problem_type):
        return spec.canonical_problem(problem)
    if isinstance(problem, str):
        return spec.parse_shape(problem)
    return spec.problem_from_mapping(problem)


def _last_error(kernel, problem, dtype) -> str:
    try:
        runtime.lookup(kernel, problem, dtype, H200)
    except InputError as exc:
        return str(exc)
    return ""


@pytest.fixture
def alarm():
    previous = signal.signal(signal.SIGALRM, _alarm)
    yield
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, previous)


@FUZZ
@given(data=st.data())
def test_no_hostile_table_breaks_a_lookup(tables_dir, alarm, data):
    kernel = data.draw(st.sampled_from(KERNELS), label="kernel")
    kind, content = data.draw(hostile_tables(kernel), label="table")
    _put(tables_dir / kernel / "NVIDIA_H200.json", kind, content)
    runtime.clear_cache()
    problems = PROBLEMS[kernel]
    for index in data.draw(st.lists(st.integers(0, len(problems) - 1), min_size=1, max_size=4), label="problems"):
        problem, dtype = problems[index]
        _check(kernel, problem, data.draw(st.sampled_from([dtype, dtype, None, torch.float32]), label="dtype"))


@FUZZ
@given(data=st.data())
def test_no_hostile_problem_gets_past_the_runtime(tables_dir, alarm, data):
    kernel = data.draw(st.sampled_from(KERNELS), label="kernel")
    (tables_dir / kernel).mkdir(exist_ok=True)
    (tables_dir / kernel / "NVIDIA_H200.json").write_text(SHIPPED[kernel])
    problem, dtype = data.draw(st.sampled_from(PROBLEMS[kernel]), label="problem")
    field = data.draw(st.sampled_from([f.name for f in dataclasses.fields(problem)]), label="field")
    value = data.draw(st.one_of(
        st.sampled_from(HOSTILE_VALUES),
        st.builds(lambda v, f: max(1, int(v * f)), st.just(getattr(problem, field)), st.sampled_from([0.5, 0.9, 1.1, 1.3, 3.0]))
        if type(getattr(problem, field)) is int else st.nothing(),
        st.integers(-3, 2**31 + 3),
    ), label="value")
    form = data.draw(st.sampled_from(["dataclass", "mapping", "shape"]), label="form")
    if form == "dataclass":
        hostile = dataclasses.replace(problem)
        object.__setattr__(hostile, field, value)
    elif form == "mapping":
        hostile = {**dataclasses.asdict(problem), field: value}
    else:
        text = value if isinstance(value, str) else repr(value)
        hostile = ",".join(f"{f.name}={text if f.name == field else _fmt(getattr(problem, f.name))}"
                           for f in dataclasses.fields(problem))
    for _ in range(2):  # cold, then with the buckets cached
        _check(kernel, hostile, dtype)
        _check(kernel, problem, dtype)


def _fmt(value) -> str:
    return str(int(value)) if isinstance(value, bool) else str(value)

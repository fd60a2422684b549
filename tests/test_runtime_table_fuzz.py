"""The runtime over mutated copies of every shipped table (tuned_configs/*/*.json), deterministic.

test_runtime_fuzz.py fuzzes the H200 tables one value at a time through hypothesis. This file
adds what it leaves out: every shipped file (the H100 ones too, which are also the H200's
same-chip twins and the other way round), mutations of the kinds a hand edit or a broken export
makes (many at once, duplicate keys, entries whose config breaks a constraint or names unknown
parameters, keys that no longer match their problem, predictor blocks built and then mangled for
kernels whose shipped table has none), two config directories (a mutated table above a pristine
one, or alone), and the lookups the public ops make: ConfigMemo.get (what every op calls, with
the current GPU's name) and nearest_configs (attention's SDPA fallback), besides get_config,
lookup and explain. For each, a lookup of a valid problem never raises, never hangs, and returns
a config of the kernel's space that breaks no constraint of the problem asked.

Seeds are fixed (random.Random(seed)), so every run checks the same cases.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import os
import random
import signal
from pathlib import Path

import pytest
import torch
from conftest import json_paths as _paths

from omnitune import registry, runtime
from omnitune.kernels._dispatch import ConfigMemo
from omnitune.profile.device import device_key
from omnitune.runtime import Lookup
from omnitune.spec import DTYPES, Config, field_kind

REPO_TABLES = Path(__file__).resolve().parents[1] / "tuned_configs"
KERNELS = sorted(registry.BUILTIN_KERNELS)
SHIPPED = {k: {p.name: p.read_text() for p in sorted((REPO_TABLES / k).glob("*.json"))} for k in KERNELS}
DEVICES = ["NVIDIA H200", "NVIDIA H100 80GB HBM3"]  # each the other's same-chip twin
SECONDS_PER_CASE = 20
SEEDS_PER_KIND = 2

# Values put where a table had something else: wrong types, nested garbage, numbers no table holds.
HOSTILE = [
    None, True, False, 0, -1, 1, 3, 2**31, 2**63, 10**400, -(10**30), 0.5, 64.0, float("nan"), float("inf"),
    float("-inf"), 1e308, "", "16", "fp16", "x" * 3000, "NaN", "bf16|b=1", [], [1, 2], [None], {}, {"a": {"b": [{}]}},
    [[[[[]]]]], {"BLOCK_M": 64}, {"time_ratios": {}}, "BLOCK_M=64 num_warps=4",
]


# --- building the mutated tables --------------------------------------------------------------


def _at(doc, path):
    for step in path:
        doc = doc[step]
    return doc


def _set_or_delete(rng, doc, path, delete: bool) -> None:
    parent = _at(doc, path[:-1])
    if delete:
        del parent[path[-1]]
    else:
        parent[path[-1]] = copy.deepcopy(rng.choice(HOSTILE))


def _some_entry(rng, doc):
    entries = doc.get("entries")
    if not isinstance(entries, dict) or not entries:
        return None, None
    key = rng.choice(sorted(entries))
    return key, entries[key]


def _breaking_config(rng, spec, config: dict) -> dict:
    """A config of the space (each value one of its choices) pushed to its extremes: the largest
    tiles, warps and stages break a shared-memory or rows constraint of most problems."""
    broken = dict(config)
    for param in spec.params:
        if rng.random() < 0.7:
            broken[param.name] = param.choices[-1] if rng.random() < 0.8 else param.choices[0]
    return broken


def _predictor_from_entries(rng, spec, doc) -> dict:
    """A predictor block of the shipped format built from the table's own entries (the kernels whose
    table ships none get one too), each point measuring its tuned config and a few others."""
    numeric = [f.name for f in spec.problem_fields() if field_kind(f) in ("int", "float")]
    points = {}
    configs = list(spec.all_configs())
    for key, raw in doc["entries"].items():
        try:
            tuned = spec.coerce_config(raw["config"], strict=True)
        except Exception:  # noqa: BLE001, S112 — an entry the runtime skips is not a point here either
            continue
        ratios = {tuned.label(): 1.0}
        for config in rng.sample(configs, min(4, len(configs))):
            ratios.setdefault(config.label(), round(rng.uniform(1.0, 3.0), 3))
        points[key] = {"problem": raw["problem"], "dtype": raw["dtype"], "time_ratios": ratios}
    return {"kind": "nearest_problems", "neighbours": rng.randint(1, 4), "features": [*numeric, "flops_per_byte"],
            "match": [f.name for f in spec.problem_fields() if f.name not in numeric], "points": points}


def _mutate(kind: str, rng: random.Random, spec, text: str) -> bytes:
    """The text of one shipped table, damaged as `kind` says."""
    if kind == "truncated":
        return text.encode()[: rng.randrange(len(text))]
    if kind == "not_utf8":
        data = bytearray(text.encode())
        for _ in range(rng.randint(1, 6)):
            data.insert(rng.randrange(len(data)), rng.choice([0xFF, 0xFE, 0xC3, 0x80, 0xED, 0x00]))
        return bytes(data)
    if kind == "bit_flips":
        data = bytearray(text.encode())
        for _ in range(rng.randint(1, 12)):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        return bytes(data)

    doc = json.loads(text)
    paths = list(_paths(doc))[1:]
    if kind == "deleted_key":
        _set_or_delete(rng, doc, rng.choice(paths), delete=True)
    elif kind == "wrong_type":
        _set_or_delete(rng, doc, rng.choice(paths), delete=False)
    elif kind == "many":
        for _ in range(rng.randint(5, 40)):
            paths = list(_paths(doc))[1:]
            if not paths:
                break
            _set_or_delete(rng, doc, rng.choice(paths), delete=rng.random() < 0.4)
    elif kind == "header":
        field = rng.choice(["schema_version", "kernel", "device", "entries", "kernel_source_hash", "predictor"])
        if rng.random() < 0.3:
            doc.pop(field, None)
        else:
            doc[field] = copy.deepcopy(rng.choice(HOSTILE))
    elif kind == "breaks_constraint":
        for _ in range(rng.randint(1, 8)):
            _, entry = _some_entry(rng, doc)
            if entry is not None:
                entry["config"] = _breaking_config(rng, spec, entry["config"])
    elif kind == "unknown_param":
        _, entry = _some_entry(rng, doc)
        if entry is not None:
            config = entry["config"]
            name = rng.choice(sorted(config))
            choice = rng.randrange(3)
            if choice == 0:
                config["NOT_A_PARAMETER"] = 4
            elif choice == 1:
                config[name.lower() + "_X"] = config.pop(name)  # renamed
            else:
                del config[name]  # a parameter missing
    elif kind == "key_mismatch":
        for _ in range(rng.randint(1, 4)):
            key, entry = _some_entry(rng, doc)
            if entry is None:
                break
            problem = entry["problem"]
            field = rng.choice(sorted(problem))
            value = problem[field]
            if type(value) is int:
                problem[field] = value * 2
            else:
                entry["dtype"] = rng.choice(["fp16", "bf16", "fp32", "fp8", "int8"])
            if rng.random() < 0.5:  # the same entry under a second, wrong key too
                doc["entries"][key + "x"] = copy.deepcopy(entry)
    elif kind == "swapped_configs":
        for _ in range(rng.randint(1, 10)):
            (_, a), (_, b) = _some_entry(rng, doc), _some_entry(rng, doc)
            if a is not None:
                a["config"], b["config"] = b["config"], a["config"]
    elif kind == "predictor":
        block = doc.get("predictor")
        if not isinstance(block, dict):
            block = doc["predictor"] = _predictor_from_entries(rng, spec, doc)
        for _ in range(rng.randint(0, 8)):  # a valid block built above is kept whole now and then
            paths = list(_paths(block))[1:]
            if not paths:
                break
            _set_or_delete(rng, block, rng.choice(paths), delete=rng.random() < 0.3)
        if rng.random() < 0.3 and isinstance(block.get("points"), dict) and block["points"]:
            point = block["points"][rng.choice(sorted(block["points"]))]
            if isinstance(point, dict) and isinstance(point.get("time_ratios"), dict):
                point["time_ratios"][rng.choice(["NOT_A_PARAMETER=1", "BLOCK_M=3", "", " "])] = 1.5
    elif kind == "duplicate_entries":
        # JSON with one key twice (json keeps the last): garbage first then the real entry, or the
        # real entry first then a config that breaks every constraint.
        key, entry = _some_entry(rng, doc)
        if entry is not None:
            text = json.dumps(doc)
            if rng.random() < 0.5:
                twin = {"problem": entry["problem"], "dtype": entry["dtype"], "config": {"NOT_A_PARAMETER": 1}}
                head, tail = text.split('"entries": {', 1)
                return (head + '"entries": {' + json.dumps({key: twin})[1:-1] + ", " + tail).encode()
            twin = dict(entry, config=_breaking_config(rng, spec, entry["config"]))
            return (text[: text.rindex("}}")] + "}, " + json.dumps({key: twin})[1:-1] + "}}").encode()
    else:
        raise AssertionError(kind)
    return json.dumps(doc, allow_nan=True).encode()


KINDS = ["truncated", "not_utf8", "bit_flips", "deleted_key", "wrong_type", "many", "header", "breaks_constraint",
         "unknown_param", "key_mismatch", "swapped_configs", "predictor", "duplicate_entries"]


# --- the problems looked up -------------------------------------------------------------------


def _problems(kernel: str) -> list[tuple[object, torch.dtype]]:
    """Every shipped entry's problem in its dtype, each also one step off along each integer field
    (a nearest or predicted answer, not an exact one), and the spec's sample problems."""
    spec = registry.get_spec(kernel)
    found = []
    for text in SHIPPED[kernel].values():
        for raw in json.loads(text)["entries"].values():
            problem, dtype = spec.problem_from_mapping(raw["problem"]), DTYPES[raw["dtype"]]
            found.append((problem, dtype))
            for f in dataclasses.fields(problem):
                value = getattr(problem, f.name)
                if type(value) is int and value > 1:
                    try:
                        found.append((spec.canonical_problem(dataclasses.replace(problem, **{f.name: value + 1})),
                                      dtype))
                    except Exception:  # noqa: BLE001, S110 — a field the problem type ties to another
                        pass
    found += [(p, torch.float16) for p in (spec.example_problem, *spec.sample_problems)]
    return found


PROBLEMS = {k: _problems(k) for k in KERNELS}


# --- the checks -------------------------------------------------------------------------------


def _assert_valid(spec, problem, dtype, config) -> None:
    assert isinstance(config, Config)
    assert spec.coerce_config(config.as_dict(), strict=True) == config, f"{config} is outside {spec.name}'s space"
    judged_at = dtype if dtype is not None else torch.float32
    assert spec.violations(problem, config, judged_at) == [], (spec.name, problem, dtype, config)


def _look_up_every_way(spec, problem, dtype, device_name, monkeypatch) -> None:
    answer = runtime.lookup(spec.name, problem, dtype, device_name)
    assert isinstance(answer, Lookup)
    _assert_valid(spec, problem, dtype, answer.config)
    assert runtime.get_config(spec.name, problem, dtype, device_name) == answer.config  # cached: the same
    if dtype is None:
        return
    # What the ops call: their memo, which asks get_config for the current GPU.
    monkeypatch.setattr(runtime, "_current_device_name", lambda: device_name)
    memo = ConfigMemo(spec.name)
    _assert_valid(spec, problem, dtype, memo.get(("fuzz", problem), None, lambda: problem, dtype))
    if device_name is None:
        return
    for config in runtime.nearest_configs(spec, problem, dtype, device_key(device_name), most=8):
        _assert_valid(spec, problem, dtype, config)
    assert runtime.explain(spec.name, problem, dtype, device_name).lookup.config == answer.config


class Hang(Exception):
    pass


@pytest.fixture
def alarm():
    def ring(signum, frame):
        raise Hang(f"a case took more than {SECONDS_PER_CASE} s")

    previous = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, SECONDS_PER_CASE)
    yield
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, previous)


@pytest.fixture
def two_dirs(tables_dir, tmp_path, monkeypatch):
    """tables_dir (read first) and a second config directory below it."""
    lower = tmp_path / "lower"
    lower.mkdir()
    monkeypatch.setenv("OMNITUNE_CONFIG_DIR", os.pathsep.join([str(tables_dir), str(lower)]))
    runtime.clear_cache()
    return tables_dir, lower


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("kernel", KERNELS)
def test_no_mutated_table_breaks_a_lookup(kernel, kind, two_dirs, alarm, monkeypatch, caplog):
    caplog.set_level(logging.CRITICAL, logger="omnitune.runtime")  # the warnings are tested elsewhere
    spec = registry.get_spec(kernel)
    upper, lower = two_dirs
    for seed in range(SEEDS_PER_KIND):
        rng = random.Random(f"{kernel}/{kind}/{seed}")
        for folder in (upper, lower):
            for old in (folder / kernel).glob("*.json") if (folder / kernel).is_dir() else ():
                old.unlink()
            (folder / kernel).mkdir(exist_ok=True)
        for name, text in SHIPPED[kernel].items():
            (upper / kernel / name).write_bytes(_mutate(kind, rng, spec, text))
            if rng.random() < 0.5:  # the pristine table below the mutated one, or none
                (lower / kernel / name).write_text(text)
        runtime.clear_cache()
        for problem, dtype in rng.sample(PROBLEMS[kernel], 4):
            sibling = {torch.float16: torch.bfloat16, torch.bfloat16: torch.float16}.get(dtype, dtype)
            asked = rng.choice([dtype, dtype, sibling, None, *(d for d in spec.dtypes if d is torch.float32)])
            for device_name in (*DEVICES, None):
                _look_up_every_way(spec, problem, asked, device_name, monkeypatch)


def test_the_mutations_change_what_they_say():
    """Each kind of mutation changes the table it is given (a fuzz test whose mutations were all
    no-ops would pass for nothing)."""
    for kernel in KERNELS:
        spec = registry.get_spec(kernel)
        for kind in KINDS:
            text = next(iter(SHIPPED[kernel].values()))
            changed = [_mutate(kind, random.Random(f"{kernel}/{kind}/{seed}"), spec, text) != text.encode()
                       for seed in range(SEEDS_PER_KIND)]
            assert any(changed), (kernel, kind)

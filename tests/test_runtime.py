"""omnitune.runtime: the lookup chain, bad tables, precedence, caching, import discipline, and
`omnitune lookup`. Tables are written by hand here, so that these tests do not depend on export."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import omnitune
import omnitune.runtime as runtime
from omnitune.cli import app
from omnitune.errors import UnknownKernelError
from omnitune.kernels.attention import SPEC, AttentionProblem
from omnitune.profile.device import device_key
from omnitune.runtime import Rung
from omnitune.spec import Config, DeviceLimits

GPU = "Test GPU X1"  # a device no shipped table is for
PREFILL = AttentionProblem(b=1, h=8, hkv=2, lq=512, lk=512, d=64, causal=True)
DECODE = AttentionProblem(b=1, h=8, hkv=2, lq=1, lk=512, d=64, causal=True)
# BACKEND is written out: the runtime fills it in ("triton") for entries that lack it.
TUNED = Config(BACKEND="triton", BLOCK_M=128, BLOCK_N=32, num_warps=8, num_stages=2, PACK_GQA=False, USE_TMA=True)
OTHER = Config(BACKEND="triton", BLOCK_M=32, BLOCK_N=128, num_warps=4, num_stages=4, PACK_GQA=True, USE_TMA=False)


def _entry(problem, config, dtype="fp16"):
    key = f"{dtype}|{SPEC.problem_key(problem)}"
    return key, {
        "problem": dataclasses.asdict(problem),
        "dtype": dtype,
        "config": dict(config),
        "time_ms": 0.5,
        "p20_ms": 0.49,
        "p80_ms": 0.52,
        "tflops": 120.0,
        "tbps": 1.1,
        "default_config": dict(SPEC.default_config(problem, torch.float16)),
        "default_time_ms": 0.7,
        "speedup_vs_default": 1.4,
        "trials": 40,
        "rel_error": 1e-4,
        "measured_at": "2026-11-29T12:00:00+00:00",
    }


def _document(entries, device_name=GPU, **changes):
    doc = {
        "schema_version": 1,
        "kernel": "attention",
        "device": {"name": device_name, "key": device_key(device_name), "compute_capability": "9.0",
                   "driver": "575.51"},
        "software": {"torch": "2.11", "triton": "3.6", "omnitune": omnitune.__version__},
        "kernel_source_hash": SPEC.source_hash(),
        "exported_at": "2026-11-29T12:00:00+00:00",
        "representative": True,
        "entries": dict(entries),
    }
    doc.update(changes)
    return doc


def _write(config_dir: Path, content, device_name=GPU) -> Path:
    path = config_dir / "attention" / f"{device_key(device_name)}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content if isinstance(content, str) else json.dumps(content, indent=2))
    return path


@pytest.fixture
def config_dir(tables_dir):
    return tables_dir


@pytest.fixture
def warnings_seen(caplog):
    caplog.set_level(logging.WARNING, logger="omnitune.runtime")

    def seen():
        return [r.getMessage() for r in caplog.records if r.name == "omnitune.runtime" and r.levelno >= logging.WARNING]

    return seen


# --- the chain -----------------------------------------------------------------------------------


def test_exact_hit(config_dir, warnings_seen):
    path = _write(config_dir, _document([_entry(PREFILL, TUNED)]))
    answer = runtime.lookup("attention", PREFILL, torch.float16, GPU)
    assert answer.rung is Rung.EXACT and answer.rung == "exact" and f"{answer.rung}" == "exact"
    assert answer.config == TUNED
    assert answer.source == path
    assert answer.matched_key == f"fp16|{SPEC.problem_key(PREFILL)}"
    assert answer.distance == 0.0
    assert runtime.get_config("attention", PREFILL, dtype=torch.float16, device_name=GPU) == TUNED
    assert warnings_seen() == []


def test_a_stale_table_and_revalidated_entries_are_still_served(config_dir, warnings_seen, caplog):
    # A table of older kernel source, one of whose entries `omnitune verify --fix` revalidated (the
    # table keeping its hash): both entries are used, with one INFO line and no warning.
    caplog.set_level(logging.INFO, logger="omnitune.runtime")
    key, revalidated = _entry(PREFILL, TUNED)
    revalidated["revalidated"] = {"at": "2026-12-01T09:00:00+00:00", "from_source_hash": "0123456789abcdef",
                                  "to_source_hash": SPEC.source_hash(),
                                  "measured": {"entry_ms": 0.49, "fallback_ms": 0.71}}
    shorter = dataclasses.replace(PREFILL, lq=256, lk=256)
    _write(config_dir, _document([(key, revalidated), _entry(shorter, OTHER)], kernel_source_hash="0123456789abcdef"))
    for problem, config in ((PREFILL, TUNED), (shorter, OTHER)):
        answer = runtime.lookup("attention", problem, torch.float16, GPU)
        assert answer.rung is Rung.EXACT and answer.config == config
    assert warnings_seen() == []
    infos = [r.getMessage() for r in caplog.records if r.name == "omnitune.runtime" and r.levelno == logging.INFO]
    assert len(infos) == 1 and "omnitune verify --fix" in infos[0]


def test_entries_kept_from_older_source_in_a_current_table_are_served_with_one_info_line(
        config_dir, warnings_seen, caplog):
    # export merging into a table keeps the entries its database lacks, each with the hash it was
    # measured on: the file's own hash is current, so the line names how many are older.
    caplog.set_level(logging.INFO, logger="omnitune.runtime")
    key, kept = _entry(PREFILL, TUNED)
    kept["kernel_source_hash"] = "0123456789abcdef"
    shorter = dataclasses.replace(PREFILL, lq=256, lk=256)
    _write(config_dir, _document([(key, kept), _entry(shorter, OTHER)], kernel_source_hash=SPEC.source_hash()))
    for problem, config in ((PREFILL, TUNED), (shorter, OTHER)):
        assert runtime.lookup("attention", problem, torch.float16, GPU).config == config
    assert warnings_seen() == []
    infos = [r.getMessage() for r in caplog.records if r.name == "omnitune.runtime" and r.levelno == logging.INFO]
    assert len(infos) == 1 and infos[0].startswith("1 of the 2 entries of") and "older attention source" in infos[0]


@pytest.mark.parametrize("with_gluon", [False, True], ids=["triton_only", "with_gluon"])
def test_a_table_recorded_before_the_hash_covered_the_gluon_kernel_is_noted_only_with_gluon_configs(
        config_dir, warnings_seen, caplog, with_gluon):
    # The attention module's own hash, as tables recorded it before the spec named the Gluon
    # kernel's modules: today's for Triton configs (no line), not for a table holding a Gluon one.
    import omnitune.kernels.attention as attention_module
    from omnitune.source_hash import kernel_source_hash

    caplog.set_level(logging.INFO, logger="omnitune.runtime")
    gluon = {"BACKEND": "gluon_pingpong", "BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 4, "num_stages": 2,
             "PACK_GQA": False, "USE_TMA": False}
    shorter = dataclasses.replace(PREFILL, lq=256, lk=256)
    entries = [_entry(PREFILL, TUNED), _entry(shorter, gluon if with_gluon else OTHER)]
    _write(config_dir, _document(entries, kernel_source_hash=kernel_source_hash(attention_module)))
    assert runtime.lookup("attention", PREFILL, torch.float16, GPU).config == TUNED
    assert warnings_seen() == []
    infos = [r.getMessage() for r in caplog.records if r.name == "omnitune.runtime" and r.levelno == logging.INFO]
    assert len(infos) == int(with_gluon), infos
    assert all("omnitune verify --fix" in line for line in infos)


def test_an_entry_verify_replaced_by_its_fallback_is_served_and_explained_as_such(config_dir, warnings_seen):
    # omnitune verify --fix leaves `verify_fix` where the tuned config was slower than its fallback:
    # the lookup serves the entry's (fallback) config, the explanation says it is not the tuned one.
    key, fixed = _entry(PREFILL, OTHER)
    fixed["verify_fix"] = {"replaced_config": dict(TUNED), "replaced_time_ms": 0.61, "fallback_time_ms": 0.5,
                           "at": "2026-12-01T00:00:00+00:00", "reason": "slower than its fallback"}
    larger = dataclasses.replace(PREFILL, lq=2048, lk=2048)
    odd_key, odd = _entry(larger, TUNED)
    odd["verify_fix"] = "not an object"  # ignored: provenance never costs an entry
    _write(config_dir, _document({key: fixed, odd_key: odd}))

    answer = runtime.lookup("attention", PREFILL, torch.float16, GPU)
    assert answer.rung is Rung.EXACT and answer.config == OTHER
    why = runtime.explain("attention", PREFILL, torch.float16, GPU).why
    assert why.startswith("this shape was tuned in this dtype on this GPU; that entry holds its fallback config")
    assert f"({TUNED.label()})" in why and "(0.61 against 0.5 ms)" in why
    fixed["verify_fix"]["replaced_config"] = [1, 2]  # no config: said as "?", never a failure
    _write(config_dir, _document({key: fixed, odd_key: odd}))
    runtime.clear_cache()
    assert "verify --fix re-timed its tuned config (?) slower" in runtime.explain("attention", PREFILL, torch.float16,
                                                                                  GPU).why

    near = dataclasses.replace(PREFILL, lq=640, lk=640)
    assert runtime.lookup("attention", near, torch.float16, GPU).matched_key == key
    assert "that entry holds its fallback config" in runtime.explain("attention", near, torch.float16, GPU).why
    assert runtime.lookup("attention", larger, torch.float16, GPU).config == TUNED
    assert "fallback" not in runtime.explain("attention", larger, torch.float16, GPU).why
    assert warnings_seen() == []


def test_nearest_hit_picks_the_closest_problem_within_the_ratio(config_dir):
    small = dataclasses.replace(PREFILL, lq=512, lk=512)
    large = dataclasses.replace(PREFILL, lq=2048, lk=2048)
    _write(config_dir, _document([_entry(small, OTHER), _entry(large, TUNED)]))
    request = dataclasses.replace(PREFILL, lq=1536, lk=1536)  # 3× small, 1.33× large

    answer = runtime.lookup("attention", request, torch.float16, GPU)

    assert answer.rung is Rung.NEAREST
    assert answer.config == TUNED
    assert answer.matched_key == f"fp16|{SPEC.problem_key(large)}"
    assert answer.distance == pytest.approx(SPEC.match.distance(request, large))
    assert answer.distance < SPEC.match.distance(request, small)


def test_decode_never_snaps_to_a_prefill_entry(config_dir):
    _write(config_dir, _document([_entry(PREFILL, TUNED)]))
    answer = runtime.lookup("attention", DECODE, torch.float16, GPU)
    assert answer.rung is Rung.DEFAULT
    assert answer.config == SPEC.default_config(DECODE, torch.float16)
    assert answer.source is None and answer.matched_key is None and answer.distance is None


def test_an_fp16_entry_serves_bf16_and_back_but_never_fp32(config_dir):
    # fp16 and bf16: the same bytes and tensor-core rate, so a config tuned in one serves the
    # other (the nearest rung, saying whose entry answered); fp32 takes neither.
    _write(config_dir, _document([_entry(PREFILL, TUNED, dtype="fp16")]))
    answer = runtime.lookup("attention", PREFILL, torch.bfloat16, GPU)
    assert (answer.rung, answer.config) == (Rung.NEAREST, TUNED)
    assert answer.matched_key.startswith("fp16|")
    why = runtime.explain("attention", PREFILL, torch.bfloat16, GPU).why
    assert "not tuned in bf16" in why and "fp16" in why
    answer = runtime.lookup("attention", PREFILL, torch.float32, GPU)
    assert answer.rung is Rung.DEFAULT
    assert answer.config == SPEC.default_config(PREFILL, torch.float32)


def test_a_dtype_s_own_nearby_entry_wins_over_its_sibling_s_exact_one(config_dir):
    nearby = dataclasses.replace(PREFILL, lq=2 * PREFILL.lq, lk=2 * PREFILL.lk)
    _write(config_dir, _document([_entry(PREFILL, TUNED, dtype="fp16"), _entry(nearby, OTHER, dtype="bf16")]))
    answer = runtime.lookup("attention", PREFILL, torch.bfloat16, GPU)
    assert (answer.rung, answer.config) == (Rung.NEAREST, OTHER)
    assert answer.matched_key.startswith("bf16|")


def test_a_missing_table_warns_once_per_kernel_and_device(config_dir, warnings_seen):
    answer = runtime.lookup("attention", PREFILL, torch.float16, GPU)
    assert answer.rung is Rung.DEFAULT
    assert answer.config == SPEC.default_config(PREFILL, torch.float16)
    runtime.lookup("attention", DECODE, torch.bfloat16, GPU)  # another problem, another dtype: no new warning
    seen = warnings_seen()
    assert len(seen) == 1, seen
    assert f"no tuned configs for attention on {GPU}" in seen[0]
    assert str(config_dir / "attention" / f"{device_key(GPU)}.json") in seen[0]
    assert _search_command(PREFILL) in seen[0]
    runtime.lookup("attention", PREFILL, torch.float16, "Test GPU X2")  # another device: its own warning
    assert len(warnings_seen()) == 2


H100, H200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"  # GPUs of one chip (omnitune.trial.same_chip_keys)


def test_a_gpu_without_tables_reads_those_of_a_gpu_of_the_same_chip_and_says_so(config_dir, caplog):
    caplog.set_level(logging.INFO, logger="omnitune.runtime")
    path = _write(config_dir, _document([_entry(PREFILL, TUNED)], device_name=H200), device_name=H200)
    answer = runtime.lookup("attention", PREFILL, torch.float16, H100)
    assert answer.rung is Rung.EXACT and answer.config == TUNED and answer.source == path
    near = dataclasses.replace(PREFILL, lq=640, lk=640)
    assert runtime.lookup("attention", near, torch.float16, H100).rung is Rung.NEAREST
    said = [r for r in caplog.records if r.name == "omnitune.runtime"]
    assert len(said) == 1 and said[0].levelno == logging.INFO, [r.getMessage() for r in said]
    assert f"no tuned configs for attention on {H100}: using {path}" in said[0].getMessage()
    assert "NVIDIA_H200, a GPU of the same chip" in runtime.explain("attention", PREFILL, torch.float16, H100).why
    assert "from NVIDIA_H200's tables" in runtime.explain("attention", near, torch.float16, H100).why
    assert runtime.explain("attention", PREFILL, torch.float16, H200).why.endswith("on this GPU")
    # a search on the H100 warm-starts from the H200's winners too; and the other way round
    assert runtime.nearest_configs(SPEC, near, torch.float16, device_key(H100)) == [TUNED]
    assert runtime.nearest_configs(SPEC, near, torch.float16, device_key("NVIDIA A100")) == []
    path.unlink()
    runtime.clear_cache()
    _write(config_dir, _document([_entry(PREFILL, OTHER)], device_name=H100), device_name=H100)
    assert runtime.lookup("attention", PREFILL, torch.float16, H200).config == OTHER


def test_a_gpu_s_own_entries_answer_first_its_twin_s_fill_the_shapes_they_lack(config_dir, warnings_seen, caplog):
    caplog.set_level(logging.INFO, logger="omnitune.runtime")
    long = dataclasses.replace(PREFILL, lq=4096, lk=4096)
    h200 = _write(config_dir, _document([_entry(PREFILL, TUNED), _entry(long, TUNED)], device_name=H200),
                  device_name=H200)
    h100 = _write(config_dir, _document([_entry(long, OTHER)], device_name=H100), device_name=H100)
    # the shape the H100 was tuned for: its own entry, though the H200's is exact too
    own = runtime.lookup("attention", long, torch.float16, H100)
    assert (own.rung, own.config, own.source) == (Rung.EXACT, OTHER, h100)
    assert runtime.explain("attention", long, torch.float16, H100).why.endswith("on this GPU")
    # a shape it was not: the H200's exact entry, not the H100's default (or its 4,096-row entry)
    lent = runtime.lookup("attention", PREFILL, torch.float16, H100)
    assert (lent.rung, lent.config, lent.source) == (Rung.EXACT, TUNED, h200)
    assert "on NVIDIA_H200, a GPU of the same chip (this GPU's own tables lack it)" in \
        runtime.explain("attention", PREFILL, torch.float16, H100).why
    near = dataclasses.replace(PREFILL, lq=640, lk=640)
    assert runtime.lookup("attention", near, torch.float16, H100).source == h200
    assert ("from NVIDIA_H200's tables: a GPU of the same chip; this GPU's own tables have nothing nearer"
            in runtime.explain("attention", near, torch.float16, H100).why)
    said = [r.getMessage() for r in caplog.records if r.name == "omnitune.runtime" and r.levelno == logging.INFO]
    assert len(said) == 1 and f"shapes its own tables lack are served from {h200}" in said[0], said
    # a search on the H100 warm-starts from its own winners first, then the H200's
    assert runtime.nearest_configs(SPEC, long, torch.float16, device_key(H100)) == [OTHER, TUNED]
    # other chips borrow nothing: the default, with the missing-table warning
    assert runtime.lookup("attention", PREFILL, torch.float16, "NVIDIA A100-SXM4-80GB").rung is Rung.DEFAULT
    assert runtime.lookup("attention", PREFILL, torch.float16, "NVIDIA H100 PCIe").rung is Rung.DEFAULT
    seen = warnings_seen()
    assert len(seen) == 2 and all("no tuned configs for attention" in line for line in seen), seen


def test_no_dtype_or_no_gpu_means_the_default(config_dir, monkeypatch):
    _write(config_dir, _document([_entry(PREFILL, TUNED)]))
    assert runtime.lookup("attention", PREFILL, None, GPU).rung is Rung.DEFAULT
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    answer = runtime.lookup("attention", PREFILL, torch.float16)
    assert answer.rung is Rung.DEFAULT
    assert answer.config == SPEC.default_config(PREFILL, torch.float16)


def test_device_defaults_to_the_current_cuda_device(config_dir, monkeypatch):
    _write(config_dir, _document([_entry(PREFILL, TUNED)]))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: GPU)
    monkeypatch.setattr("omnitune.runtime._device_limits", DeviceLimits)
    assert runtime.get_config("attention", PREFILL, dtype=torch.float16) == TUNED


def test_nearest_configs_judge_this_gpu_unless_told_another(config_dir, monkeypatch):
    # Attention's fallback when its entry's backend cannot take a call asks without limits: a
    # config this GPU cannot run (TMA before Hopper) must not come back, as a lookup would skip it.
    small = Config(BACKEND="triton", BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=2, PACK_GQA=False, USE_TMA=False)
    near = dataclasses.replace(PREFILL, lq=640, lk=640)
    _write(config_dir, _document([_entry(PREFILL, TUNED), _entry(near, small)]))
    ada = DeviceLimits(101_376, (8, 9), 142)
    monkeypatch.setattr("omnitune.runtime._device_limits", lambda: ada)
    assert SPEC.violations(PREFILL, TUNED, torch.float16, ada) and not SPEC.violations(PREFILL, small, torch.float16, ada)
    assert runtime.nearest_configs(SPEC, PREFILL, torch.float16, device_key(GPU)) == [small]
    assert runtime.nearest_configs(SPEC, PREFILL, torch.float16, device_key(GPU), DeviceLimits()) == [TUNED, small]


def test_unknown_kernel_is_a_programming_error(config_dir):
    with pytest.raises(UnknownKernelError, match="unknown kernel 'nope'"):
        runtime.get_config("nope", PREFILL, torch.float16, GPU)


def test_a_shape_string_is_accepted(config_dir):
    _write(config_dir, _document([_entry(PREFILL, TUNED)]))
    assert runtime.get_config("attention", SPEC.problem_key(PREFILL), torch.float16, GPU) == TUNED


# --- bad tables: one warning naming the search command, then the fallback -------------------------


def _search_command(problem, dtype="fp16"):
    return f"omnitune search attention --shape {SPEC.problem_key(problem)} --dtype {dtype}"


def _truncated():
    text = json.dumps(_document([_entry(PREFILL, TUNED)]), indent=2)
    return text[: len(text) // 2]


def _bad_block_m():
    key, entry = _entry(PREFILL, TUNED)
    entry["config"]["BLOCK_M"] = 7
    return _document([(key, entry)])


BAD_TABLES = {
    "empty": lambda: "",
    "corrupt": lambda: "{not json at all",
    "truncated": _truncated,
    "wrong_schema_version": lambda: _document([_entry(PREFILL, TUNED)], schema_version=2),
    "another_kernels_table": lambda: _document([_entry(PREFILL, TUNED)], kernel="kv_cache_write"),
    "another_devices_table": lambda: _document([_entry(PREFILL, TUNED)], device={"key": "NVIDIA_H100"}),
    "invalid_value": _bad_block_m,
}


@pytest.mark.parametrize("kind", sorted(BAD_TABLES))
def test_bad_table_warns_once_and_falls_back(config_dir, warnings_seen, kind):
    _write(config_dir, BAD_TABLES[kind]())
    answer = runtime.lookup("attention", PREFILL, torch.float16, GPU)
    assert answer.rung is Rung.DEFAULT
    assert answer.config == SPEC.default_config(PREFILL, torch.float16)
    # Other calls — the same problem again, and a different one — do not warn again.
    runtime.lookup("attention", PREFILL, torch.float16, GPU)
    runtime.lookup("attention", dataclasses.replace(PREFILL, b=2), torch.float16, GPU)
    seen = warnings_seen()
    assert len(seen) == 1, seen
    assert _search_command(PREFILL) in seen[0]
    assert "attention" in seen[0] and str(config_dir) in seen[0]


def test_a_config_that_breaks_a_constraint_of_the_requested_problem_is_skipped(config_dir, warnings_seen):
    tuned_for = dataclasses.replace(PREFILL, lq=64, lk=64)
    config = TUNED.replace(BLOCK_M=64)
    assert not SPEC.violations(tuned_for, config, torch.float16)
    request = dataclasses.replace(PREFILL, lq=16, lk=64)  # 16 rows: BLOCK_M=64 is too large
    assert SPEC.violations(request, config, torch.float16)
    _write(config_dir, _document([_entry(tuned_for, config)]))

    answer = runtime.lookup("attention", request, torch.float16, GPU)

    assert answer.rung is Rung.DEFAULT
    assert answer.config == SPEC.default_config(request, torch.float16)
    seen = warnings_seen()
    assert len(seen) == 1 and _search_command(request) in seen[0] and "block_m_exceeds_rows" in seen[0]
    # The entry still serves its own problem.
    assert runtime.lookup("attention", tuned_for, torch.float16, GPU).config == config


def test_an_invalid_entry_does_not_spoil_the_rest_of_the_file(config_dir, warnings_seen):
    far = dataclasses.replace(PREFILL, lq=8192, lk=8192)
    _write(config_dir, {**_bad_block_m(), "entries": {**_bad_block_m()["entries"], **dict([_entry(far, OTHER)])}})
    assert runtime.lookup("attention", far, torch.float16, GPU).config == OTHER
    assert runtime.lookup("attention", PREFILL, torch.float16, GPU).rung is Rung.DEFAULT
    assert len(warnings_seen()) == 1


def test_a_bad_table_falls_through_to_the_next_directory(tmp_path, config_dir, monkeypatch, warnings_seen):
    second = tmp_path / "second"
    _write(config_dir, "{corrupt")
    good = _write(second, _document([_entry(PREFILL, TUNED)]))
    monkeypatch.setenv("OMNITUNE_CONFIG_DIR", os.pathsep.join([str(config_dir), str(second)]))
    answer = runtime.lookup("attention", PREFILL, torch.float16, GPU)
    assert (answer.rung, answer.config, answer.source) == (Rung.EXACT, TUNED, good)
    assert len(warnings_seen()) == 1


def test_a_config_dir_that_does_not_exist_is_said_once_and_the_next_serves(tmp_path, config_dir, monkeypatch,
                                                                             warnings_seen):
    typo = tmp_path / "tuned_cofnigs"
    good = _write(config_dir, _document([_entry(PREFILL, TUNED)]))
    monkeypatch.setenv("OMNITUNE_CONFIG_DIR", os.pathsep.join([str(typo), str(config_dir)]))
    runtime.clear_cache()
    for _ in range(2):
        answer = runtime.lookup("attention", PREFILL, torch.float16, GPU)
        assert (answer.rung, answer.config, answer.source) == (Rung.EXACT, TUNED, good)
    assert warnings_seen() == [f"OMNITUNE_CONFIG_DIR names {typo}, which does not exist: no table is read from it"]


def test_a_rewritten_bad_table_warns_again(config_dir, warnings_seen):
    path = _write(config_dir, "{corrupt")
    runtime.lookup("attention", PREFILL, torch.float16, GPU)
    path.write_text("{corrupt, and longer now")
    runtime.lookup("attention", dataclasses.replace(PREFILL, b=3), torch.float16, GPU)
    assert len(warnings_seen()) == 2


# --- where tables come from ----------------------------------------------------------------------


def test_config_dir_takes_precedence_over_shipped_tables(tmp_path, config_dir, monkeypatch):
    package_dir = Path(omnitune.__file__).parent  # the fake one the fixture set up
    repo_tables = package_dir.parent / "tuned_configs"
    wheel_tables = package_dir / "tuned_configs"
    third = Config(BACKEND="triton", BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1, PACK_GQA=False,
                   USE_TMA=False)
    _write(config_dir, _document([_entry(PREFILL, TUNED)]))
    repo_file = _write(repo_tables, _document([_entry(PREFILL, OTHER)]))
    _write(wheel_tables, _document([_entry(PREFILL, third)]))
    assert runtime.config_dirs() == [config_dir, repo_tables, wheel_tables]

    assert runtime.get_config("attention", PREFILL, torch.float16, GPU) == TUNED
    monkeypatch.delenv("OMNITUNE_CONFIG_DIR")
    assert runtime.get_config("attention", PREFILL, torch.float16, GPU) == TUNED  # read at the first lookup
    runtime.clear_cache()  # ... and again after clear_cache
    assert runtime.get_config("attention", PREFILL, torch.float16, GPU) == OTHER
    repo_file.unlink()
    runtime.clear_cache()
    assert runtime.get_config("attention", PREFILL, torch.float16, GPU) == third


def test_an_exact_entry_in_a_later_directory_beats_a_nearest_one_in_an_earlier(tmp_path, config_dir, monkeypatch):
    second = tmp_path / "second"
    _write(config_dir, _document([_entry(dataclasses.replace(PREFILL, lq=1024, lk=1024), OTHER)]))
    _write(second, _document([_entry(PREFILL, TUNED)]))
    monkeypatch.setenv("OMNITUNE_CONFIG_DIR", os.pathsep.join([str(config_dir), str(second)]))
    answer = runtime.lookup("attention", PREFILL, torch.float16, GPU)
    assert (answer.rung, answer.config) == (Rung.EXACT, TUNED)


# --- caching -------------------------------------------------------------------------------------


def test_repeated_lookups_are_cached(config_dir):
    _write(config_dir, _document([_entry(PREFILL, TUNED)]))
    runtime.get_config("attention", PREFILL, torch.float16, GPU)
    start = time.perf_counter()
    for _ in range(10_000):
        runtime.get_config("attention", PREFILL, torch.float16, GPU)
    assert time.perf_counter() - start < 1.0


def test_files_are_parsed_once_per_version(config_dir, monkeypatch):
    from omnitune.runtime import _tables

    parses = []
    real_parse = _tables._parse
    monkeypatch.setattr(_tables, "_parse", lambda *a: parses.append(a[0]) or real_parse(*a))
    path = _write(config_dir, _document([_entry(PREFILL, TUNED)]))
    for b in (1, 2, 3):
        runtime.lookup("attention", dataclasses.replace(PREFILL, b=b), torch.float16, GPU)
    assert parses == [path]

    # Rewritten (another size): answers already given stay, new problems read the new version.
    # (a longer exported_at, so that the size changes even where mtimes are coarse)
    _write(config_dir, _document([_entry(PREFILL, OTHER)], exported_at="2026-12-01T00:00:00.000+00:00"))
    assert runtime.get_config("attention", PREFILL, torch.float16, GPU) == TUNED
    assert runtime.lookup("attention", dataclasses.replace(PREFILL, b=4), torch.float16, GPU).config == OTHER
    assert parses == [path, path]
    runtime.clear_cache()
    assert runtime.get_config("attention", PREFILL, torch.float16, GPU) == OTHER


# --- import discipline ---------------------------------------------------------------------------

_FORBIDDEN = ("optuna", "pandas", "rich", "typer", "sqlite_utils",
              "omnitune.report", "omnitune.export", "omnitune.store", "omnitune.cli")

_CHECK = """
import json, sys
forbidden = {forbidden!r}
def loaded():
    return sorted(m for m in sys.modules if any(m == f or m.startswith(f + ".") for f in forbidden))
import torch
import omnitune.runtime
after_import = loaded()
from omnitune.kernels.attention import AttentionProblem
answer = omnitune.runtime.lookup("attention", AttentionProblem(**{problem!r}), torch.float16, {gpu!r})
print(json.dumps({{"after_import": after_import, "after_lookup": loaded(), "rung": answer.rung.value}}))
"""


def test_runtime_imports_nothing_heavy(config_dir):
    _write(config_dir, _document([_entry(PREFILL, TUNED)]))
    code = _CHECK.format(forbidden=_FORBIDDEN, problem=dataclasses.asdict(PREFILL), gpu=GPU)
    env = dict(os.environ, TRITON_INTERPRET="1", OMNITUNE_CONFIG_DIR=str(config_dir))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["rung"] == "exact"  # the table was really read
    assert report["after_import"] == []
    assert report["after_lookup"] == []


# --- omnitune lookup -----------------------------------------------------------------------------


def test_lookup_command_shows_rung_file_and_key(config_dir):
    path = _write(config_dir, _document([_entry(PREFILL, TUNED)]))
    result = CliRunner().invoke(
        app, ["lookup", "attention", "--shape", SPEC.problem_key(PREFILL), "--dtype", "fp16", "--device", GPU]
    )
    assert result.exit_code == 0, result.output
    assert TUNED.label() in result.output
    assert "rung: exact" in result.output
    assert f"fp16|{SPEC.problem_key(PREFILL)}" in result.output
    assert f"file: {path}" in result.output


def test_lookup_command_default_rung(config_dir):
    result = CliRunner().invoke(
        app, ["lookup", "attention", "--shape", SPEC.problem_key(DECODE), "--dtype", "fp16", "--device", GPU]
    )
    assert result.exit_code == 0, result.output
    assert "rung: default" in result.output
    assert SPEC.default_config(DECODE, torch.float16).label() in result.output


@pytest.mark.parametrize(
    "args, message",
    [
        (["lookup", "nope", "--shape", "b=1"], "unknown kernel 'nope'"),
        (["lookup", "attention", "--shape", "b=1,h=8,hkv=2,lq=1,lk=4,d=64", "--dtype", "int3"], "unknown dtype"),
        (["lookup", "attention", "--shape", "b=1,zz=3"], "no dimension 'zz'"),
    ],
)
def test_lookup_command_errors_are_one_line(config_dir, args, message):
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_the_untuned_rule_is_quoted_from_its_docstring_keeping_names_as_written():
    from omnitune.kernels.attention import untuned_config
    from omnitune.runtime._explain import _untuned_rule

    def long_rule():
        """Long span-free prefill to SDPA: measured so."""

    def unnamed():
        pass

    assert _untuned_rule(long_rule) == "long span-free prefill to SDPA"
    assert _untuned_rule(unnamed) == "unnamed"
    quoted = _untuned_rule(untuned_config)
    assert quoted.startswith("PyTorch's SDPA for span-free long prefill") and "non-causal" in quoted


@pytest.mark.parametrize("content, said", [("null", "holds null"), ("[]", "holds an array"), ('"x"', "holds a string"),
                                           ("5", "holds a number"), ("true", "holds JSON true")])
def test_a_table_that_is_not_an_object_is_named_in_json_s_words(config_dir, warnings_seen, content, said):
    _write(config_dir, content)
    assert runtime.lookup("attention", PREFILL, torch.float16, GPU).rung is Rung.DEFAULT
    (warning,) = warnings_seen()
    assert f"{said}, not an object" in warning

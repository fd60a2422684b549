"""`omnitune verify` on the CPU: the compatibility and numerics parts run for real under Triton's
interpreter (--interpret); speed runs against a fake timer, the soak's bookkeeping against a CPU
backend; the JSON report's schema; the user errors. The GPU parts run in the `gpu` tests at the end
(on the device machine)."""

from __future__ import annotations

import json
import os
import math
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from omnitune import export, runtime
from omnitune.cli import app
from omnitune.kernels.attention import SPEC, AttentionProblem
from omnitune.profile.device import INTERPRETER_DEVICE, DeviceFacts, current_device_facts, device_key
from omnitune.spec import Config, parse_dtype
from omnitune.verify import compat, memory, traffic
from omnitune.verify.pipeline import VerifyOptions, run_verify
from omnitune.verify.verdict import PARTS, REPORT_SCHEMA, REPORT_SCHEMA_VERSION, Status
from trial_rows import results_db, trial_row

ON_GPU = torch.cuda.is_available()
# The CPU tests run the kernels under the interpreter; with a GPU the kernels are compiled (conftest).
cpu_only = pytest.mark.skipif(ON_GPU, reason="runs the kernels through --interpret, on a machine without a GPU")
WRONG_KERNEL = str(Path(__file__).with_name("wrong_kernel.py"))
ROOT = Path(__file__).resolve().parent.parent

PROBLEM = AttentionProblem(b=1, h=2, hkv=1, lq=17, lk=23, d=64, causal=True)
DEFAULT = SPEC.default_config(PROBLEM, torch.float32)
FAST = Config(BLOCK_M=32, BLOCK_N=32, num_warps=4, num_stages=2, PACK_GQA=True, USE_TMA=False)
H100 = "NVIDIA H100 80GB HBM3"  # the H200's twin (omnitune.trial.same_chip_keys)
H100_PCIE = "NVIDIA H100 PCIe"


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def interpreter_facts(**changes) -> DeviceFacts:
    facts = current_device_facts(interpret=True)
    return DeviceFacts(**{**facts.as_dict(), **changes})


def machine(facts: DeviceFacts) -> dict:
    return {**facts.as_dict(), "key": facts.key, "interpret": True}


def row(number, problem, config, *, spec=SPEC, device=INTERPRETER_DEVICE, dtype="fp32", **changes):
    """A trial row measured here (this machine's versions and the kernel's current source) unless
    `changes` say otherwise."""
    facts = current_device_facts(interpret=True)
    r = trial_row(number, problem, config, spec=spec, device=device, dtype=dtype, source_hash=spec.source_hash())
    r.update(torch_version=facts.torch, triton_version=facts.triton, omnitune_version=facts.omnitune)
    r.update(changes)
    return r


def exported(tmp_path: Path, rows: list[dict], devices: list[DeviceFacts]) -> Path:
    """Tables written by omnitune.export from a results database holding `rows`."""
    out = tmp_path / "tables"
    export.export_tables(results_db(tmp_path / "results.db", rows, devices), out)
    return out


def attention_table(tmp_path: Path, **changes) -> Path:
    """One attention entry, FAST (measured faster than the default), on the interpreter."""
    rows = [row(0, PROBLEM, DEFAULT, time_ms=2.0, is_default=True, **changes),
            row(1, PROBLEM, FAST, time_ms=1.0, **changes)]
    return exported(tmp_path, rows, [interpreter_facts()])


def checks(report: dict, part: str) -> list[dict]:
    return [c for c in report["checks"] if c["part"] == part]


def assert_schema(report: dict) -> None:
    """The JSON report's documented schema (docs/cli.md, "omnitune verify")."""
    assert set(report) == {"schema", "schema_version", "verdict", "exit_code", "started_at", "finished_at",
                           "machine", "options", "counts", "parts", "checks"}
    assert report["schema"] == REPORT_SCHEMA and report["schema_version"] == REPORT_SCHEMA_VERSION
    statuses = {s.value for s in Status}
    assert report["verdict"] in ("pass", "fail")
    assert report["exit_code"] == (0 if report["verdict"] == "pass" else 1)
    assert {"name", "key", "compute_capability", "driver", "torch", "triton", "omnitune", "interpret"} <= set(report["machine"])
    assert set(report["options"]) == {"tables", "model", "kernels", "soak_minutes", "fix", "interpret", "seed"}
    assert set(report["counts"]) == statuses and sum(report["counts"].values()) == len(report["checks"])
    assert set(report["parts"]) == set(PARTS)
    for part in report["parts"].values():
        assert part["status"] in statuses and set(part["counts"]) == statuses
    for check in report["checks"]:
        assert set(check) == {"part", "kernel", "subject", "status", "summary", "details"}
        assert check["part"] in PARTS and check["status"] in statuses
        assert isinstance(check["subject"], str) and isinstance(check["summary"], str)
        assert check["kernel"] is None or isinstance(check["kernel"], str)
        assert isinstance(check["details"], dict)
    assert (report["verdict"] == "fail") == any(c["status"] == "fail" for c in report["checks"])
    for part in PARTS:  # every part reports, if only why it was skipped
        assert checks(report, part), part


def fake_timer(ms_by_kind: dict[str, float]):
    """A Timer that times nothing: each candidate takes its kind's figure (± 0.1 %), per round;
    a kind not named (the spec's other backends, by default) takes 100 ms: never the fastest."""
    def timer(candidates, rounds):
        return [[ms_by_kind.get(c.kind, 100.0) * (1 + 0.001 * (i % 3)) for i in range(rounds)] for c in candidates]

    return timer


# --- the whole command on the CPU -----------------------------------------------------------


@cpu_only
def test_an_entry_slower_than_a_pytorch_backend_fails_and_fix_switches_the_backend(tmp_path):
    """Attention's BACKEND=sdpa timed beside the entry: faster past the margin, the entry fails
    and --fix writes the SDPA config, which the runtime then dispatches to."""
    tables = attention_table(tmp_path)
    path = next(tables.glob("attention/*.json"))
    timer = fake_timer({"entry": 2.0, "fallback": 2.5, "default": 2.5, "backend": 1.0})
    report = run_verify(VerifyOptions(tables=(tables,), interpret=True), timer=timer)
    (speed_check,) = [c for c in report.checks if c.part == "speed"]
    assert report.exit_code == 1 and speed_check.status is Status.FAIL
    assert "slower than backend" in speed_check.summary and speed_check.details["slower_than_backend"]
    fixed = run_verify(VerifyOptions(tables=(tables,), interpret=True, fix=True), timer=timer)
    assert fixed.exit_code == 0
    entry = json.loads(path.read_text())["entries"][f"fp32|{SPEC.problem_key(PROBLEM)}"]
    assert entry["config"]["BACKEND"] == "sdpa"
    assert entry["verify_fix"]["replaced_config"] == FAST.as_dict()


@cpu_only
def test_a_tiny_search_then_export_verifies_on_the_cpu(tmp_path):
    db, tables, out = tmp_path / "omnitune.db", tmp_path / "tables", tmp_path / "report.json"
    searched = invoke("search", "attention", "--shape", "b=1,h=2,hkv=1,lq=17,lk=23,d=64,causal=1", "--dtype", "fp32",
                      "--trials", "3", "--interpret", "--db", str(db))
    assert searched.exit_code == 0, searched.output
    assert invoke("export", "--db", str(db), "--out", str(tables)).exit_code == 0

    result = invoke("verify", "--tables", str(tables), "--interpret", "--json", str(out))
    assert result.exit_code == 0, result.output
    assert "verdict: PASS" in result.stdout
    report = json.loads(out.read_text())
    assert_schema(report)
    assert report["verdict"] == "pass" and report["machine"]["name"] == INTERPRETER_DEVICE
    (table_check,) = checks(report, "compat")
    assert table_check["status"] == "pass" and table_check["details"]["hard"] == [] == table_check["details"]["soft"]
    (entry_check,) = checks(report, "numerics")
    assert entry_check["status"] == "pass" and entry_check["details"]["rel_error"] <= 1e-4
    assert entry_check["details"]["seed"] != 0  # not the search's inputs
    for part in ("speed", "memory"):
        assert [c["summary"] for c in checks(report, part)] == ["skipped (no GPU)"]
    assert [c["status"] for c in checks(report, "soak")] == ["skipped"]


def test_the_configs_compiled_ahead_are_those_the_checks_launch():
    """An entry's own config, its fallback and the default, each once; never one of PyTorch's
    backends (nothing to compile) nor a config that breaks a constraint here (never launched)."""
    from omnitune.spec import DeviceLimits
    from omnitune.verify.ahead import configs_checked

    limits = DeviceLimits()
    assert configs_checked(SPEC, PROBLEM, torch.float32, FAST, limits) == [FAST, DEFAULT]
    assert configs_checked(SPEC, PROBLEM, torch.float32, DEFAULT, limits) == [DEFAULT]
    sdpa = SPEC.complete_config(SPEC.backends[0], PROBLEM, torch.float32)
    assert configs_checked(SPEC, PROBLEM, torch.float32, sdpa, limits) == [DEFAULT]
    huge = FAST.replace(BLOCK_M=256, BLOCK_N=256, num_stages=4)
    assert SPEC.violations(PROBLEM, huge, torch.float32, limits)
    assert configs_checked(SPEC, PROBLEM, torch.float32, huge, limits) == [DEFAULT]


@cpu_only
def test_a_table_compiled_ahead_in_workers_gives_the_same_report(tmp_path):
    """With its configs handed to compile workers first (what verify does on a GPU), the checks
    say what they say without, and the progress names what the workers did."""
    tables = attention_table(tmp_path)
    timer = fake_timer({"entry": 1.0, "fallback": 2.0, "default": 2.0})
    plain = run_verify(VerifyOptions(tables=(tables,), interpret=True), timer=timer, compile_ahead=False)
    said = []
    ahead = run_verify(VerifyOptions(tables=(tables,), interpret=True), timer=timer, compile_ahead=True,
                       progress=said.append)
    assert [(c.part, c.subject, c.status) for c in ahead.checks] == [(c.part, c.subject, c.status)
                                                                     for c in plain.checks]
    assert ahead.exit_code == plain.exit_code == 0
    assert any(m.startswith("compiling ahead: 2 configs of attention/") for m in said), said
    assert any("precompiled 2 configs" in m for m in said), said


@cpu_only
def test_compile_workers_that_cannot_start_leave_the_checks_to_compile(tmp_path, monkeypatch):
    from omnitune.verify import ahead

    def no_workers(*args, **kwargs):
        raise OSError("no more processes")

    monkeypatch.setattr(ahead, "EntriesAhead", no_workers)
    said = []
    report = run_verify(VerifyOptions(tables=(attention_table(tmp_path),), interpret=True),
                        timer=fake_timer({"entry": 1.0, "fallback": 2.0, "default": 2.0}), compile_ahead=True,
                        progress=said.append)
    assert report.exit_code == 0 and [c.status for c in report.checks if c.part == "numerics"] == [Status.PASS]
    assert any("compiling ahead: not started (OSError: no more processes)" in m for m in said), said


@cpu_only
def test_a_table_from_another_gpu_fails_and_its_entries_are_not_run(tmp_path, monkeypatch):
    # a PCIe H100 (114 SMs) is another chip than the H200, though of the same architecture
    h100 = interpreter_facts(name=H100_PCIE, compute_capability="9.0", driver="575.51")
    tables = exported(tmp_path, [row(0, PROBLEM, DEFAULT, time_ms=1.0, is_default=True, device=H100_PCIE)], [h100])
    here = machine(interpreter_facts(name="NVIDIA H200", compute_capability="9.0", driver="575.51"))
    report = run_verify(VerifyOptions(tables=(tables,), interpret=True), machine=here).as_record()
    assert report["exit_code"] == 1
    (table_check,) = checks(report, "compat")
    assert table_check["status"] == "fail" and "another GPU" in table_check["summary"]
    assert [d["field"] for d in table_check["details"]["hard"]] == ["device"]
    assert [c["status"] for c in checks(report, "numerics")] == ["skipped"]
    assert "NVIDIA H100" in checks(report, "numerics")[0]["summary"]

    # the same through the command, this machine standing in for an H200
    monkeypatch.setattr("omnitune.verify.pipeline.current_machine", lambda interpret: here)
    result = invoke("verify", "--tables", str(tables), "--interpret", "--json", str(tmp_path / "r.json"))
    assert result.exit_code == 1, result.output
    assert "verdict: FAIL" in result.stdout
    assert "another GPU" in checks(json.loads((tmp_path / "r.json").read_text()), "compat")[0]["summary"]


@cpu_only
def test_the_twin_s_table_the_runtime_serves_here_is_checked_and_timed_here_but_never_rewritten(tmp_path, tables_dir):
    # an H200's table on an H100 with none of its own: what the runtime here serves
    h200 = interpreter_facts(**H200_FACTS)
    tables = exported(tmp_path, [row(0, PROBLEM, DEFAULT, time_ms=1.0, is_default=True, device="NVIDIA H200"),
                                 row(1, PROBLEM, FAST, time_ms=0.5, device="NVIDIA H200")], [h200])
    path = next(tables.glob("attention/*.json"))
    before = path.read_text()
    here = machine(interpreter_facts(name=H100, compute_capability="9.0", driver="580.159.04"))
    said = []
    # the tuned config slower here than its fallback: --fix would replace it, in a table of this GPU
    report = run_verify(VerifyOptions(tables=(tables,), interpret=True, fix=True), machine=here,
                        timer=fake_timer({"entry": 2.0, "fallback": 1.0, "default": 1.0}), progress=said.append)
    (table_check,) = checks(report.as_record(), "compat")
    assert table_check["status"] == "warn" and "a GPU of the same chip: served here" in table_check["summary"]
    assert table_check["details"]["hard"] == [] and [d["field"] for d in table_check["details"]["soft"]] == ["device"]
    assert [c.status for c in report.checks if c.part == "numerics"] == [Status.PASS]
    # the H200's table is not rewritten; its slower entry goes, replaced, into the H100's own table
    (speed_check,) = [c for c in report.checks if c.part == "speed"]
    own_path = path.with_name(f"{device_key(H100)}.json")
    assert speed_check.status is Status.WARN and speed_check.details["fixed_in"] == str(own_path)
    assert path.read_text() == before
    assert any("served here: not rewritten; 1 entry slower here written" in line for line in said), said
    own = json.loads(own_path.read_text())
    assert own["device"]["name"] == H100 and own["kernel"] == "attention" and "predictor" not in own
    (key,) = own["entries"]
    assert Config(own["entries"][key]["config"]) == DEFAULT
    assert Config(own["entries"][key]["verify_fix"]["replaced_config"]) == FAST
    assert own["entries"][key]["verify_fix"]["replaced_in"] == path.name and "trials" not in own["entries"][key]
    # the runtime here now runs the fallback for that shape, from this GPU's own table
    assert tables == tables_dir  # the folder the runtime reads
    runtime.clear_cache()
    answer = runtime.lookup("attention", PROBLEM, torch.float32, H100)
    assert (answer.config, answer.source) == (DEFAULT, own_path)
    # a second --fix leaves the own entry as it is (it is this GPU's now), and the twin's file too
    own_before = own_path.read_text()
    run_verify(VerifyOptions(tables=(tables,), interpret=True, fix=True), machine=here,
               timer=fake_timer({"entry": 2.0, "fallback": 1.0, "default": 1.0}))
    assert own_path.read_text() == own_before and path.read_text() == before
    # an own table that cannot be merged into safely is left as it is, and said so
    own_path.write_text("{")
    said.clear()
    report = run_verify(VerifyOptions(tables=(tables,), interpret=True, fix=True), machine=here,
                        timer=fake_timer({"entry": 2.0, "fallback": 1.0, "default": 1.0}), progress=said.append)
    assert own_path.read_text() == "{" and path.read_text() == before
    assert [c.status for c in report.checks if c.part == "speed"] == [Status.FAIL]
    assert any("1 entry slower here not written into this GPU's own table: cannot merge into" in line
               for line in said), said
    own_path.unlink()

    # with a table of its own for the kernel, the runtime serves the twin's below it: both are run
    own = exported(tmp_path / "own", [row(0, PROBLEM, DEFAULT, time_ms=1.0, is_default=True, device=H100)],
                   [interpreter_facts(name=H100, compute_capability="9.0", driver="580.159.04")])
    report = run_verify(VerifyOptions(tables=(tables, own), interpret=True), machine=here,
                        timer=fake_timer({"entry": 1.0, "fallback": 1.0, "default": 1.0})).as_record()
    by_table = {c["details"]["table"]: c for c in checks(report, "compat")}
    assert by_table[str(path)]["status"] == "warn" and "another GPU" not in by_table[str(path)]["summary"]
    assert [c["status"] for c in checks(report, "numerics")] == ["pass", "pass"]
    # a third chip's table is another GPU's: not run here
    a100 = exported(tmp_path / "a100", [row(0, PROBLEM, FAST, time_ms=0.5, device="NVIDIA A100-SXM4-80GB")],
                    [interpreter_facts(name="NVIDIA A100-SXM4-80GB", compute_capability="8.0", driver="580.159.04")])
    report = run_verify(VerifyOptions(tables=(a100,), interpret=True), machine=here,
                        timer=fake_timer({"entry": 1.0, "fallback": 1.0, "default": 1.0})).as_record()
    (a100_check,) = checks(report, "compat")
    assert a100_check["status"] == "fail" and "another GPU" in a100_check["summary"]
    assert [c["status"] for c in checks(report, "numerics")] == ["skipped"]
    # an unusable table of its own is passed over, by the runtime and so here: the twin's is served
    next(own.glob("attention/*.json")).write_text("{")
    report = run_verify(VerifyOptions(tables=(tables, own), interpret=True), machine=here,
                        timer=fake_timer({"entry": 1.0, "fallback": 1.0, "default": 1.0})).as_record()
    by_table = {c["details"]["table"]: c for c in checks(report, "compat")}
    assert by_table[str(path)]["status"] == "warn"
    assert [c["status"] for c in checks(report, "numerics")] == ["pass"]


@cpu_only
def test_a_stale_twin_table_is_never_revalidated_here(tmp_path):
    tables = stale_h200_table(tmp_path, tuned=((PROBLEM, FAST),))
    path = next(tables.glob("attention/*.json"))
    before = path.read_text()
    here = machine(interpreter_facts(name=H100, compute_capability="9.0", driver="580.159.04"))
    report = run_verify(VerifyOptions(tables=(tables,), interpret=True, fix=True), machine=here, timer=FASTER)
    (table_check,) = [c for c in report.checks if c.part == "compat"]
    assert table_check.status is Status.FAIL and table_check.details["revalidation"]["possible"] is False
    assert "NVIDIA H200's table, served here as a same-chip GPU's: only `omnitune verify --fix` on an NVIDIA H200" \
        in table_check.summary
    assert path.read_text() == before


@cpu_only
def test_without_a_gpu_a_gpus_table_is_checked_for_source_and_versions_only(tmp_path):
    h200 = interpreter_facts(name="NVIDIA H200", compute_capability="9.0", driver="575.51")
    tables = exported(tmp_path, [row(0, PROBLEM, DEFAULT, time_ms=1.0, is_default=True, device="NVIDIA H200")],
                      [h200])
    report = run_verify(VerifyOptions(tables=(tables,), interpret=True)).as_record()
    (table_check,) = checks(report, "compat")
    assert table_check["status"] == "pass", table_check
    assert table_check["details"]["skipped"] == ["device", "compute_capability", "driver"]
    assert "device skipped (no GPU)" in table_check["summary"]
    assert [c["status"] for c in checks(report, "numerics")] == ["pass"]  # run on a derived small problem
    assert report["exit_code"] == 0


def test_an_entry_recording_an_impossible_time_is_warned_about_and_still_checked(tmp_path):
    """An export from before impossible times were left out could ship one (a trial at -3.6 ms won
    its key); the runtime serves the entry (it reads no time), so verify warns rather than fails."""
    h200 = interpreter_facts(name="NVIDIA H200", compute_capability="9.0", driver="575.51")
    tables = exported(tmp_path, [row(0, PROBLEM, DEFAULT, time_ms=1.0, is_default=True, device="NVIDIA H200")],
                      [h200])
    [path] = (tables / "attention").glob("*.json")
    document = json.loads(path.read_text())
    [(key, entry)] = document["entries"].items()
    entry["time_ms"] = -3.6
    path.write_text(json.dumps(document))
    report = run_verify(VerifyOptions(tables=(tables,), interpret=True)).as_record()
    table_check, entry_check = checks(report, "compat")
    assert table_check["status"] == "pass", table_check
    assert (entry_check["status"], entry_check["subject"]) == ("warn", key), entry_check
    assert entry_check["summary"].startswith("time_ms -3.6 is not a positive number of milliseconds")
    assert [c["status"] for c in checks(report, "numerics")] == ["pass"]
    assert report["exit_code"] == 0


@cpu_only
def test_soft_differences_warn_and_pass(tmp_path):
    tables = attention_table(tmp_path, torch_version="2.11.0+cu130", triton_version="3.6.1")
    report = run_verify(VerifyOptions(tables=(tables,), interpret=True)).as_record()
    (table_check,) = checks(report, "compat")
    assert table_check["status"] == "warn"
    soft = {d["field"]: d["note"] for d in table_check["details"]["soft"]}
    assert soft["torch"] in ("minor", "major", "patch", "build") and soft["triton"] == "patch"
    assert report["exit_code"] == 0 and report["verdict"] == "pass"


@cpu_only
def test_a_changed_kernel_source_fails_compat_but_its_configs_are_still_checked(tmp_path):
    tables = attention_table(tmp_path, source_hash="0123456789abcdef")
    result = invoke("verify", "--tables", str(tables), "--interpret", "--json", str(tmp_path / "r.json"))
    assert result.exit_code == 1, result.output
    report = json.loads((tmp_path / "r.json").read_text())
    assert_schema(report)
    (table_check,) = checks(report, "compat")
    assert table_check["status"] == "fail" and "kernel source changed" in table_check["summary"]
    assert table_check["details"]["hard"][0]["recorded"] == "0123456789abcdef"
    assert [c["status"] for c in checks(report, "numerics")] == ["pass"]


@cpu_only
def test_an_older_whole_module_hash_of_todays_source_is_accepted(tmp_path):
    import sys

    from omnitune.source_hash import module_source_hash

    tables = attention_table(tmp_path)
    path = next(tables.glob("attention/*.json"))
    doc = json.loads(path.read_text())
    doc["kernel_source_hash"] = module_source_hash(sys.modules[SPEC.module])
    export.write_json_atomic(path, doc)
    report = run_verify(VerifyOptions(tables=(tables,), interpret=True)).as_record()
    (table_check,) = checks(report, "compat")
    assert table_check["status"] == "pass" and "whole-module hash" in table_check["details"]["notes"][0]


@cpu_only
def test_an_entry_with_a_wrong_result_fails_numerics(tmp_path):
    from omnitune.registry import get_spec

    spec = get_spec(WRONG_KERNEL)
    small, large = spec.problem_type(n=100), spec.problem_type(n=300)
    rows = [row(0, small, Config(BLOCK=32, SKEW=False), spec=spec, time_ms=1.0, is_default=True),
            row(0, large, Config(BLOCK=32, SKEW=False), spec=spec, time_ms=2.0, is_default=True),
            row(1, large, Config(BLOCK=64, SKEW=True), spec=spec, time_ms=1.0)]  # measured "faster": wrong
    tables = exported(tmp_path, rows, [interpreter_facts()])
    result = invoke("verify", "--tables", str(tables), "--kernels", WRONG_KERNEL, "--interpret",
                    "--json", str(tmp_path / "r.json"))
    assert result.exit_code == 1, result.output
    report = json.loads((tmp_path / "r.json").read_text())
    by_n = {c["details"]["problem"]: c for c in checks(report, "numerics")}
    assert by_n["n=100"]["status"] == "pass"
    assert by_n["n=300"]["status"] == "fail" and "wrong result" in by_n["n=300"]["summary"]
    assert by_n["n=300"]["details"]["rel_error"] == pytest.approx(0.25)
    assert checks(report, "compat")[0]["status"] == "pass"


# Attention's Gluon kernel (BACKEND=gluon_pingpong) on a problem it serves: the interpreter cannot run it.
GLUON = Config(BACKEND="gluon_pingpong", BLOCK_M=128, BLOCK_N=128, num_warps=4, num_stages=2, PACK_GQA=False,
               USE_TMA=False)
PREFILL = AttentionProblem(b=1, h=2, hkv=1, lq=256, lk=256, d=128, causal=True)


def gluon_and_triton_table(tmp_path: Path, gluon_dtype: str = "fp16") -> Path:
    """Attention's FAST entry (fp32) and a Gluon entry for PREFILL, one table on the interpreter."""
    gluon_default = SPEC.default_config(PREFILL, parse_dtype(gluon_dtype))
    rows = [row(0, PROBLEM, DEFAULT, time_ms=2.0, is_default=True), row(1, PROBLEM, FAST, time_ms=1.0),
            row(0, PREFILL, gluon_default, dtype=gluon_dtype, time_ms=2.0, is_default=True),
            row(1, PREFILL, GLUON, dtype=gluon_dtype, time_ms=1.0)]
    return exported(tmp_path, rows, [interpreter_facts()])


@cpu_only
def test_a_gluon_entry_is_not_checkable_under_the_interpreter_and_the_others_still_are(tmp_path):
    tables = gluon_and_triton_table(tmp_path)
    path = next(tables.glob("attention/*.json"))
    written = path.read_bytes()
    out = tmp_path / "r.json"
    result = invoke("verify", "--tables", str(tables), "--interpret", "--json", str(out))
    assert result.exit_code == 0, result.output
    assert "verdict: PASS" in result.stdout and "1 not checkable on this machine" in result.stdout
    report = json.loads(out.read_text())
    assert_schema(report)
    numerics = {c["subject"]: c for c in checks(report, "numerics")}
    gluon = numerics[f"fp16|{SPEC.problem_key(PREFILL)}"]
    assert gluon["status"] == "not_checkable"
    assert gluon["summary"] == "not checkable under the interpreter: Gluon kernel, needs an sm_90 GPU"
    assert gluon["details"]["config"] == GLUON.as_dict() and "rel_error" not in gluon["details"]
    triton_entry = numerics[f"fp32|{SPEC.problem_key(PROBLEM)}"]  # still run under the interpreter
    assert triton_entry["status"] == "pass" and triton_entry["details"]["rel_error"] <= 1e-4
    assert report["counts"]["not_checkable"] == 1 and report["counts"]["fail"] == 0
    assert report["parts"]["numerics"]["status"] == "pass"
    assert checks(report, "compat")[0]["status"] == "pass"

    # --fix has nothing to repair in it: the file stays as export wrote it
    fixed = invoke("verify", "--tables", str(tables), "--interpret", "--fix", "--json", str(out))
    assert fixed.exit_code == 0, fixed.output
    assert [c["status"] for c in checks(json.loads(out.read_text()), "numerics")].count("not_checkable") == 1
    assert path.read_bytes() == written


@cpu_only
@pytest.mark.parametrize("with_gluon", [False, True], ids=["triton_only", "with_gluon"])
def test_a_table_recorded_before_the_hash_covered_the_gluon_kernel_is_stale_only_with_gluon_configs(tmp_path,
                                                                                                   with_gluon):
    # the hash of the attention module's own code, as tables recorded it before the spec named the
    # Gluon kernel's modules: still today's for the Triton entries, not for a Gluon one
    import omnitune.kernels.attention as attention_module
    from omnitune.source_hash import kernel_source_hash

    tables = gluon_and_triton_table(tmp_path) if with_gluon else attention_table(tmp_path)
    path = next(tables.glob("attention/*.json"))
    doc = json.loads(path.read_text())
    assert doc["kernel_source_hash"] == SPEC.source_hash()  # export records the whole hash
    doc["kernel_source_hash"] = kernel_source_hash(attention_module)
    path.write_text(json.dumps(doc))
    report = run_verify(VerifyOptions(tables=(tables,), interpret=True)).as_record()
    (table_check,) = checks(report, "compat")
    if with_gluon:
        assert table_check["status"] == "fail" and "kernel source changed" in table_check["summary"]
    else:
        assert table_check["status"] == "pass", table_check


@cpu_only
def test_a_gluon_entry_breaking_a_constraint_still_fails_under_the_interpreter(tmp_path):
    # fp32: the Gluon kernel takes 16-bit operands (gluon_16_bit), on any GPU
    tables = gluon_and_triton_table(tmp_path, gluon_dtype="fp32")
    report = run_verify(VerifyOptions(tables=(tables,), interpret=True)).as_record()
    assert report["exit_code"] == 1
    (gluon,) = [c for c in checks(report, "numerics") if c["details"]["config"]["BACKEND"] == "gluon_pingpong"]
    assert gluon["status"] == "fail" and "config breaks constraint gluon_16_bit" in gluon["summary"]


@cpu_only
def test_an_entry_slower_than_its_fallback_fails_and_fix_replaces_it(tmp_path):
    tables = attention_table(tmp_path)
    path = next(tables.glob("attention/*.json"))
    slower = fake_timer({"entry": 2.0, "fallback": 1.0, "default": 1.0})
    report = run_verify(VerifyOptions(tables=(tables,), interpret=True), timer=slower)
    assert report.exit_code == 1
    (speed_check,) = [c for c in report.checks if c.part == "speed"]
    assert speed_check.status is Status.FAIL and "slower than its fallback" in speed_check.summary
    assert speed_check.details["speedup_vs_fallback"] == pytest.approx(0.5, rel=0.01)
    assert json.loads(path.read_text())["entries"][f"fp32|{SPEC.problem_key(PROBLEM)}"]["config"] == FAST.as_dict()

    fixed = run_verify(VerifyOptions(tables=(tables,), interpret=True, fix=True), timer=slower)
    assert fixed.exit_code == 0
    (speed_check,) = [c for c in fixed.checks if c.part == "speed"]
    assert speed_check.status is Status.WARN and "replaced by its fallback" in speed_check.summary
    text = path.read_text()
    doc = json.loads(text)
    assert text == export.document_text(doc)  # written the way export writes
    entry = doc["entries"][f"fp32|{SPEC.problem_key(PROBLEM)}"]
    assert entry["config"] == DEFAULT.as_dict() and entry["speedup_vs_default"] == 1.0
    assert entry["verify_fix"]["replaced_config"] == FAST.as_dict()
    assert entry["time_ms"] == pytest.approx(1.0, rel=0.01)

    # now the entry is its fallback: nothing left to flag
    again = run_verify(VerifyOptions(tables=(tables,), interpret=True), timer=slower)
    assert again.exit_code == 0
    (speed_check,) = [c for c in again.checks if c.part == "speed"]
    assert speed_check.status is Status.PASS and speed_check.details["entry_is_fallback"]


@cpu_only
def test_fix_through_the_command(tmp_path, monkeypatch):
    tables = attention_table(tmp_path)
    monkeypatch.setattr("omnitune.verify.speed.default_timer",
                        lambda interpret: fake_timer({"entry": 2.0, "fallback": 1.0, "default": 1.0}))
    assert invoke("verify", "--tables", str(tables), "--interpret").exit_code == 1
    result = invoke("verify", "--tables", str(tables), "--interpret", "--fix")
    assert result.exit_code == 0, result.output
    doc = json.loads(next(tables.glob("attention/*.json")).read_text())
    assert doc["entries"][f"fp32|{SPEC.problem_key(PROBLEM)}"]["config"] == DEFAULT.as_dict()


# --- revalidation: --fix re-stamps a table tuned on older kernel source ----------------------

STALE = "0123456789abcdef"  # a kernel source hash no code here has
H200_FACTS = {"name": "NVIDIA H200", "compute_capability": "9.0", "driver": "580.159.04"}
PROBLEM2 = AttentionProblem(b=1, h=2, hkv=1, lq=9, lk=31, d=64, causal=False)
SLOW = Config(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1, PACK_GQA=False, USE_TMA=False)


def h200_machine(**changes) -> dict:
    """This machine standing in for an H200 (the kernels still run under the interpreter)."""
    return machine(interpreter_facts(**{**H200_FACTS, **changes}))


def stale_h200_table(tmp_path: Path, tuned=((PROBLEM, FAST), (PROBLEM2, SLOW)), **device) -> Path:
    """An H200 attention table measured on older kernel source: per problem its default and a
    tuned config measured faster."""
    rows = []
    for problem, config in tuned:
        default = SPEC.default_config(problem, torch.float32)
        rows += [row(len(rows), problem, default, time_ms=2.0, is_default=True, device="NVIDIA H200", source_hash=STALE),
                 row(len(rows) + 1, problem, config, time_ms=1.0, device="NVIDIA H200", source_hash=STALE)]
    return exported(tmp_path, rows, [interpreter_facts(**{**H200_FACTS, **device})])


def entry_timer(entry_ms) -> object:
    """A Timer whose entry takes `entry_ms(config)` and every other candidate 1.0 ms."""
    def timer(candidates, rounds):
        entry = next(c.config for c in candidates if c.kind == "entry")
        return [[(entry_ms(entry) if c.kind == "entry" else 1.0) * (1 + 0.001 * (i % 3)) for i in range(rounds)]
                for c in candidates]

    return timer


FASTER = entry_timer(lambda config: 0.8)


def table_doc(tables: Path, kernel: str = "attention") -> dict:
    return json.loads(next(tables.glob(f"{kernel}/*.json")).read_text())


@cpu_only
def test_fix_revalidates_a_stale_table_whose_entries_pass_and_the_runtime_serves_it(tmp_path, monkeypatch, caplog):
    import logging

    from omnitune import runtime

    tables = stale_h200_table(tmp_path)
    path = next(tables.glob("attention/*.json"))
    monkeypatch.setattr("omnitune.verify.pipeline.current_machine", lambda interpret: h200_machine())
    monkeypatch.setattr("omnitune.verify.speed.default_timer", lambda interpret: FASTER)
    out = tmp_path / "r.json"

    result = invoke("verify", "--tables", str(tables), "--interpret", "--json", str(out))
    assert result.exit_code == 1, result.output
    (table_check,) = checks(json.loads(out.read_text()), "compat")
    assert table_check["status"] == "fail" and "kernel source changed" in table_check["summary"]
    assert "`omnitune verify --fix` on this GPU would revalidate" in table_check["summary"]
    assert table_check["details"]["revalidation"]["possible"] is True

    result = invoke("verify", "--tables", str(tables), "--interpret", "--fix", "--json", str(out))
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert_schema(report)
    (table_check,) = checks(report, "compat")
    assert table_check["status"] == "warn" and table_check["summary"].startswith("revalidated (--fix)")
    assert table_check["details"]["revalidated"]["moved"] is True
    assert len(table_check["details"]["revalidated"]["entries"]) == 2
    assert all(c["status"] == "pass" and c["summary"].startswith("revalidated") for c in checks(report, "speed"))
    text = path.read_text()
    doc = json.loads(text)
    assert text == export.document_text(doc)  # written the way export writes
    assert doc["kernel_source_hash"] == SPEC.source_hash()
    for problem, config in ((PROBLEM, FAST), (PROBLEM2, SLOW)):
        entry = doc["entries"][f"fp32|{SPEC.problem_key(problem)}"]
        assert entry["config"] == config.as_dict() and "verify_fix" not in entry  # re-stamped, not changed
        record = entry["revalidated"]
        assert set(record) == {"at", "from_source_hash", "to_source_hash", "measured"}
        assert (record["from_source_hash"], record["to_source_hash"]) == (STALE, SPEC.source_hash())
        assert record["measured"]["entry_ms"] == pytest.approx(0.8, rel=0.01)
        assert record["measured"]["fallback_ms"] == pytest.approx(1.0, rel=0.01)

    # the table is today's again: a plain verify passes compat
    result = invoke("verify", "--tables", str(tables), "--interpret", "--json", str(out))
    assert result.exit_code == 0, result.output
    (table_check,) = checks(json.loads(out.read_text()), "compat")
    assert table_check["status"] == "pass" and table_check["details"]["hard"] == []

    # and the runtime serves its entries, the revalidated record notwithstanding
    monkeypatch.setenv(runtime.CONFIG_DIR_ENV, str(tables))
    runtime.clear_cache()
    caplog.set_level(logging.WARNING, logger="omnitune.runtime")
    answer = runtime.lookup("attention", PROBLEM, torch.float32, "NVIDIA H200")
    runtime.clear_cache()
    assert answer.rung is runtime.Rung.EXACT and answer.source == path
    assert answer.config == SPEC.coerce_config(FAST.as_dict())
    assert [r for r in caplog.records if r.name == "omnitune.runtime"] == []


@cpu_only
def test_fix_replaces_a_slower_entry_revalidates_the_others_and_moves_the_hash(tmp_path):
    tables = stale_h200_table(tmp_path)
    timer = entry_timer(lambda config: 2.0 if config["BLOCK_M"] == SLOW["BLOCK_M"] else 0.8)
    report = run_verify(VerifyOptions(tables=(tables,), interpret=True, fix=True), machine=h200_machine(), timer=timer)
    assert report.exit_code == 0
    (table_check,) = [c for c in report.checks if c.part == "compat"]
    assert table_check.status is Status.WARN and "1 replaced by a faster config" in table_check.summary
    doc = table_doc(tables)
    assert doc["kernel_source_hash"] == SPEC.source_hash()
    fast, slow = (doc["entries"][f"fp32|{SPEC.problem_key(p)}"] for p in (PROBLEM, PROBLEM2))
    assert fast["config"] == FAST.as_dict() and fast["revalidated"]["to_source_hash"] == SPEC.source_hash()
    assert slow["config"] == SPEC.default_config(PROBLEM2, torch.float32).as_dict()
    assert slow["verify_fix"]["replaced_config"] == SLOW.as_dict() and "revalidated" not in slow
    speed_checks = {c.subject: c for c in report.checks if c.part == "speed"}
    assert speed_checks[f"fp32|{SPEC.problem_key(PROBLEM2)}"].status is Status.WARN
    assert speed_checks[f"fp32|{SPEC.problem_key(PROBLEM)}"].details["revalidated"]["measured"]["entry_ms"] > 0


@cpu_only
def test_an_entry_failing_numerics_keeps_the_tables_hash(tmp_path):
    from omnitune.registry import get_spec

    spec = get_spec(WRONG_KERNEL)
    small, large = spec.problem_type(n=100), spec.problem_type(n=300)
    kw = {"spec": spec, "device": "NVIDIA H200", "source_hash": STALE}
    rows = [row(0, small, Config(BLOCK=32, SKEW=False), time_ms=1.0, is_default=True, **kw),
            row(0, large, Config(BLOCK=32, SKEW=False), time_ms=2.0, is_default=True, **kw),
            row(1, large, Config(BLOCK=64, SKEW=True), time_ms=1.0, **kw)]  # measured "faster": wrong
    tables = exported(tmp_path, rows, [interpreter_facts(**H200_FACTS)])
    options = VerifyOptions(tables=(tables,), kernels=(spec.name,), interpret=True, fix=True)
    report = run_verify(options, {spec.name: spec}, machine=h200_machine(), timer=FASTER)
    assert report.exit_code == 1
    (table_check,) = [c for c in report.checks if c.part == "compat"]
    assert table_check.status is Status.FAIL and "the table keeps its hash" in table_check.summary
    assert "numerics did not pass" in table_check.summary
    doc = table_doc(tables, spec.name)
    assert doc["kernel_source_hash"] == STALE
    assert doc["entries"]["fp32|n=100"]["revalidated"]["to_source_hash"] == spec.source_hash()
    assert "revalidated" not in doc["entries"]["fp32|n=300"]

    # a plain verify still fails compat, and counts the entry already re-stamped
    again = run_verify(VerifyOptions(tables=(tables,), kernels=(spec.name,), interpret=True), {spec.name: spec},
                       machine=h200_machine(), timer=FASTER)
    (table_check,) = [c for c in again.checks if c.part == "compat"]
    assert table_check.status is Status.FAIL and table_check.details["revalidation"]["entries_revalidated_before"] == 1


PROBLEM3 = AttentionProblem(b=1, h=2, hkv=1, lq=21, lk=45, d=64, causal=False)


def export_into(tables: Path, tmp_path: Path, rows: list[dict], devices: list[DeviceFacts]):
    """`omnitune export` of a second database (holding `rows`) into `tables`, run for real."""
    result = invoke("export", "--db", str(results_db(tmp_path / "later.db", rows, devices)), "--out", str(tables))
    assert result.exit_code == 0, result.output
    return result


def compat_by_subject(report: dict) -> dict[str, dict]:
    return {c["subject"]: c for c in checks(report, "compat")}


@cpu_only
def test_entries_kept_from_a_table_of_older_source_fail_compat_and_the_new_ones_pass(tmp_path):
    tables = attention_table(tmp_path, source_hash=STALE)
    result = export_into(tables, tmp_path, [row(0, PROBLEM2, SPEC.default_config(PROBLEM2, torch.float32),
                                                time_ms=1.0, is_default=True)], [interpreter_facts()])
    assert "1 entries kept from the file were measured on other kernel source" in result.stderr
    doc = table_doc(tables)
    assert doc["kernel_source_hash"] == SPEC.source_hash()  # the newest measurement's
    stale_key, fresh_key = (f"fp32|{SPEC.problem_key(p)}" for p in (PROBLEM, PROBLEM2))
    assert doc["entries"][stale_key]["kernel_source_hash"] == STALE

    out = tmp_path / "r.json"
    result = invoke("verify", "--tables", str(tables), "--interpret", "--json", str(out))
    assert result.exit_code == 1, result.output
    report = json.loads(out.read_text())
    assert_schema(report)
    by_subject = compat_by_subject(report)
    assert set(by_subject) == {"attention/triton_interpreter.json", stale_key}  # nothing for the fresh entry
    table_check, entry_check = by_subject["attention/triton_interpreter.json"], by_subject[stale_key]
    assert table_check["status"] == "pass" and "1 entries measured on other kernel source" in table_check["summary"]
    assert entry_check["status"] == "fail" and "kernel source changed" in entry_check["summary"]
    assert entry_check["details"]["hard"] == [{"field": "kernel_source_hash", "recorded": STALE,
                                               "here": SPEC.source_hash(),
                                               "note": "kernel source changed since this entry was measured"}]
    assert entry_check["details"]["revalidation"]["from_source_hash"] == STALE
    assert {c["subject"]: c["status"] for c in checks(report, "numerics")} == {stale_key: "pass", fresh_key: "pass"}


@cpu_only
def test_fix_revalidates_or_replaces_the_entries_kept_from_older_source(tmp_path):
    """On the table's GPU: the stale entry that passes is re-stamped (its own hash goes: it is the
    table's now), the one slower than its fallback replaced; the table's hash was today's throughout."""
    tables = stale_h200_table(tmp_path)
    export_into(tables, tmp_path, [row(0, PROBLEM3, FAST, time_ms=1.0, device="NVIDIA H200")],
                [interpreter_facts(**H200_FACTS)])
    fast_key, slow_key, fresh_key = (f"fp32|{SPEC.problem_key(p)}" for p in (PROBLEM, PROBLEM2, PROBLEM3))
    assert {k: e.get("kernel_source_hash") for k, e in table_doc(tables)["entries"].items()} == {
        fast_key: STALE, slow_key: STALE, fresh_key: None}
    timer = entry_timer(lambda config: 2.0 if config["BLOCK_M"] == SLOW["BLOCK_M"] else 0.8)

    plain = run_verify(VerifyOptions(tables=(tables,), interpret=True), machine=h200_machine(), timer=timer)
    before = {c.subject: c for c in plain.checks if c.part == "compat"}
    assert before[fast_key].status is Status.FAIL
    assert "`omnitune verify --fix` on this GPU would revalidate" in before[fast_key].summary

    report = run_verify(VerifyOptions(tables=(tables,), interpret=True, fix=True), machine=h200_machine(), timer=timer)
    assert report.exit_code == 0, [c.summary for c in report.checks if c.status is Status.FAIL]
    after = {c.subject: c for c in report.checks if c.part == "compat"}
    assert after[fast_key].status is Status.WARN and after[fast_key].summary.startswith("revalidated (--fix)")
    assert after[slow_key].status is Status.WARN and after[slow_key].summary.startswith("replaced by a faster config")
    doc = table_doc(tables)
    assert doc["kernel_source_hash"] == SPEC.source_hash()
    assert not any("kernel_source_hash" in e for e in doc["entries"].values())
    record = doc["entries"][fast_key]["revalidated"]
    assert (record["from_source_hash"], record["to_source_hash"]) == (STALE, SPEC.source_hash())
    assert doc["entries"][slow_key]["verify_fix"]["replaced_config"] == SLOW.as_dict()

    again = run_verify(VerifyOptions(tables=(tables,), interpret=True), machine=h200_machine(), timer=FASTER)
    assert [c.status for c in again.checks if c.part == "compat"] == [Status.PASS]


@cpu_only
def test_fix_revalidates_a_stale_table_and_its_entries_of_still_older_source_each_from_its_own_hash(tmp_path):
    tables = stale_h200_table(tmp_path)
    older_too = "00000000000000ff"
    export_into(tables, tmp_path, [row(0, PROBLEM3, FAST, time_ms=1.0, device="NVIDIA H200", source_hash=older_too)],
                [interpreter_facts(**H200_FACTS)])
    keys = [f"fp32|{SPEC.problem_key(p)}" for p in (PROBLEM, PROBLEM2, PROBLEM3)]
    report = run_verify(VerifyOptions(tables=(tables,), interpret=True, fix=True), machine=h200_machine(), timer=FASTER)
    assert report.exit_code == 0, [c.summary for c in report.checks if c.status is Status.FAIL]
    doc = table_doc(tables)
    assert doc["kernel_source_hash"] == SPEC.source_hash()
    assert not any("kernel_source_hash" in e for e in doc["entries"].values())
    assert [doc["entries"][k]["revalidated"]["from_source_hash"] for k in keys] == [STALE, STALE, older_too]


@cpu_only
def test_an_entry_of_older_source_failing_numerics_is_not_revalidated(tmp_path):
    from omnitune.registry import get_spec

    spec = get_spec(WRONG_KERNEL)
    large = spec.problem_type(n=300)
    kw = {"spec": spec, "device": "NVIDIA H200"}
    tables = exported(tmp_path, [row(0, large, Config(BLOCK=32, SKEW=False), time_ms=2.0, is_default=True,
                                     source_hash=STALE, **kw),
                                 row(1, large, Config(BLOCK=64, SKEW=True), time_ms=1.0, source_hash=STALE, **kw)],
                      [interpreter_facts(**H200_FACTS)])  # measured "faster": wrong
    export_into(tables, tmp_path, [row(0, spec.problem_type(n=100), Config(BLOCK=32, SKEW=False), time_ms=1.0,
                                       is_default=True, **kw)], [interpreter_facts(**H200_FACTS)])
    options = VerifyOptions(tables=(tables,), kernels=(spec.name,), interpret=True, fix=True)
    report = run_verify(options, {spec.name: spec}, machine=h200_machine(), timer=FASTER)
    assert report.exit_code == 1
    entry_check = next(c for c in report.checks if c.part == "compat" and c.subject == "fp32|n=300")
    assert entry_check.status is Status.FAIL and "not revalidated: numerics did not pass" in entry_check.summary
    assert table_doc(tables, spec.name)["entries"]["fp32|n=300"]["kernel_source_hash"] == STALE


@cpu_only
def test_without_a_speed_measurement_nothing_is_revalidated(tmp_path):
    # --interpret on a GPU's table: no GPU to compare with, no timing
    tables = stale_h200_table(tmp_path, tuned=((PROBLEM, FAST),))
    path = next(tables.glob("attention/*.json"))
    before = path.read_text()
    out = tmp_path / "r.json"
    result = invoke("verify", "--tables", str(tables), "--interpret", "--fix", "--json", str(out))
    assert result.exit_code == 1, result.output
    (table_check,) = checks(json.loads(out.read_text()), "compat")
    assert table_check["status"] == "fail"
    assert "`omnitune verify --fix` on the NVIDIA H200 would revalidate" in table_check["summary"]
    assert "not here: no GPU" in table_check["summary"]
    assert path.read_text() == before

    # the interpreter's own table: the device matches, but the speed part did not run
    tables = attention_table(tmp_path / "interpreter", source_hash=STALE)
    path = next(tables.glob("attention/*.json"))
    before = path.read_text()
    report = run_verify(VerifyOptions(tables=(tables,), interpret=True, fix=True))
    assert report.exit_code == 1
    (table_check,) = [c for c in report.checks if c.part == "compat"]
    assert "not revalidated: the speed part did not run" in table_check.summary
    assert path.read_text() == before


@cpu_only
def test_a_table_of_another_gpu_or_architecture_is_never_revalidated(tmp_path):
    h100 = exported(tmp_path / "h100", [row(0, PROBLEM, DEFAULT, time_ms=1.0, is_default=True, device=H100,
                                            source_hash=STALE)],
                    [interpreter_facts(name=H100, compute_capability="9.0", driver="580.159.04")])
    sm80 = stale_h200_table(tmp_path / "sm80", tuned=((PROBLEM, FAST),), compute_capability="8.0")
    for tables in (h100, sm80):
        before = next(tables.glob("attention/*.json")).read_text()
        report = run_verify(VerifyOptions(tables=(tables,), interpret=True, fix=True), machine=h200_machine(),
                            timer=FASTER)
        assert report.exit_code == 1
        (table_check,) = [c for c in report.checks if c.part == "compat"]
        assert table_check.status is Status.FAIL and "cannot be revalidated" in table_check.summary
        assert table_check.details["revalidation"]["possible"] is False
        assert next(tables.glob("attention/*.json")).read_text() == before
    # the same chip name on another architecture runs its entries here, and they pass: still no re-stamp
    assert [c.status for c in report.checks if c.part == "speed"] == [Status.PASS]


@cpu_only
def test_an_entry_slower_in_one_timing_but_not_its_confirmation_is_kept(tmp_path):
    """A slower verdict is timed twice before --fix acts on it: slower in the first timing only,
    the entry stays (a warning); slower in both, it is replaced."""
    tables = attention_table(tmp_path)
    path = next(tables.glob("attention/*.json"))
    before = path.read_text()
    slow = fake_timer({"entry": 2.0, "fallback": 1.0, "default": 1.0})
    fast = fake_timer({"entry": 1.0, "fallback": 1.5, "default": 1.5})
    calls = []

    def once_slow(candidates, rounds):
        calls.append(rounds)
        return (slow if len(calls) == 1 else fast)(candidates, rounds)

    report = run_verify(VerifyOptions(tables=(tables,), interpret=True, fix=True), timer=once_slow)
    (speed_check,) = [c for c in report.checks if c.part == "speed"]
    assert len(calls) == 2 and speed_check.status is Status.WARN, speed_check.summary
    assert speed_check.summary.startswith("slower in the first of two interleaved timings only (kept)")
    assert speed_check.details["first_timing"]["summary"].startswith("slower than its fallback")
    assert speed_check.details["speedup_vs_fallback"] == pytest.approx(1.5, rel=0.01)
    assert report.exit_code == 0 and path.read_text() == before

    calls.clear()
    report = run_verify(VerifyOptions(tables=(tables,), interpret=True, fix=True), timer=slow)
    (speed_check,) = [c for c in report.checks if c.part == "speed"]
    assert speed_check.details["fixed"] and "was slower than its fallback" in speed_check.summary
    assert speed_check.details["first_timing"]["summary"].startswith("slower than its fallback")
    assert path.read_text() != before


@cpu_only
def test_speed_is_timed_once_the_compile_workers_are_done_with_every_entry(tmp_path, monkeypatch):
    """The workers compile every entry's configs ahead; the first timing waits until they are done
    with all of them (none withdrawn), so that no entry is timed on a busy host."""
    from omnitune.measure import ahead as measure_ahead
    from omnitune.verify import ahead

    made = []

    class Recorded(ahead.EntriesAhead):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(ahead, "EntriesAhead", Recorded)
    states = []  # at each timing: (pending, cancelled) compile futures over every entry's configs

    def timer(candidates, rounds):
        futures = [f for w in made for pool, _ in w._pools.values() for f in pool.futures.values()]
        states.append((sum(not f.done() for f in futures), sum(f.cancelled() for f in futures), len(futures)))
        return fake_timer({"entry": 1.0, "fallback": 1.5, "default": 1.5})(candidates, rounds)

    # Three entries of the shipped KV-write table, small enough for the interpreter as they are.
    doc = json.loads((ROOT / "tuned_configs" / "kv_cache_write" / "NVIDIA_H200.json").read_text())
    keys = ["fp16|t=4,hkv=2,d=128,block_size=16", "fp16|t=64,hkv=2,d=128,block_size=16",
            "fp16|t=4,hkv=4,d=128,block_size=16"]
    doc["entries"] = {key: doc["entries"][key] for key in keys}
    (tmp_path / "kv_cache_write").mkdir()
    (tmp_path / "kv_cache_write" / "NVIDIA_H200.json").write_text(json.dumps(doc))
    lines = []
    try:
        report = run_verify(VerifyOptions(tables=(tmp_path,), interpret=True), timer=timer, progress=lines.append,
                            compile_ahead=True)
    finally:
        measure_ahead.close_shared_workers()
    assert len(made) == 1 and len(states) == len([c for c in report.checks if c.part == "speed"]) == 3
    assert states[0][2] >= 3  # every entry's configs were handed to the workers
    assert all(pending == 0 and cancelled == 0 for pending, cancelled, _ in states), states
    assert sum("timing waits for the compile workers to finish" in line for line in lines) == 1


@cpu_only
def test_a_faster_entry_passes_and_a_faster_baseline_only_warns(tmp_path):
    tables = attention_table(tmp_path)
    faster = run_verify(VerifyOptions(tables=(tables,), interpret=True),
                        timer=fake_timer({"entry": 1.0, "fallback": 1.5, "default": 1.5}))
    (speed_check,) = [c for c in faster.checks if c.part == "speed"]
    assert speed_check.status is Status.PASS and speed_check.details["speedup_vs_fallback"] == pytest.approx(1.5, rel=0.01)
    assert faster.exit_code == 0

    # a baseline is timed beside the configs (on a GPU; here the check is made on a CPU runner)
    import dataclasses

    from omnitune.measure.runner import Runner
    from omnitune.verify import speed
    from omnitune.verify.tables import read_table

    table = read_table(next(tables.glob("attention/*.json")), "attention", {})
    spec = dataclasses.replace(SPEC, baselines=lambda problem: {"torch": lambda inputs: SPEC.reference(inputs)})
    runner = Runner(spec, PROBLEM, torch.float32, interpret=True)
    outcome = speed.check_speed(table, table.entries[0], runner,
                                fake_timer({"entry": 1.0, "fallback": 1.5, "default": 1.5, "baseline": 0.5}),
                                baselines=True)
    assert outcome.check.status is Status.WARN and "slower than baseline:torch" in outcome.check.summary
    assert outcome.replacement is None
    assert outcome.check.details["speedup_vs_best_baseline"] == pytest.approx(0.5, rel=0.01)


@cpu_only
def test_the_shipped_tables_configs_are_right_on_derived_problems(tmp_path):
    # One kernel's shipped table, checked as CI can: numerics on small problems derived from it.
    out = tmp_path / "r.json"
    result = invoke("verify", "--tables", str(ROOT / "tuned_configs"), "--kernels", "kv_cache_write",
                    "--interpret", "--json", str(out))
    report = json.loads(out.read_text())
    assert_schema(report)
    numerics = checks(report, "numerics")
    assert numerics and all(c["status"] == "pass" for c in numerics), result.output
    # The interpreter computes bf16 wrongly: bf16 entries are checked on fp16 problems derived from
    # them; fp16 entries small enough for the interpreter run as they are.
    table = json.loads((ROOT / "tuned_configs" / "kv_cache_write" / "NVIDIA_H200.json").read_text())
    fp16_keys = {key.split("|", 1)[1] for key in table["entries"] if key.startswith("fp16|")}
    assert all(c["details"]["dtype"] == "fp16" for c in numerics)
    assert all(c["details"]["derived"] or c["details"]["problem"] in fp16_keys for c in numerics)
    assert any(c["details"]["derived"] for c in numerics)


def _one_entry_kv_write_doc() -> dict:
    doc = json.loads((ROOT / "tuned_configs" / "kv_cache_write" / "NVIDIA_H200.json").read_text())
    key = "fp16|t=4,hkv=2,d=128,block_size=16"
    doc["entries"] = {key: doc["entries"][key]}
    return doc


_HOSTILE = [None, "s", [], 5, True, {"x": {"y": []}}]


@cpu_only
@pytest.mark.parametrize("field", ["software", "device", "kernel_source_hash", "exported_at", "representative",
                                   "entries", "schema_version", "kernel", "predictor"])
def test_a_hostile_field_fails_or_warns_in_one_line_never_a_traceback(tmp_path, field):
    """Whatever a table's field holds, verify reports on it (the runtime ignores such a table or
    field: verify says why), never raises."""
    for i, value in enumerate(_HOSTILE + ["[" * 100_000 + "]" * 100_000]):
        tables = tmp_path / str(i)
        (tables / "kv_cache_write").mkdir(parents=True)
        doc = _one_entry_kv_write_doc()
        path = tables / "kv_cache_write" / "NVIDIA_H200.json"
        if isinstance(value, str) and value.startswith("["):  # nesting past the JSON parser's recursion
            text = json.dumps(doc).replace(f'"{field}": ', f'"{field}": {value}, "_was": ', 1) if field in doc \
                else json.dumps({**doc, "_deep": 0}).replace('"_deep": 0', f'"_deep": {value}')
            path.write_text(text)
        else:
            path.write_text(json.dumps({**doc, field: value}))
        out = tmp_path / f"r{i}.json"
        result = invoke("verify", "--interpret", "--tables", str(tables), "--json", str(out))
        assert result.exit_code in (0, 1) and result.exception is None or isinstance(result.exception, SystemExit), \
            (field, value if not isinstance(value, str) else value[:10], result.output[-2000:])
        assert "Traceback" not in result.output
        report = json.loads(out.read_text())
        assert_schema(report)
        assert all("\n" not in c["summary"] for c in report["checks"])


@cpu_only
@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_or_a_table_past_the_runtimes_size_fails_compat_as_the_runtime_ignores_it(tmp_path):
    """verify reads a table as the runtime does (runtime._reading): a FIFO in place of a table
    blocked it for ever, and a table past MAX_TABLE_BYTES passed while the runtime ignored it."""
    from omnitune.runtime._reading import MAX_TABLE_BYTES

    fifo_tables, big_tables = tmp_path / "fifo", tmp_path / "big"
    for tables in (fifo_tables, big_tables):
        (tables / "kv_cache_write").mkdir(parents=True)
    os.mkfifo(fifo_tables / "kv_cache_write" / "NVIDIA_H200.json")
    doc = _one_entry_kv_write_doc()
    text = json.dumps(doc)
    (big_tables / "kv_cache_write" / "NVIDIA_H200.json").write_text(
        text[:-1] + ', "_padding": "' + "x" * (MAX_TABLE_BYTES - len(text)) + '"}')
    for tables, said in ((fifo_tables, "is not a regular file (it is a FIFO)"),
                         (big_tables, "more than a table may hold")):
        out = tmp_path / f"{tables.name}.json"
        result = invoke("verify", "--interpret", "--tables", str(tables), "--json", str(out))
        assert result.exit_code == 1, result.output
        report = json.loads(out.read_text())
        failed = [c for c in report["checks"] if c["status"] == "fail"]
        assert len(failed) == 1 and said in failed[0]["summary"], failed


@cpu_only
def test_a_symlink_loop_a_surrogate_key_and_a_config_the_runtime_refuses_are_one_line_each(tmp_path):
    """A symlink loop at a table's path raised from path.resolve(); a key holding a lone
    surrogate (JSON "\\ud800") crashed the report's printing after every check had run; and a
    config value "8" for 8 passed verify while the runtime skipped the entry (its parse is strict)."""
    loop, odd = tmp_path / "loop", tmp_path / "odd"
    (loop / "kv_cache_write").mkdir(parents=True)
    (loop / "kv_cache_write" / "NVIDIA_H200.json").symlink_to("NVIDIA_H200.json")
    doc = _one_entry_kv_write_doc()
    (key, entry), = doc["entries"].items()
    stringly = dict(entry, config={k: str(v) if isinstance(v, int) else v for k, v in entry["config"].items()})
    doc["entries"] = {"\ud800" + key: entry, key: stringly}
    (odd / "kv_cache_write").mkdir(parents=True)
    (odd / "kv_cache_write" / "NVIDIA_H200.json").write_text(json.dumps(doc))  # the surrogate as its JSON escape
    said = {loop: ["cannot be opened"],
            odd: ["BLOCK_H='2' is not a valid choice", "its problem and dtype give the key"]}
    for tables in (loop, odd):
        out = tmp_path / f"{tables.name}.json"
        result = invoke("verify", "--interpret", "--tables", str(tables), "--json", str(out))
        assert result.exit_code == 1 and "Traceback" not in result.output, result.output[-3000:]
        report = json.loads(out.read_text())
        failed = sorted(c["summary"] for c in report["checks"] if c["status"] == "fail")
        assert len(failed) == len(said[tables]) and all(s in f for s, f in zip(said[tables], failed)), failed


@cpu_only
def test_a_predictor_block_the_runtime_ignores_in_whole_or_in_part_fails_compat(tmp_path):
    """verify passed any predictor block while the runtime ignored a bad one (problems it would
    have answered got the default): it now reads the block by the runtime's parse."""
    doc = _one_entry_kv_write_doc()
    assert isinstance(doc.get("predictor"), dict) and doc["predictor"]["points"]
    whole = json.loads(json.dumps(doc))
    whole["predictor"]["neighbours"] = 0
    part = json.loads(json.dumps(doc))
    point = sorted(part["predictor"]["points"])[0]
    label = next(iter(part["predictor"]["points"][point]["time_ratios"]))
    part["predictor"]["points"][point]["time_ratios"][label] = 0.5
    total = len(part["predictor"]["points"])
    for name, bad, said in (("whole", whole, "the runtime ignores the predictor block: it has neighbours 0"),
                            ("part", part, f"the runtime ignores 1 of the {total} points of the predictor block")):
        tables = tmp_path / name
        (tables / "kv_cache_write").mkdir(parents=True)
        (tables / "kv_cache_write" / "NVIDIA_H200.json").write_text(json.dumps(bad))
        out = tmp_path / f"{name}.json"
        result = invoke("verify", "--interpret", "--tables", str(tables), "--json", str(out))
        assert result.exit_code == 1, result.output
        failed = [c["summary"] for c in json.loads(out.read_text())["checks"] if c["status"] == "fail"]
        assert len(failed) == 1 and failed[0].startswith(said), failed


@cpu_only
def test_the_gpu_parts_say_why_they_were_skipped(tmp_path):
    tables = attention_table(tmp_path)
    out = tmp_path / "r.json"
    result = invoke("verify", "--tables", str(tables), "--interpret", "--model", "qwen2.5-omni-7b", "--soak", "1",
                    "--json", str(out))
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert_schema(report)
    assert report["options"]["model"] == "qwen2.5-omni-7b" and report["options"]["soak_minutes"] == 1.0
    for part in ("speed", "memory", "soak"):
        assert [(c["status"], c["summary"]) for c in checks(report, part)] == [("skipped", "skipped (no GPU)")]


@pytest.mark.parametrize("args, message", [
    (["--soak", "5"], "--soak needs --model"),
    (["--soak", "0", "--model", "qwen2.5-omni-7b"], "positive number of minutes"),
    (["--model", "no-such-model"], "unknown model"),
    (["--tables", "/no/such/folder"], "no such folder"),
    (["--kernels", "no_such_kernel"], "unknown kernel"),
])
def test_user_errors_exit_2(args, message):
    result = invoke("verify", *args, *([] if ON_GPU else ["--interpret"]))
    assert result.exit_code == 2, result.output
    assert message in result.output


@cpu_only
def test_nothing_to_verify_and_no_gpu_are_user_errors(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    result = invoke("verify", "--tables", str(empty), "--interpret")
    assert result.exit_code == 2 and "no tables" in result.output
    result = invoke("verify", "--tables", str(empty))
    assert result.exit_code == 2 and "no CUDA GPU" in result.output


# --- the parts, one by one ------------------------------------------------------------------


def test_version_changes_are_named():
    assert compat.version_change("2.11.0+cu130", "3.0.0") == "major"
    assert compat.version_change("2.11.0+cu130", "2.13.0+cpu") == "minor"
    assert compat.version_change("3.6.0", "3.6.1") == "patch"
    assert compat.version_change("580.159.04", "580.159.05") == "patch"
    assert compat.version_change("2.11.0+cu130", "2.11.0+cu128") == "build"
    assert compat.version_change("n/a", "580.1") == "other"


@cpu_only
def test_derived_problems_keep_what_the_config_was_chosen_for():
    from omnitune.registry import get_spec
    from omnitune.verify.shrink import BYTE_WEIGHT, INTERPRET_BUDGET, interpret_dtype, small_problem

    spec = get_spec("paged_decode_attention")
    problem = spec.parse_shape("b=64,h=28,hkv=4,lq=1,ctx=16384,d=128,block_size=16")
    config = spec.complete_config({"NUM_SPLITS": 8, "BLOCK_N": 64, "PACK_GQA": True}, problem, torch.bfloat16)
    dtype = interpret_dtype(spec, torch.bfloat16)
    small = small_problem(spec, problem, config, dtype)
    assert dtype is torch.float16
    assert (small.h, small.hkv, small.d, small.block_size) == (28, 4, 128, 16)  # matched exactly: kept
    # the context halves down to one BLOCK_N tile per split (8 × 64): no split may be empty
    assert small.b == 1 and small.ctx == 8 * 64
    assert spec.violations(small, config, dtype) == []
    # without splits to feed, down to the budget
    one = spec.complete_config({"NUM_SPLITS": 1, "BLOCK_N": 64, "PACK_GQA": True}, problem, torch.bfloat16)
    smaller = small_problem(spec, problem, one, dtype)
    assert spec.flops(smaller) + BYTE_WEIGHT * spec.bytes_moved(smaller, dtype) <= INTERPRET_BUDGET
    assert smaller.ctx > 64  # more than one BLOCK_N tile
    # a config that needs many keys per split keeps them
    many = spec.complete_config({"NUM_SPLITS": 64, "BLOCK_N": 64, "PACK_GQA": True}, problem, torch.bfloat16)
    assert spec.violations(small_problem(spec, problem, many, dtype), many, dtype) == []


def test_the_largest_shapes_of_a_preset():
    from omnitune.presets import get_preset, preset_problems

    preset = get_preset("qwen2.5-omni-7b")
    largest = {k: memory.largest(preset_problems(preset, k)).problem for k in
               ("attention", "paged_decode_attention", "kv_cache_write", "cross_attention_layer")}
    assert (largest["attention"].b, largest["attention"].lk) == (64, 16384)
    assert (largest["paged_decode_attention"].b, largest["paged_decode_attention"].ctx) == (64, 16384)
    assert largest["kv_cache_write"].t == 16384
    assert (largest["cross_attention_layer"].lk, largest["cross_attention_layer"].lq) == (16384, 256)  # long video


def test_the_traffic_mix_follows_the_request_model():
    from omnitune.presets import get_preset, preset_problems

    preset = get_preset("qwen2.5-omni-7b")
    problems = [p for k in ("attention", "paged_decode_attention") for p in preset_problems(preset, k)]
    shares = traffic.weights(problems)
    assert sum(shares) == pytest.approx(1.0)
    step = [s for p, s in zip(problems, shares) if traffic.is_step(p.role)]
    prefill = [s for p, s in zip(problems, shares) if not traffic.is_step(p.role)]
    # attention: 4 prefill-time problems share one call per request, its 4 decode problems 32
    assert sum(step) / sum(prefill) == pytest.approx(2 * traffic.DECODE_STEPS_PER_REQUEST / 1)


def _tiny_calls():
    from omnitune.kernels.attention import AttentionProblem as A
    from omnitune.kernels.cross_attention_layer import CrossAttentionLayerProblem as L
    from omnitune.kernels.kv_cache_write import KVCacheWriteProblem as W
    from omnitune.kernels.paged_decode_attention import PagedDecodeProblem as P
    from omnitune.presets import PresetProblem

    return [
        PresetProblem("attention", A(b=1, h=4, hkv=2, lq=24, lk=24, d=64, causal=True, spans=1, span_len=8), "short prefill"),
        PresetProblem("paged_decode_attention", P(b=2, h=4, hkv=2, lq=1, ctx=40, d=64), "decode: batch 2"),
        PresetProblem("kv_cache_write", W(t=8, hkv=2, d=64), "decode step: 8 tokens"),
        PresetProblem("cross_attention_layer", L(b=2, lq=2, lk=20, hidden=128, h=4, hkv=2, d=64), "decode-like"),
        PresetProblem("cross_attention_layer", L(b=2, lq=2, lk=20, hidden=128, h=4, hkv=2, d=64, kv_cached=True),
                      "decode-like, K/V cached"),
    ]


@cpu_only
def test_the_public_op_calls_agree_with_the_references():
    for preset_problem in _tiny_calls():
        op = traffic.build(preset_problem, torch.float16, "cpu")
        error, tolerance = op.compare(op.call(), op.reference())
        assert error <= tolerance, preset_problem
        assert op.step == preset_problem.role.startswith("decode")


class CpuBackend:
    """The soak's device on the CPU: wall-clock stamps for events, `capture` the call itself
    (or a failure, for the kernels named in `refuse`)."""

    def __init__(self, refuse=()):
        self.refuse = set(refuse)

    def capture(self, call):
        out = call()
        if any(call is c for c in self.refuse):
            raise RuntimeError("operation not permitted when stream is capturing")
        return (lambda: call()), out

    def start(self):
        import time

        return time.perf_counter()

    def stop(self, token):
        return self.start()

    def elapsed_ms(self, start, stop):
        return (stop - start) * 1e3

    def synchronize(self):
        pass


class FakeSampler:
    def start(self):
        pass

    def stop(self, calls):
        return {"sm_clock_mhz_median": 1980, "temperature_c_max": 50, "throttle_reasons": [], "throttled_thermal": False}


@cpu_only
def test_the_soak_counts_calls_checks_and_drift():
    from omnitune.verify.soak import run_soak

    calls = [traffic.build(p, torch.float16, "cpu") for p in _tiny_calls()[1:3]]
    results = run_soak(calls, [0.5, 0.5], 0.04, backend=CpuBackend(), sampler_factory=FakeSampler, chunk=4)
    *per_op, summary = results
    assert summary.subject == "all" and summary.status in (Status.PASS, Status.WARN), summary.summary
    assert summary.details["errors"] == 0 == summary.details["mismatches"]
    assert summary.details["calls"] > 0 and len(summary.details["windows"]) == 2
    assert summary.details["windows"][0]["telemetry"]["sm_clock_mhz_median"] == 1980
    for check in per_op:
        assert check.details["graph"] and check.details["calls"] > 0 and check.details["checks"] >= 1
        assert check.details["drift"] is not None
        assert check.status is not Status.FAIL


@cpu_only
def test_the_soak_reports_a_failed_capture_and_a_mismatch_without_crashing():
    from omnitune.verify.soak import run_soak

    paged, write = (traffic.build(p, torch.float16, "cpu") for p in _tiny_calls()[1:3])
    good_call = write.call
    write.call = lambda: good_call() * 1.5  # a wrong output, every call
    results = run_soak([paged, write], [0.5, 0.5], 0.02, backend=CpuBackend(refuse=[paged.call]),
                       sampler_factory=FakeSampler, chunk=4)
    paged_check, write_check, summary = results
    assert paged_check.status is Status.FAIL and "CUDA graph capture failed" in paged_check.summary
    assert not paged_check.details["graph"] and paged_check.details["calls"] > 0  # called eagerly instead
    assert write_check.status is Status.FAIL and write_check.details["mismatches"] >= 1
    assert summary.status is Status.FAIL and summary.details["capture_failures"] == 1


# --- on the GPU -----------------------------------------------------------------------------


def tables_for_this_gpu(folder: Path, kernels) -> Path:
    """The shipped tables of `kernels` for this GPU; where none ships for it (an H100, say),
    the H200's, re-addressed to this GPU, so that every part runs here rather than reporting
    "the table is for NVIDIA H200" (what a user with another GPU rightly gets)."""
    facts = current_device_facts()
    shipped = Path(__file__).resolve().parents[1] / "tuned_configs"
    for kernel in kernels:
        (folder / kernel).mkdir(parents=True)
        own = shipped / kernel / f"{facts.key}.json"
        document = json.loads((own if own.exists() else shipped / kernel / "NVIDIA_H200.json").read_text())
        document["device"] = {**document["device"], "name": facts.name, "key": facts.key,
                              "compute_capability": facts.compute_capability}
        (folder / kernel / f"{facts.key}.json").write_text(json.dumps(document))
    return folder


@pytest.mark.gpu
def test_every_part_reports_on_the_gpu(tmp_path):
    """The shipped tables for two kernels, their preset's largest shapes and a short soak: every
    part reports (whatever the verdict), a capture failure is a check, not a crash."""
    out = tmp_path / "r.json"
    kernels = ("kv_cache_write", "paged_decode_attention")
    tables = tables_for_this_gpu(tmp_path / "tables", kernels)
    result = invoke("verify", "--model", "qwen2.5-omni-7b", "--kernels", ",".join(kernels), "--tables", str(tables),
                    "--soak", "0.2", "--json", str(out))
    assert result.exit_code in (0, 1), result.output
    report = json.loads(out.read_text())
    assert_schema(report)
    assert all(c["status"] != "skipped" for c in checks(report, "speed") + checks(report, "memory"))
    for check in checks(report, "memory"):
        assert check["details"].get("peak_bytes", 0) > 0 or check["status"] == "fail"
    soak = {c["subject"]: c for c in checks(report, "soak")}
    assert soak["all"]["details"]["calls"] > 0
    for subject, check in soak.items():
        if subject != "all":
            assert check["details"]["calls"] > 0 or check["details"]["capture_error"], check
    assert not math.isnan(soak["all"]["details"]["minutes_run"])

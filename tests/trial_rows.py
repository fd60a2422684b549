"""Rows of the results database's `trials` table, built by hand for the report and export tests,
and a database made from them by omnitune.store."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from omnitune.kernels.attention import SPEC
from omnitune.profile.device import INTERPRETER_DEVICE, DeviceFacts, device_key
from omnitune.store import TrialRecord, open_db, record_device, record_trials

H200 = "NVIDIA H200"


def trial_row(number, problem, config, *, status="ok", time_ms=None, dtype="fp16", device=H200,
              is_default=False, tflops=None, tbps=None, rel_error=None, extra=None,
              measured_at="2026-11-29T12:00:00+00:00", source_hash="0123456789abcdef", spec=SPEC):
    """One row of the `trials` schema (an attention row unless another spec is given); p20/p80
    lie 5% either side of time_ms. A failed row keeps a time_ms if given one (a fast mismatch,
    say), so tests can check it never wins."""
    key, dkey = spec.problem_key(problem), device_key(device)
    ok = status == "ok"
    return {
        "study": f"{spec.name}|{key}|{dtype}|{dkey}", "trial_number": number, "kernel": spec.name,
        "problem_key": key, "problem_json": json.dumps(dataclasses.asdict(problem), sort_keys=True),
        "dtype": dtype, "device_key": dkey, "device_name": device, "sampler": "tpe",
        "config_json": json.dumps(config.as_dict(), sort_keys=True), "config_label": config.label(),
        "status": status, "time_ms": time_ms,
        "p20_ms": time_ms * 0.95 if time_ms else None, "p80_ms": time_ms * 1.05 if time_ms else None,
        "rel_error": rel_error if rel_error is not None else (1e-4 if ok else None),
        "tflops": tflops, "tbps": tbps,
        "detail": "" if ok else f"{status}: because", "representative": device != INTERPRETER_DEVICE,
        "is_default": is_default, "extra_json": json.dumps(extra or {}), "source_hash": source_hash,
        "torch_version": "2.11.0", "triton_version": "3.6.0", "omnitune_version": "0.1.0",
        "measured_at": measured_at,
    }


def results_db(path: Path, rows: list[dict], devices: list[DeviceFacts] = ()) -> Path:
    """A results database made by omnitune.store, holding `rows` and `devices`."""
    db = open_db(path)
    record_trials(db, [TrialRecord(**row) for row in rows])
    for facts in devices:
        record_device(db, facts)
    db.conn.close()
    return path

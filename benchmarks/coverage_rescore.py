"""A held-out run scored again for what the runtime answers now: each problem's answer from the
shipped tables with the code as it is (or with another MatchPolicy ratio), timed by the run's own
measurements where the run timed that config (its pick, its default or its tuned optimum), "not
measured" where it did not. No GPU: a rule or policy change is judged from one run's timings, all
taken side by side, before a device run confirms it.

    python benchmarks/coverage_rescore.py benchmarks/results/coverage_attention_h200_round28_D.json \
        [--max-ratio 2] [--device "NVIDIA H200"] [--json OUT]

It answers for the tables the rows were judged on only if those tables are still the ones
shipped (the file records their folders; a later export changes the answers).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from coverage_report import GOOD_SPEED
from match_ratio_probe import match_ratio

from omnitune import runtime
from omnitune.registry import get_spec
from omnitune.spec import KernelSpec, parse_dtype

MEASURED = ("pick", "default", "tuned")


def rescore_row(row: Mapping, spec: KernelSpec, device: str) -> dict:
    """The runtime's answer now for one row's problem, and its time ÷ the tuned time where the
    row timed that config."""
    problem = spec.problem_from_mapping(row["problem"])
    dtype = parse_dtype(row["dtype"])
    found = runtime.lookup(spec.name, problem, dtype, device)
    config = found.config
    configs = row.get("configs") or {}
    times = row.get("times_ms") or {}
    same = next((label for label in MEASURED
                 if label in configs and spec.coerce_config(configs[label]) == config and times.get(label)), None)
    tuned = times.get("tuned")
    ratio = times[same] / tuned if same and tuned else None
    then = spec.coerce_config(configs["pick"]) if "pick" in configs else None
    return {"key": row["key"], "rung": found.rung.value, "config": dict(config), "timed_as": same,
            "changed": config != then, "pick_over_tuned": ratio,
            "then": {"rung": row.get("rung"), "pick_over_tuned": (row.get("ratios") or {}).get("pick_over_tuned")}}


def rescore(doc: Mapping, device: str, max_ratio: float | None = None) -> dict:
    rows = [r for r in doc["rows"] if r.get("status") == "ok" and (r.get("times_ms") or {}).get("tuned")]
    kernels = sorted({r["kernel"] for r in rows})
    out: dict = {"device": device, "max_ratio": max_ratio, "kernels": {}}
    for kernel in kernels:
        spec = get_spec(kernel)
        with match_ratio(spec, max_ratio):
            scored = [rescore_row(r, spec, device) for r in rows if r["kernel"] == kernel]
        timed = [s for s in scored if s["pick_over_tuned"] is not None]
        out["kernels"][kernel] = {
            "problems": len(scored),
            "timed": len(timed),
            "not_measured": [s["key"] for s in scored if s["pick_over_tuned"] is None],
            "within_95pct": sum(1 for s in timed if 1.0 / s["pick_over_tuned"] >= GOOD_SPEED),
            "changed": [s for s in scored if s["changed"]],
            "rows": scored,
        }
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, help="a coverage.py results file")
    parser.add_argument("--max-ratio", type=float, help="answer with this MatchPolicy max_ratio instead of the spec's")
    parser.add_argument("--device", default=None, help="the tables' GPU (default: the results file's)")
    parser.add_argument("--json", type=Path, help="write the rescored rows here")
    args = parser.parse_args(argv)
    doc = json.loads(args.results.read_text())
    device = args.device or (doc.get("device") or {}).get("name")
    if not device:
        print(f"{args.results}: no device recorded; give --device", file=sys.stderr)
        return 2
    result = rescore(doc, device, args.max_ratio)
    for kernel, k in result["kernels"].items():
        print(f"{kernel}: {k['within_95pct']} of {k['problems']} within 95% of the tuned speed "
              f"({k['timed']} timed in the run, {len(k['not_measured'])} answered with a config it did not time)")
        for s in k["changed"]:
            then = s["then"]["pick_over_tuned"]
            now = s["pick_over_tuned"]
            print(f"  {s['key']}: {then and round(then, 3)} ({s['then']['rung']}) → "
                  f"{round(now, 3) if now is not None else 'not measured'} ({s['rung']}, timed as {s['timed_as']})")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

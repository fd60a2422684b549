"""Would a kernel's MatchPolicy with a tighter max_ratio serve shapes nobody tuned better?

The nearest rung answers with the config of a tuned shape up to `max_ratio` away in each free
dimension (4x for every kernel); past it, the predictor answers. For every held-out problem
(benchmarks/coverage_set.py) whose runtime answer changes when the policy's max_ratio is --ratio,
the answer now, the answer under --ratio and the problem's tuned optimum (an earlier coverage run's,
--tuned-from) are checked against the reference and timed against each other, interleaved, in one
run (coverage_eval's method: CUDA events, L2 flushed, round-robin).

    python benchmarks/match_ratio_probe.py --kernel kv_compress --ratio 2 \
        --tuned-from benchmarks/results/coverage_kv_compress_h200_round23_J.json --out $OUT/x.json
    python benchmarks/match_ratio_probe.py --kernel kv_compress --ratio 2 --list   # no GPU: which change
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from coverage import earlier_optima, problem_dtype, select  # noqa: E402
from coverage_set import HELD_OUT  # noqa: E402

DEVICE = "NVIDIA H200"


@contextmanager
def match_ratio(spec, ratio: float | None) -> Iterator[None]:
    """The spec's MatchPolicy with max_ratio `ratio` (None: as it is) while inside, the runtime's
    cached answers dropped on the way in and out."""
    import omnitune.runtime as runtime

    policy = spec.match
    if ratio is not None:
        object.__setattr__(spec, "match", dataclasses.replace(policy, max_ratio=ratio))
    runtime.clear_cache()
    try:
        yield
    finally:
        object.__setattr__(spec, "match", policy)
        runtime.clear_cache()


def answers(kernel: str, ratio: float | None, device_name: str = DEVICE) -> dict[str, tuple[str, dict]]:
    """Row key (coverage's 'dtype|problem key') → (rung, config) of each held-out problem."""
    import omnitune.runtime as runtime
    from omnitune.registry import get_spec

    found = {}
    with match_ratio(get_spec(kernel), ratio):
        for item in select(HELD_OUT, [kernel]):
            lookup = runtime.lookup(kernel, item.problem, problem_dtype(item.dtype_name, False), device_name)
            found[item.key] = (lookup.rung.value, lookup.config.as_dict())
    return found


def changed(kernel: str, ratio: float, device_name: str = DEVICE) -> list[dict]:
    """The held-out problems whose answer differs under `ratio`: key, problem, dtype, both answers."""
    now, alt = answers(kernel, None, device_name), answers(kernel, ratio, device_name)
    return [{"key": item.key, "problem": item.problem, "dtype": item.dtype_name,
             "now": {"rung": now[item.key][0], "config": now[item.key][1]},
             "alt": {"rung": alt[item.key][0], "config": alt[item.key][1]}}
            for item in select(HELD_OUT, [kernel]) if now[item.key] != alt[item.key]]


def judge(row: dict, spec, tuned: dict, rounds: int, interpret: bool = False) -> None:
    """Check and time the answer now, the answer under the ratio and the tuned optimum (the
    distinct configs among them) against each other; fills row["timings"] and the ratios.
    interpret: on the CPU under Triton's interpreter (checks only; its times mean nothing)."""
    from coverage_eval import Setup, checked_candidates, problem_runner, time_against_each_other

    from omnitune.profile.device import current_device_facts
    from omnitune.spec import Config, DeviceLimits

    dtype = problem_dtype(row["dtype"], interpret)
    limits = DeviceLimits() if interpret else DeviceLimits.of_current_device()
    setup = Setup(device=current_device_facts(interpret), tables_device=DEVICE, limits=limits, trials=0,
                  rounds=rounds, interpret=interpret)
    runner = problem_runner(spec, row["problem"], dtype, setup)
    roles = {"now": Config(row["now"]["config"]), "alt": Config(row["alt"]["config"]), "tuned": Config(tuned)}
    candidates, checks = checked_candidates(spec, row["problem"], runner, roles, baselines=False)
    row["checks"] = checks
    ok = [c for c in candidates if checks[c.name]["status"] == "ok"]
    timings = time_against_each_other(ok, runner, setup)
    row["timings"] = timings
    median = {role: timings[c.name]["median_ms"] for c in ok for role in c.roles}
    if "tuned" in median:
        row["now_over_tuned"] = median.get("now", float("nan")) / median["tuned"]
        row["alt_over_tuned"] = median.get("alt", float("nan")) / median["tuned"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernel", required=True, choices=sorted(HELD_OUT))
    parser.add_argument("--ratio", type=float, required=True, help="the MatchPolicy max_ratio to try")
    parser.add_argument("--tuned-from", type=Path, help="a coverage.py results JSON: each problem's tuned optimum")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--list", action="store_true", help="only say which problems change (no GPU)")
    args = parser.parse_args(argv)
    from omnitune.registry import get_spec

    rows = changed(args.kernel, args.ratio)
    for row in rows:
        print(f"{row['key']}: {row['now']['rung']} -> {row['alt']['rung']}", flush=True)
    if args.list:
        return 0
    if args.tuned_from is None or args.out is None:
        parser.error("--tuned-from and --out are needed to time the answers (or give --list)")
    optima = earlier_optima(args.tuned_from)
    spec = get_spec(args.kernel)
    for row in rows:
        tuned = optima.get((args.kernel, row["key"]))
        if tuned is None:
            row["error"] = "no tuned optimum in --tuned-from"
            continue
        judge(row, spec, tuned["config"], args.rounds)
        print(f"  now ÷ tuned {row.get('now_over_tuned', float('nan')):.3f}, "
              f"alt ÷ tuned {row.get('alt_over_tuned', float('nan')):.3f}", flush=True)
    for row in rows:
        row["problem"] = dataclasses.asdict(row["problem"])
    doc = {"command": " ".join(sys.argv), "device": torch.cuda.get_device_name(), "kernel": args.kernel,
           "ratio": args.ratio, "spec_ratio": spec.match.max_ratio, "tuned_from": str(args.tuned_from), "rows": rows}
    args.out.write_text(json.dumps(doc, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""How long a whole model's search takes, and how busy it keeps the GPU (issue 20's figure).

Runs `omnitune search --model MODEL -n TRIALS --timeout S --db DB` (compiling ahead in the CPU
cores less two, the default on a GPU) as a subprocess
while a thread samples NVML every 100 ms: the GPU's utilization (the share of the sample period in
which a kernel ran), its SM clock and its power. Afterwards reads each problem's row from the
results database (search_runs: wall, setup and re-timing seconds, trials measured by this run;
`omnitune report --format json`: best and default time, speedup) and puts beside it what the
shipped table (tuned_configs/<kernel>/NVIDIA_H200*.json) holds for the same problem: its speedup
over the default, config and time. Writes it all as JSON and prints a short summary.

    python benchmarks/search_wall.py --out benchmarks/results/search_wall_h200.json

The same thread reads the host's CPU counters (/proc/stat, where there is one): the share of all
cores busy, over the search and per sample, and each problem's row carries the CPU time its search
took (its own process's, and its precompile workers' for its configs). Both series are also kept
in 5-second bins (`timeline`), so that a phase bound by compiling shows as the CPU full and the
GPU idle; `events` keeps when each problem started and ended (and its compile report came), so
each lane's problems can be laid out along that timeline. `--fresh-triton-cache` runs the search with an empty Triton cache of its own (what a
first search on a machine meets: every config compiled).

With lanes, the search writes each lane's GPU-lock accounting (`--lane-stats`): what the lanes held
the GPU for (checking, timing, ...), and when each holding began and ended, which `lanes` lays beside
the utilization: the share of the wall a lane held the GPU, how busy the GPU was while held and
while not, and the held share per 5-second bin.

Without NVML (no driver, no nvidia-ml-py) the search still runs; the busy fraction is then null
and the JSON says why. Extra arguments after `--` go to omnitune search unchanged; with `--model ''`
they name what is searched (`-- kv_compress --shape ... --shape ...`), so one kernel's problems
can be laid out the same way.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SAMPLE_PERIOD_S = 0.1
TIMELINE_BIN_S = 5.0
# The device call that runs this is limited to 600 s: the search stops in time to leave margin
# for its finalists, the report and the start of the interpreter.
DEFAULT_TIMEOUT_S = 540.0


class GpuSampler(threading.Thread):
    """Samples NVML (utilization %, SM clock MHz, power W) of one GPU every `period_s` until
    stopped; `unavailable` says why there are no samples when NVML cannot be used."""

    def __init__(self, index: int = 0, period_s: float = SAMPLE_PERIOD_S):
        super().__init__(daemon=True)
        self.index, self.period_s = index, period_s
        self.samples: list[dict] = []
        self.cpu_samples: list[dict] = []  # {"t", "busy"}: the host's cores, busy share since the last read
        self.unavailable: str | None = None
        self.stopping = threading.Event()

    def run(self) -> None:
        from omnitune.profile import telemetry

        device = telemetry._open(self.index)  # the project's one NVML reader, opened once per process
        if device is None:
            self.unavailable = "NVML not available: no pynvml, no driver, or no such GPU"
        last_cpu = cpu_counters()
        while not self.stopping.is_set():
            at = time.monotonic()
            if device is not None:
                sample = device.sample()
                if sample.utilization_pct is None:  # one failed read is a gap, not the end
                    self.unavailable = "an NVML read gave no utilization"
                else:
                    self.samples.append({"t": at, "util": sample.utilization_pct, "sm_mhz": sample.sm_clock_mhz,
                                         "power_w": sample.power_w})
            now_cpu = cpu_counters()
            if last_cpu is not None and now_cpu is not None and now_cpu[1] > last_cpu[1]:
                self.cpu_samples.append({"t": at, "busy": (now_cpu[0] - last_cpu[0]) / (now_cpu[1] - last_cpu[1])})
            last_cpu = now_cpu
            self.stopping.wait(max(0.0, self.period_s - (time.monotonic() - at)))

    def stop(self) -> None:
        self.stopping.set()
        self.join(timeout=5)


def cpu_counters(stat: str = "/proc/stat") -> tuple[int, int] | None:
    """(busy, total) jiffies of all the host's cores since boot, from the first line of
    /proc/stat (busy: all but idle and iowait); None where there is no such file."""
    try:
        with open(stat) as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    total = sum(fields[:8])  # guest times are counted inside user already
    return total - idle, total


def timeline(samples: list[dict], field: str, start: float, end: float, bin_s: float = TIMELINE_BIN_S) -> list:
    """The mean of `field` over each `bin_s` of [start, end] (None for a bin without samples)."""
    bins: list[list[float]] = [[] for _ in range(max(1, math.ceil((end - start) / bin_s)))]
    for s in samples:
        if start <= s["t"] <= end and s[field] is not None:
            bins[min(len(bins) - 1, int((s["t"] - start) // bin_s))].append(s[field])
    return [round(sum(b) / len(b), 3) if b else None for b in bins]


def busy_fraction(samples: list[dict], start: float, end: float) -> float | None:
    """The mean utilization (0–1) of the samples taken between `start` and `end` (monotonic);
    None without any."""
    within = [s["util"] for s in samples if start <= s["t"] <= end]
    return sum(within) / (100.0 * len(within)) if within else None


def merged(intervals: list[list[float]]) -> list[list[float]]:
    """The union of (start, end) intervals, as sorted, non-overlapping intervals."""
    union: list[list[float]] = []
    for start, end in sorted(intervals):
        if union and start <= union[-1][1]:
            union[-1][1] = max(union[-1][1], end)
        else:
            union.append([start, end])
    return union


def covered(union: list[list[float]], start: float, end: float) -> float:
    """The share of [start, end] inside `union` (merged intervals)."""
    if end <= start:
        return 0.0
    inside = sum(max(0.0, min(b, end) - max(a, start)) for a, b in union)
    return inside / (end - start)


def held_analysis(holdings: list[list[float]], samples: list[dict], start: float, end: float,
                  window_s: float = 2 * SAMPLE_PERIOD_S, bin_s: float = TIMELINE_BIN_S) -> dict:
    """The lanes' holdings of the GPU lock (monotonic (start, end) pairs) beside the GPU's
    utilization: the share of the wall some lane held it; the mean utilization of the samples whose
    last `window_s` a lane held throughout (the GPU's use of the time it was held) and of those
    whose last `window_s` nobody held; and the held share per `bin_s` of the timeline."""
    union = merged(holdings)
    held = [s["util"] for s in samples if start <= s["t"] <= end and covered(union, s["t"] - window_s, s["t"]) >= 0.9]
    idle = [s["util"] for s in samples if start <= s["t"] <= end and covered(union, s["t"] - window_s, s["t"]) <= 0.1]
    bins = max(1, math.ceil((end - start) / bin_s))
    return {
        "held_fraction": covered(union, start, end),
        "busy_while_held": sum(held) / (100.0 * len(held)) if held else None, "samples_held": len(held),
        "busy_while_not_held": sum(idle) / (100.0 * len(idle)) if idle else None, "samples_not_held": len(idle),
        "window_s": window_s,
        "held_timeline": [round(covered(union, start + i * bin_s, min(end, start + (i + 1) * bin_s)), 3)
                          for i in range(bins)],
    }


def lanes_accounting(path: Path, samples: list[dict], start: float, end: float) -> dict | None:
    """What `omnitune search --lane-stats` wrote (each lane's GPU-lock accounting), summed: what the
    lanes held the GPU for (phases), and their holdings beside the GPU's utilization; None when
    the search ran no lanes."""
    try:
        written = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    phases: dict[str, float] = {}
    holdings: list[list[float]] = []
    for stats in written.get("stats", []):
        for phase, seconds in (stats.get("gpu_lock_phase_s") or {}).items():
            phases[phase] = phases.get(phase, 0.0) + seconds
        holdings += stats.get("gpu_lock_holdings") or []
    held_s = sum(s.get("gpu_lock_held_s", 0.0) for s in written.get("stats", []))

    def since_start(stamp: float | None) -> float | None:  # monotonic stamps of the lanes: host-wide
        return None if stamp is None else round(stamp - start, 2)

    return {"lanes": written.get("lanes"), "held_s": held_s, "phase_s": phases,
            # when each lane was ready for the go (imports done, kernels loaded) and saw it
            "ready_s": [since_start(s.get("ready_at")) for s in written.get("stats", [])],
            "go_s": [since_start(s.get("go_at")) for s in written.get("stats", [])],
            # when each lane's CUDA context was being made, beside its imports (omnitune.measure.cuda_start)
            "cuda_start_s": [[since_start(s.get("cuda_start_began")), since_start(s.get("cuda_start_ended"))]
                             for s in written.get("stats", [])],
            # each lane's first holdings of the GPU lock (from, to) and what they were spent on
            "first_holdings": [[{"from_s": since_start(began), "to_s": since_start(ended), "phases": phases}
                                for (began, ended), phases in zip(s.get("gpu_lock_holdings") or [],
                                                                  s.get("gpu_lock_first_phases") or [])]
                               for s in written.get("stats", [])],
            "acquisitions": sum(s.get("gpu_lock_acquisitions", 0) for s in written.get("stats", [])),
            **held_analysis(holdings, samples, start, end)}


def _mean(samples: list[dict], field: str) -> float | None:
    values = [s[field] for s in samples if s[field] is not None]  # a field this GPU does not report
    return sum(values) / len(values) if values else None


# The lines of the search's output whose arrival times `events` keeps: the session and each
# problem starting and ending, each problem's compile report and where its trial loop's time went
# (a lane's lines carry its number).
EVENT_MARKERS = ("searching ", ": best ", ": precompiled ", "trial loop: ", " lanes: ")


def run_following(command: list[str], env: dict[str, str], started: float) -> tuple[int, list[dict]]:
    """Run `command`, passing its output through line by line, and note when each line of
    EVENT_MARKERS arrived (seconds after `started`, a time.monotonic() value)."""
    events = []
    with subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          bufsize=1) as process:
        assert process.stdout is not None
        for line in process.stdout:
            print(line, end="", flush=True)
            if any(marker in line for marker in EVENT_MARKERS):
                events.append({"t": round(time.monotonic() - started, 2), "line": line.rstrip("\n")[:200]})
    return process.returncode, events


def search_command(args: argparse.Namespace, db: str, lane_stats: str) -> list[str]:
    # --model '' leaves the problems to the extra arguments (a kernel and its --shape options).
    model = ["--model", args.model] if args.model else []
    command = [sys.executable, "-m", "omnitune", "search", *model, "-n", str(args.trials),
               "--db", db, "--lane-stats", lane_stats]
    if args.timeout is not None:
        command += ["--timeout", str(args.timeout)]
    return command + list(args.extra)


def search_runs_since(db: str, since_utc: str) -> list[dict]:
    """The search_runs rows this run wrote (finished at or after `since_utc`), in order."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    con.row_factory = sqlite3.Row
    try:
        rows = con.execute("SELECT * FROM search_runs WHERE finished_at >= ? ORDER BY finished_at",
                           (since_utc,)).fetchall()
    finally:
        con.close()
    return [dict(r) for r in rows]


def report_rows(db: str) -> dict[str, dict]:
    """`omnitune report --format json`, by study name (kernel|problem|dtype|device key)."""
    out = subprocess.run([sys.executable, "-m", "omnitune", "report", "--db", db, "--format", "json"],
                         capture_output=True, text=True, check=True, cwd=REPO).stdout
    rows = json.loads(out) if out.strip() else []
    return {"|".join((r["kernel"], r["problem_key"], r["dtype"], r["device_key"])): r for r in rows}


def shipped_entry(kernel: str, problem_key: str, dtype: str, tables: Path = REPO / "tuned_configs") -> dict | None:
    """The shipped H200 table's entry for the problem: its speedup over the default, config, time."""
    for path in sorted(glob.glob(str(tables / kernel / "NVIDIA_H200*.json"))):
        entry = json.loads(Path(path).read_text()).get("entries", {}).get(f"{dtype}|{problem_key}")
        if entry is not None:
            return {"table": Path(path).name, "speedup_vs_default": entry.get("speedup_vs_default"),
                    "time_ms": entry.get("time_ms"), "default_time_ms": entry.get("default_time_ms"),
                    "config": entry.get("config")}
    return None


def search_times(db: str, study: str) -> dict[str, float]:
    """The search's own time (ms, its median over the timed repetitions) of every config the study
    measured ok, by canonical config JSON; the finalists' re-timings left out, so that every config
    is timed the same way."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        rows = con.execute("SELECT config_json, time_ms FROM trials WHERE study = ? AND status = 'ok' "
                           "AND (extra_json IS NULL OR extra_json NOT LIKE '%\"finalist\"%')", (study,)).fetchall()
    finally:
        con.close()
    return {config: time_ms for config, time_ms in rows}


def shipped_side_by_side(times: dict[str, float], shipped: dict | None) -> dict:
    """The shipped table's config against this search's best, both as this search timed them (the
    warm start measures the shipped config of a preset problem among the first trials): like for
    like, where the tables' own speedups were measured against older defaults."""
    best_ms = min(times.values()) if times else None
    shipped_json = json.dumps(shipped["config"], sort_keys=True) if shipped and shipped.get("config") else None
    shipped_ms = times.get(shipped_json) if shipped_json else None
    return {"best_search_ms": best_ms, "shipped_config_search_ms": shipped_ms,
            "shipped_over_best": shipped_ms / best_ms if shipped_ms and best_ms else None}


def problem_rows(db: str, since_utc: str, tables: Path = REPO / "tuned_configs") -> list[dict]:
    """One row per problem this run searched: its timings, its result, and the shipped table's."""
    reported = report_rows(db)
    rows = []
    for run in search_runs_since(db, since_utc):
        kernel, problem_key, dtype, _ = run["study"].split("|", 3)
        best = reported.get(run["study"], {})
        shipped = shipped_entry(kernel, problem_key, dtype, tables)
        rows.append({
            "kernel": kernel, "problem": problem_key, "dtype": dtype, "stop_reason": run["stop_reason"],
            "wall_s": run["wall_s"], "setup_s": run["setup_s"], "retime_s": run["retime_s"],
            "gpu_s": run.get("gpu_s"), "lock_wait_s": run.get("lock_wait_s"),
            "cpu_s": run.get("cpu_s"), "compile_cpu_s": run.get("compile_cpu_s"),
            "measured_this_run": run["measured"], "trials_total": best.get("trials"),
            "best_ms": best.get("time_ms"), "default_ms": best.get("default_time_ms"),
            "speedup_vs_default": best.get("speedup_vs_default"), "best_config": best.get("best_config"),
            "shipped": shipped,
            "side_by_side": shipped_side_by_side(search_times(db, run["study"]), shipped),
        })
    return rows


def summary(result: dict) -> str:
    rows = result["problems"]
    busy = result["gpu"]["busy_fraction"]
    lines = [f"{len(rows)} problems in {result['wall_s']:.0f} s (exit {result['returncode']}); GPU busy "
             + (f"{busy:.0%}" if busy is not None else f"unknown ({result['gpu']['unavailable']})")]
    held = [r["gpu_s"] for r in rows if r.get("gpu_s") is not None]
    if held and result["wall_s"] > 0:
        lines.append(f"the searches held the GPU {sum(held):.0f} s ({sum(held) / result['wall_s']:.0%} of the wall): "
                     "the reference, checks, timings and re-timing, one search at a time")
    lanes = result.get("lanes")
    if lanes and lanes.get("busy_while_held") is not None:
        phases = ", ".join(f"{name} {seconds:.0f} s" for name, seconds in
                           sorted(lanes["phase_s"].items(), key=lambda item: -item[1]))
        lines.append(f"a lane held the GPU {lanes['held_fraction']:.0%} of the wall ({phases}); the GPU was busy "
                     f"{lanes['busy_while_held']:.0%} while held, {lanes['busy_while_not_held'] or 0:.0%} while not")
    ready = [t for t in (lanes or {}).get("ready_s") or [] if t is not None]
    went = [t for t in (lanes or {}).get("go_s") or [] if t is not None]
    if ready and went:
        lines.append(f"the lanes were ready for the go at {min(ready):.1f}-{max(ready):.1f} s and saw it at "
                     f"{min(went):.1f}-{max(went):.1f} s")
    made = [end for _, end in (lanes or {}).get("cuda_start_s") or [] if end is not None]
    if made:
        lines.append(f"their CUDA contexts were made by {min(made):.1f}-{max(made):.1f} s")
    first = [holdings[0] for holdings in (lanes or {}).get("first_holdings") or [] if holdings]
    if first:
        lines.append("their first holdings of the GPU: " + "; ".join(
            f"{h['from_s']:.1f}-{h['to_s']:.1f} s ({', '.join(f'{p} {s:.2f} s' for p, s in h['phases'].items())})"
            for h in sorted(first, key=lambda h: h["from_s"])))
    cpu = result.get("cpu", {})
    if cpu.get("busy_fraction") is not None:
        searching = sum(r.get("cpu_s") or 0 for r in rows)
        compiling = sum(r.get("compile_cpu_s") or 0 for r in rows)
        lines.append(f"the host's {cpu['cores']} cores busy {cpu['busy_fraction']:.0%} of the wall; CPU time of the "
                     f"searching processes {searching:.0f} s, of their compile workers {compiling:.0f} s")
    better = [r for r in rows if r["speedup_vs_default"] and r["shipped"] and r["shipped"]["speedup_vs_default"]]
    if better:
        ratio = sum(r["speedup_vs_default"] / r["shipped"]["speedup_vs_default"] for r in better) / len(better)
        lines.append(f"speedup over default vs the shipped tables' (mean ratio over {len(better)} problems): {ratio:.2f}")
    side = [r["side_by_side"]["shipped_over_best"] for r in rows if r.get("side_by_side", {}).get("shipped_over_best")]
    if side:
        worse = sum(1 for x in side if x < 1 / 1.02)
        lines.append(f"the shipped config as this search timed it ÷ this search's best, over {len(side)} problems: "
                     f"min {min(side):.3f}, median {sorted(side)[len(side) // 2]:.3f}; the best more than 2% slower "
                     f"than the shipped config on {worse}")
    slowest = sorted(rows, key=lambda r: -(r["wall_s"] or 0))[:3]
    for r in slowest:
        lines.append(f"  slowest: {r['kernel']} {r['problem']}: {r['wall_s']:.1f} s (setup {r['setup_s']:.1f} s, "
                     f"re-timing {r['retime_s']:.1f} s, {r['measured_this_run']} measured)")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="search_wall.json", help="where the JSON goes")
    parser.add_argument("--model", default="qwen2.5-omni-7b",
                        help="model preset to search; '' to search what the extra arguments name instead "
                             "(after --: a kernel and its --shape options)")
    parser.add_argument("--trials", type=int, default=50, help="configs per problem (-n)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                        help="passed to omnitune search: no new trial after this many seconds")
    parser.add_argument("--db", default=None, help="results database [default: a fresh one in a temporary folder]")
    parser.add_argument("--gpu", type=int, default=0, help="NVML index of the GPU to sample")
    parser.add_argument("--fresh-triton-cache", action="store_true",
                        help="search with an empty Triton cache of its own: every config compiled, as on a first run")
    parser.add_argument("--triton-cache", default=None,
                        help="search with this Triton cache folder (e.g. one a search before filled: nothing compiled)")
    parser.add_argument("extra", nargs="*", help="after --: more arguments for omnitune search")
    return parser.parse_args(argv)


def _files_in(folder: str | None) -> int | None:
    """How many files a Triton cache folder holds (None: the default cache, not counted)."""
    if folder is None:
        return None
    return sum(len(files) for _, _, files in os.walk(folder))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    db = args.db or str(Path(tempfile.mkdtemp(prefix="search_wall_")) / "omnitune.db")
    lane_stats = Path(tempfile.mkdtemp(prefix="search_wall_lanes_")) / "lanes.json"
    command = search_command(args, db, str(lane_stats))
    since_utc = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S+00:00")
    env = os.environ.copy()
    if args.fresh_triton_cache:
        env["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="search_wall_triton_")
    elif args.triton_cache:
        Path(args.triton_cache).mkdir(parents=True, exist_ok=True)
        env["TRITON_CACHE_DIR"] = args.triton_cache
    cached_at_start = _files_in(env.get("TRITON_CACHE_DIR"))
    sampler = GpuSampler(args.gpu)
    sampler.start()
    started = time.monotonic()
    returncode, events = run_following(command, env, started)
    ended = time.monotonic()
    sampler.stop()
    within = [s for s in sampler.samples if started <= s["t"] <= ended]
    cpu_within = [s["busy"] for s in sampler.cpu_samples if started <= s["t"] <= ended]
    result = {
        "command": command, "db": db, "returncode": returncode, "wall_s": ended - started,
        "triton_cache_dir": env.get("TRITON_CACHE_DIR", "~/.triton/cache"),
        "fresh_triton_cache": args.fresh_triton_cache or cached_at_start == 0,
        "triton_cache_files_at_start": cached_at_start,
        "gpu": {"busy_fraction": busy_fraction(sampler.samples, started, ended), "samples": len(within),
                "sample_period_s": SAMPLE_PERIOD_S, "mean_sm_mhz": _mean(within, "sm_mhz"),
                "mean_power_w": _mean(within, "power_w"),
                "unavailable": sampler.unavailable if not within else None},
        "cpu": {"busy_fraction": sum(cpu_within) / len(cpu_within) if cpu_within else None,
                "cores": os.cpu_count(), "samples": len(cpu_within)},
        "lanes": lanes_accounting(lane_stats, sampler.samples, started, ended),
        "events": events,
        "timeline": {"bin_s": TIMELINE_BIN_S, "gpu_busy": timeline(sampler.samples, "util", started, ended),
                     "cpu_busy": timeline(sampler.cpu_samples, "busy", started, ended)},
        "problems": problem_rows(db, since_utc) if Path(db).is_file() else [],
        "shipped_note": "shipped: the entry of tuned_configs/<kernel>/NVIDIA_H200*.json for the same "
                        "problem and dtype (speedup_vs_default as exported), or null when it has none",
    }
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(summary(result))
    print(f"written to {args.out}")
    return returncode


if __name__ == "__main__":
    sys.exit(main())

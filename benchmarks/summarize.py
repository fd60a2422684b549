"""Markdown tables from the raw H200 results in benchmarks/results/, for docs/results.md.

    python benchmarks/summarize.py
"""

from __future__ import annotations

import json
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def _rows(path: str) -> list[dict]:
    return json.loads((RESULTS / path).read_text())["results"]


def _short(problem_key: str) -> str:
    """Drop fields at their default values (spans=0, causal=0, ...) from a problem key."""
    keep = [p for p in problem_key.split(",") if p not in ("causal=0", "spans=0", "span_len=0", "block_size=16")]
    return ",".join(keep)


def bench_table(path: str, title: str) -> str:
    lines = [f"**{title}** (`{path}`)", ""]
    for res in _rows(path):
        rows = {r["name"]: r for r in res["rows"]}
        ours = [r for r in res["rows"] if r["kind"] == "omnitune" and r["status"] == "ok"]
        tuned = next((r for r in ours if r["name"].startswith("omnitune[tuned") or "= tuned" in r["name"]), None)
        default = rows.get("omnitune[default]") or next((r for r in ours if "default" in r["name"]), None)
        best = tuned or min(ours, key=lambda r: r["time_ms"])
        bases = [r for r in res["rows"] if r["kind"] == "baseline"]
        if len(lines) == 2:
            head = ["problem", "ours ms", "TFLOP/s", "TB/s", "rel err", "default ms", "vs default"]
            head += [f"vs {b['name']}" for b in bases]
            lines += ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
        cells = [
            f"`{_short(res['problem_key'])}`", f"{best['time_ms']:.4f}", f"{best['tflops']:.0f}",
            f"{best['tbps']:.2f}", f"{best['rel_error']:.1e}",
            f"{default['time_ms']:.4f}" if default else "—",
            f"{default['time_ms'] / best['time_ms']:.2f}x" if default else "—",
        ]
        for b in bases:
            cells.append(f"{b['time_ms'] / best['time_ms']:.2f}x" if b["status"] == "ok" else b["status"])
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    print(bench_table("attention_tuned_vs_sdpa_h200.json", "Attention, tuned table vs default vs SDPA (round 3)"))
    print(bench_table("attention_tuned_vs_sdpa_h200_round2.json", "Attention, tuned table vs default vs SDPA (round 2)"))
    print(bench_table("attention_bench_h200.json", "Attention, hand-picked configs vs SDPA (round 1)"))
    print(bench_table("kv_cache_write_vs_torch_h200.json", "Paged KV-cache write vs torch index_copy_"))
    print(bench_table("paged_decode_vs_sdpa_h200.json", "Paged decode attention vs SDPA over a contiguous cache"))


if __name__ == "__main__":
    main()

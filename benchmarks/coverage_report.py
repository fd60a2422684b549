"""What benchmarks/coverage.py's results say: the summary per kernel it writes beside its rows,
the Markdown tables of `--report`, and the plot of pick ÷ tuned per kernel. No GPU, no kernel:
only the results JSON is read."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path

# "The pick reaches 95% of the tuned speed": tuned time ÷ pick time ≥ 0.95.
GOOD_SPEED = 0.95
RUNGS = ("exact", "nearest", "predictor", "default")


def evaluated(rows: Sequence[Mapping]) -> list[Mapping]:
    """The rows with a timed pick and a timed tuned config."""
    return [r for r in rows if r.get("status") == "ok" and (r.get("ratios") or {}).get("pick_over_tuned") is not None]


def kernel_summary(rows: Sequence[Mapping]) -> dict:
    """The figures the evaluation is judged by, over one kernel's rows (or every row)."""
    timed = evaluated(rows)
    pick = [r["ratios"]["pick_over_tuned"] for r in timed]
    default = [r["ratios"]["default_over_tuned"] for r in timed if r["ratios"]["default_over_tuned"] is not None]
    good = [r for r in timed if 1.0 / r["ratios"]["pick_over_tuned"] >= GOOD_SPEED]
    against = [r for r in timed if r.get("pick_slower_than_pytorch") is not None]
    slower = [r for r in against if r["pick_slower_than_pytorch"]]
    clearly_slower = [r for r in slower if slower_beyond_spread(r)]
    # Rows from before baselines were told apart carry no same-inputs verdict: left out of it.
    against_same = [r for r in timed if r.get("pick_slower_than_pytorch_same_inputs") is not None]
    slower_same = [r for r in against_same if r["pick_slower_than_pytorch_same_inputs"]]
    worst = max(timed, key=lambda r: r["ratios"]["pick_over_tuned"], default=None)
    return {
        "problems": len(rows),
        "evaluated": len(timed),
        "errors": sum(1 for r in rows if r.get("status") == "error"),
        "pick_failed_check": sum(1 for r in rows if r.get("status") == "ok" and r not in timed),
        "rungs": {rung: sum(1 for r in rows if r.get("rung") == rung) for rung in RUNGS},
        "pick_within_95pct": len(good),
        "pick_within_95pct_share": share(len(good), len(timed)),
        # Which rung the misses came through: the one to work on next.
        "pick_within_95pct_by_rung": {rung: [sum(1 for r in good if r.get("rung") == rung),
                                             sum(1 for r in timed if r.get("rung") == rung)]
                                      for rung in RUNGS if any(r.get("rung") == rung for r in timed)},
        "median_pick_over_tuned": statistics.median(pick) if pick else None,
        "worst_pick_over_tuned": max(pick) if pick else None,
        "worst_problem": f"{worst['dtype']}|{worst['problem_key']}" if worst else None,
        "median_default_over_tuned": statistics.median(default) if default else None,
        "with_pytorch": len(against),
        "pick_slower_than_pytorch": len(slower),
        "pick_slower_than_pytorch_share": share(len(slower), len(against)),
        # Medians 0.1% apart are one implementation timed twice (an SDPA config against SDPA):
        # counted here only where the pick's 20th percentile lies above the baseline's 80th.
        "pick_slower_than_pytorch_beyond_spread": len(clearly_slower),
        # The bar: slower than a PyTorch path over the op's own inputs (what backend
        # selection could choose), not one that did part of its work ahead (prepared_baselines).
        "with_pytorch_same_inputs": len(against_same),
        "pick_slower_than_pytorch_same_inputs": len(slower_same),
        "prepared_baselines": sorted({name for r in timed for name in r.get("prepared_baselines") or ()}),
    }


def slower_beyond_spread(row: Mapping) -> bool | None:
    """Whether the pick's p20 time is above the fastest baseline's p80 (their p20–p80 spreads do
    not overlap); None where the row lacks either timing."""
    timings, baseline = row.get("timings") or {}, row.get("best_pytorch")
    pick = next((name for name in timings if "pick" in name.split("+")), None)
    if pick is None or baseline not in timings:
        return None
    return timings[pick]["p20_ms"] > timings[baseline]["p80_ms"]


def summarize(rows: Sequence[Mapping]) -> dict[str, dict]:
    """kernel_summary per kernel, in the order the rows first name them, and over all rows."""
    kernels = dict.fromkeys(r["kernel"] for r in rows)
    summary = {k: kernel_summary([r for r in rows if r["kernel"] == k]) for k in kernels}
    summary["all"] = kernel_summary(rows)
    return summary


def tables_of(doc: Mapping) -> str:
    return doc.get("settings", {}).get("tables_device") or "no GPU"


def share(part: int, whole: int) -> float | None:
    return part / whole if whole else None


# --- Markdown -----------------------------------------------------------------------------------


def markdown(doc: Mapping) -> str:
    """One section per kernel: its summary in a sentence, then a row per problem."""
    rows = doc.get("rows", [])
    summary = summarize(rows) if rows else {}
    parts = [f"# Held-out coverage: {plural(len(rows), 'problem')}, tables of {tables_of(doc)}"]
    if doc.get("settings", {}).get("interpret"):
        parts.append("_Timed under Triton's interpreter on a CPU: the times say nothing about a GPU._")
    if doc.get("settings", {}).get("tuned_from"):
        other = sum(1 for r in rows if (r.get("search") or {}).get("tuned_on_this_source") is False)
        parts.append(f"_Each problem's tuned optimum is the one found by the search of "
                     f"`{doc['settings']['tuned_from']}`, checked and timed again in this run"
                     + (f"; for {plural(other, 'problem')} that search ran on other (or unrecorded) kernel source_."
                        if other else "._"))
    for kernel in (k for k in summary if k != "all"):
        parts.append(kernel_section(kernel, [r for r in rows if r["kernel"] == kernel], summary[kernel]))
    if len(summary) > 2:
        parts.append("## All kernels\n\n" + summary_sentence(summary["all"]))
    return "\n\n".join(parts) + "\n"


def kernel_section(kernel: str, rows: Sequence[Mapping], summary: Mapping) -> str:
    header = ("| problem | dtype | rung | pick ms | default ms | tuned ms | best PyTorch ms | pick ÷ tuned "
              "| default ÷ tuned | PyTorch ÷ tuned |\n" + "| --- " * 10 + "|")
    lines = [table_line(r) for r in rows]
    return f"## {kernel}\n\n{summary_sentence(summary)}\n\n{header}\n" + "\n".join(lines)


def summary_sentence(s: Mapping) -> str:
    rungs = ", ".join(f"{n} {rung}" for rung, n in s["rungs"].items() if n)
    text = (f"{plural(s['problems'], 'problem')} ({rungs or 'none looked up'}); {s['evaluated']} evaluated, "
            f"{s['errors']} failed.")
    if s["pick_failed_check"]:
        text += f" On {plural(s['pick_failed_check'], 'problem')} the pick failed its check against the reference."
    if s["evaluated"]:
        text += (f" The pick reaches ≥ {GOOD_SPEED:.0%} of the tuned speed on {s['pick_within_95pct']} of "
                 f"{s['evaluated']} ({percent(s['pick_within_95pct_share'])}); pick ÷ tuned: median "
                 f"{number(s['median_pick_over_tuned'])}, worst {number(s['worst_pick_over_tuned'])} "
                 f"(`{s['worst_problem']}`); default ÷ tuned median {number(s['median_default_over_tuned'])}.")
        by_rung = s.get("pick_within_95pct_by_rung") or {}
        if len(by_rung) > 1:
            counts = (f"{rung} {good} of {timed}" for rung, (good, timed) in by_rung.items())
            text += " By rung, ≥ 95%: " + ", ".join(counts) + "."
    if s["with_pytorch"]:
        text += (f" The pick is slower than the best PyTorch path on {s['pick_slower_than_pytorch']} of "
                 f"{s['with_pytorch']} ({percent(s['pick_slower_than_pytorch_share'])}), beyond the p20–p80 "
                 f"spread of both timings on {s['pick_slower_than_pytorch_beyond_spread']}.")
    if s.get("prepared_baselines") and s.get("with_pytorch_same_inputs"):
        ahead = ", ".join(f"`{name}`" for name in s["prepared_baselines"])
        text += (f" Without the baselines that do part of their work ahead ({ahead}): slower on "
                 f"{s['pick_slower_than_pytorch_same_inputs']} of {s['with_pytorch_same_inputs']}.")
    return text


def table_line(r: Mapping) -> str:
    if r.get("status") != "ok":
        return (f"| `{r['problem_key']}` | {r['dtype']} | {r.get('rung') or '—'} | failed: "
                f"{str(r.get('error', '')).replace('|', '/')[:160]} | | | | | | |")
    times, ratios = r.get("times_ms") or {}, r.get("ratios") or {}
    pytorch = f"{r['best_pytorch']} {number(times.get('best_pytorch'), 4)}" if r.get("best_pytorch") else "—"
    cells = [f"`{r['problem_key']}`", r["dtype"], r["rung"], number(times.get("pick"), 4),
             number(times.get("default"), 4), number(times.get("tuned"), 4), pytorch,
             number(ratios.get("pick_over_tuned")), number(ratios.get("default_over_tuned")),
             number(ratios.get("best_pytorch_over_tuned"))]
    return "| " + " | ".join(cells) + " |"


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def number(value: float | None, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}g}"


def percent(value: float | None) -> str:
    return "—" if value is None else f"{value:.0%}"


# --- the plot -----------------------------------------------------------------------------------


def plot_or_note(doc: Mapping, path: Path) -> str:
    """Write the plot and say where; without matplotlib, say so in one line instead."""
    try:
        import matplotlib
    except ImportError:
        return "no plot: matplotlib is not installed (pip install matplotlib)"
    if not evaluated(doc.get("rows", [])):
        return "no plot: no problem was evaluated"
    matplotlib.use("Agg")
    plot(doc, path)
    return f"wrote {path}"


def plot(doc: Mapping, path: Path) -> None:
    """pick ÷ tuned of every evaluated problem, one column per kernel (a box over the points,
    each point coloured by the rung that answered), and the line the pick must stay under to
    reach 95% of the tuned speed."""
    import matplotlib.pyplot as plt

    rows = evaluated(doc["rows"])
    kernels = list(dict.fromkeys(r["kernel"] for r in rows))
    colours = {rung: f"C{i}" for i, rung in enumerate(RUNGS)}
    fig, ax = plt.subplots(figsize=(max(6.0, 1.8 * len(kernels)), 4.8))
    values = [[r["ratios"]["pick_over_tuned"] for r in rows if r["kernel"] == k] for k in kernels]
    ax.boxplot(values, positions=range(len(kernels)), widths=0.5, showfliers=False)
    for x, kernel in enumerate(kernels):
        mine = [r for r in rows if r["kernel"] == kernel]
        for i, r in enumerate(mine):
            jitter = (i / max(1, len(mine) - 1) - 0.5) * 0.3 if len(mine) > 1 else 0.0
            ax.scatter(x + jitter, r["ratios"]["pick_over_tuned"], s=14, color=colours[r["rung"]], zorder=3)
    for rung in RUNGS:
        if any(r["rung"] == rung for r in rows):
            ax.scatter([], [], s=14, color=colours[rung], label=rung)
    ax.axhline(1 / GOOD_SPEED, color="gray", linestyle="--", linewidth=1)
    ax.text(len(kernels) - 0.5, 1 / GOOD_SPEED, f" {GOOD_SPEED:.0%} of tuned speed", va="bottom", ha="right",
            fontsize=8, color="gray")
    ax.set_xticks(range(len(kernels)))
    ax.set_xticklabels([f"{k}\n({plural(len(v), 'problem')})" for k, v in zip(kernels, values)], fontsize=8)
    ax.set_ylabel("pick time ÷ tuned time (1 = the tuned optimum)")
    device = tables_of(doc)
    note = " (interpreter: not GPU times)" if doc.get("settings", {}).get("interpret") else ""
    if max(max(v) for v in values) > 3:
        ax.set_yscale("log")  # a default far off would flatten everything near 1
    ax.set_title(f"The runtime's pick against a search per held-out problem\ntables of {device}{note}", fontsize=9)
    ax.legend(title="rung", fontsize=7, title_fontsize=8, loc="upper left")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130)
    plt.close(fig)

#!/usr/bin/env python3
"""Report of one or more ab_bench.py runs, on a CPU machine: tables and PNG plots.

Reads each run's ab_results.json, recomputes the summaries from its raw records with the current
ab_bench.summarize (so every run is judged by the same rules; a record without a mode, written
before ab_bench had ``--mode``, is a sequential one; a together one with ``--cpu-split`` shows as
``together+cpu-split``), and writes into --out:

* ``summary.md``: one table row per (configuration, mode, concurrency): ratio, bootstrap interval
  or range, its verdict (descriptive), the plan's TOST verdict where the cell has one (ab_bench
  ``--plan``; or ``--plan`` here, marked post hoc), sd of the log ratio; per tree tokens/s, TTFT,
  ITL, accept length; then the pairs a TOST at ±2% with 80% power would need at each measured sd
  (scipy), the exactness check and the measured draft kv_indices rows against
  benchmark/kv_indices_memory.py's formula;
  For a run of ``ab_bench --mode both``, the mode's bias: per block of a together and a sequential
  pair, the difference of log ratios, its mean with a 95% t interval, and the share of the
  sequential log ratio that together mode keeps;
* ``summary.json``: the same, machine-readable;
* ``ab_ratio.png``: per (configuration, concurrency) each pair's ratio, the median and its 95%
  interval (or, below 6 pairs, the min-max range, drawn dashed), the ±2% parity band;
* ``ab_tokens.png``: output tokens/s against concurrency, both trees, each round a dot;
* ``ab_drift.png``: per configuration, every run's output tokens/s (warm-up, calibration, measured
  rounds) against the time it started, both trees: how much the same tree's speed moves while
  the workload stays the same. Runs without ``t_start`` (before 2026-12-01 evening) are placed
  by their durations added up in run order (the runs of a sequential A/B follow each other).

    python benchmark/gpu/report_ab.py benchmark/gpu/results/h200-2026-12-01-ab/run*/ab_results.json \\
        --out benchmark/gpu/results/h200-2026-12-01-ab

Needs matplotlib (benchmark/gpu/requirements.txt).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import ab_bench  # noqa: E402
import ab_stats  # noqa: E402

TREE_COLORS = {"unpatched": "tab:red", "patched": "tab:blue"}


def load(paths: list[str], plan: dict | None = None) -> tuple[list[dict], list[dict]]:
    """(records, summaries) of every run, summaries recomputed from the records (``plan``: judge
    records that ran under no plan by its cells, post hoc)."""
    records, summaries = [], []
    for path in paths:
        with open(path) as f:
            run = json.load(f)
        for record in run["records"]:
            record["source"] = path
            records.append(record)
            summaries += ab_bench.summarize(record, run["settings"]["concurrencies"], plan)
    return records, summaries


def memory_table(summaries: list[dict]) -> str:
    rows = [
        "| config | tree | max_bs | topk | steps | ctx | rows measured (bytes) | formula (bytes) | equal | "
        "allocation diff of init_cuda_graph_state (bytes) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    seen = set()
    for s in summaries:
        for m in s.get("memory", []):
            key = (s["config"], m["tree"])
            if key in seen:
                continue
            seen.add(key)
            rows.append(
                f"| {s['config']} | {m['tree']} | {m['max_bs']} | {m['topk']} | {m['steps']} | {m['ctx']} | "
                f"{m['rows_bytes']:,} | {m['formula_bytes']:,} | {m['rows_equal_formula']} | "
                f"{m['allocated_diff']:,} |"
            )
    return "\n".join(rows) + "\n"


def exactness_table(summaries: list[dict]) -> str:
    rows = [
        "| config | tree | outputs = rule | accept length min / mean / max | every request num_steps + 1 |",
        "| --- | --- | --- | --- | --- |",
    ]
    seen = set()
    for s in summaries:
        for tree, e in s.get("exactness", {}).items():
            if (s["config"], tree) in seen:
                continue
            seen.add((s["config"], tree))
            rows.append(
                f"| {s['config']} | {tree} | {e.get('all_match_rule')} | {e.get('accept_min')} / "
                f"{e.get('accept_mean')} / {e.get('accept_max')} | {e.get('accept_all_exact')} |"
            )
    return "\n".join(rows) + "\n"


def need_table(summaries: list[dict]) -> str:
    """Per measured cell: its sd of log ratio and the pairs a TOST at ±2% with 80% power would need
    at that sd (ab_stats.tost_pairs; needs scipy, as the report does on a CPU)."""
    rows = [
        "| config | mode | conc | pairs measured | round s (min) | sd of log ratio | pairs for a TOST at ±2%, "
        "80% power, at this sd |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for s in summaries:
        if s.get("sd_log_ratio"):
            rows.append(
                f"| {s['config']} | {s['mode']} | {s['concurrency']} | {s['pairs']} | "
                f"{ab_bench.fmt(s.get('round_seconds'), '.1f')} | {s['sd_log_ratio']:.4f} | "
                f"{ab_stats.tost_pairs(s['sd_log_ratio'])} |"
            )
    return "\n".join(rows) + "\n"


def bias_table(records: list[dict]) -> str:
    """Per (configuration, concurrency) run with ``ab_bench --mode both``: the mode's bias over its
    complete blocks (ab_stats.mode_bias), with the 95% t interval of the ratio of ratios (scipy)."""
    rows = [
        "| config | conc | blocks | sequential ratio (mean) | together ratio (mean) | together / sequential "
        "ratio [95% t CI] | share of the sequential log ratio together keeps [95% bootstrap CI] |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for record in records:
        if record.get("mode") != "both":
            continue
        for c in record["concurrencies"]:
            ratios = ab_bench.pair_ratios([r for r in record["rounds"] if r["concurrency"] == c])
            b = ab_stats.mode_bias(ratios)
            if b["blocks"] >= 2:
                b = ab_stats.mode_bias(ratios, ab_stats.t_quantile(0.975, b["blocks"] - 1))
            else:
                rows.append(f"| {record['config']} | {c} | {b['blocks']} | - | - | - | - |")
                continue
            lo, hi = b["ratio_of_ratios_ci95"]
            klo, khi = b["kept_ci95"]
            rows.append(
                f"| {record['config']} | {c} | {b['blocks']} | {b['sequential_ratio']:.3f} | "
                f"{b['together_ratio']:.3f} | {b['ratio_of_ratios']:.3f} [{lo:.3f}, {hi:.3f}] | "
                f"{b['kept']:.2f} [{klo:.2f}, {khi:.2f}] |"
            )
    return "\n".join(rows) + "\n"


def plot_ratio(summaries: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [s for s in summaries if s.get("ratios")]
    fig, ax = plt.subplots(figsize=(7, 1.2 + 0.9 * len(rows)))
    band = ab_stats.PARITY_BAND
    ax.axvspan(1 - band, 1 + band, color="tab:green", alpha=0.15, label="±2% parity band")
    ax.axvline(1.0, color="gray", lw=0.8)
    for y, s in enumerate(rows):
        ax.scatter(
            s["ratios"],
            [y] * len(s["ratios"]),
            color="black",
            s=14,
            zorder=3,
            label="one pair (patched / unpatched)" if y == 0 else None,
        )
        if "ci_low" in s:
            lo, hi, style, label = s["ci_low"], s["ci_high"], "-", "95% bootstrap interval of the median"
        else:
            lo, hi, style, label = s["ratio_min"], s["ratio_max"], "--", "min-max (too few pairs for an interval)"
        ax.plot([lo, hi], [y, y], style, color="tab:blue", lw=2, label=label)
        ax.scatter(
            [s["ratio_median"]], [y], marker="D", color="tab:blue", s=40, zorder=4, label="median" if y == 0 else None
        )
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(
        [f"{s['config']} ({s['mode']})\nconcurrency {s['concurrency']}, {s['pairs']} pairs" for s in rows]
    )
    ax.set_ylim(-0.6, len(rows) - 0.4)
    ax.set_xlabel("output tokens/s, patched / unpatched")
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    ax.legend(unique.values(), unique.keys(), fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    ax.set_title("SGLang 0.5.12 on an H200, 8B-shaped exact model", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_tokens(records: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recs = [r for r in records if r.get("rounds")]
    fig, axes = plt.subplots(1, len(recs), figsize=(3.8 * len(recs), 3.6), squeeze=False)
    for ax, record in zip(axes[0], recs):
        for tree, color in TREE_COLORS.items():
            by_c: dict[int, list[float]] = {}
            for r in record["rounds"]:
                if r["tree"] == tree:
                    by_c.setdefault(r["concurrency"], []).append(r["output_throughput"])
            cs = sorted(by_c)
            for c in cs:
                ax.scatter([c] * len(by_c[c]), by_c[c], color=color, s=14, alpha=0.6)
            meds = [statistics.median(by_c[c]) for c in cs]
            ax.plot(cs, meds, "o-", color=color, label=f"{tree} (median; dots: rounds)")
        ax.set_xscale("log", base=2)
        ax.set_xticks([1, 8, 32])
        ax.set_xticklabels(["1", "8", "32"])
        ax.set_xlim(0.7, 45)
        ax.set_ylim(bottom=0)
        ax.set_xlabel("concurrency")
        ax.set_ylabel("output tokens/s")
        measured = sorted({r["concurrency"] for r in record["rounds"]})
        ax.set_title(
            f"{record['config']}, {ab_bench.mode_label(record)}\n(measured at " f"{', '.join(map(str, measured))})",
            fontsize=9,
        )
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_times(record: dict) -> list[float]:
    """Each run's start in seconds from the record's first run: ``t_start`` where recorded, else
    the walls of the runs before it added up."""
    runs = record["runs"]
    if runs and all("t_start" in r for r in runs):
        return [r["t_start"] - runs[0]["t_start"] for r in runs]
    starts, t = [], 0.0
    for r in runs:
        starts.append(t)
        t += r["wall_s"]
    return starts


def plot_drift(records: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recs = [r for r in records if r.get("rounds")]
    fig, axes = plt.subplots(1, len(recs), figsize=(4.2 * len(recs), 3.4), squeeze=False)
    for ax, record in zip(axes[0], recs):
        starts = run_times(record)
        for tree, color in TREE_COLORS.items():
            for measured, marker in ((False, "o"), (True, "s")):
                points = [
                    (t, r["output_throughput"])
                    for t, r in zip(starts, record["runs"])
                    if r["tree"] == tree and r["tag"].startswith("pair") == measured and r.get("output_throughput")
                ]
                if points:
                    ax.scatter(
                        *zip(*points),
                        color=color,
                        marker=marker,
                        s=22,
                        facecolors=color if measured else "none",
                        label=f"{tree}, {'measured round' if measured else 'warm-up / calibration'}",
                    )
        ax.set_ylim(bottom=0)
        ax.set_xlabel("run start, s from the first run")
        ax.set_ylabel("output tokens/s")
        ax.set_title(f"{record['config']}, {ab_bench.mode_label(record)}", fontsize=9)
        ax.legend(fontsize=6, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="+", help="ab_results.json files")
    ap.add_argument("--out", required=True)
    ap.add_argument("--no-plots", action="store_true")
    ap.add_argument(
        "--plan",
        help="a plan (benchmark/gpu/plans/*.json) to judge records that ran under none "
        "by, marked post hoc; a record run with ab_bench --plan is judged by the cells it ran under",
    )
    a = ap.parse_args(argv)
    records, summaries = load(a.results, ab_stats.load_plan(a.plan) if a.plan else None)
    os.makedirs(a.out, exist_ok=True)
    text = (
        "## A/B\n\n"
        + ab_bench.markdown_table(summaries)
        + "\n## The mode's bias (ab_bench --mode both)\n\n"
        + bias_table(records)
        + "\n## Pairs a TOST at ±2% would need\n\n"
        + need_table(summaries)
        + "\n## Exactness (serve_checks.py's requests on each server)\n\n"
        + exactness_table(summaries)
        + "\n## Draft kv_indices CUDA-graph rows, measured in the server\n\n"
        + memory_table(summaries)
    )
    with open(os.path.join(a.out, "summary.md"), "w") as f:
        f.write(text)
    with open(os.path.join(a.out, "summary.json"), "w") as f:
        json.dump(summaries, f, indent=1)
    if not a.no_plots:
        plot_ratio(summaries, os.path.join(a.out, "ab_ratio.png"))
        plot_tokens(records, os.path.join(a.out, "ab_tokens.png"))
        plot_drift(records, os.path.join(a.out, "ab_drift.png"))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Writes parity-tost.json: issue 29's pre-registered equivalence tests, one per parity cell.

For each cell (configuration, concurrency) the plan fixes, before any run: the test (TOST on the
mean of the pairs' log ratios of output tokens/s, paired t, alpha 0.05 each side, margin
log(1.02); ab_stats.py's docstring), the sd of the log ratio it was sized on and where that sd
was measured, the pair count that gives the test 80% power at that sd and a true ratio of 1
(ab_stats.tost_pairs), the critical t value the verdict will use, and the device seconds the
cell is expected to take from the measured time per pair. A cell whose seconds exceed the share
of a session's device time this work may take (BUDGET_S) says so, with the pairs it needs.

The sd is read from the committed results (``source``); a cell never measured, or measured in
another design than the plan's, says so (``sd_basis``) and asks for a pilot first (``pilot_first``,
``pilot_command``): 6 pairs in the plan's design, not part of the test, then a new version of the
plan (``VERSION``, ``VERSIONS``) sized on the pilot's sd and time per pair, committed before the
test's run. The power is the power at that sd: from
6 pairs an sd is uncertain (``sd_upper80``, the one-sided 80% upper confidence bound, and the
pairs it would need, show by how much).

    python benchmark/gpu/plans/parity_tost.py            # rewrites benchmark/gpu/plans/parity-tost.json
    python benchmark/gpu/plans/parity_tost.py --check    # exit 1 when the committed plan differs

Run with the plan (ab_bench.py --plan): each cell's configuration exactly as the plan's design says,
its pairs fixed by the plan, the verdict at exactly that count.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
GPU = os.path.dirname(HERE)
REPO = os.path.dirname(os.path.dirname(GPU))
sys.path.insert(0, GPU)

import ab_bench  # noqa: E402
import ab_stats  # noqa: E402

PLAN = os.path.join(HERE, "parity-tost.json")
RESULTS = "benchmark/gpu/results"
LATE = f"{RESULTS}/h200-2026-12-01-ab4/ab_results.json"  # together, --cpu-split (2026-12-01, late)
NIGHT = f"{RESULTS}/h200-2026-12-01-ab3/ab_results.json"  # together, CPUs shared (2026-12-01, night)
#: the pilots of issue 29 (2026-12-04), 6 pairs each in the plan's design, not part of any test:
#: FlashInfer CUDA graphs at 64 and triton eager on one machine, FlashInfer eager on a second one
PILOTS = f"{RESULTS}/h200-2026-12-04-pilots/ab_results.json"
PILOT_FI_EAGER = f"{RESULTS}/h200-2026-12-04-pilots/flashinfer_nocg_k4s3/ab_results.json"

#: the plan's version, raised whenever a cell's sizing changes; a cell's verdict holds under the
#: version (and sha256) its run recorded
VERSION = 2
VERSIONS = [
    "1 (2026-12-02): cells at 8 and 32 sized on the late run (2026-12-01, plan's design); 64 assumed; "
    "the eager cells on the night run (CPUs shared). The cell at 32 was run under it (sha256 f9d56032...ea00, "
    "2026-12-03 afternoon: equivalent)",
    "2 (2026-12-04): the cell at 64 and the two eager cells sized on their pilots (6 pairs each, plan's "
    "design, results/h200-2026-12-04-pilots/); cells at 8 and 32 unchanged",
]

#: ab_bench's settings the sds were measured at (the late run's); a run of the plan must use them
DESIGN = {
    "mode": "together",
    "cpu_split": True,
    "round_seconds": 20,
    "round_margin": 1.25,
    "warmup_waves": 6,
    "input_len": 512,
    "output_len": 512,
    "range_ratio": 0.5,
    "seed": 1,
    "stress": 1,
    "mem_fraction": 0.4,
    "max_total_tokens": 120000,
    "extra_args": "",
}
SESSION_DEVICE_S = 1800
BUDGET_S = 900  # of a session's 30 minutes, at most 15 for this
#: device seconds a session spends before any cell (docs/performance.md, 2026-12-01 late: machine
#: start and transfers about 90 s, setup 61 s)
SESSION_START_S = 90 + 61
#: exactness, warm-up and calibration of a configuration at one concurrency (same run: 107 s)
PRE_MEASURE_S = 107

IN_DESIGN = "measured in the plan's design"
PILOT = "measured in the plan's design: its pilot of 6 pairs (2026-12-04), not part of the test"
#: (config, concurrency, where its sd and time per pair come from, why that source)
CELLS = [
    ("flashinfer_cg_k1s3", 8, (LATE, "flashinfer_cg_k1s3", 8), IN_DESIGN),
    ("flashinfer_cg_k1s3", 32, (LATE, "flashinfer_cg_k1s3", 32), IN_DESIGN),
    ("flashinfer_cg_k1s3", 64, (PILOTS, "flashinfer_cg_k1s3", 64), PILOT),
    ("flashinfer_nocg_k4s3", 32, (PILOT_FI_EAGER, "flashinfer_nocg_k4s3", 32), PILOT),
    ("triton_nocg_k1s3", 32, (PILOTS, "triton_nocg_k1s3", 32), PILOT),
]
#: where a cell's server pair start time comes from (the record's startup_s): the late run, the
#: flashinfer modules carried (.gpu/fiaot)
START_FROM = {"flashinfer": (LATE, "flashinfer_cg_k1s3"), "triton": (LATE, "triton_nocg_k4s3")}


def load(path: str) -> dict:
    with open(os.path.join(REPO, path)) as f:
        return json.load(f)


def record_of(path: str, config: str) -> dict:
    return next(r for r in load(path)["records"] if r["config"] == config)


def measured(path: str, config: str, concurrency: int) -> dict:
    """A cell's pairs in a results file: their log ratios' sd and the mean wall time of a pair
    (both trees run at once: the longer round's wall)."""
    record = record_of(path, config)
    (s,) = [s for s in ab_bench.summarize(record, [concurrency]) if s["concurrency"] == concurrency]
    walls: dict[int, float] = {}
    for r in record["rounds"]:
        if r["concurrency"] == concurrency:
            walls[r["pair"]] = max(walls.get(r["pair"], 0.0), r["wall_s"])
    return {"pairs": s["pairs"], "sd": s["sd_log_ratio"], "pair_s": statistics.mean(walls.values())}


def sd_upper(sd: float, df: int, level: float = 0.8) -> float:
    """One-sided ``level`` upper confidence bound of a normal sd estimated with ``df`` degrees of freedom."""
    stats, _ = ab_stats._scipy()
    return sd * math.sqrt(df / stats.chi2.ppf(1 - level, df))


def cell_plan(config: str, concurrency: int, source, basis: str) -> dict:
    alpha, margin, power = ab_stats.TOST_ALPHA, ab_stats.TOST_MARGIN, ab_stats.TOST_POWER
    if source:
        m = measured(*source)
        sd, sd_source, df = (
            m["sd"],
            f"{source[0]}: {source[1]} at concurrency {source[2]}, {m['pairs']} pairs",
            m["pairs"] - 1,
        )
        pair_s, pair_source = m["pair_s"], sd_source
    else:
        alike = [(measured(LATE, config, c), c) for c in (8, 32)]
        (m, c_sd) = max(alike, key=lambda x: x[0]["sd"])
        sd, df = m["sd"], m["pairs"] - 1
        sd_source = f"assumed: {LATE}: {config} at concurrency {c_sd}, {m['pairs']} pairs"
        pair_s = measured(LATE, config, 32)["pair_s"]
        pair_source = f"assumed: {LATE}: {config} at concurrency 32"
    backend = config.split("_")[0]
    start_path, start_config = START_FROM[backend]
    start_s = record_of(start_path, start_config)["startup_s"]
    sd, pair_s = round(sd, 5), round(pair_s, 1)  # the plan's figures are the ones it is sized on
    n = ab_stats.tost_pairs(sd, margin, alpha, power)
    upper = sd_upper(sd, df)
    seconds = start_s + PRE_MEASURE_S + n * pair_s
    cell = {
        "config": config,
        "concurrency": concurrency,
        "sd_log_ratio": sd,
        "sd_source": sd_source,
        "sd_basis": basis,
        "alpha": alpha,
        "margin": margin,
        "power": power,
        "true_ratio_for_power": 1.0,
        "n_pairs": n,
        "t_crit": round(ab_stats.t_quantile(1 - alpha, n - 1), 6),
        "power_at_n": round(ab_stats.tost_power(n, sd, margin, alpha), 4),
        "sd_upper80": round(upper, 5),
        "n_pairs_at_sd_upper80": ab_stats.tost_pairs(upper, margin, alpha, power),
        "pair_s": pair_s,
        "pair_s_source": pair_source,
        "start_s": start_s,
        "start_s_source": f"{start_path}: {start_config}'s startup_s",
        "pre_measure_s": PRE_MEASURE_S,
        "est_device_s": round(seconds),
        "fits_budget": seconds <= BUDGET_S,
    }
    if not cell["fits_budget"]:
        cell["budget_note"] = (
            f"does not fit the {BUDGET_S} s this work may take of a session: {n} pairs of "
            f"{pair_s:.0f} s plus {start_s + PRE_MEASURE_S:.0f} s of start, exactness, warm-up "
            f"and calibration is about {seconds:.0f} s"
            + (
                f"; a session's whole {SESSION_DEVICE_S} s less its {SESSION_START_S} s of " f"start would hold it"
                if seconds <= SESSION_DEVICE_S - SESSION_START_S
                else "; more than a whole session"
            )
        )
    if basis not in (IN_DESIGN, PILOT):
        cell["pilot_first"] = (
            "its sd was not measured in the plan's design: first a pilot of 6 pairs in that "
            "design (ab_bench without --plan; its pairs are not part of the test), then a new "
            "version of this plan sized on the pilot's sd, committed before the test's run"
        )
    return cell


def command(cell: dict, plan_file: bool = True) -> str:
    """The device call that starts the cell's run (``ab_h200.sh wait`` follows, as for any A/B);
    the deadline is the session's, the run ends once its pairs are measured. Without
    ``plan_file``: the pilot's (6 pairs in the plan's design, not part of the test)."""
    d = DESIGN
    return (
        f"DEADLINE_S={SESSION_DEVICE_S - 160} WAIT_S=500 bash benchmark/gpu/ab_h200.sh start "
        + ("--plan benchmark/gpu/plans/parity-tost.json " if plan_file else "--pairs 6 ")
        + f"--mode {d['mode']} --cpu-split --round-seconds {d['round_seconds']} --round-margin {d['round_margin']} "
        f"--configs {cell['config']}@{cell['concurrency']}"
    )


def plan() -> dict:
    cells = [cell_plan(*c) for c in CELLS]
    for cell in cells:
        cell["command"] = command(cell)
        if "pilot_first" in cell:
            cell["pilot_command"] = command(cell, plan_file=False)
    return {
        "plan": "parity-tost",
        "version": VERSION,
        "versions": VERSIONS,
        "issue": 29,
        "question": "does the patch cost output tokens/s where 0.5.12 was already right? Equivalent when "
        "patched / unpatched is within ±2%",
        "test": "TOST on the mean of d = log(patched / unpatched output tokens/s) per pair, paired t with n - 1 "
        "degrees of freedom: equivalent when mean ± t_crit * sd / sqrt(n) lies inside (-margin, margin), "
        "t_crit = t's 1 - alpha quantile; on exactly the first n_pairs pairs of the cell, no verdict "
        "with fewer, none looked at beyond",
        "alpha": ab_stats.TOST_ALPHA,
        "margin": ab_stats.TOST_MARGIN,
        "margin_ratio": [round(math.exp(-ab_stats.TOST_MARGIN), 6), round(math.exp(ab_stats.TOST_MARGIN), 6)],
        "power": ab_stats.TOST_POWER,
        "design": DESIGN,
        "device": {
            "session_device_s": SESSION_DEVICE_S,
            "budget_s": BUDGET_S,
            "session_start_s": SESSION_START_S,
            "pre_measure_s_source": "docs/performance.md, 2026-12-01 (late): exactness, warm-up and "
            "calibration 107 s at one concurrency; machine start and "
            "transfers about 90 s, setup 61 s",
        },
        "generator": "benchmark/gpu/plans/parity_tost.py",
        "cells": cells,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="compare with the committed plan instead of writing it")
    ap.add_argument("--out", default=PLAN)
    a = ap.parse_args(argv)
    text = json.dumps(plan(), indent=1, ensure_ascii=False) + "\n"
    if a.check:
        with open(a.out) as f:
            same = f.read() == text
        print("the plan is what its generator writes" if same else f"{a.out} differs from what its generator writes")
        return 0 if same else 1
    with open(a.out, "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

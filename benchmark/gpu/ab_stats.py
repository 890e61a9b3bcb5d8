"""The arithmetic of ab_bench.py, kept free of servers so that it runs (and is tested) on a CPU.

* :func:`schedule`: the order of the measured rounds (ab_bench's sequential mode). Pair k runs
  every concurrency once per tree; within a pair the two trees alternate which goes first (A B,
  then B A, ...), so a drift of the machine over a pair's minute does not favour one tree.
* :func:`together_schedule`: the order of ab_bench's together mode, where both trees run each
  pair's round at the same time: no tree goes first.
* :func:`ratio_summary`: per (configuration, concurrency), the patched / unpatched ratio of
  output tokens/s of each pair, its median and a percentile-bootstrap 95% interval of that
  median (seeded; only from MIN_PAIRS_FOR_CI pairs on), the spread of log ratios and the pairs a
  ±2% interval would need.
* :func:`pairs_needed`: from the measured spread, how many pairs (at this round length, and at
  a longer one) bring the 95% half-width of the median ratio to ±2%. Normal approximation:
  half-width = z * 1.2533 * sd(log ratio) / sqrt(pairs) (1.2533 = sqrt(pi / 2), the median's
  standard error over the mean's); longer rounds are assumed to shrink sd as 1 / sqrt(seconds)
  (independent noise within a round), which is an assumption, not a measurement.
* :func:`memory_check`: the kv_indices CUDA-graph rows measured in the running server (the
  memory probe of trace/sitecustomize.py) against benchmark/kv_indices_memory.py's formula.
"""

from __future__ import annotations

import math
import os
import random
import statistics
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(_HERE, ".."), os.path.join(_HERE, "..", "..", "python")]

from kv_indices_memory import BACKENDS  # noqa: E402

from sglang_draft_layout.speculative.spec_utils import draft_kv_indices_buffer_width  # noqa: E402

TREES = ("unpatched", "patched")  # A, B
Z95 = 1.959964
MEDIAN_SE_FACTOR = math.sqrt(math.pi / 2)  # standard error of a median over that of a mean (normal data)
PARITY_BAND = 0.02
#: below this many pairs no interval is given: a bootstrap over 2-5 values only restates their range
MIN_PAIRS_FOR_CI = 6


def schedule(pairs: int, concurrencies: list[int]) -> list[tuple[int, int, str]]:
    """(pair, concurrency, tree) in run order: per pair every concurrency, both trees, the first
    tree alternating from one (pair, concurrency) slot to the next."""
    order, slot = [], 0
    for k in range(pairs):
        for c in concurrencies:
            trees = TREES if slot % 2 == 0 else TREES[::-1]
            order += [(k, c, tree) for tree in trees]
            slot += 1
    return order


def together_schedule(pairs: int, concurrencies: list[int]) -> list[tuple[int, int]]:
    """(pair, concurrency) in run order when both trees run a pair's rounds at the same time."""
    return [(k, c) for k in range(pairs) for c in concurrencies]


def bootstrap_median_ci(values: list[float], level: float = 0.95, n_boot: int = 20000,
                        seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the median of ``values`` (resampled with replacement)."""
    if not values:
        raise ValueError("no values")
    rng = random.Random(seed)
    n = len(values)
    meds = sorted(statistics.median(rng.choices(values, k=n)) for _ in range(n_boot))
    lo = meds[int(math.floor((1 - level) / 2 * (n_boot - 1)))]
    hi = meds[int(math.ceil((1 + level) / 2 * (n_boot - 1)))]
    return lo, hi


def pairs_needed(sd_log: float, halfwidth: float = PARITY_BAND, z: float = Z95) -> int:
    """Pairs for a 95% half-width of ``halfwidth`` (relative) on the median ratio, given the
    standard deviation of the pairs' log ratios."""
    if sd_log <= 0:
        return 2
    return max(2, math.ceil((z * MEDIAN_SE_FACTOR * sd_log / math.log1p(halfwidth)) ** 2))


def sd_at_round_seconds(sd_log: float, measured_s: float, wanted_s: float) -> float:
    """The spread expected at rounds of ``wanted_s`` seconds if noise averages out within a round."""
    return sd_log * math.sqrt(measured_s / wanted_s)


def verdict(lo: float, hi: float, band: float = PARITY_BAND) -> str:
    if 1 - band <= lo and hi <= 1 + band:
        return f"within ±{band:.0%}"
    if lo > 1:
        return "patched faster"
    if hi < 1:
        return "patched slower"
    return f"not resolved to ±{band:.0%}"


def ratio_summary(pairs: list[tuple[dict, dict]], round_seconds: float | None = None) -> dict:
    """Summary of one (configuration, concurrency): ``pairs`` holds (unpatched, patched) rounds,
    each a bench_serving result with ``output_throughput``."""
    ratios = [b["output_throughput"] / a["output_throughput"] for a, b in pairs]
    out: dict = {"pairs": len(ratios), "ratios": ratios}
    if not ratios:
        return out
    out["ratio_median"] = statistics.median(ratios)
    out["ratio_min"], out["ratio_max"] = min(ratios), max(ratios)
    if len(ratios) >= 2:
        logs = [math.log(r) for r in ratios]
        sd = statistics.stdev(logs)
        out.update(sd_log_ratio=sd, pairs_for_2pct=pairs_needed(sd))
        if len(ratios) >= MIN_PAIRS_FOR_CI:
            lo, hi = bootstrap_median_ci(ratios)
            out.update(ci_low=lo, ci_high=hi, verdict=verdict(lo, hi))
        else:
            out["verdict"] = f"{len(ratios)} pairs: too few for a 95% interval (min-max given)"
        if round_seconds:
            out["round_seconds"] = round_seconds
            out["pairs_for_2pct_at_60s_rounds"] = pairs_needed(sd_at_round_seconds(sd, round_seconds, 60))
    return out


def tree_summary(rounds: list[dict]) -> dict:
    """Medians over one tree's rounds: tokens/s, round medians and p99s of TTFT and ITL, accept length."""
    def med(key):
        xs = [r[key] for r in rounds if r.get(key) is not None]
        return statistics.median(xs) if xs else None

    return {"rounds": len(rounds), "tokens_per_s": med("output_throughput"),
            "ttft_median_ms": med("median_ttft_ms"), "ttft_p99_ms": med("p99_ttft_ms"),
            "itl_median_ms": med("median_itl_ms"), "itl_p99_ms": med("p99_itl_ms"),
            "accept_length": med("accept_length"), "round_seconds": med("duration")}


def formula_rows_bytes(backend: str, tree: str, steps: int, max_bs: int, topk: int, ctx: int) -> int:
    """kv_indices_memory.py's bytes of the draft CUDA-graph rows (all ``steps`` rows)."""
    dtype_bytes, unpatched_width = BACKENDS[backend]
    width = unpatched_width(max_bs, topk, ctx) if tree == "unpatched" else \
        draft_kv_indices_buffer_width(max_bs, topk, ctx)
    return steps * width * dtype_bytes


def memory_check(record: dict, backend: str, tree: str) -> dict:
    """One probe record (trace/sitecustomize.py) against the formula at the server's own
    max_bs (the first int argument of init_cuda_graph_state), topk, steps and context."""
    max_bs = record["args"][0]
    want = formula_rows_bytes(backend, tree, record["steps"], max_bs, record["topk"], record["max_context_len"])
    return {"tree": tree, "backend": backend, "max_bs": max_bs, "topk": record["topk"], "steps": record["steps"],
            "ctx": record["max_context_len"], "formula_bytes": want, "rows_bytes": record.get("rows_bytes"),
            "allocated_diff": record["allocated_diff"], "rows_equal_formula": record.get("rows_bytes") == want,
            "allocation_covers_rows": record["allocated_diff"] >= want}

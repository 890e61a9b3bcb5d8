"""The arithmetic of ab_bench.py, kept free of servers so that it runs (and is tested) on a CPU.

* :func:`schedule`: the order of the measured rounds (ab_bench's sequential mode). Pair k runs
  every concurrency once per tree; within a pair the two trees alternate which goes first (A B,
  then B A, ...), so a drift of the machine over a pair's minute does not favour one tree.
* :func:`together_schedule`: the order of ab_bench's together mode, where both trees run each
  pair's round at the same time: no tree goes first.
* :func:`pair_mode`, :func:`both_schedule`: ab_bench's ``--mode both``, which measures the mode's
  bias (issue 29): on the same servers the pairs alternate between together and sequential in the
  order T S S T (repeated), so a drift that is linear over four pairs favours neither mode; each
  block of two pairs (0-1, 2-3, ...) holds one of each. :func:`mode_bias`: the blocks' differences
  of log ratio, together minus sequential, and how much of the sequential log ratio together keeps.
* :func:`ratio_summary`: per (configuration, concurrency), the patched / unpatched ratio of
  output tokens/s of each pair, its median and a percentile-bootstrap 95% interval of that
  median (seeded; only from MIN_PAIRS_FOR_CI pairs on; descriptive: in simulation it covered the
  true median 92.5-94% of the time, not 95%), the spread of log ratios, and, for a cell of a
  pre-registered plan (benchmark/gpu/plans/), the plan's verdict (:func:`tost_verdict`).
* The parity test (issue 29): two one-sided tests (TOST) on the mean of the pairs' log ratios
  ``d = log(patched / unpatched)``, paired t, each side at ``alpha`` 0.05 against the margin
  ``log(1.02)``: equivalent within ±2% when the 90% t interval of the mean lies inside
  ``(-log 1.02, log 1.02)``. :func:`tost_power` is its exact power (the sample sd integrated over
  its chi distribution), :func:`tost_pairs` the smallest pair count with 80% power at a given sd
  of d and a true ratio of 1 (replacing the old ``pairs_needed``, whose count gave a ratio of
  exactly 1 a 20-23% chance of coming out within ±2%). Both need scipy (planning, on a CPU);
  :func:`tost_verdict` needs only the critical t value the plan recorded, so ab_bench on the GPU
  machine never imports scipy.
* :func:`memory_check`: the kv_indices CUDA-graph rows measured in the running server (the
  memory probe of trace/sitecustomize.py) against benchmark/kv_indices_memory.py's formula.
"""

from __future__ import annotations

import hashlib
import json
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


MODES = ("together", "sequential")


def pair_mode(mode: str, k: int) -> str:
    """The mode pair ``k`` runs in: ``mode`` itself, or with ``both`` together for k % 4 in (0, 3)
    and sequential for k % 4 in (1, 2) (T S S T, ...)."""
    if mode != "both":
        return mode
    return MODES[0] if k % 4 in (0, 3) else MODES[1]


def both_schedule(pairs: int, concurrencies: list[int]) -> list[tuple[int, int, tuple[str, ...]]]:
    """(pair, concurrency, trees run at once) in run order for ``--mode both``: a together pair runs
    both trees at once; a sequential one runs them one after the other, the first tree alternating
    from one sequential (pair, concurrency) slot to the next, as :func:`schedule` does."""
    order, slot = [], 0
    for k in range(pairs):
        for c in concurrencies:
            if pair_mode("both", k) == "together":
                order.append((k, c, TREES))
            else:
                order += [(k, c, (tree,)) for tree in (TREES if slot % 2 == 0 else TREES[::-1])]
                slot += 1
    return order


def mode_bias(ratios: dict[int, float], t_crit: float | None = None, n_boot: int = 20000, seed: int = 0) -> dict:
    """``--mode both``'s bias from the patched / unpatched ratio of each pair (pair index -> ratio):
    per complete block of two pairs b (pairs 2b and 2b + 1, one in each mode, see :func:`pair_mode`),
    ``d_b = log(together ratio) - log(sequential ratio)``, paired within the block so that the
    machine's slow drift cancels. Gives the blocks, the mean of d and its sd, the mean as a ratio of
    ratios, and ``kept``: the mean together log ratio over the mean sequential one (1: together
    shows the sequential ratio, 0: it pulls it all the way to 1), with a percentile-bootstrap 95%
    interval over the blocks (seeded). With ``t_crit`` (t's 0.975 quantile at blocks - 1 degrees of
    freedom) also the 95% t interval of the ratio of ratios."""
    blocks = []
    for b in sorted({k // 2 for k in ratios}):
        pair = {pair_mode("both", k): math.log(ratios[k]) for k in (2 * b, 2 * b + 1) if k in ratios}
        if len(pair) == 2:
            blocks.append((pair["together"], pair["sequential"]))
    out: dict = {"blocks": len(blocks)}
    if len(blocks) < 2:
        return out
    d = [t - s for t, s in blocks]
    mean, sd = statistics.mean(d), statistics.stdev(d)

    def kept(sample: list[tuple[float, float]]) -> float:
        seq = statistics.mean(s for _, s in sample)
        return statistics.mean(t for t, _ in sample) / seq if seq else math.nan

    rng = random.Random(seed)
    boots = sorted(kept(rng.choices(blocks, k=len(blocks))) for _ in range(n_boot))
    out.update(
        mean_log_diff=mean,
        sd_log_diff=sd,
        ratio_of_ratios=math.exp(mean),
        together_ratio=math.exp(statistics.mean(t for t, _ in blocks)),
        sequential_ratio=math.exp(statistics.mean(s for _, s in blocks)),
        kept=kept(blocks),
        kept_ci95=(boots[int(0.025 * (n_boot - 1))], boots[int(math.ceil(0.975 * (n_boot - 1)))]),
    )
    if t_crit is not None:
        half = t_crit * sd / math.sqrt(len(d))
        out["ratio_of_ratios_ci95"] = (math.exp(mean - half), math.exp(mean + half))
    return out


def bootstrap_median_ci(
    values: list[float], level: float = 0.95, n_boot: int = 20000, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap interval of the median of ``values`` (resampled with replacement)."""
    if not values:
        raise ValueError("no values")
    rng = random.Random(seed)
    n = len(values)
    meds = sorted(statistics.median(rng.choices(values, k=n)) for _ in range(n_boot))
    lo = meds[int(math.floor((1 - level) / 2 * (n_boot - 1)))]
    hi = meds[int(math.ceil((1 + level) / 2 * (n_boot - 1)))]
    return lo, hi


TOST_ALPHA = 0.05
TOST_MARGIN = math.log1p(PARITY_BAND)  # log(1.02): ratios within (1 / 1.02, 1.02)
TOST_POWER = 0.8


def _scipy():
    """scipy's stats and integrate (planning and reports on a CPU only; see the module docstring)."""
    from scipy import integrate, stats

    return stats, integrate


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom."""
    stats, _ = _scipy()
    return float(stats.t.ppf(p, df))


def tost_power(
    n: int, sd: float, margin: float = TOST_MARGIN, alpha: float = TOST_ALPHA, true_log_ratio: float = 0.0
) -> float:
    """Probability that the TOST on ``n`` pairs passes when the pairs' log ratios are normal with
    mean ``true_log_ratio`` and standard deviation ``sd``. Exact: the mean and the sample sd s are
    independent, and the test passes when ``-margin + t s / sqrt(n) < mean < margin - t s / sqrt(n)``,
    so the pass probability given s is a difference of two normal cdfs, integrated over
    ``s^2 = sd^2 * chi2(n - 1) / (n - 1)``."""
    if n < 2:
        raise ValueError("the TOST needs at least 2 pairs")
    stats, integrate = _scipy()
    df = n - 1
    t = t_quantile(1 - alpha, df)
    se = sd / math.sqrt(n)
    u_max = df * (margin * math.sqrt(n) / (t * sd)) ** 2  # above it the interval is wider than the band

    def given(u: float) -> float:
        half = t * sd * math.sqrt(u / df) / math.sqrt(n)
        inside = stats.norm.cdf((margin - half - true_log_ratio) / se) - stats.norm.cdf(
            (-margin + half - true_log_ratio) / se
        )
        return max(inside, 0.0) * stats.chi2.pdf(u, df)

    return float(integrate.quad(given, 0, u_max, limit=200)[0])


def tost_pairs(
    sd: float,
    margin: float = TOST_MARGIN,
    alpha: float = TOST_ALPHA,
    power: float = TOST_POWER,
    true_log_ratio: float = 0.0,
    n_max: int = 5000,
) -> int:
    """The smallest pair count whose TOST has ``power`` at this ``sd`` of the log ratios (the power
    grows with n: doubled until it suffices, then bisected)."""

    def enough(n: int) -> bool:
        return tost_power(n, sd, margin, alpha, true_log_ratio) >= power

    lo, hi = 1, 2  # not enough at lo (1 pair has no test), enough at hi once found
    while not enough(hi):
        lo, hi = hi, 2 * hi
        if hi > n_max:
            raise ValueError(f"more than {n_max} pairs for sd {sd}")
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if enough(mid) else (mid, hi)
    return hi


def tost(log_ratios: list[float], t_crit: float, margin: float = TOST_MARGIN) -> dict:
    """The TOST over ``log_ratios`` at the critical value ``t_crit`` (t's 1 - alpha quantile at
    n - 1 degrees of freedom): the mean, its 1 - 2 alpha interval (as ratios) and whether that
    interval lies inside the margin (both one-sided nulls rejected)."""
    n = len(log_ratios)
    if n < 2:
        raise ValueError("the TOST needs at least 2 pairs")
    mean, sd = statistics.mean(log_ratios), statistics.stdev(log_ratios)
    lo, hi = mean - t_crit * sd / math.sqrt(n), mean + t_crit * sd / math.sqrt(n)
    return {
        "n": n,
        "mean_log_ratio": mean,
        "sd_log_ratio": sd,
        "ratio_mean": math.exp(mean),
        "ci_low": math.exp(lo),
        "ci_high": math.exp(hi),
        "passed": -margin < lo and hi < margin,
    }


def load_plan(path: str) -> dict:
    """A pre-registered plan (benchmark/gpu/plans/), with its file name and sha256 added."""
    with open(path, "rb") as f:
        data = f.read()
    plan = json.loads(data)
    plan["file"], plan["sha256"] = path, hashlib.sha256(data).hexdigest()
    return plan


def plan_cell(plan: dict, config: str, concurrency: int) -> dict | None:
    """The plan's cell for (configuration, concurrency), or None."""
    return next((c for c in plan["cells"] if (c["config"], c["concurrency"]) == (config, concurrency)), None)


def tost_verdict(ratios: list[float], cell: dict) -> dict:
    """A plan cell's verdict over a cell's pair ratios in pair order: the TOST on exactly the
    first ``cell["n_pairs"]`` pairs, the number fixed before the run (pairs beyond it are not
    looked at; with fewer there is no verdict: no optional stopping either way)."""
    n = cell["n_pairs"]
    out = {"n_planned": n, "pairs_measured": len(ratios), "level": 1 - 2 * cell["alpha"]}
    if len(ratios) < n:
        out["verdict"] = f"incomplete: {len(ratios)} of the {n} planned pairs, no verdict"
        return out
    out.update(tost([math.log(r) for r in ratios[:n]], cell["t_crit"], cell["margin"]))
    out["verdict"] = (
        f"equivalent within ±{PARITY_BAND:.0%} (TOST, {n} planned pairs)"
        if out["passed"]
        else f"not shown within ±{PARITY_BAND:.0%} (TOST, {n} planned pairs)"
    )
    return out


def verdict(lo: float, hi: float, band: float = PARITY_BAND) -> str:
    if 1 - band <= lo and hi <= 1 + band:
        return f"within ±{band:.0%}"
    if lo > 1:
        return "patched faster"
    if hi < 1:
        return "patched slower"
    return f"not resolved to ±{band:.0%}"


def ratio_summary(
    pairs: list[tuple[dict, dict]], round_seconds: float | None = None, plan_cell: dict | None = None
) -> dict:
    """Summary of one (configuration, concurrency): ``pairs`` holds (unpatched, patched) rounds
    in pair order, each a bench_serving result with ``output_throughput``; ``plan_cell``: its
    cell of a pre-registered plan, whose TOST verdict goes under ``tost``."""
    ratios = [b["output_throughput"] / a["output_throughput"] for a, b in pairs]
    out: dict = {"pairs": len(ratios), "ratios": ratios}
    if round_seconds:
        out["round_seconds"] = round_seconds
    if plan_cell:
        out["tost"] = tost_verdict(ratios, plan_cell)
    if not ratios:
        return out
    out["ratio_median"] = statistics.median(ratios)
    out["ratio_min"], out["ratio_max"] = min(ratios), max(ratios)
    if len(ratios) >= 2:
        out["sd_log_ratio"] = statistics.stdev([math.log(r) for r in ratios])
        if len(ratios) >= MIN_PAIRS_FOR_CI:
            lo, hi = bootstrap_median_ci(ratios)
            out.update(ci_low=lo, ci_high=hi, verdict=verdict(lo, hi))
        else:
            out["verdict"] = f"{len(ratios)} pairs: too few for a 95% interval (min-max given)"
    return out


def tree_summary(rounds: list[dict]) -> dict:
    """Medians over one tree's rounds: tokens/s, round medians and p99s of TTFT and ITL, the
    accept length of the server's decode windows while the rounds ran (ab_bench.server_accept_length;
    None for records written before it) and bench_serving's (the server's average since start)."""

    def med(key):
        xs = [r[key] for r in rounds if r.get(key) is not None]
        return statistics.median(xs) if xs else None

    return {
        "rounds": len(rounds),
        "tokens_per_s": med("output_throughput"),
        "ttft_median_ms": med("median_ttft_ms"),
        "ttft_p99_ms": med("p99_ttft_ms"),
        "itl_median_ms": med("median_itl_ms"),
        "itl_p99_ms": med("p99_itl_ms"),
        "accept_length": med("accept_length_windows"),
        "accept_length_since_start": med("accept_length"),
        "round_seconds": med("duration"),
    }


def formula_rows_bytes(backend: str, tree: str, steps: int, max_bs: int, topk: int, ctx: int) -> int:
    """kv_indices_memory.py's bytes of the draft CUDA-graph rows (all ``steps`` rows)."""
    dtype_bytes, unpatched_width = BACKENDS[backend]
    width = (
        unpatched_width(max_bs, topk, ctx) if tree == "unpatched" else draft_kv_indices_buffer_width(max_bs, topk, ctx)
    )
    return steps * width * dtype_bytes


def memory_check(record: dict, backend: str, tree: str) -> dict:
    """One probe record (trace/sitecustomize.py) against the formula at the server's own
    max_bs (the first int argument of init_cuda_graph_state), topk, steps and context."""
    max_bs = record["args"][0]
    want = formula_rows_bytes(backend, tree, record["steps"], max_bs, record["topk"], record["max_context_len"])
    return {
        "tree": tree,
        "backend": backend,
        "max_bs": max_bs,
        "topk": record["topk"],
        "steps": record["steps"],
        "ctx": record["max_context_len"],
        "formula_bytes": want,
        "rows_bytes": record.get("rows_bytes"),
        "allocated_diff": record["allocated_diff"],
        "rows_equal_formula": record.get("rows_bytes") == want,
        "allocation_covers_rows": record["allocated_diff"] >= want,
    }

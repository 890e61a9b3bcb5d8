"""benchmark/helper_overhead.py's sum per decode iteration: which per-call differences it adds up,
and that every one it needs is a case the script times."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmark"
sys.path.insert(0, str(BENCH))
import helper_overhead  # noqa: E402


def test_per_iteration_adds_the_layout_the_width_and_steps_minus_one_used_lengths():
    diffs = {
        "out_cache_loc layout": -700.0,
        "row width (int)": 50.0,
        "used length (int)": 30.0,
        "site: capacity check": 200.0,
    }
    assert helper_overhead.per_iteration_ns(diffs, steps=3) == {"triton": -590.0, "flashinfer": -390.0}
    assert helper_overhead.per_iteration_ns(diffs, steps=8)["triton"] == -700.0 + 50.0 + 7 * 30.0


def test_every_difference_the_sum_needs_is_timed():
    timed = {name for name, *_ in helper_overhead.cases(1, 1, 3, 16, 4, device="cpu")}
    diffs = dict.fromkeys(timed, 1.0)
    assert helper_overhead.per_iteration_ns(diffs, steps=3) == {"triton": 4.0, "flashinfer": 5.0}

"""benchmark/gpu/serve_checks.py's request length: a multiple of num_steps + 1 for every step
count, so ``accept_all_exact`` (accept length == num_steps + 1) means the same in every config."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from sglang_draft_layout.tiny_models import EXPECTED_NEW

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmark" / "gpu"))
import serve_checks  # noqa: E402


@pytest.mark.parametrize("steps", range(1, 9))
def test_length_is_the_smallest_multiple_of_steps_plus_one_from_64(steps):
    n = serve_checks.max_new_tokens(steps)
    assert n % (steps + 1) == 0
    assert serve_checks.MIN_NEW_TOKENS <= n < serve_checks.MIN_NEW_TOKENS + steps + 1
    # the non-spec reference and the stored rule continuation cover every spec request
    assert n <= serve_checks.NONSPEC_NEW_TOKENS <= EXPECTED_NEW


def test_four_steps_no_longer_get_72_tokens():
    """72 tokens at 4 steps end on a partial verify: accept length 4.8 on an exact draft."""
    assert serve_checks.max_new_tokens(4) == 65


def test_every_named_config_has_a_length_its_steps_divide():
    for name in dict.fromkeys(n for names in serve_checks.SETS.values() for n in names):
        steps = serve_checks.parse(name)["steps"]
        if steps is not None:
            assert serve_checks.max_new_tokens(steps) % (steps + 1) == 0, name

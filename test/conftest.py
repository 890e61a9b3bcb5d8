"""Shared by every test folder: test/ on sys.path (for ``support``), and the strict-skips
plugin (support/strict_skips.py: with SGLANG_DRAFT_LAYOUT_STRICT_SKIPS=1, as in .ci/run, a
skipped test fails the run unless it is a gpu test skipped for lack of CUDA)."""

import sys
from pathlib import Path

import pytest

_TEST_DIR = str(Path(__file__).resolve().parent)
if _TEST_DIR not in sys.path:
    sys.path.insert(0, _TEST_DIR)

pytest_plugins = ["support.strict_skips"]


@pytest.fixture(autouse=True)
def whole_lines(monkeypatch):
    """A terminal wider than any line a test makes, so that the CLI wraps none (its output,
    stdout and stderr, fits ``COLUMNS``): tests of the width set their own."""
    monkeypatch.setenv("COLUMNS", "100000")

"""Shared by every test folder: test/ on sys.path (for ``support``), the strict-skips
plugin (support/strict_skips.py: with SGLANG_DRAFT_LAYOUT_STRICT_SKIPS=1, as in .ci/run, a
skipped test fails the run unless it is a gpu test skipped for lack of CUDA), parsed
trees shared across the session's plans, and one process a plan in a pytest-xdist worker."""

import os
import sys
from pathlib import Path

import pytest

from sglang_draft_layout.layout_patterns.ast_walk import parsing_once

_TEST_DIR = str(Path(__file__).resolve().parent)
if _TEST_DIR not in sys.path:
    sys.path.insert(0, _TEST_DIR)

pytest_plugins = ["support.strict_skips"]

if os.environ.get("PYTEST_XDIST_WORKER"):
    # a worker per core (-n auto) keeps each busy: the tool's second process (harness/apart.py) would only add its
    # CPU; test/unit/test_harness_apart.py runs it, and the CLI with it against one process
    os.environ.setdefault("SGLANG_DRAFT_LAYOUT_JOBS", "1")


@pytest.fixture(scope="session", autouse=True)
def parsed_trees_shared():
    """The plans of a test process share their parsed trees (``parsing_once``, 1024 kept, some 700 MB
    at most): the tests patch and judge the same release files again and again. The CLI keeps them
    for one plan."""
    with parsing_once(kept=1024):
        yield


@pytest.fixture(scope="session")
def warm_python(tmp_path_factory):
    """warm_python(venv's python) -> a ``python3`` of that venv that starts warm (support/warm_python.py:
    torch and transformers imported once, a child forked per command), one server a venv a test process."""
    from support import warm_python as warm

    servers: dict = {}

    def get(python: Path) -> Path:
        if python not in servers:
            servers[python] = warm.start(python, tmp_path_factory.mktemp("warm-python"))
        return servers[python][0]

    yield get
    for _python3, server in servers.values():
        warm.stop(server)


@pytest.fixture(autouse=True)
def whole_lines(monkeypatch):
    """A terminal wider than any line a test makes, so that the CLI wraps none of its output (which
    fits ``COLUMNS``; stderr is wrapped only on a terminal): tests of the width set their own."""
    monkeypatch.setenv("COLUMNS", "100000")

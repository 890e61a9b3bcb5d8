"""Fixtures of the fork CI tests: a scratch fork checkout (scratch_fork.py) and the proof venv's
``python3``, warm (support/warm_python.py: torch and transformers imported once per test process)."""

from __future__ import annotations

from pathlib import Path

import pytest

from scratch_fork import VERSION, make_fork


@pytest.fixture
def fork(tmp_path) -> Path:
    return make_fork(tmp_path / "my-sglang-fork")


@pytest.fixture(scope="session")
def proof_python(tmp_path_factory):
    from support import warm_python
    from support.sglang_venv import proof_venv

    python3, server = warm_python.start(proof_venv(VERSION), tmp_path_factory.mktemp("warm-python"))
    yield python3
    warm_python.stop(server)

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
def proof_python(warm_python) -> Path:
    from support.sglang_venv import proof_venv

    return warm_python(proof_venv(VERSION))

"""Fixtures of the fork CI tests: a scratch fork checkout (scratch_fork.py) and the proof venv."""

from __future__ import annotations

from pathlib import Path

import pytest

from scratch_fork import VERSION, make_fork


@pytest.fixture
def fork(tmp_path) -> Path:
    return make_fork(tmp_path / "my-sglang-fork")


@pytest.fixture(scope="module")
def proof_python():
    from support.sglang_venv import proof_venv

    return proof_venv(VERSION)

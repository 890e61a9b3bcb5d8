"""The project formats its own code with black (``[tool.black]`` in pyproject.toml); what it writes
into SGLang (the helpers, the fork test templates) is laid out as SGLang's black (24.10.0, 88
columns) lays it out."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: the project's own code
OWN = ("python", "test", "benchmark")
#: code written into SGLang trees, kept at SGLang's layout (pyproject's extend-exclude)
INTO_SGLANG = (
    "python/sglang_draft_layout/speculative",
    "python/sglang_draft_layout/fork_templates",
    "python/sglang_draft_layout/tiny_models.py",  # embedded in the written GPU test
)


def black_check(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "black", "--check", *args], cwd=ROOT, capture_output=True, text=True)


def test_own_code_is_black_formatted():
    result = black_check(*OWN)
    assert result.returncode == 0, result.stderr
    assert "left unchanged" in result.stderr  # it found files to check


def test_code_written_into_sglang_is_laid_out_as_sglang_lays_it_out():
    result = black_check("-l", "88", "--extend-exclude", "^$", *INTO_SGLANG)
    assert result.returncode == 0, result.stderr
    assert "8 files would be left unchanged" in result.stderr


def test_a_misformatted_file_fails_the_check(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("x = ( 1 )\n")
    assert black_check(str(bad)).returncode == 1

"""A scratch fork checkout of SGLang 0.5.12, laid out as a fork: python/sglang/ (every file of
the wheel's package, so it imports), python/pyproject.toml with a dynamic version, test/registered/,
and a git repository around it."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path

from support.sglang_release import pristine_tree, require_release

VERSION = "0.5.12"
FORK_PYPROJECT = """[project]
name = "sglang"
dynamic = ["version"]

[tool.setuptools_scm]
root = ".."
"""
CPU_TEST = "test/registered/unit/speculative/test_draft_layout.py"
GPU_TEST = "test/registered/spec/eagle/test_draft_layout_exact.py"


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=fork", "-c", "user.email=fork@example.com", *args],
                          cwd=cwd, check=True, capture_output=True, text=True).stdout


def make_fork(root: Path) -> Path:
    """The fork checkout at root (a git repository with one commit)."""
    require_release(VERSION)
    shutil.copytree(pristine_tree(VERSION) / "sglang", root / "python" / "sglang")
    (root / "python" / "sglang" / "_version.py").unlink()
    (root / "python" / "pyproject.toml").write_text(FORK_PYPROJECT)
    (root / "test" / "registered" / "unit").mkdir(parents=True)
    (root / "test" / "registered" / "unit" / "test_existing.py").write_text("")
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "fork")
    return root



def ci_register(fork: Path):
    """0.5.12's own sglang/test/ci/ci_register.py (stdlib only), loaded by path."""
    spec = importlib.util.spec_from_file_location(
        "ci_register_0512", fork / "python/sglang/test/ci/ci_register.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

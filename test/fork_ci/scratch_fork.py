"""A scratch fork checkout of an SGLang release, laid out as a fork: python/sglang/ (every file of
the wheel's package, so it imports), python/pyproject.toml with a dynamic version, test/registered/,
test/run_suite.py (a fixture of the release's era, fixtures/run_suite/), and a git repository
around it (its objects borrowed from the release's: support/git_objects.py). By default 0.5.12
with its era's run_suite.py."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path
from typing import Optional

from support.git_objects import borrow_objects
from support.sglang_release import pristine_tree, require_release

VERSION = "0.5.12"
RUN_SUITES = Path(__file__).resolve().parent / "fixtures" / "run_suite"
FORK_PYPROJECT = """[project]
name = "sglang"
dynamic = ["version"]

[tool.setuptools_scm]
root = ".."
"""
CPU_TEST = "test/registered/unit/speculative/test_draft_layout.py"
GPU_TEST = "test/registered/spec/eagle/test_draft_layout_exact.py"


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=fork", "-c", "user.email=fork@example.com", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        text=True,
    ).stdout


def make_fork(
    root: Path, version: str = VERSION, run_suite: Optional[str] = "v0.5.12", ci_register: Optional[str] = None
) -> Path:
    """The fork checkout at root (a git repository with one commit) of sglang==version, with
    fixtures/run_suite/<run_suite>.py as test/run_suite.py (None: the fork has none) and
    fixtures/run_suite/<ci_register>.py over its python/sglang/test/ci/ci_register.py."""
    require_release(version)
    shutil.copytree(pristine_tree(version) / "sglang", root / "python" / "sglang")
    (root / "python" / "sglang" / "_version.py").unlink(missing_ok=True)
    (root / "python" / "pyproject.toml").write_text(FORK_PYPROJECT)
    (root / "test" / "registered" / "unit").mkdir(parents=True)
    (root / "test" / "registered" / "unit" / "__init__.py").write_text("")
    if run_suite is not None:
        shutil.copy(RUN_SUITES / f"{run_suite}.py", root / "test" / "run_suite.py")
    if ci_register is not None:
        shutil.copy(RUN_SUITES / f"{ci_register}.py", root / "python" / "sglang" / "test" / "ci" / "ci_register.py")
    git(root, "init", "-q")
    borrow_objects(root, version)
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "fork")
    return root


def ci_register(fork: Path):
    """0.5.12's own sglang/test/ci/ci_register.py (stdlib only), loaded by path."""
    spec = importlib.util.spec_from_file_location("ci_register_0512", fork / "python/sglang/test/ci/ci_register.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

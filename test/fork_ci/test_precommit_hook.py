"""The pre-commit hook (.pre-commit-hooks.yaml): valid by pre-commit's own schema, and run by
`pre-commit try-repo` (a venv with this repository pip-installed) on a scratch fork: red before
`apply`, green after."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_draft_layout import cli
from sglang_draft_layout.releases import cache_dir

pytestmark = pytest.mark.releases
REPO = Path(__file__).resolve().parents[2]
HOOK = "sglang-draft-layout"


def test_manifest_is_valid():
    from pre_commit.clientlib import load_manifest

    [hook] = load_manifest(str(REPO / ".pre-commit-hooks.yaml"))
    assert (hook["id"], hook["language"], hook["pass_filenames"], hook["always_run"]) == \
        (HOOK, "python", False, True)
    assert hook["entry"] == "sglang-draft-layout check ."


def try_repo(fork: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PRE_COMMIT_HOME=str(cache_dir() / "pre-commit"))
    return subprocess.run([sys.executable, "-m", "pre_commit", "try-repo", str(REPO), HOOK, "--all-files"],
                          cwd=fork, env=env, capture_output=True, text=True, timeout=900)


def test_hook_is_red_before_apply_and_green_after(fork, capsys):
    before = try_repo(fork)
    assert before.returncode == 1, before.stdout + before.stderr
    assert "to patch" in before.stdout and "Failed" in before.stdout
    assert cli.main(["apply", str(fork)]) == 0
    after = try_repo(fork)
    assert after.returncode == 0, after.stdout + after.stderr
    assert "Passed" in after.stdout

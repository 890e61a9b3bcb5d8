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
FIXING_HOOK = "sglang-draft-layout-apply"


def test_manifest_is_valid():
    from pre_commit.clientlib import load_manifest

    hooks = {hook["id"]: hook for hook in load_manifest(str(REPO / ".pre-commit-hooks.yaml"))}
    assert set(hooks) == {HOOK, FIXING_HOOK}
    for hook in hooks.values():
        assert (hook["language"], hook["pass_filenames"], hook["always_run"]) == ("python", False, True)
    assert hooks[HOOK]["entry"] == "sglang-draft-layout check ."
    assert hooks[FIXING_HOOK]["entry"] == "sglang-draft-layout apply --exit-non-zero-on-fix ."


def try_repo(fork: Path, hook: str = HOOK) -> subprocess.CompletedProcess:
    env = dict(os.environ, PRE_COMMIT_HOME=str(cache_dir() / "pre-commit"), NO_COLOR="1")
    return subprocess.run([sys.executable, "-m", "pre_commit", "try-repo", str(REPO), hook, "--all-files"],
                          cwd=fork, env=env, capture_output=True, text=True, timeout=900)


def test_hook_is_red_before_apply_and_green_after(fork, capsys):
    before = try_repo(fork)
    assert before.returncode == 1, before.stdout + before.stderr
    assert "to patch" in before.stdout and "Failed" in before.stdout
    assert "next: run\n  sglang-draft-layout apply .\n" in before.stdout
    assert cli.main(["apply", str(fork)]) == 0
    after = try_repo(fork)
    assert after.returncode == 0, after.stdout + after.stderr
    assert "Passed" in after.stdout


def test_fixing_hook_patches_and_fails_like_black_then_passes(fork):
    fixed = try_repo(fork, FIXING_HOOK)
    assert fixed.returncode == 1, fixed.stdout + fixed.stderr
    assert "Failed" in fixed.stdout and "files were modified by this hook" in fixed.stdout
    assert "git add test/registered/" in fixed.stdout
    assert cli.main(["check", str(fork)]) == 0
    again = try_repo(fork, FIXING_HOOK)
    assert again.returncode == 0 and "Passed" in again.stdout, again.stdout + again.stderr

"""The pre-commit hook (.pre-commit-hooks.yaml): valid by pre-commit's own schema, and run by
`pre-commit try-repo` (a venv with this repository pip-installed) on a scratch fork: red before
`apply`, green after. The README's snippet runs as written, from a fresh clone of this repository
(its URL: the clone's path; its rev: `git rev-parse HEAD` of the clone), with each hook it names."""

from __future__ import annotations

import os
import re
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


def pre_commit(fork: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PRE_COMMIT_HOME=str(cache_dir() / "pre-commit"), NO_COLOR="1")
    return subprocess.run(
        [sys.executable, "-m", "pre_commit", *args], cwd=fork, env=env, capture_output=True, text=True, timeout=900
    )


def try_repo(fork: Path, hook: str = HOOK, repo: Path = REPO) -> subprocess.CompletedProcess:
    return pre_commit(fork, "try-repo", str(repo), hook, "--all-files")


def readme_snippet() -> str:
    """The README's ``.pre-commit-config.yaml`` entry, as written."""
    readme = (REPO / "README.md").read_text()
    snippet = readme[readme.index("```yaml\n- repo:") + len("```yaml\n") :]
    return snippet[: snippet.index("```")]


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> tuple[Path, str]:
    """A fresh clone of this repository (what it has committed) and its commit, as the README says."""
    path = tmp_path_factory.mktemp("clone") / "sglang-draft-layout"
    subprocess.run(["git", "clone", "-q", str(REPO), str(path)], check=True)
    rev = subprocess.run(
        ["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    return path, rev


def filled(snippet: str, repo: Path, rev: str, hook: str) -> str:
    """The snippet with its two values filled in as the README says, ``hook`` the one not commented out."""
    snippet = re.sub(r"^- repo: <.*>$", f"- repo: {repo}", snippet, count=1, flags=re.MULTILINE)
    snippet = re.sub(r"^  rev: <.*>$", f"  rev: {rev}", snippet, count=1, flags=re.MULTILINE)
    assert "<" not in snippet, snippet  # no placeholder is left
    lines = []
    for line in snippet.splitlines():
        stripped = line.lstrip().removeprefix("# ")
        if stripped.startswith("- id: "):
            indent = line[: len(line) - len(line.lstrip())]
            line = indent + ("" if stripped.split()[2] == hook else "# ") + stripped
        lines.append(line)
    return "repos:\n" + "".join(f"  {line}\n" for line in lines)


def test_readme_snippet_runs_as_written_from_a_fresh_clone(fork, clone, tmp_path):
    """Each hook the README's snippet names (with the args it gives), from the clone at its commit:
    `pre-commit run` with the snippet as the fork's config, and `pre-commit try-repo <clone> <hook>`."""
    path, rev = clone
    snippet = readme_snippet()
    hooks = re.findall(r"id: ([\w-]+)", snippet)
    assert hooks == [HOOK, FIXING_HOOK] and "args:" not in snippet  # the README's two hooks, without args
    for hook in hooks:
        checkout = tmp_path / hook
        subprocess.run(["git", "clone", "-q", str(fork), str(checkout)], check=True)
        (checkout / ".pre-commit-config.yaml").write_text(filled(snippet, path, rev, hook))
        first = pre_commit(checkout, "run", "--all-files")
        assert first.returncode == 1 and "Failed" in first.stdout, first.stdout + first.stderr
        tried = try_repo(checkout, hook, repo=path)
        assert tried.returncode == (1 if hook == HOOK else 0), tried.stdout + tried.stderr
        if hook == FIXING_HOOK:  # it patched the tree, and try-repo found nothing more to do
            assert "files were modified by this hook" in first.stdout and "Passed" in tried.stdout
            assert cli.main(["check", str(checkout)]) == 0
        else:
            assert "to patch" in first.stdout and "next: run\n  sglang-draft-layout apply .\n" in first.stdout


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
    [git_add] = [line for line in fixed.stdout.splitlines() if line.startswith("  git add ")]
    assert git_add.startswith("  git add python/sglang/srt/") and " test/registered/" in git_add
    assert cli.main(["check", str(fork)]) == 0
    again = try_repo(fork, FIXING_HOOK)
    assert again.returncode == 0 and "Passed" in again.stdout, again.stdout + again.stderr

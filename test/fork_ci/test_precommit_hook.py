"""The pre-commit hook (.pre-commit-hooks.yaml): valid by pre-commit's own schema, run only on
commits touching a file `check` reads (its `files`, no `always_run`), and run by `pre-commit
try-repo` (a venv with this repository pip-installed) on a scratch fork: red before `apply`, green
after. The README's snippet is a complete `.pre-commit-config.yaml` (valid YAML, valid by
pre-commit's schema) and runs as written, from a fresh clone of this repository (its URL: the
clone's path; its rev: `git rev-parse HEAD` of the clone), with each hook it names; a commit
touching no draft file skips it."""

from __future__ import annotations

import builtins
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sglang_draft_layout import api, cli
from sglang_draft_layout.fork_tests import HARNESS
from sglang_draft_layout.releases import cache_dir

pytestmark = pytest.mark.releases
REPO = Path(__file__).resolve().parents[2]
HOOK = "sglang-draft-layout"
FIXING_HOOK = "sglang-draft-layout-apply"


def manifest() -> dict[str, dict]:
    from pre_commit.clientlib import load_manifest

    return {hook["id"]: hook for hook in load_manifest(str(REPO / ".pre-commit-hooks.yaml"))}


def test_manifest_is_valid():
    hooks = manifest()
    assert set(hooks) == {HOOK, FIXING_HOOK}
    for hook in hooks.values():
        assert (hook["language"], hook["pass_filenames"], hook["always_run"]) == ("python", False, False)
    assert hooks[HOOK]["files"] == hooks[FIXING_HOOK]["files"] != ""
    assert "always_run" not in (REPO / ".pre-commit-hooks.yaml").read_text().replace("no `always_run`", "")
    assert hooks[HOOK]["entry"] == "sglang-draft-layout check ."
    assert hooks[FIXING_HOOK]["entry"] == "sglang-draft-layout apply --exit-non-zero-on-fix ."


def test_files_are_the_draft_folders_and_the_fork_tests_only():
    """A commit touching none of these paths (the fork root's) runs neither hook."""
    files = re.compile(manifest()[HOOK]["files"])
    for path in (
        "python/sglang/srt/layers/attention/flashinfer_backend.py",
        "python/sglang/srt/layers/attention/dsv4/compressor.py",
        "python/sglang/srt/speculative/eagle_worker_v2.py",
        "python/sglang/test/ci/ci_register.py",
        "test/registered/unit/speculative/test_draft_layout.py",
        "test/registered/spec/eagle/test_draft_layout_exact.py",
        "test/run_suite.py",
        "sglang/srt/speculative/spec_utils.py",  # a repository holding the package at its root
    ):
        assert files.search(path), path
    for path in (
        "README.md",
        "python/pyproject.toml",
        "python/sglang/srt/managers/scheduler.py",
        "python/sglang/srt/server_args.py",
        "python/sglang/srt/layers/attention/README.md",
        "test/registered/unit/speculative/test_other.py",
        "test/srt/test_eagle_infer.py",
        "docs/advanced_features/speculative_decoding.md",
        "vendor/python/sglang/srt/speculative/spec_utils.py",
    ):
        assert not files.search(path), path


def test_files_cover_every_file_check_reads_in_the_draft_folders_and_the_fork_tests(fork, monkeypatch):
    """What `check` reads on a patched fork with its written tests: every file of the draft folders
    and of test/ matches ``files``; what it reads elsewhere are modules of the package the draft
    paths import (run by the judgement) and the header's release files, which no verdict is read from."""
    assert api.apply(fork, gpu_test=True).exit_code == 0
    read: set[str] = set()

    def traced(function):
        def reading(self, *args, **kwargs):
            path = Path(self).resolve()
            if fork in path.parents:
                read.add(path.relative_to(fork).as_posix())
            return function(self, *args, **kwargs)

        return reading

    opened = builtins.open

    def tracing_open(file, *args, **kwargs):
        if isinstance(file, (str, os.PathLike)):
            traced(lambda *_a, **_k: None)(file)
        return opened(file, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", traced(Path.read_text))
    monkeypatch.setattr(Path, "read_bytes", traced(Path.read_bytes))
    monkeypatch.setattr(builtins, "open", tracing_open)
    monkeypatch.setattr(io, "open", tracing_open)
    report = api.check(fork, gpu_test=True)
    assert report.exit_code == 0 and report.kinds()["test"] == 3
    files = re.compile(manifest()[HOOK]["files"])
    draft = ("python/sglang/srt/layers/attention/", "python/sglang/srt/speculative/", "test/", HARNESS[0])
    assert {item.file for item in report.items if item.line or item.kind == api.TEST} <= read
    assert [path for path in read if path.startswith(draft) and not files.search(path)] == []
    assert "test/run_suite.py" in read
    elsewhere = {path for path in read if not files.search(path)}
    assert all(path.startswith("python/sglang/") or path == "python/pyproject.toml" for path in elsewhere), elsewhere


def pre_commit(fork: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PRE_COMMIT_HOME=str(cache_dir() / "pre-commit"), NO_COLOR="1")
    return subprocess.run(
        [sys.executable, "-m", "pre_commit", *args], cwd=fork, env=env, capture_output=True, text=True, timeout=900
    )


def try_repo(fork: Path, hook: str = HOOK, repo: Path = REPO) -> subprocess.CompletedProcess:
    return pre_commit(fork, "try-repo", str(repo), hook, "--all-files")


def readme_snippet() -> str:
    """The README's ``.pre-commit-config.yaml``, as written."""
    readme = (REPO / "README.md").read_text()
    snippet = readme[readme.index("```yaml\nrepos:\n") + len("```yaml\n") :]
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
    snippet = re.sub(r"^(\s*- repo: )<.*>$", rf"\g<1>{repo}", snippet, count=1, flags=re.MULTILINE)
    snippet = re.sub(r"^(\s*rev: )<.*>$", rf"\g<1>{rev}", snippet, count=1, flags=re.MULTILINE)
    assert "<" not in snippet, snippet  # no placeholder is left
    lines = []
    for line in snippet.splitlines():
        stripped = line.lstrip().removeprefix("# ")
        if stripped.startswith("- id: "):
            indent = line[: len(line) - len(line.lstrip())]
            line = indent + ("" if stripped.split()[2] == hook else "# ") + stripped
        lines.append(line)
    return "".join(f"{line}\n" for line in lines)


def test_readme_snippet_is_a_complete_valid_config(tmp_path):
    """Pasted as it is, the snippet is a whole `.pre-commit-config.yaml` (YAML, and pre-commit's schema)."""
    from pre_commit.clientlib import load_config

    snippet = readme_snippet()
    config = yaml.safe_load(snippet)
    [entry] = config["repos"]
    assert set(entry) == {"repo", "rev", "hooks"} and [hook["id"] for hook in entry["hooks"]] == [HOOK]
    path = tmp_path / ".pre-commit-config.yaml"
    path.write_text(filled(snippet, REPO, "5d1f0c2ab" + "e" * 31, FIXING_HOOK))  # a commit's 40 hex digits
    assert [hook["id"] for hook in load_config(str(path))["repos"][0]["hooks"]] == [FIXING_HOOK]


def test_readme_snippet_runs_as_written_from_a_fresh_clone(fork, clone, tmp_path):
    """Each hook the README's snippet names (with the args it gives), from the clone at its commit:
    `pre-commit run` with the snippet as the fork's config, and `pre-commit try-repo <clone> <hook>`;
    a commit touching no draft file skips it."""
    path, rev = clone
    snippet = readme_snippet()
    hooks = re.findall(r"id: ([\w-]+)", snippet)
    assert hooks == [HOOK, FIXING_HOOK] and "args:" not in snippet  # the README's two hooks, without args
    for hook in hooks:
        checkout = tmp_path / hook
        subprocess.run(["git", "clone", "-q", str(fork), str(checkout)], check=True)
        (checkout / ".pre-commit-config.yaml").write_text(filled(snippet, path, rev, hook))
        (checkout / "NOTES.md").write_text("a change to no draft file\n")
        skipped = pre_commit(checkout, "run", "--files", "NOTES.md", "python/sglang/srt/managers/scheduler.py")
        assert skipped.returncode == 0 and "(no files to check)Skipped" in skipped.stdout, skipped.stdout
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

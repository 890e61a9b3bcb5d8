"""The README's recipe, run as a fork maintainer runs it (issue 40 item 7's trial), its commands read from
README.md and run by the shell in the fork checkout, the tool under test on PATH as `sglang-draft-layout`.

On a fork laid out from the 0.5.12 wheel (scratch_fork.py: python/sglang/, test/registered/,
test/run_suite.py, one commit tagged v0.5.12; upstream's next commit holds 0.5.13's files, tag v0.5.13):
check, diff, apply, the `git add` apply prints, commit; both hooks of the README's pre-commit snippet; then
`git merge v0.5.13`, resolved as "Upgrading to upstream 0.5.13 or later" says, and `check` exits 0.

The hooks are run as their entries in .pre-commit-hooks.yaml declare them (`entry`, `pass_filenames:
false`), on a commit their `files` match: pre-commit itself installs the hook repository into a venv of its
own at each commit of this repository (pip from PyPI, some 20 s a hook), which test_precommit_hook.py does,
with the same snippet, from a fresh clone. Also the README's revert before committing: no trace left.
"""

from __future__ import annotations

import os
import re
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from pre_commit.clientlib import load_manifest
from sglang_draft_layout.fork_tests import HARNESS

from scratch_fork import CPU_TEST, GPU_TEST, git
from test_precommit_hook import readme_snippet
from test_upgrade_to_upstream import unmerged, upstream  # noqa: F401 (a fixture)

pytestmark = pytest.mark.releases
REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
PACKAGE = "python/sglang/"


def readme_block(after: str) -> list[str]:
    """The commands of the README's indented block after the line ``after``, without their comments."""
    lines = README[README.index(after + "\n") :].splitlines()[1:]
    start = next(i for i, line in enumerate(lines) if line.startswith("    "))
    block = []
    for line in lines[start:]:
        if not line.startswith("    "):
            break
        block.append(re.sub(r"\s+# .*$", "", line.strip()))
    return block


@pytest.fixture
def shell(tmp_path):
    """shell(fork, command) -> the command run by ``sh`` in the fork, `sglang-draft-layout` being this
    checkout's tool (a script on PATH running it with this Python), git's identity and editor set as a
    maintainer's are (`git commit` without -m takes the message git offers)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "sglang-draft-layout"
    script.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m sglang_draft_layout "$@"\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GIT_", "PYTHON"))}
    env.update(
        PATH=f"{bin_dir}{os.pathsep}{env['PATH']}",
        PYTHONPATH=str(REPO / "python"),
        GIT_AUTHOR_NAME="fork",
        GIT_AUTHOR_EMAIL="fork@example.com",
        GIT_COMMITTER_NAME="fork",
        GIT_COMMITTER_EMAIL="fork@example.com",
        GIT_EDITOR="true",
        NO_COLOR="1",
    )

    def run(fork: Path, command: str) -> subprocess.CompletedProcess:
        return subprocess.run(command, shell=True, cwd=fork, env=env, capture_output=True, text=True, timeout=300)

    return run


def written(out: str) -> dict[str, bool]:
    """The files `apply` listed (``patched`` / ``new``): path -> new."""
    return {
        line.split()[1]: line.startswith("new") for line in out.splitlines() if re.match(r"(patched|new) +\S", line)
    }


def test_the_readme_recipe_from_check_to_the_upgraded_fork(upstream, tmp_path, shell):  # noqa: F811
    fork = tmp_path / "fork"
    git(tmp_path, "clone", "-q", str(upstream), str(fork))
    git(fork, "checkout", "-q", "-b", "fork", "v0.5.12")

    check, diff, apply = readme_block(
        "On your tree (any folder inside a fork checkout; no path: the SGLang installed in this Python):"
    )
    assert [check, diff, apply] == [
        "sglang-draft-layout check .",
        "sglang-draft-layout diff . > ../draft-layout.patch",
        "sglang-draft-layout apply .",
    ]
    checked = shell(fork, check)
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert (
        "3 helpers to patch; 17 call sites to patch; 2 test files to write; 3 call sites not in this release"
        in " ".join(checked.stdout.split())
    )
    assert checked.stdout.endswith("next: run\n  sglang-draft-layout apply .\n")
    diffed = shell(fork, diff)
    assert diffed.returncode == 0 and diffed.stdout == "", diffed.stderr
    patch = tmp_path / "draft-layout.patch"
    assert patch.read_text().startswith("diff --git a/python/sglang/") and git(fork, "status", "--porcelain") == ""

    applied = shell(fork, apply)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    files = written(applied.stdout)
    assert sum(files.values()) == 2 and len(files) == 11  # 9 files patched, the CPU test and its harness new
    [git_add] = [line.strip() for line in applied.stdout.splitlines() if line.startswith("  git add ")]
    assert shell(fork, git_add).returncode == 0
    staged = git(fork, "status", "--porcelain").splitlines()
    assert {line[3:] for line in staged} == set(files) and all(line[1] == " " for line in staged)  # all, staged
    assert shell(fork, f"git apply -R --check --cached {patch}").returncode == 0  # the diff is what apply wrote
    committed = shell(fork, 'git commit -q -m "Use upstream\'s multi-step EAGLE draft layout helpers"')
    assert committed.returncode == 0, committed.stderr

    # pre-commit: each hook the README's snippet names, as .pre-commit-hooks.yaml declares it, on this commit
    manifest = {hook["id"]: hook for hook in load_manifest(str(REPO / ".pre-commit-hooks.yaml"))}
    hooks = re.findall(r"id: ([\w-]+)", readme_snippet())
    assert hooks == ["sglang-draft-layout", "sglang-draft-layout-apply"]
    changed = git(fork, "diff", "--name-only", "HEAD~1", "HEAD").split()
    for hook in hooks:
        assert manifest[hook]["pass_filenames"] is False
        assert any(re.search(manifest[hook]["files"], path) for path in changed)  # it runs on this commit
        ran = shell(fork, manifest[hook]["entry"])
        assert ran.returncode == 0, ran.stdout + ran.stderr
    assert git(fork, "status", "--porcelain") == ""  # the fixing hook found nothing to fix

    # upgrading: the README's block, FILE each path git leaves unmerged
    merge, theirs, removed, check_again, commit = readme_block("The rule: **in a patched site, take upstream's side.**")
    assert merge == "git merge v0.5.13" and check_again == check and "FILE" in theirs and "FILE" in removed
    merged = shell(fork, merge)
    assert merged.returncode == 1 and "Automatic merge failed" in merged.stdout, merged.stdout + merged.stderr
    conflicts = unmerged(fork)
    assert ("UD", PACKAGE + "srt/speculative/eagle_worker.py") in conflicts and len(conflicts) > 1
    for status, path in sorted(conflicts):
        resolved = shell(fork, (removed if status == "UD" else theirs).replace("FILE", shlex.quote(path)))
        assert resolved.returncode == 0, resolved.stderr
    assert unmerged(fork) == set()
    again = shell(fork, check_again)  # the merge renamed the suites: the written test is stale
    assert again.returncode == 1 and f"{CPU_TEST}\n" in again.stdout, again.stdout + again.stderr
    assert shell(fork, apply).returncode == 0  # "then apply, and check again: exit 0"
    final = shell(fork, check_again)
    assert final.returncode == 0, final.stdout + final.stderr
    done = shell(fork, commit)
    assert done.returncode == 0, done.stdout + done.stderr
    assert git(fork, "status", "--porcelain") == "" and git(fork, "log", "-1", "--format=%P").count(" ") == 1
    assert (
        git(fork, "diff", "--name-only", "v0.5.13", "HEAD", "--", "python") == f"{HARNESS[0]}\n"
    )  # upstream's package, and the test's harness
    assert 'suite="base-a-test-cpu"' in (fork / CPU_TEST).read_text()


def every_path(root: Path) -> list[str]:
    """Every file and folder of the checkout, the repository's own folder left out."""
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if ".git" not in p.relative_to(root).parts)


@pytest.mark.parametrize("flags", ["", "--gpu-test"])
def test_the_readme_revert_before_committing_leaves_no_trace(fork, shell, flags):
    """`apply` (with the GPU test: two new folders), then the README's "Not yet committed" command."""
    before = every_path(fork)
    applied = shell(fork, f"sglang-draft-layout apply {flags} .".replace("  ", " "))
    assert applied.returncode == 0, applied.stdout + applied.stderr
    new = [path for path, is_new in written(applied.stdout).items() if is_new]
    assert new == [HARNESS[0], CPU_TEST, GPU_TEST][: 3 if flags else 2]
    assert "test/registered/unit/speculative" not in before and (fork / "test/registered/unit/speculative").is_dir()
    [command] = re.findall(r"Not yet committed: `([^`]+)`", README)
    command = " ".join(command.split()).replace("<the files apply listed as new>", " ".join(map(shlex.quote, new)))
    reverted = shell(fork, command)
    assert reverted.returncode == 0, reverted.stderr
    assert every_path(fork) == before and git(fork, "status", "--porcelain", "--ignored") == ""

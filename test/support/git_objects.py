"""Scratch fork repositories that borrow the release trees' git objects.

A scratch fork is a git repository holding a whole release tree, and its first `git add -A`
writes each of the tree's ~3,000 files once more as a loose object: more files than any
test writes otherwise. Here the fork's repository lists an object store in the cache
(``git-objects/``, holding the blobs of the release trees) in ``objects/info/alternates``,
as ``git clone --shared`` does, so `git add` finds those blobs there and writes only the
files the fork changed. The fork is otherwise the repository `git init` makes.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from sglang_draft_layout.releases import cache_dir

from support.sglang_release import pristine_tree


def _store(version: str) -> Path:
    """The store's objects folder, holding every file of sglang==version's tree as a blob."""
    store = cache_dir() / "git-objects"
    marker = store / "trees" / version
    if not marker.exists():
        subprocess.run(["git", "init", "-q", "--bare", str(store)], check=True)
        marker.parent.mkdir(exist_ok=True)
        index = store / f"index-{os.getpid()}"  # this process's own: xdist workers may fill the store at once
        try:
            subprocess.run(
                ["git", f"--git-dir={store}", f"--work-tree={pristine_tree(version) / 'sglang'}", "add", "-A"],
                env={**os.environ, "GIT_INDEX_FILE": str(index)},
                check=True,
                capture_output=True,
            )
        finally:
            index.unlink(missing_ok=True)
        marker.write_text(version + "\n")
    return store / "objects"


def borrow_objects(repository: Path, version: str) -> None:
    """Let the git repository at ``repository`` (after `git init`) read sglang==version's blobs
    from the store rather than write its own copies."""
    alternates = repository / ".git" / "objects" / "info" / "alternates"
    listed = alternates.read_text().splitlines() if alternates.exists() else []
    objects = str(_store(version))
    if objects not in listed:
        alternates.write_text("".join(f"{line}\n" for line in [*listed, objects]))

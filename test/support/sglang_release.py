"""Unpacked SGLang release trees for the proof tests, cached by version.

Nothing of SGLang is kept in this repository: the trees are unpacked from the PyPI wheels
that ``sglang_draft_layout.releases`` caches (``$SGLANG_DRAFT_LAYOUT_CACHE`` or
``~/.cache/sglang-draft-layout``).

Unlike ``releases.unpack_release`` (the .py files only), these trees hold every file of the
wheel's ``sglang/`` package: importing SGLang needs some of the others (``import sglang``
reaches ``sglang/jit_kernel/utils.py``, which raises "Cannot find sglang.jit_kernel path"
unless ``jit_kernel/include`` and ``jit_kernel/csrc`` exist).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import zipfile
from pathlib import Path

from sglang_draft_layout.releases import cache_dir, release_wheel


def pristine_tree(version: str) -> Path:
    """The folder holding ``sglang/`` of sglang==version, unpacked once into the cache.
    Treat it as read-only: a test that modifies a tree works on ``scratch_tree``."""
    root = cache_dir() / "proof-trees" / f"{version}-full"
    marker = root / ".complete"
    if marker.exists():
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{version}-", dir=root.parent))
    try:
        with zipfile.ZipFile(release_wheel(version)) as wheel:
            wheel.extractall(tmp, [n for n in wheel.namelist() if n.startswith("sglang/")])
        (tmp / ".complete").write_text(version + "\n")
        if marker.exists():  # another process finished first
            shutil.rmtree(tmp)
            return root
        if root.exists():  # left half-written by an interrupted run
            shutil.rmtree(root)
        os.replace(tmp, root)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not marker.exists():  # not merely another process finishing first
            raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return root


def scratch_tree(version: str, dest: Path) -> Path:
    """A private copy of sglang==version under dest; returns dest (which holds ``sglang/``)."""
    shutil.copytree(pristine_tree(version) / "sglang", Path(dest) / "sglang")
    return Path(dest)


def require_release(version: str) -> Path:
    """For tests: the cached wheel of sglang==version, or pytest.skip when pip cannot
    download it (no access to PyPI)."""
    import subprocess

    import pytest

    try:
        return release_wheel(version)
    except (subprocess.CalledProcessError, FileNotFoundError) as exc:
        pytest.skip(f"sglang=={version} could not be downloaded from PyPI: {exc}")

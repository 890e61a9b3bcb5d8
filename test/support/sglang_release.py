"""Unpacked SGLang release trees for the proof tests, cached by version.

Nothing of SGLang is kept in this repository: the trees are unpacked from the PyPI wheels
that ``sglang_draft_layout.releases`` caches (``$SGLANG_DRAFT_LAYOUT_CACHE`` or
``~/.cache/sglang-draft-layout``).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from sglang_draft_layout.releases import cache_dir, unpack_release


def pristine_tree(version: str) -> Path:
    """A read-only-by-convention unpacked copy of sglang==version; returns the folder
    that holds ``sglang/``. Unpacked once into the cache; tests that modify a tree must
    copy it first (see ``scratch_tree``)."""
    root = cache_dir() / "proof-trees" / version
    marker = root / ".complete"
    if not marker.exists():
        root.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{version}-", dir=root.parent))
        try:
            unpack_release(version, tmp)
            (tmp / ".complete").write_text(version + "\n")
            if marker.exists():  # another process finished first
                shutil.rmtree(tmp)
                return root
            if root.exists():  # a half-written tree left by an interrupted run
                shutil.rmtree(root)
            os.replace(tmp, root)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
            if not marker.exists():  # not just another process finishing first
                raise
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return root


def scratch_tree(version: str, dest: Path) -> Path:
    """A private copy of sglang==version's sources under dest (holding ``sglang/``)."""
    src = pristine_tree(version)
    shutil.copytree(src / "sglang", Path(dest) / "sglang")
    return Path(dest)

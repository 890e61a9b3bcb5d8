"""Real SGLang releases from PyPI, unpacked once per test session (wheels cached across sessions)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from sglang_draft_layout.releases import unpack_release


@pytest.fixture(scope="session")
def pristine(tmp_path_factory):
    """pristine(version) -> a folder holding the unpacked, never modified sglang/ of that release."""
    unpacked: dict[str, Path] = {}

    def get(version: str) -> Path:
        if version not in unpacked:
            root = tmp_path_factory.mktemp(f"sglang-{version}-pristine")
            unpack_release(version, root)
            unpacked[version] = root
        return unpacked[version]

    return get


@pytest.fixture
def scratch(pristine, tmp_path):
    """scratch(version) -> a fresh copy of the release, free to patch."""

    def get(version: str) -> Path:
        dest = tmp_path / f"sglang-{version}"
        shutil.copytree(pristine(version), dest)
        return dest

    return get


@pytest.fixture(scope="session")
def patched(pristine, tmp_path_factory):
    """patched(version) -> a copy of the release with the patch applied (once per session)."""
    from sglang_draft_layout import engine
    from sglang_draft_layout.target import resolve

    trees: dict[str, Path] = {}

    def get(version: str) -> Path:
        if version not in trees:
            dest = tmp_path_factory.mktemp(f"sglang-{version}-patched")
            shutil.copytree(pristine(version), dest, dirs_exist_ok=True)
            engine.apply(resolve(str(dest)))
            trees[version] = dest
        return trees[version]

    return get

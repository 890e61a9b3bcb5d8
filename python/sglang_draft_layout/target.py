"""Find the SGLang tree to patch, and what it states about itself.

The rules judge every site by its code, so nothing here decides whether a tree can be
patched: the release a tree states (if any) is read only to show it in reports, and the
fork's black line length only shapes the import lines the patch writes.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

BLACK_LINE_LENGTH = 88
#: setuptools-scm's versions of a build that is not a release: no tag (0.0.0.devN) or
#: commits past the nearest tag (X.Y.Z.devN+g<sha>, also X.Y.Z.postN.devM+g<sha>)
_SCM_FALLBACK = re.compile(r"^0\.0\.0|\.dev\d+")


class TargetError(Exception):
    """Bad input: the one-line message names the path and what is wrong."""


@dataclass(frozen=True)
class Target:
    root: Path  # the folder the user named: diff paths are relative to it
    package: Path  # the `sglang` package folder (holds srt/)
    version: Optional[str]  # the release the tree states; None when it states none
    version_source: str  # where ``version`` was read, or why there is none
    line_length: int = BLACK_LINE_LENGTH  # the fork's black line length

    @property
    def release_source(self) -> str:
        """Where the stated release was read, in one word (``none`` when the tree states none)."""
        if self.version is None:
            return "none"
        return _SOURCE_WORDS.get(self.version_source, self.version_source)

    def describe(self) -> str:
        """``SGLang 0.5.12 (_version.py)``, or ``SGLang, release not stated``."""
        if self.version is None:
            return "SGLang, release not stated"
        return f"SGLang {self.version} ({self.release_source})"


#: read_version's sources, each in one word
_SOURCE_WORDS = {"sglang/_version.py": "_version.py", "pyproject.toml": "pyproject", "dist-info": "dist-info",
                 "git describe": "git-tag"}


def _package_of(folder: Path) -> Optional[tuple[Path, Path]]:
    """(root, package) when ``folder`` is a fork checkout, a folder holding sglang/, or the package."""
    for candidate in (folder / "python" / "sglang", folder / "sglang", folder):
        if (candidate / "srt" / "speculative").is_dir():
            return folder, candidate
    return None


def find_package(path: Optional[str]) -> tuple[Path, Path]:
    """(root, the `sglang` folder): the installed SGLang when ``path`` is None, else the tree
    holding ``path``, found upward as git and black find their root.

    A fork checkout (a folder holding ``python/sglang``) that holds ``path`` wins, so a
    command run from ``python/`` or ``python/sglang/srt`` of a checkout patches the whole
    checkout (its tests included); otherwise the nearest folder that is an SGLang tree.
    """
    if path is None:
        spec = importlib.util.find_spec("sglang")
        if spec is None or not spec.submodule_search_locations:
            raise TargetError("no SGLang installed in this Python; name a tree: sglang-draft-layout check PATH")
        package = Path(list(spec.submodule_search_locations)[0]).resolve()
        return package.parent, package
    named = Path(path)
    if not named.exists():
        raise TargetError(f"{path}: no such path")
    start = named.resolve()
    if not start.is_dir():
        start = start.parent
    folders = [start, *start.parents]
    for folder in folders:
        if (folder / "python" / "sglang" / "srt" / "speculative").is_dir():
            return folder, folder / "python" / "sglang"
    for folder in folders:
        found = _package_of(folder)
        if found and found[1] == folder and folder != start:
            return folder.parent, folder  # found upward from inside the package: its parent is the root
        if found:
            return found
    raise TargetError(f"{start}: not in an SGLang tree (no sglang/srt/speculative/ in it or any folder above it)")


def _assigned_string(file: Path, names: tuple[str, ...]) -> Optional[str]:
    """The string literal assigned to one of ``names`` at the top level of ``file``."""
    try:
        tree = ast.parse(file.read_text())
    except (OSError, SyntaxError, ValueError):
        return None
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            if any(isinstance(t, ast.Name) and t.id in names for t in node.targets):
                return node.value.value
    return None


def _pyproject_version(pyproject: Path) -> Optional[str]:
    """A literal ``version = "..."`` (a fork with ``dynamic = ["version"]`` has none)."""
    if not pyproject.is_file():
        return None
    found = re.search(r'^version\s*=\s*"([^"]+)"', pyproject.read_text(), re.MULTILINE)
    return found.group(1) if found else None


def _dist_info_version(site: Path) -> Optional[str]:
    for metadata in sorted(site.glob("sglang-*.dist-info/METADATA")):
        found = re.search(r"^Version: (\S+)", metadata.read_text(), re.MULTILINE)
        if found:
            return found.group(1)
    return None


def _git_describe(folder: Path) -> Optional[str]:
    """The nearest ``v*`` tag of a git checkout, as ``git describe`` says it."""
    try:
        result = subprocess.run(["git", "describe", "--tags", "--match", "v*"], cwd=folder,
                                capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if result.returncode != 0:
        return None
    return result.stdout.strip() or None


def read_version(package: Path) -> tuple[Optional[str], str]:
    """(release, where it was read) from what the tree states, in this order: sglang/_version.py
    (wheels, installs), a literal version in the fork's python/pyproject.toml, the install's
    dist-info, and in a fork checkout (python/pyproject.toml beside the package) the nearest
    ``v*`` git tag. setuptools-scm's fallbacks are no release."""
    ignored = []
    for version, source in (
        (lambda: _assigned_string(package / "_version.py", ("__version__", "version")), "sglang/_version.py"),
        (lambda: _pyproject_version(package.parent / "pyproject.toml"), "pyproject.toml"),
        (lambda: _dist_info_version(package.parent), "dist-info"),
    ):
        found = version()
        if found and _SCM_FALLBACK.search(found):
            ignored.append(f"{source} says {found}, a setuptools-scm build")
        elif found:
            return found, source
    described = _git_describe(package) if (package.parent / "pyproject.toml").is_file() else None
    if described:
        return described, "git describe"
    return None, "; ".join(ignored) or "no _version.py, pyproject version, dist-info or v* git tag"


def black_line_length(root: Path, package: Path) -> int:
    """``[tool.black] line-length`` from the pyproject.toml at the fork root or beside the package."""
    for pyproject in dict.fromkeys((root / "pyproject.toml", package.parent / "pyproject.toml")):
        if not pyproject.is_file():
            continue
        section = re.search(r"^\[tool\.black\][ \t]*\n(.*?)(?=^\[|\Z)", pyproject.read_text(), re.MULTILINE | re.DOTALL)
        if section:
            found = re.search(r"^line[-_]length\s*=\s*(\d+)", section.group(1), re.MULTILINE)
            if found:
                return int(found.group(1))
    return BLACK_LINE_LENGTH


def resolve(path: Optional[str]) -> Target:
    """The target tree: where its package is, the release it states, its black line length."""
    root, package = find_package(path)
    version, source = read_version(package)
    return Target(root, package, version, source, black_line_length(root, package))

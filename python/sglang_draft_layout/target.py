"""Find the SGLang tree to patch, and what it states about itself.

The rules judge every site by its code, so nothing here decides whether a tree can be
patched: the release a tree states (if any) is read only to show it in reports, and the
fork's black line length only shapes the import lines the patch writes.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import shlex
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
    git_describe: Optional[str] = None  # a fork checkout's ``git describe``: shown beside, never the release

    @property
    def release_source(self) -> str:
        """Where the stated release was read, in one word (``none`` when the tree states none)."""
        if self.version is None:
            return "none"
        return _SOURCE_WORDS.get(self.version_source, self.version_source)

    def describe(self) -> str:
        """``SGLang 0.5.12 (pyproject)``, or ``SGLang, release not stated`` (with a fork's
        ``git describe`` beside it: the nearest tag may be far behind what the fork is based on)."""
        if self.version is not None:
            return f"SGLang {self.version} ({self.release_source})"
        return "SGLang, release not stated" + (f" (git describe: {self.git_describe})" if self.git_describe else "")


#: read_version's sources, each in one word
_SOURCE_WORDS = {"sglang/_version.py": "_version.py", "python/pyproject.toml": "pyproject", "dist-info": "dist-info"}


def _package_of(folder: Path) -> Optional[tuple[Path, Path]]:
    """(root, package) when ``folder`` is a fork checkout, a folder holding sglang/, or the package."""
    for candidate in (folder / "python" / "sglang", folder / "sglang", folder):
        if (candidate / "srt" / "speculative").is_dir():
            return folder, candidate
    return None


def find_package(path: Optional[str]) -> tuple[Path, Path]:
    """(root, the `sglang` folder): the installed SGLang when ``path`` is None, else the nearest
    tree holding ``path``, found upward as git and black find their root.

    The package of a fork checkout (``python/sglang``) is the whole checkout's, so a command run
    from ``python/`` or ``python/sglang/srt`` of a checkout patches the whole checkout (its tests
    included); another SGLang tree inside the checkout's folder (a copy, a vendored tree) is its own.
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
        raise TargetError(
            f"{path}: a file, not a folder (TARGET names the tree, which is patched whole: "
            f"e.g. {shlex.quote(str(named.parent))})"
        )
    for folder in [start, *start.parents]:
        found = _package_of(folder)
        if found is None:
            continue
        root, package = found
        checkout = package.parent.parent
        if package == checkout / "python" / "sglang" and root != checkout:
            return checkout, package  # from inside a fork checkout's python/: the whole checkout
        if package == folder and folder != start:
            return folder.parent, folder  # found upward from inside the package: its parent is the root
        return found
    below = trees_below(start)
    if below:
        raise TreeBelow(start, below)
    raise TargetError(f"{start}: not in an SGLang tree (no sglang/srt/speculative/ in it or any folder above it)")


class TreeBelow(TargetError):
    """No SGLang tree holds the folder, but one or more sit one or two levels below it (a
    repository vendoring SGLang): ``below`` are their roots, relative to ``start``."""

    def __init__(self, start: Path, below: list[Path]) -> None:
        self.start, self.below = start, below
        named = ", ".join(str(root) for root in below)
        super().__init__(
            f"{start}: not in an SGLang tree; {'one is' if len(below) == 1 else 'these are'} " f"below it: {named}"
        )


def trees_below(folder: Path, depth: int = 2) -> list[Path]:
    """The roots of the SGLang trees one to ``depth`` levels below ``folder`` (hidden folders and
    symlinks skipped), relative to it, nearest first."""
    found, level = [], [folder]
    for _ in range(depth):
        children = []
        for parent in level:
            try:
                children += sorted(
                    child
                    for child in parent.iterdir()
                    if child.is_dir() and not child.is_symlink() and not child.name.startswith(".")
                )
            except OSError:
                continue
        for child in children:
            package = _package_of(child)
            if package and package[1] != child:  # a fork checkout or a folder holding sglang/
                found.append(child.relative_to(folder))
        level = [child for child in children if not _package_of(child)]
    return found


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
    """A literal ``version = "..."`` of ``[project]`` (a fork with ``dynamic = ["version"]`` has none)."""
    if not pyproject.is_file():
        return None
    project = re.search(r"^\[project\][ \t]*\n(.*?)(?=^\[|\Z)", pyproject.read_text(), re.MULTILINE | re.DOTALL)
    found = project and re.search(r'^version\s*=\s*["\']([^"\']+)["\']', project.group(1), re.MULTILINE)
    return found.group(1) if found else None


def _dist_info_version(site: Path) -> Optional[str]:
    for metadata in sorted(site.glob("sglang-*.dist-info/METADATA")):
        found = re.search(r"^Version: (\S+)", metadata.read_text(), re.MULTILINE)
        if found:
            return found.group(1)
    return None


def _git_describe(folder: Path) -> Optional[str]:
    """The nearest ``v*`` tag of a git checkout, as ``git describe`` says it."""
    import subprocess  # here, not above: only a checkout that states no release asks git

    try:
        result = subprocess.run(
            ["git", "describe", "--tags", "--match", "v*"], cwd=folder, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if result.returncode != 0:
        return None
    return result.stdout.strip() or None


def read_version(package: Path) -> tuple[Optional[str], str]:
    """(release, where it was read) from the tree's own files, in this order: a literal version in
    the fork's python/pyproject.toml (beside the package), sglang/_version.py (wheels, installs;
    in a fork it may be a stale build's, so the fork's pyproject wins), the install's dist-info.
    setuptools-scm's fallbacks are no release; ``git describe`` never is (``fork_git_describe``)."""
    ignored = []
    for version, source in (
        (lambda: _pyproject_version(package.parent / "pyproject.toml"), "python/pyproject.toml"),
        (lambda: _assigned_string(package / "_version.py", ("__version__", "version")), "sglang/_version.py"),
        (lambda: _dist_info_version(package.parent), "dist-info"),
    ):
        found = version()
        if found and _SCM_FALLBACK.search(found):
            ignored.append(f"{source} says {found}, a setuptools-scm build")
        elif found:
            return found, source
    return None, "; ".join(ignored) or "no pyproject version, _version.py or dist-info"


def fork_git_describe(package: Path) -> Optional[str]:
    """A fork checkout's (python/pyproject.toml beside the package) nearest ``v*`` tag, as ``git
    describe`` says it: shown beside the release, since on a fork's main it may name a tag
    thousands of commits behind what the fork is based on."""
    return _git_describe(package) if (package.parent / "pyproject.toml").is_file() else None


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
    return Target(root, package, version, source, black_line_length(root, package), fork_git_describe(package))

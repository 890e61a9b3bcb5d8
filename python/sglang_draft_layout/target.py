"""Find the SGLang tree to patch and tell which release it is."""

from __future__ import annotations

import ast
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

#: first release whose draft sites these rules were written against
OLDEST_SUPPORTED = (0, 5, 8)
#: first release that calls the helpers itself
FIRST_UPSTREAM = (0, 5, 13)


class TargetError(Exception):
    """Bad input: the one-line message names the path and what is wrong."""


@dataclass(frozen=True)
class Target:
    package: Path  # the `sglang` package folder (holds srt/)
    version: str

    @property
    def release(self) -> tuple[int, int, int]:
        return parse_release(self.version)


def parse_release(version: str) -> tuple[int, int, int]:
    found = re.match(r"(\d+)\.(\d+)\.(\d+)", version)
    if not found:
        raise TargetError(f"unknown SGLang release {version!r}")
    return tuple(int(part) for part in found.groups())


def find_package(path: Optional[str]) -> Path:
    """The `sglang` folder of a fork checkout, a folder holding sglang/, the package itself, or the installed one."""
    if path is None:
        spec = importlib.util.find_spec("sglang")
        if spec is None or not spec.submodule_search_locations:
            raise TargetError("no SGLang installed in this Python; name a tree: sglang-draft-layout check PATH")
        return Path(list(spec.submodule_search_locations)[0]).resolve()
    root = Path(path).resolve()
    for candidate in (root, root / "sglang", root / "python" / "sglang"):
        if (candidate / "srt" / "speculative").is_dir():
            return candidate
    raise TargetError(f"{root}: not an SGLang tree (no sglang/srt/speculative/ under it)")


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


def read_version(package: Path) -> Optional[str]:
    """The release: sglang/_version.py (wheels, installs), then a fork's python/pyproject.toml, then dist-info."""
    version = _assigned_string(package / "_version.py", ("__version__", "version"))
    if version:
        return version
    pyproject = package.parent / "pyproject.toml"
    if pyproject.is_file():
        found = re.search(r'^version\s*=\s*"([^"]+)"', pyproject.read_text(), re.MULTILINE)
        if found:
            return found.group(1)
    for metadata in sorted(package.parent.glob("sglang-*.dist-info/METADATA")):
        found = re.search(r"^Version: (\S+)", metadata.read_text(), re.MULTILINE)
        if found:
            return found.group(1)
    return None


def resolve(path: Optional[str], release: Optional[str] = None) -> Target:
    """The target tree and its release (``release`` overrides what the tree says)."""
    package = find_package(path)
    version = release or read_version(package)
    if version is None:
        raise TargetError(f"{package}: unknown SGLang release (no _version.py, pyproject version or dist-info); pass --release X.Y.Z")
    if parse_release(version) < OLDEST_SUPPORTED:
        raise TargetError(f"{package}: SGLang {version} is older than {'.'.join(map(str, OLDEST_SUPPORTED))}, the oldest release these rules know")
    return Target(package, version)

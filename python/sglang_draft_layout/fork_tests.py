"""The test files ``apply`` writes into a fork checkout's own suite (``test/registered/``).

A fork checkout is a folder holding ``python/sglang`` and ``test/registered/``. Each file
is rendered from a template module in ``fork_templates`` (one source of its text), with
the package modules it names embedded verbatim, so the fork's CI needs nothing but the fork.
"""

from __future__ import annotations

import ast
import enum
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from .target import Target

#: (path under the fork root, template module in fork_templates, what it checks)
FORK_TESTS = (
    ("test/registered/unit/speculative/test_draft_layout.py", "registered_cpu", "registered CPU test"),
    ("test/registered/spec/eagle/test_draft_layout_exact.py", "registered_gpu", "registered GPU test"),
)
_EMBED = re.compile(r"^# sglang-draft-layout: embed ([\w.]+)\n\n*", re.MULTILINE)


class FileState(enum.Enum):
    TO_WRITE = "to write"
    PRESENT = "present"
    STALE = "stale"


@dataclass(frozen=True)
class GeneratedFile:
    path: Path
    what: str
    text: str
    old: Optional[str]  # the file's current text; None where it does not exist

    @property
    def state(self) -> FileState:
        if self.old is None:
            return FileState.TO_WRITE
        return FileState.PRESENT if self.old == self.text else FileState.STALE


def _module_source(module: str) -> str:
    """A module's source, read from its file (not imported: a builder may need torch)."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(f"no source for {module}")
    return Path(spec.origin).read_text(encoding="utf-8")


def _split_imports(source: str) -> tuple[list[tuple[str, str, Optional[str]]], str]:
    """((module, name or "", alias) of each top-level import, the rest of the body's text).

    The module's docstring and its top-level import statements are left out of the text.
    """
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    imports: list[tuple[str, str, Optional[str]]] = []
    dropped: set[int] = set()
    for index, stmt in enumerate(tree.body):
        is_docstring = index == 0 and isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
        if isinstance(stmt, ast.Import):
            imports += [(alias.name, "", alias.asname) for alias in stmt.names]
        elif isinstance(stmt, ast.ImportFrom):
            imports += [(stmt.module or "", alias.name, alias.asname) for alias in stmt.names]
        elif not is_docstring:
            continue
        dropped.update(range(stmt.lineno - 1, stmt.end_lineno))
    body = "".join(line for number, line in enumerate(lines) if number not in dropped)
    return imports, body.strip("\n") + "\n"


def _bound(tree: ast.Module, module: str, name: str, alias: Optional[str]) -> bool:
    for stmt in tree.body:
        if isinstance(stmt, ast.Import) and not name:
            if any((a.name, a.asname) == (module, alias) for a in stmt.names):
                return True
        if isinstance(stmt, ast.ImportFrom) and stmt.module == module and name:
            if any((a.name, a.asname) == (name, alias) for a in stmt.names):
                return True
    return False


def render(template: str) -> str:
    """The text of the file that template module ``fork_templates.<template>`` describes."""
    return embed(_module_source(f"{__package__}.fork_templates.{template}"), template)


def embed(text: str, template: str) -> str:
    """``text`` with each embed marker (and the blank lines after it) replaced by the named
    module's body and two blank lines (black's spacing after a top-level definition).

    The template itself imports what the embedded modules import (the rendered file is the
    template's text, its imports untouched); a module import the template lacks is an error.
    """
    for marker in _EMBED.finditer(text):
        module = marker.group(1)
        imports, body = _split_imports(_module_source(module))
        tree = ast.parse(text)
        for imported, name, alias in imports:
            if not _bound(tree, imported, name, alias):
                line = f"from {imported} import {name}" if name else f"import {imported}"
                line += f" as {alias}" if alias else ""
                raise ValueError(f"{template}: the embedded {module} needs `{line}` in the template")
        embedded = f"# {module} (sglang-draft-layout), verbatim\n{body}\n\n"
        text = text.replace(marker.group(0), embedded, 1)
    return text


def fork_root(target: Target) -> Optional[Path]:
    """The fork checkout holding the target package and a ``test/registered/`` suite, if any."""
    root = getattr(target, "root", None) or target.package.parent.parent
    if target.package.resolve() != (root / "python" / "sglang").resolve():
        return None
    return root if (root / "test" / "registered").is_dir() else None


def generated_files(target: Target) -> list[GeneratedFile]:
    """The test files a fork checkout gets, each with its current text; [] for other trees."""
    root = fork_root(target)
    if root is None:
        return []
    files = []
    for relative, template, what in FORK_TESTS:
        path = root / relative
        old = path.read_text(encoding="utf-8") if path.is_file() else None
        files.append(GeneratedFile(path, what, render(template), old))
    return files

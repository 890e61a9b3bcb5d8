"""The written CPU test's split-once check, run here on a tree: its function
(``proof.split_once.split_once_problems``) on the modules it reads, each text parsed once a test
process (``ast_walk.parse`` within conftest's ``parsed_trees_shared``)."""

from __future__ import annotations

from pathlib import Path

from sglang_draft_layout.layout_patterns.ast_walk import parse
from sglang_draft_layout.proof.baking import ATTENTION, WORKERS
from sglang_draft_layout.proof.split_once import split_once_problems


def not_split_once(package: Path) -> list[tuple[str, str]]:
    """(class, verdict) of each per-step backend path under ``package`` (the sglang folder) that the written
    test finds not split once."""
    paths = [p.relative_to(package).as_posix() for p in sorted((package / ATTENTION).rglob("*.py"))]
    modules = {}
    for path in paths + [p for p, _cls in WORKERS]:
        text = (package / path).read_text() if (package / path).is_file() else ""
        modules[path] = (parse(text, path), text.splitlines())
    _found, problems = split_once_problems(package, modules)
    return [(scope.split(".")[0], verdict.who) for _path, _line, scope, verdict in problems]

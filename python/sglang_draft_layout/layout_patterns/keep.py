"""The keep pragma: the comment that keeps a site as the fork wrote it, and where it is looked for."""

from __future__ import annotations

import ast
from typing import List, Optional

from .baking import KEEP as KEEP_PRAGMA  # the comment that keeps a site as the fork wrote it
from .baking import comment_above, first_line
from .ast_walk import nodes_of


def _is_pragma(line: str) -> bool:
    return any(part.strip().startswith(KEEP_PRAGMA[2:]) for part in line.split("#")[1:])


def _header_lines(stmt: ast.stmt) -> List[int]:
    """The lines of a simple statement, or of a compound statement's header (its first lines before its body)."""
    body = getattr(stmt, "body", None)
    end = stmt.end_lineno or stmt.lineno
    if isinstance(body, list) and body and body[0].lineno > stmt.lineno:
        end = body[0].lineno - 1
    return list(range(stmt.lineno, max(end, stmt.lineno) + 1))


def has_keep_pragma(
    lines: List[str],
    func: Optional[ast.AST],
    line: Optional[int],
    scope: Optional[ast.AST] = None,
) -> bool:
    """KEEP_PRAGMA on the def line(s) of ``func`` or on the statement starting at ``line`` (the outermost one
    there, looked up in ``scope``, default ``func``), or alone on the line just above either (black keeps it
    there: a comment at the end of a def line can push the line past 88 columns)."""
    numbers: List[int] = _header_lines(func) if isinstance(func, ast.stmt) else []
    starts: List[int] = [first_line(func)] if isinstance(func, ast.stmt) else []
    within = scope if scope is not None else func
    if isinstance(within, ast.Module):  # only the top-level definition holding the line is walked
        within = next(
            (d for d in within.body if line and d.lineno <= line <= (d.end_lineno or 0)),
            None,
        )
    if line and within is not None:
        starting = [n for n in nodes_of(within, ast.stmt) if n.lineno == line]
        numbers += _header_lines(starting[0]) if starting else [line]
        starts.append(line)
    return any(_is_pragma(lines[n - 1]) for n in numbers if 0 < n <= len(lines)) or any(
        comment_above(lines, start) for start in starts
    )

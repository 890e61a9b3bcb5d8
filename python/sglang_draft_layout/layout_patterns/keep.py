"""The keep pragma: the comment that keeps a site as the fork wrote it, and where it is looked for."""

from __future__ import annotations

import ast
import re
from typing import Dict, List, Optional, Tuple

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
    return bool(keep_comments(lines, func, line, scope))


def keep_comments(
    lines: List[str],
    func: Optional[ast.AST],
    line: Optional[int],
    scope: Optional[ast.AST] = None,
) -> Dict[int, Tuple[int, int]]:
    """The lines holding the keep comments ``has_keep_pragma`` honours there, each with the lines of what it is
    on: (first, last) of the def header or statement whose code it ends a line of (or stands in), or (n, n) for
    one alone on line n above them or between a header and its body."""
    spans: List[Tuple[int, int]] = []
    starts: List[int] = []
    if isinstance(func, ast.stmt):
        header = _header_lines(func)
        spans.append((header[0], header[-1]))
        starts.append(first_line(func))
    within = scope if scope is not None else func
    if isinstance(within, ast.Module):  # only the top-level definition holding the line is walked
        within = next(
            (d for d in within.body if line and d.lineno <= line <= (d.end_lineno or 0)),
            None,
        )
    if line and within is not None:
        starting = [n for n in nodes_of(within, ast.stmt) if n.lineno == line]
        header = _header_lines(starting[0]) if starting else [line]
        spans.append((header[0], header[-1]))
        starts.append(line)
    found: Dict[int, Tuple[int, int]] = {}
    for first, last in spans:
        code = last  # the header's code ends here: comment lines after it lead the body
        while code > first and code <= len(lines) and lines[code - 1].strip()[:1] in ("", "#"):
            code -= 1
        for n in range(first, last + 1):
            if 0 < n <= len(lines) and _is_pragma(lines[n - 1]):
                found.setdefault(n, (first, code) if n <= code else (n, n))
    for start in starts:
        if comment_above(lines, start):
            found.setdefault(start - 1, (start - 1, start - 1))
    return found


def keeps_class(text: str, name: str) -> bool:
    """KEEP_PRAGMA on the header of the last top-level ``class name`` of ``text`` (its lines up to the one ending in
    ``:``), or alone on the line above it (``comment_above``): the fork keeps the draft path of that class as it
    wrote it."""
    if KEEP_PRAGMA[2:] not in text:
        return False
    lines = text.split("\n")
    starts = [n for n, line in enumerate(lines, 1) if re.match(rf"class {re.escape(name)}\b", line)]
    if not starts:
        return False
    header = []
    for line in lines[starts[-1] - 1 : starts[-1] + 7]:
        header.append(line)
        if line.partition("#")[0].rstrip().endswith(":"):
            break
    return comment_above(lines, starts[-1]) or any(_is_pragma(line) for line in header)

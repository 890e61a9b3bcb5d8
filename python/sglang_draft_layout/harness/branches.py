"""Which way each ``if`` ordering against a number went in a tree's runs: where the probes need more.

``Branches`` records which way each ``if`` ordering against a number (``numbers``: ``num_seqs <= 4``,
``num_seqs <= MAX_SMALL``) went in the runs, its test handed to it (the tree's code as
``with_branches`` compiles it): one that every run took the same way is what the harness runs more probes for
(``invariant.judge``: probes one past its number, ``paths.past``).
"""

from __future__ import annotations

import ast
import bisect
import copy
import re
from typing import Any, Optional

from .unknown import Run

#: the name each ``if`` ordering against a number hands its test to, in the tree's code (``Tree.builtins``)
BRANCH = "__sglang_draft_layout_branch__"
_ORDERS = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)
#: a name written in capitals: a constant's (``MAX_SMALL``), its number read when the test runs
_CONSTANT = re.compile(r"[A-Z][A-Z0-9_]+")
#: the fields of a statement (and of an except handler or match case) holding statements
BODIES = ("body", "orelse", "finalbody", "handlers", "cases")
#: the base probes (``paths.PROBES``) take each layout parameter (sequences, topk, steps) at 1, 2 and more: a comparison
#: of one with a number up to this went both ways on them already
TAKEN = 2


def numbers(test: ast.expr) -> list[ast.expr]:
    """The numbers ``test`` orders against, written on either side of the operator: an int larger than ``TAKEN``
    (``num_seqs <= 4``, ``16 < bs``) or a name in capitals, a constant's, read when the test runs
    (``num_seqs <= MAX_SMALL``)."""
    return [
        side
        for node in ast.walk(test)
        if isinstance(node, ast.Compare)
        for op, left, right in zip(node.ops, [node.left, *node.comparators], node.comparators)
        if isinstance(op, _ORDERS)
        for side in (left, right)
        if _is_number(side)
    ]


def _is_number(side: ast.expr) -> bool:
    if isinstance(side, ast.Name):
        return bool(_CONSTANT.fullmatch(side.id))
    return isinstance(side, ast.Constant) and type(side.value) is int and side.value > TAKEN


#: where a line may order against a number larger than ``TAKEN`` or a name in capitals, after the operator or before
#: it (``numbers`` decides)
ORDERING = re.compile(
    r"[<>]=?[ \t]*(?:[3-9]|[1-9]\d|[A-Z][A-Z0-9_])|(?<![\w.])(?:[3-9]|[1-9]\d+|[A-Z][A-Z0-9_]+)[ \t]*[<>]"
)


_OPERATOR = re.compile(r"[<>]")


def ordering_lines(text: str) -> list[int]:
    """The lines of ``text`` where ``ORDERING`` matches, in order (only the lines holding a ``<`` or ``>`` searched)."""
    lines, line, at, end = [], 1, 0, -1
    for operator in _OPERATOR.finditer(text):
        if operator.start() < end:  # on the line searched last
            continue
        start, end = text.rfind("\n", 0, operator.start()) + 1, text.find("\n", operator.start()) % (len(text) + 1)
        if ORDERING.search(text, start, end):
            line, at = line + text.count("\n", at, start), start
            lines.append(line)
    return lines


def with_branches(module: ast.Module, text: str, filename: str, lines: Optional[list[int]] = None) -> ast.Module:
    """``module`` (``text`` parsed) with each ``if`` whose test orders against ``numbers`` and whose lines hold one of
    ``lines`` (``ordering_lines``) testing ``BRANCH((filename, line, the test's text), test, *those numbers)``; the
    parsed tree is never changed (a statement holding none is the parsed one, ``module`` itself where none does)."""
    body = _body(module.body, filename, ordering_lines(text) if lines is None else lines)
    return module if body is module.body else ast.Module(body=body, type_ignores=module.type_ignores)


def _body(body: list, filename: str, lines: list[int]) -> list:
    out = [_with_branches(stmt, filename, lines) for stmt in body]
    return body if all(new is old for new, old in zip(out, body)) else out


def _with_branches(stmt: ast.AST, filename: str, lines: list[int]) -> ast.AST:
    first = getattr(stmt, "lineno", None)  # a match statement's case has no lines of its own: its body has
    at = bisect.bisect_left(lines, first) if first is not None else None
    if at is not None and (at == len(lines) or lines[at] > (stmt.end_lineno or first)):  # none orders against a number
        return stmt
    fields = {
        name: new
        for name in BODIES
        if isinstance(old := getattr(stmt, name, None), list) and (new := _body(old, filename, lines)) is not old
    }
    ordered = numbers(stmt.test) if isinstance(stmt, ast.If) else []
    if ordered:
        where = {k: getattr(stmt.test, k) for k in ("lineno", "col_offset", "end_lineno", "end_col_offset")}
        key = ast.Constant((filename, stmt.lineno, ast.unparse(stmt.test)), **where)
        again = [ast.copy_location(copy.copy(side), side) for side in ordered]  # each read again, as its own node
        fields["test"] = ast.Call(ast.Name(BRANCH, ast.Load(), **where), [key, stmt.test, *again], [], **where)
    if not fields:
        return stmt
    new = copy.copy(stmt)
    for name, value in fields.items():
        setattr(new, name, value)
    return new


class Branches:
    """Which way each ``if`` ordering against ``numbers`` went, in runs (outside one: a module's own code, not
    recorded), by its key: (file, line, test, the numbers)."""

    def __init__(self) -> None:
        self.ways: dict[tuple[str, int, str, tuple[int, ...]], set[bool]] = {}

    def __call__(self, key: tuple[str, int, str], value: Any, *numbers: Any) -> Any:
        ints = tuple(n for n in numbers if type(n) is int and n > TAKEN)  # a constant's may be anything
        if type(value) is bool and ints and Run.current is not None:  # an unknown's is decided both ways
            self.ways.setdefault((*key, ints), set()).add(value)
        return value

    def one_way(self) -> list[tuple[str, int, str, tuple[int, ...]]]:
        """The key of each that every run so far took the same way."""
        return [key for key, ways in self.ways.items() if len(ways) == 1]

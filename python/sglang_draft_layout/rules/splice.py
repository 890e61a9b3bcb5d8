"""A file's text with the rules' edits spliced in as plain text, for ``check`` to judge without libcst.

Layout is not kept (``rewrite.py`` does that when a file is written): the result only has to be the
same program. ``apply`` judges the text libcst rendered instead.
"""

from __future__ import annotations

import ast
import itertools
from typing import Sequence

from .base import Edit, Source, removed_lines


def _offset(source: Source, starts: list[int], line: int, col: int) -> int:
    """The text offset of (1-based line, UTF-8 byte column); ``starts``: each line's offset."""
    return starts[line - 1] + len(source.lines[line - 1].encode()[:col].decode())


def _indent(source: Source, node: ast.AST) -> str:
    text = source.lines[node.lineno - 1]
    return text[: len(text) - len(text.lstrip())]


def _indented(text: str, pad: str) -> str:
    lines = text.rstrip("\n").split("\n")
    return "\n".join([lines[0], *(pad + line if line else line for line in lines[1:])])


def spliced(source: Source, edits: Sequence[Edit]) -> str:
    """``source`` with every edit applied: a node's text replaced, statements inserted before a
    statement (at its indentation), absorbed statements and removed definitions deleted."""
    changes: list[tuple[int, int, str]] = []  # (start, end, new text), by text offset
    starts = list(itertools.accumulate(map(len, source.lines), initial=0))
    for edit in edits:
        node = edit.node
        if edit.remove:
            first, last = removed_lines(source, node)
            changes.append(
                (
                    _offset(source, starts, first + 1, 0),
                    _offset(source, starts, last, 0) + len(source.lines[last - 1]),
                    "",
                )
            )
            continue
        start = _offset(source, starts, node.lineno, node.col_offset)
        end = _offset(source, starts, node.end_lineno, node.end_col_offset)
        pad = _indent(source, node)
        if edit.replace is not None:
            changes.append((start, end, _indented(edit.replace, pad)))
        if edit.before:  # ahead of the statement's decorators too
            first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", ()))])
            line_start = _offset(source, starts, first, 0)
            inserted = "".join(pad + _indented(stmt, pad) + "\n" for stmt in edit.before)
            changes.append((line_start, line_start, inserted))
        for absorbed in edit.absorb:
            first = _offset(source, starts, absorbed.lineno, 0)
            last = _offset(source, starts, absorbed.end_lineno, 0) + len(source.lines[absorbed.end_lineno - 1])
            changes.append((first, last, ""))
    text = source.code
    for start, end, new in sorted(changes, key=lambda c: (c[0], c[1]), reverse=True):
        text = text[:start] + new + text[end:]
    return text

"""Which lines of a path's layout code its runs reach: a layout that no probe runs is not judged.

A layout statement is a statement of the path's classes (and their bases in the tree) that splits the draft
``out_cache_loc`` per step (a move of the steps dimension, ``chunk``/``unbind``/``split``, or upstream's
helper). ``Lines`` traces, while a path runs, the lines of the functions holding one no run has reached yet
(Python's own line events: ``sys.settrace``, other functions untraced); ``unrun`` names each layout statement of a
function the runs entered that no run reached (a split under a branch no probe takes: ``if self.topk > 1`` where
DeepSeek-V4 runs topk 1).
"""

from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass, field
from typing import Any, Collection, Iterable, Optional

#: what a statement that splits the draft buffer per step says
_SPLIT = re.compile(
    r"\.(?:permute|movedim|transpose|swapaxes|swapdims|chunk|unbind|split|tensor_split)\(|per_step_draft_out_cache_loc\("
)


@dataclass(frozen=True)
class Statement:
    filename: str
    function: int  # the ``def`` line Python gives the function's code (``co_firstlineno``)
    first: int
    last: int
    text: str


def layout_statements(filename: str, classes: Iterable[ast.ClassDef], lines: Collection[int]) -> list[Statement]:
    """The statements of ``classes`` (class statements of the file ``filename``) that split out_cache_loc per
    step and take up one of ``lines``: the innermost simple statement naming ``out_cache_loc`` and a split."""
    found = []
    for cls in classes:
        for function in (n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            start = min([function.lineno, *(d.lineno for d in function.decorator_list)])
            if not any(start <= line <= (function.end_lineno or start) for line in lines):
                continue
            for stmt in ast.walk(function):
                if not isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.Return, ast.Expr)):
                    continue
                last = stmt.end_lineno or stmt.lineno
                if any(stmt.lineno <= n <= last for n in lines):
                    text = ast.unparse(stmt)
                    if "out_cache_loc" in text and _SPLIT.search(text):
                        found.append(Statement(filename, start, stmt.lineno, last, text))
    return found


@dataclass
class Lines:
    """The lines run in the functions holding ``statements``, over every run traced with it: a run traces only the
    functions holding a statement no run has reached yet (none: it runs untraced)."""

    statements: list[Statement]
    entered: set = field(default_factory=set)
    ran: set = field(default_factory=set)

    def __enter__(self) -> "Lines":
        self._outer: Optional[Any] = sys.gettrace()
        self._functions = {(s.filename, s.function) for s in self.statements if not self._reached(s)}
        if self._functions:
            sys.settrace(self._call)
        return self

    def _reached(self, statement: Statement) -> bool:
        return any((statement.filename, n) in self.ran for n in range(statement.first, statement.last + 1))

    def __exit__(self, *exc: object) -> None:
        sys.settrace(self._outer)

    def _call(self, frame: Any, event: str, _arg: Any) -> Optional[Any]:
        key = (frame.f_code.co_filename, frame.f_code.co_firstlineno)
        if event != "call" or key not in self._functions:
            return None
        self.entered.add(key)
        filename, ran = key[0], self.ran

        def line(frame: Any, event: str, _arg: Any) -> Any:
            if event == "line":
                ran.add((filename, frame.f_lineno))
            return line

        return line

    def unrun(self) -> list[Statement]:
        """The layout statements of an entered function that no run reached."""
        return [s for s in self.statements if (s.filename, s.function) in self.entered and not self._reached(s)]

"""Which classes bake the per-step out_cache_loc at init (DeepSeek-V4's form), and which of their paths the
fork keeps: what the rules ask the harness's verdict about. ``ast`` only."""

from __future__ import annotations

import ast
from typing import Sequence

#: the comment that keeps a site as the fork wrote it (on a method's def line or a site's statement)
KEEP = "# sglang-draft-layout: keep"
#: where the per-step backends that bake out_cache_loc are looked for (under the sglang package)
ATTENTION = "srt/layers/attention/"
#: DeepSeek-V4's per-step method (0.5.13 on) that computes its SWA KV-store write target inside the CUDA
#: graph; its eager ``init_forward_metadata`` calls it too
IN_GRAPH = "init_forward_metadata_in_graph"
#: the write target there: what this call is handed
SWA_TARGET = "translate_loc_from_full_to_swa"
#: the per-step methods whose paths the split-once verdict judges: the eager init's and the in-graph one
BAKING_STARTS = ("init_forward_metadata", IN_GRAPH)
#: the EAGLE workers (module under the sglang package, class) whose ``draft_forward`` drives each draft step
WORKERS = (
    ("srt/speculative/eagle_worker_v2.py", "EagleDraftWorker"),
    ("srt/speculative/eagle_worker.py", "EAGLEWorker"),
)


def methods(cls: ast.ClassDef) -> dict[str, ast.FunctionDef]:
    """The class's own methods by name, each its live (last) definition."""
    return {m.name: m for m in cls.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))}


def nodes(node: ast.AST, kind: type) -> list:
    return [n for n in ast.walk(node) if isinstance(n, kind)]


def baked_at(method: ast.FunctionDef, start: str = "init_forward_metadata") -> list[ast.AST]:
    """Where ``method`` bakes out_cache_loc on the path from ``start``: the ``out_cache_loc=`` it hands on
    (``init_forward_metadata``, as DeepSeek-V4's decode branch does), or its ``SWA_TARGET`` calls (``IN_GRAPH``)."""
    if start == IN_GRAPH:
        return [c for c in nodes(method, ast.Call) if isinstance(c.func, ast.Attribute) and c.func.attr == SWA_TARGET]
    return [k for k in nodes(method, ast.keyword) if k.arg == "out_cache_loc"]


def baking_methods(cls: ast.ClassDef, start: str = "init_forward_metadata") -> list[ast.FunctionDef]:
    """``start`` and the methods of ``cls`` it reaches through ``self.m(...)`` calls, when they bake
    out_cache_loc (``baked_at``) and the class knows its step; else []: the per-step backends whose path is
    judged."""
    own, todo, seen = methods(cls), [start], []
    while todo:
        method = own.get(todo.pop())
        if method is not None and method not in seen:
            seen.append(method)
            todo += [
                c.func.attr
                for c in nodes(method, ast.Call)
                if isinstance(c.func, ast.Attribute)
                and isinstance(c.func.value, ast.Name)
                and c.func.value.id == "self"
            ]
    bakes = [n for m in seen for n in baked_at(m, start)]
    return seen if bakes and "speculative_step_id" in ast.unparse(cls) else []


def comment_above(lines: Sequence[str], start: int) -> bool:
    """The keep comment alone on the line just above line ``start`` (a form black leaves where it is)."""
    return 1 < start <= len(lines) + 1 and lines[start - 2].strip().startswith(KEEP)


def first_line(node: ast.stmt) -> int:
    """The first line of a statement, its decorators included."""
    return min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])


def keeps_path(lines: Sequence[str], path: Sequence[ast.FunctionDef]) -> bool:
    """The keep comment on a def line of the path's methods (``baking_methods``) or on a statement of
    theirs handing ``out_cache_loc=`` on (a compound statement: its header), or alone on the line above either: the fork keeps that per-step
    backend's split as it wrote it. A keep on a caller keeps that caller's own layout only, never a double
    split."""
    numbers, starts = [n for m in path for n in range(m.lineno, m.body[0].lineno)], [first_line(m) for m in path]
    for statement in [s for m in path for s in nodes(m, ast.stmt)]:
        body = getattr(statement, "body", None)
        last = body[0].lineno - 1 if body else statement.end_lineno or statement.lineno
        if any(k.arg == "out_cache_loc" and k.lineno <= last for k in nodes(statement, ast.keyword)):
            numbers += range(statement.lineno, last + 1)
            starts.append(statement.lineno)
    return any(KEEP in lines[n - 1] for n in numbers if 0 < n <= len(lines)) or any(
        comment_above(lines, start) for start in starts
    )

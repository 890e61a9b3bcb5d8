"""A fork's own per-step split beside upstream's, and the edits that take it out (upstream's side of a merge).

A fork that fixed DeepSeek-V4's eager bug in its multi-step caller sets the batch's out_cache_loc to
each step's row before it calls that step's backend (and puts the whole buffer back after); one that
fixed it in the per-step backend's callee (``init_forward_metadata_decode``, where 0.5.12's shape
assert points) rebinds that method's ``out_cache_loc`` parameter to the step's row. Once the per-step
backend splits as upstream 0.5.13 does (the fork merged upstream, or cherry-picked its fix), the
fork's split is a second one. Upstream's caller hands each step the whole batch, and its callee takes
the row it is handed; taking the fork's statements out gives both: the statements that set
``<batch>.out_cache_loc`` (caller) or rebind the parameter to a layout of itself (callee), then what that
leaves with nothing to do (an ``if`` with an empty body, a ``try`` whose ``finally`` only restored the
buffer, a local no statement left reads, a private method of the class that nothing else calls). The
lines that stay are kept as written. Whether the result splits once is the split-once verdict's to
prove.
"""

from __future__ import annotations

import ast
from typing import Optional

from ..layout_patterns.ast_walk import is_self_attr, method_named, parse
from .base import Edit, Source, definition_start, param_names

#: the nodes a value may hold and still do nothing but compute (calls are checked apart)
PURE = (
    *(ast.Name, ast.Attribute, ast.Subscript, ast.Constant, ast.Slice, ast.Tuple, ast.keyword, ast.expr_context),
    *(ast.UnaryOp, ast.BinOp, ast.unaryop, ast.operator),
)

#: tensor methods that give a view or copy of their tensor: layout code, not a use of the buffer
LAYOUT_METHODS = frozenset(
    {"reshape", "view", "permute", "transpose", "swapaxes", "swapdims", "movedim", "flatten", "contiguous", "clone",
     "to", "long", "int", "chunk", "unbind", "split"}
)  # fmt: skip


def _sets_batch_loc(stmt: ast.stmt, batch: str) -> bool:
    return isinstance(stmt, ast.Assign) and all(
        isinstance(t, ast.Attribute)
        and t.attr == "out_cache_loc"
        and isinstance(t.value, ast.Name)
        and t.value.id == batch
        for t in stmt.targets
    )


def _statements(node: ast.AST) -> list[ast.stmt]:
    return [n for n in ast.walk(node) if isinstance(n, ast.stmt) and n is not node]


def _pure(expr: ast.expr, cls: ast.ClassDef) -> bool:
    """Reading ``expr`` does nothing but compute it: names, attributes, subscripts, constants, a tensor's
    layout methods (``reshape``, ``permute``, ...) and calls of the class's own methods, with such arguments."""

    for node in ast.walk(expr):
        if isinstance(node, ast.Call):
            if not isinstance(node.func, ast.Attribute):
                return False
            own = is_self_attr(node.func, node.func.attr) and method_named(cls, node.func.attr) is not None
            if not (own or node.func.attr in LAYOUT_METHODS):
                return False
        elif not isinstance(node, PURE):
            return False
    return True


def _rebinds_to_a_layout(stmt: ast.stmt, method: ast.FunctionDef, cls: ast.ClassDef) -> bool:
    """``stmt`` binds a parameter of ``method`` to a layout of itself: a value that reads it, calls a
    tensor's layout method and does nothing but compute (``_pure``); which rows is the proof's to say."""

    if not (
        isinstance(stmt, ast.Assign)
        and len(stmt.targets) == 1
        and isinstance(stmt.targets[0], ast.Name)
        and stmt.targets[0].id in param_names(method)
    ):
        return False
    name, nodes = stmt.targets[0].id, list(ast.walk(stmt.value))
    return (
        any(isinstance(n, ast.Name) and n.id == name for n in nodes)
        and any(isinstance(n, ast.Call) and getattr(n.func, "attr", "") in LAYOUT_METHODS for n in nodes)
        and _pure(stmt.value, cls)
    )


def _removed(method: ast.FunctionDef, cls: ast.ClassDef, seeds: set[int]) -> set[int]:
    """The ids of the statements to take out: ``seeds`` and what they leave with nothing to do (see the
    module), to a fixed point."""
    statements = _statements(method)
    removed = set(seeds)
    while True:
        live = [s for s in statements if not any(id(a) in removed for a in _holders(method, s))]
        loads = {n.id for s in live for n in _own_nodes(s) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        more = set()
        for s in live:
            if isinstance(s, ast.If) and not s.orelse and all(id(b) in removed for b in s.body):
                more.add(id(s))
            if (
                isinstance(s, ast.Assign)
                and len(s.targets) == 1
                and isinstance(s.targets[0], ast.Name)
                and s.targets[0].id not in loads
                and s.targets[0].id not in param_names(method)
                and _pure(s.value, cls)
            ):
                more.add(id(s))
        if not more - removed:
            return removed
        removed |= more


def _holders(method: ast.FunctionDef, stmt: ast.stmt) -> list[ast.stmt]:
    """``stmt`` and the statements of ``method`` that hold it."""
    return [s for s in _statements(method) if s is stmt or stmt in _statements(s)]


def _own_nodes(stmt: ast.stmt) -> list[ast.AST]:
    """The nodes of ``stmt`` outside the statements it holds (a block's header, a simple statement whole)."""
    inner = {id(n) for s in _statements(stmt) for n in ast.walk(s) if hasattr(n, "lineno")}
    return [n for n in ast.walk(stmt) if id(n) not in inner]


def _unwrapped(stmt: ast.AST, removed: set[int]) -> bool:
    """A ``try`` with no handler whose ``finally`` is taken out whole: its body stays in its place."""
    return (
        isinstance(stmt, ast.Try)
        and not stmt.handlers
        and not stmt.orelse
        and bool(stmt.finalbody)
        and all(id(s) in removed for s in stmt.finalbody)
    )


def _text_without(source: Source, stmt: ast.stmt, removed: set[int]) -> Optional[str]:
    """``stmt``'s lines with the removed statements (and their comment lines) cut and each unwrapped
    ``try`` opened, dedented; None where the lines do not allow it (two statements on one line, say)."""
    outer = _indent(source.lines[stmt.lineno - 1])
    keep = {i: source.lines[i] for i in range(stmt.lineno - 1, stmt.end_lineno)}
    for inner in _statements(stmt):
        if id(inner) in removed:
            for i in range(definition_start(source, inner), inner.end_lineno):
                keep.pop(i, None)
    for inner in [stmt, *_statements(stmt)]:
        if not _unwrapped(inner, removed) or id(inner) in removed:
            continue
        if source.lines[inner.lineno - 1].strip() != "try:":
            return None
        body_end = inner.body[-1].end_lineno
        finally_line = next(
            (i for i in range(body_end, inner.finalbody[0].lineno - 1) if source.lines[i].strip() == "finally:"), None
        )
        if finally_line is None:
            return None
        at = _indent(source.lines[inner.lineno - 1])
        shift = len(_indent(source.lines[inner.body[0].lineno - 1])) - len(at)
        for i in [inner.lineno - 1, *range(finally_line, inner.end_lineno)]:
            keep.pop(i, None)
        for i in range(inner.lineno, body_end):
            if i in keep and keep[i].strip():
                if not keep[i].startswith(at + " " * shift):
                    return None
                keep[i] = at + keep[i][len(at) + shift :]
    text = "".join(line[len(outer) :] if line.startswith(outer) else line for line in (keep[i] for i in sorted(keep)))
    try:
        parsed = ast.parse(text)
    except SyntaxError:
        return None
    return text if len(parsed.body) == 1 else None


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def caller_split_removal(source: Source, cls_name: str, method_name: str) -> tuple[list[Edit], str]:
    """The edits that take the fork's per-step split out of the multi-step caller ``cls_name.method_name``
    (its statements setting ``<batch>.out_cache_loc``; see the module), or ([], why not) in one line."""
    cls = source.cls(cls_name)
    method = source.method(cls_name, method_name) if cls is not None else None
    if method is None or len(param_names(method)) < 2:
        return [], f"no {cls_name}.{method_name}(self, forward_batch) in this file"
    batch = param_names(method)[1]
    seeds = {id(s) for s in _statements(method) if _sets_batch_loc(s, batch)}
    return _removal(source, cls, method, seeds, f"`{batch}.out_cache_loc`")


def callee_split_removal(source: Source, cls_name: str, method_name: str) -> tuple[list[Edit], str]:
    """The edits that take the fork's per-step split out of the per-step backend's callee
    ``cls_name.method_name`` (the statements rebinding a parameter to a layout of it; see the module), or
    ([], why not) in one line."""
    cls = source.cls(cls_name)
    method = source.method(cls_name, method_name) if cls is not None else None
    if method is None:
        return [], f"no {cls_name}.{method_name} in this file"
    seeds = {id(s) for s in _statements(method) if _rebinds_to_a_layout(s, method, cls)}
    return _removal(source, cls, method, seeds, "parameter to a layout of itself")


def _removal(
    source: Source, cls: ast.ClassDef, method: ast.FunctionDef, seeds: set[int], what: str
) -> tuple[list[Edit], str]:
    """The edits that take ``seeds`` out of ``cls.method`` with what they leave with nothing to do."""
    cls_name, method_name = cls.name, method.name
    if not seeds:
        return [], f"{cls_name}.{method_name} sets no {what}"
    removed = _removed(method, cls, seeds)
    kept = [s for s in method.body if id(s) not in removed]
    if not kept:
        return [], f"taking the fork's split out leaves {cls_name}.{method_name} empty: do it by hand"
    replaced: dict[int, str] = {}
    for stmt in kept:
        if any(id(inner) in removed for inner in _statements(stmt)):
            text = _text_without(source, stmt, removed)
            if text is None:
                return (
                    [],
                    f"cannot take the fork's split out of {cls_name}.{method_name} (line {stmt.lineno}) as written",
                )
            replaced[id(stmt)] = text
    taker = next((s for s in kept if id(s) in replaced), kept[0])  # takes the comments of those taken out
    absorbed = tuple(s for s in method.body if id(s) in removed)
    edits = [
        Edit(s, replace=replaced.get(id(s)), absorb=absorbed if s is taker else ())
        for s in kept
        if id(s) in replaced or s is taker and absorbed
    ]
    return edits + _unused_methods(source, cls, method, removed), ""


def _unused_methods(source: Source, cls: ast.ClassDef, method: ast.FunctionDef, removed: set[int]) -> list[Edit]:
    """Removals of the private methods of ``cls`` that only the removed statements called."""
    called = {
        n.func.attr
        for s in _statements(method)
        if id(s) in removed
        for n in _own_nodes(s)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and is_self_attr(n.func, n.func.attr)
    }
    module = parse(source.code, source.path)
    gone = {
        (n.lineno, n.col_offset)
        for s in _statements(method)
        if id(s) in removed
        for n in ast.walk(s)
        if hasattr(n, "lineno")
    }
    edits = []
    for name in sorted(called):
        defined = [m for m in cls.body if isinstance(m, ast.FunctionDef) and m.name == name]
        used = [
            n
            for n in ast.walk(module)
            if (isinstance(n, ast.Attribute) and n.attr == name or isinstance(n, ast.Name) and n.id == name)
            and (n.lineno, n.col_offset) not in gone
        ]
        if name.startswith("_") and len(defined) == 1 and not used:
            edits.append(Edit(defined[0], remove=True))
    return edits

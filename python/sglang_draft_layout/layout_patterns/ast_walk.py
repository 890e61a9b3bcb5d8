"""Generic helpers over Python's own ``ast``: a text parsed once per plan, walking a tree in
source order, source ranges, the names a call or an attribute spells, a class's methods and the
methods ``self`` reaches.
"""

from __future__ import annotations

import ast
import contextlib
from typing import Dict, FrozenSet, Iterator, List, Optional, Tuple


#: within ``parsing_once``: parsed texts (text, file name) -> tree, and how many are kept; None outside
_PARSED: Optional[Dict[Tuple[str, str], ast.Module]] = None
_KEPT: Optional[int] = None


@contextlib.contextmanager
def parsing_once(kept: Optional[int] = None) -> Iterator[None]:
    """Within it ``parse`` parses each text once: a plan reads a file whole, by its class blocks and
    as rendered, several times over. ``kept``: at most that many trees, the oldest let go first
    (a test session's plans meet the same release files again); all are let go at the end. Nested,
    the outermost one holds."""
    global _PARSED, _KEPT
    outermost = _PARSED is None
    if outermost:
        _PARSED, _KEPT = {}, kept
    try:
        yield
    finally:
        if outermost:
            _PARSED, _KEPT = None, None


def parse(code: str, path: str = "<unknown>") -> ast.Module:
    """``ast.parse(code, filename=path)``, once per text within ``parsing_once``. The tree may be
    shared: read it, never change it (what the proofs keep on a node is a function of that node alone)."""
    if _PARSED is None:
        return ast.parse(code, filename=path)
    key = (code, path)
    if key not in _PARSED:
        if _KEPT is not None and len(_PARSED) >= _KEPT:
            del _PARSED[next(iter(_PARSED))]
        _PARSED[key] = ast.parse(code, filename=path)
    return _PARSED[key]


def in_order(node: ast.AST) -> Iterator[ast.AST]:
    """``node`` and every node below it, in source order."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        children = []
        for name in current._fields:
            value = getattr(current, name, None)
            if isinstance(value, ast.AST):
                children.append(value)
            elif isinstance(value, list):
                children += [item for item in value if isinstance(item, ast.AST)]
        stack += reversed(children)


def nodes_of(func: ast.AST, kind: type) -> List[ast.AST]:
    """The ``kind`` nodes of ``func`` in source order, from one walk kept on ``func``."""
    index: Optional[Dict[type, List[ast.AST]]] = getattr(func, "_nodes_by_type", None)
    if index is None:
        index = {}
        for node in in_order(func):
            index.setdefault(type(node), []).append(node)
        func._nodes_by_type = index  # type: ignore[attr-defined]
    if kind in index or not kind.__subclasses__():
        return index.get(kind, [])
    found = [n for k, group in index.items() if issubclass(k, kind) for n in group]
    return sorted(found, key=lambda n: (n.lineno, n.col_offset))


def is_self_attr(node: ast.AST, name: str) -> bool:
    """``self.<name>``."""
    return (
        isinstance(node, ast.Attribute)
        and node.attr == name
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    )


def called_name(node: ast.AST) -> Optional[str]:
    """``f`` for a call ``f(...)`` or ``x.f(...)``; None for anything else."""
    if not isinstance(node, ast.Call):
        return None
    if isinstance(node.func, ast.Name):
        return node.func.id
    if isinstance(node.func, ast.Attribute):
        return node.func.attr
    return None


def factors(expr: ast.expr) -> List[ast.expr]:
    """The factors of a product ``a * b * c``; ``[expr]`` for anything else."""
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Mult):
        return factors(expr.left) + factors(expr.right)
    return [expr]


def start_of(node: ast.AST) -> Tuple[int, int]:
    """Where ``node`` starts in the source: (line, column)."""
    return node.lineno, node.col_offset


def end_of(node: ast.AST) -> Tuple[int, int]:
    """Where ``node`` ends in the source: (line, column)."""
    return node.end_lineno or node.lineno, node.end_col_offset or 0


def inside(node: ast.AST, outer: ast.AST) -> bool:
    """``node`` lies within ``outer``'s source range."""
    return start_of(outer) <= start_of(node) and end_of(node) <= end_of(outer)


def holding_statement(func: ast.AST, node: ast.AST) -> ast.stmt:
    """The innermost statement of ``func`` holding ``node``."""
    return [s for s in nodes_of(func, ast.stmt) if inside(node, s)][-1]


def comprehension_targets(node: ast.AST) -> FrozenSet[int]:
    """``id`` of each name a comprehension in ``node`` binds (``for bs in ...`` inside ``[...]``):
    local to the comprehension, it rebinds nothing around it."""
    return frozenset(
        id(name)
        for comprehension in nodes_of(node, ast.comprehension)
        for name in in_order(comprehension.target)
        if isinstance(name, ast.Name)
    )


def methods(cls: ast.ClassDef) -> List[ast.FunctionDef]:
    """The functions defined in the class body."""
    return [s for s in cls.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))]


def method_named(cls: ast.ClassDef, name: str) -> Optional[ast.FunctionDef]:
    """The method ``name`` of ``cls`` as Python keeps it, the last definition (None when it has none)."""
    return next((m for m in reversed(methods(cls)) if m.name == name), None)


def self_called(cls: ast.ClassDef, func: ast.AST) -> List[ast.FunctionDef]:
    """The methods of ``cls`` that ``func`` calls as ``self.<name>(...)``."""
    called = {n.func.attr for n in nodes_of(func, ast.Call) if is_self_attr(n.func, getattr(n.func, "attr", ""))}
    return [m for m in methods(cls) if m.name in called and m is not func]


def self_reached(cls: ast.ClassDef, func: ast.AST) -> List[ast.AST]:
    """``func``, then each method of ``cls`` it reaches through ``self.<name>(...)`` calls at any
    depth (``self_called`` of ``self_called`` ...), each once in the order first reached, so
    recursion and methods calling each other end."""
    reached = [func]
    for each in reached:  # the list grows while it is walked: breadth first
        reached += [m for m in self_called(cls, each) if m not in reached]
    return reached

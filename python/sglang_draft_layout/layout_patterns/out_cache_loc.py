"""The per-step out_cache_loc spellings: a hand-written split of ``[bs, topk, steps]`` per step
(``Split``, ``out_cache_loc_layouts``), when removing its bound 3-d view would change it
(``view_reads``, ``view_rebinds``), and the calls of ``per_step_draft_out_cache_loc``.
"""

from __future__ import annotations

import ast
from typing import Dict, Iterator, List, NamedTuple, Optional, Tuple

from .ast_walk import (
    called_name,
    comprehension_targets,
    end_of,
    factors,
    holding_statement,
    in_order,
    inside,
    nodes_of,
    start_of,
)
from .helper_names import PER_STEP_HELPER


def _method_call(node: ast.AST, name: str) -> Optional[ast.Call]:
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        if node.func.attr == name:
            return node
    return None


class Split(NamedTuple):
    """A hand-written per-step split of the draft out_cache_loc: ``[bs, topk, steps]`` to
    ``[steps, bs * topk]``, the same layout as ``per_step_draft_out_cache_loc``.

    ``node`` is the ``[steps, bs * topk]`` expression; ``statements`` the two statements
    of the two-statement form (``x = x.reshape(bs, topk, steps)`` then
    ``x = x.permute(...).reshape(steps, -1)``; ``node`` is then the 3-d view), else empty.
    ``view`` is the statement binding the 3-d view to a local that ``node``, in a later
    statement of the same block, moves (``rows = x.reshape(bs, topk, steps)`` then
    ``y = rows.permute(...).reshape(...)``), else None; ``between`` the statements
    between the two; ``block`` the compound statement of that block holding the move in
    a block of its own (``if ...:`` / ``with ...:`` / ... ``y = rows.permute(...)...``),
    else None. ``buffer``, ``batch_size``, ``topk`` and ``num_steps`` are the
    expressions the fork wrote (its locals included).
    """

    node: ast.expr
    statements: List[ast.stmt]
    buffer: ast.expr
    batch_size: ast.expr
    topk: ast.expr
    num_steps: ast.expr
    view: Optional[ast.Assign] = None
    between: Tuple[ast.stmt, ...] = ()
    block: Optional[ast.stmt] = None

    @property
    def line(self) -> int:
        """The split's first line: its first statement's, its bound view's, or its expression's."""
        first = self.statements[0] if self.statements else self.view or self.node
        return first.lineno


def _int(node: ast.AST) -> Optional[int]:
    """The value of an int literal, ``-1`` included."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        value = _int(node.operand)
        return None if value is None else -value
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    return None


def _args(call: ast.Call) -> Optional[List[ast.expr]]:
    """A call's positional arguments, one tuple/list argument unpacked; None with keywords."""
    if call.keywords or any(isinstance(a, ast.Starred) for a in call.args):
        return None
    if len(call.args) == 1 and isinstance(call.args[0], (ast.Tuple, ast.List)):
        return list(call.args[0].elts)
    return list(call.args)


class Locals:
    """A function's locals bound once (``name = value``, never rebound nor a parameter),
    to compare expressions through them: ``topk`` bound to ``self.topk`` is ``self.topk``.
    """

    def __init__(self, func: ast.AST) -> None:
        stores: Dict[str, int] = {}
        for node in nodes_of(func, ast.Name):
            if not isinstance(node.ctx, ast.Load):
                stores[node.id] = stores.get(node.id, 0) + 1
        args = getattr(func, "args", None)
        params = {a.arg for a in nodes_of(args, ast.arg)} if args is not None else set()
        self.values: Dict[str, ast.expr] = {}
        for node in nodes_of(func, ast.Assign):
            target = node.targets[0]
            if len(node.targets) == 1 and isinstance(target, ast.Name):
                if stores.get(target.id) == 1 and target.id not in params:
                    self.values[target.id] = node.value

    def key(self, node: ast.AST, depth: int = 0) -> str:
        """A text of ``node`` with each local replaced by its value and a product's factors
        sorted: two expressions with the same key have the same value."""
        if isinstance(node, ast.Name):
            if node.id in self.values and depth < 8:
                return self.key(self.values[node.id], depth + 1)
            return node.id
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            return "(" + "*".join(sorted(self.key(f, depth + 1) for f in factors(node))) + ")"
        parts = [type(node).__name__]
        for name in node._fields:
            if name == "ctx":
                continue
            value = getattr(node, name, None)
            for item in value if isinstance(value, list) else [value]:
                parts.append(self.key(item, depth + 1) if isinstance(item, ast.AST) else repr(item))
        return "(" + " ".join(parts) + ")"

    def same(self, a: ast.AST, b: ast.AST) -> bool:
        return self.key(a) == self.key(b)


_SELF_TOPK = ast.parse("self.topk", mode="eval").body
_SELF_STEPS = ast.parse("self.speculative_num_steps", mode="eval").body


def _split_3d(node: ast.AST, names: Locals) -> Optional[ast.Call]:
    """``x.reshape|view(bs, self.topk, self.speculative_num_steps)`` (either through locals)."""
    call = _method_call(node, "reshape") or _method_call(node, "view")
    args = _args(call) if call is not None else None
    if args is None or len(args) != 3:
        return None
    _bs, topk, steps = args
    if names.same(topk, _SELF_TOPK) and names.same(steps, _SELF_STEPS):
        return call
    return None


def _steps_first(
    node: ast.AST,
) -> Optional[Tuple[ast.expr, Optional[ast.expr], Optional[ast.expr]]]:
    """(receiver, steps, width) of ``<x>.<moves>.reshape(steps, width)`` or ``<x>.<moves>.flatten(1)``
    (steps and width None) where the moves put the last of three dimensions first: ``permute(2, 0, 1)``,
    ``movedim(2, 0)``, or transposes that end in the same order."""
    reshape = _method_call(node, "reshape")
    flatten = _method_call(node, "flatten")
    if reshape is not None:
        shape = _args(reshape)
        if shape is None or len(shape) != 2:
            return None
        steps, width = shape
        current = reshape.func.value
    elif flatten is not None:
        dims = [_int(a) for a in flatten.args] + [
            _int(k.value) for k in flatten.keywords if k.arg in ("start_dim", "end_dim")
        ]
        if dims not in ([1], [1, 2], [1, -1]) or len(flatten.keywords) > 2:
            return None
        if flatten.keywords and [k.arg for k in flatten.keywords][:1] != ["start_dim"]:
            return None
        steps = width = None
        current = flatten.func.value
    else:
        return None
    moves: List[Tuple[str, List[Optional[int]]]] = []
    while isinstance(current, ast.Call) and isinstance(current.func, ast.Attribute):
        name = current.func.attr
        if name not in ("permute", "transpose", "swapaxes", "swapdims", "movedim"):
            break
        args = _args(current)
        if args is None:
            return None
        moves.append((name, [_int(a) for a in args]))
        current = current.func.value
    order = [0, 1, 2]  # the [bs, topk, steps] dimension at each place
    for name, args in reversed(moves):
        if None in args or any(not -3 <= a < 3 for a in args):
            return None
        places = [a % 3 for a in args]
        if name == "permute" and sorted(places) == [0, 1, 2]:
            order = [order[p] for p in places]
        elif name != "permute" and len(places) == 2 and name == "movedim":
            moved = order.pop(places[0])
            order.insert(places[1], moved)
        elif name != "permute" and len(places) == 2:
            order[places[0]], order[places[1]] = order[places[1]], order[places[0]]
        else:
            return None
    if not moves or order != [2, 0, 1]:
        return None
    return current, steps, width


def _split_of(node: ast.AST, names: Locals, three_d: Optional[ast.Call] = None) -> Optional[Split]:
    """The split ``node`` computes: its steps-first receiver is the 3-d view (or ``three_d``'s
    result), the steps are the view's, the width ``-1`` or the view's ``bs * topk``."""
    found = _steps_first(node)
    if found is None:
        return None
    receiver, steps, width = found
    split = three_d if three_d is not None else _split_3d(receiver, names)
    if split is None:
        return None
    bs, topk, num_steps = _args(split)
    if steps is not None:
        steps_ok = _int(steps) == -1 or names.same(steps, num_steps)
        width_ok = _int(width) == -1 or names.same(width, ast.BinOp(bs, ast.Mult(), topk))
        if not (steps_ok and width_ok) or _int(steps) == _int(width) == -1:
            return None
    return Split(node, [], split.func.value, bs, topk, num_steps)


def _assigned(stmt: ast.stmt) -> Optional[ast.Assign]:
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
        if isinstance(stmt.targets[0], ast.Name):
            return stmt
    return None


def _header_nodes(stmt: ast.stmt) -> Iterator[ast.AST]:
    """The nodes of ``stmt`` outside the statements nested in it."""
    stack: List[ast.AST] = [stmt]
    while stack:
        node = stack.pop()
        yield node
        stack += [c for c in ast.iter_child_nodes(node) if not isinstance(c, ast.stmt)]


def _moves_of(stmt: ast.stmt, name: str) -> Iterator[ast.Call]:
    """The steps-first calls of ``stmt`` (not of a statement nested in it) whose receiver is ``name``."""
    for node in _header_nodes(stmt):
        moved = _steps_first(node)
        if moved and isinstance(moved[0], ast.Name) and moved[0].id == name:
            yield node  # type: ignore[misc]


def _block_moves(stmt: ast.stmt, name: str) -> Iterator[ast.Call]:
    """The steps-first calls whose receiver is ``name`` in the statements nested in ``stmt`` (not in
    a ``def`` or ``class`` there); none when ``stmt`` binds ``name`` anywhere (a move might then
    be another value's)."""
    scopes = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    if isinstance(stmt, scopes) or any(bound == name for bound, _ in _bindings(stmt)):
        return
    defined = [d for d in nodes_of(stmt, ast.stmt) if isinstance(d, scopes)]
    for inner in nodes_of(stmt, ast.stmt):
        if inner is not stmt and not any(inside(inner, d) for d in defined):
            yield from _moves_of(inner, name)


def _views_anew(stmt: ast.stmt, name: str, names: Locals) -> bool:
    """``stmt`` binds ``name`` to a 3-d view of its own: the moves after it are that view's."""
    bound = _assigned(stmt)
    return bound is not None and bound.targets[0].id == name and _split_3d(bound.value, names) is not None


def out_cache_loc_layouts(func: ast.AST) -> List[Split]:
    """Hand-written per-step out_cache_loc layouts, in one expression or two statements.

    One expression: ``x.reshape(bs, self.topk, self.speculative_num_steps)`` (or ``view``),
    its last dimension moved first (``permute(2, 0, 1)``, ``permute((2, 0, 1))``,
    ``movedim(2, 0)``, ``transpose(1, 2).transpose(0, 1)``, ...), then
    ``reshape(self.speculative_num_steps, -1)``, ``reshape(-1, bs * self.topk)``,
    ``reshape(steps, step_width)`` or ``flatten(1)``; topk, steps and widths also through
    locals bound once. Two statements: ``x = x.reshape(bs, ...)`` then
    ``x = x.permute(...).reshape(...)``; or the 3-d view bound to any local
    (``rows = x.reshape(bs, ...)``) and moved through it in a later statement of the same
    block, anywhere in it (``y = rows.permute(...).reshape(...)[i]``, ``return ...``), or
    in the blocks of a later compound statement (``Split.block``: ``if ...:``, ``with``,
    ``try``, ``match``, a loop, at any depth; each such move a split):
    ``Split.view``, the statements between in ``Split.between`` (``view_rebinds`` and
    ``view_reads`` say when removing the view's statement would change the split).
    """
    names = Locals(func)
    found: List[Split] = []
    inner = set()
    holders = [*nodes_of(func, ast.stmt), *nodes_of(func, ast.excepthandler)]
    for node in holders if isinstance(func, ast.stmt) else [func, *holders]:
        for field in ("body", "orelse", "finalbody"):
            body = getattr(node, field, None)
            if not isinstance(body, list):
                continue
            for index, first in enumerate(body):
                one = _assigned(first)
                split = _split_3d(one.value, names) if one is not None else None
                if split is None:
                    continue
                view = one.targets[0].id
                moves: List[Tuple[ast.Call, Split]] = []
                for end, second in enumerate(body[index + 1 :], index + 1):
                    calls, block = list(_moves_of(second, view)), None
                    if not calls:
                        calls, block = list(_block_moves(second, view)), second
                    moves = [
                        (call, layout)
                        for call in calls
                        for layout in [_split_of(call, names, split)]
                        if layout is not None
                    ]
                    if moves or _views_anew(second, view, names):
                        break
                for call, layout in moves:
                    between = tuple(body[index + 1 : end])
                    inner.add(id(call))
                    two = _assigned(second)
                    if not between and two is not None and two.value is call and two.targets[0].id == view:
                        found.append(layout._replace(node=one.value, statements=[first, second]))
                    else:
                        found.append(layout._replace(view=first, between=between, block=block))
    for call in nodes_of(func, ast.Call):
        if id(call) not in inner:
            layout = _split_of(call, names)
            if layout is not None:
                found.append(layout)
    return sorted(found, key=lambda s: (s.node.lineno, s.node.col_offset))


def view_reads(func: ast.AST, split: Split) -> List[ast.Name]:
    """The reads (loads, ``del``) of ``split``'s bound 3-d view other than the split's own:
    any after the view is bound (or anywhere in a loop around it), up to the end of the
    split's statement when that statement binds the name anew; any in a function, lambda
    or generator expression of ``func`` (they may run later). Removing the view's
    statement would break them.
    """
    view = split.view
    if view is None:
        return []
    name = view.targets[0].id  # type: ignore[attr-defined]
    receiver = _steps_first(split.node)[0]  # type: ignore[index]
    holder = holding_statement(func, split.node)
    rebinds = isinstance(holder, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in holder.targets)
    loops = [loop for loop in [*nodes_of(func, ast.For), *nodes_of(func, ast.While)] if inside(view, loop)]
    deferring = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.GeneratorExp)
    later = [n for k in deferring for n in nodes_of(func, k) if n is not func]
    reads = []
    for read in nodes_of(func, ast.Name):
        if read.id != name or isinstance(read.ctx, ast.Store) or read is receiver:
            continue
        if inside(read, view):
            continue  # the view's own value (``x = x.view(...)``)
        if any(inside(read, node) for node in later):
            seen = True
        elif rebinds:
            seen = end_of(view) <= start_of(read) and end_of(read) <= end_of(holder)
        else:
            seen = end_of(view) <= start_of(read) or any(inside(read, loop) for loop in loops)
        if seen:
            reads.append(read)
    return reads


def _bindings(stmt: ast.stmt, until: Optional[ast.stmt] = None) -> Iterator[Tuple[str, int]]:
    """(what, line) of each name, attribute or item ``stmt`` binds or deletes, anywhere in it:
    targets (assignments, ``for``, ``with ... as``, walrus, ``del``), definitions, imports,
    ``global`` / ``nonlocal``, ``except ... as`` and ``match`` captures; not a comprehension's
    own names (``comprehension_targets``); with ``until`` (a statement in ``stmt``), only
    those written before it."""
    inner = comprehension_targets(stmt)
    for node in in_order(stmt):
        if id(node) in inner:
            continue
        names = _bound_by(node)
        if names and until is not None and start_of(node) >= start_of(until):
            continue
        for name in names:
            yield name, node.lineno


def _bound_by(node: ast.AST) -> List[str]:
    """What ``node`` itself binds or deletes (``_bindings``)."""
    if isinstance(node, (ast.Name, ast.Attribute, ast.Subscript)):
        return [] if isinstance(node.ctx, ast.Load) else [ast.unparse(node)]
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return [a.asname or a.name.split(".")[0] for a in node.names]
    if isinstance(node, (ast.Global, ast.Nonlocal)):
        return list(node.names)
    if isinstance(node, ast.ExceptHandler) or type(node).__name__ in (
        "MatchAs",
        "MatchStar",
        "MatchMapping",
    ):
        return [getattr(node, field) for field in ("name", "rest") if isinstance(getattr(node, field, None), str)]
    return []


def _bound_ahead(holder: ast.stmt, node: ast.AST) -> Iterator[Tuple[str, int]]:
    """(what, line) of each binding in ``holder``'s own header written before ``node`` in it, so
    made before ``node`` runs: a walrus, a ``match`` capture, a ``with ... as`` target; not
    ``holder``'s assignment or ``for`` targets (bound after their value) nor a comprehension's.
    """
    targets = [*getattr(holder, "targets", []), getattr(holder, "target", None)]
    skipped = {id(n) for t in targets if t is not None for n in in_order(t)}
    skipped |= comprehension_targets(holder)
    for each in _header_nodes(holder):
        if id(each) in skipped or not hasattr(each, "lineno"):
            continue
        if start_of(each) < start_of(node):
            for name in _bound_by(each):
                yield name, each.lineno


def view_rebinds(split: Split, holder: Optional[ast.stmt] = None) -> List[Tuple[str, int]]:
    """(what, line) of each binding, in the statements between ``split``'s bound 3-d view
    and its move (in the ``Split.block`` holding the move, everything written before the
    move's statement: headers, earlier statements and branches; with ``holder``, the move's
    statement, what its header binds before the move, ``_bound_ahead``), of the view's
    local or of what the view reads (the buffer, the batch size, ``self.topk`` or a local
    for it, ...; an attribute or item of them too). Removing the view's statement would
    then split other values than the fork's.
    """
    if split.view is None:
        return []
    read = {split.view.targets[0].id}  # type: ignore[attr-defined]
    read |= {
        ast.unparse(node)
        for node in in_order(split.view.value)
        if isinstance(node, (ast.Name, ast.Attribute, ast.Subscript))
    }
    scanned: List[Tuple[ast.stmt, Optional[ast.stmt]]] = [(stmt, None) for stmt in split.between]
    if split.block is not None:
        scanned.append((split.block, holding_statement(split.block, split.node)))
    bound = [b for stmt, until in scanned for b in _bindings(stmt, until)]
    bound += _bound_ahead(holder, split.node) if holder is not None else []
    return [
        (name, line) for name, line in bound if any(r == name or r.startswith((name + ".", name + "[")) for r in read)
    ]


def helper_calls(func: ast.AST) -> List[ast.Call]:
    """The ``per_step_draft_out_cache_loc(...)`` calls of ``func``."""
    return [n for n in nodes_of(func, ast.Call) if called_name(n) == PER_STEP_HELPER]

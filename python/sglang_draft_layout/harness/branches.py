"""Which way each ``if`` comparing with a number went in a tree's runs: where the probes need more.

A ``min`` or ``max`` of a value and such a number (``min(max_bs, 64)``) is an ``if`` in disguise: noted alike.

``Branches`` records which way each ``if`` (and conditional expression) ordering against or equal to a number
(``comparisons``: ``num_seqs <= 4``, ``num_seqs <= MAX_SMALL``, ``num_seqs != 5``) went in the runs, its test handed
to it (the tree's code as ``with_branches`` compiles it), and the values its test read: one that every run took the
same way is what the harness runs more probes for (``invariant.judge``: probes on its other side, ``paths.past``),
and refuses where it stays one way, but where its test computes nothing and the values it read were the same on every
probe (configuration values, not a layout parameter).
"""

from __future__ import annotations

import ast
import bisect
import copy
import re
from typing import Any, Optional

from .unknown import Run

#: the name each ``if`` comparing with a number hands its test to, in the tree's code (``Tree.builtins``)
BRANCH = "__sglang_draft_layout_branch__"
_ORDERS = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)
_EQUALS = (ast.Eq, ast.NotEq)
#: a name written in capitals: a constant's (``MAX_SMALL``, ``self.MAX_BS``), its number read when the test runs
_CONSTANT = re.compile(r"[A-Z][A-Z0-9_]+")
#: the fields of a statement (and of an except handler or match case) holding statements
BODIES = ("body", "orelse", "finalbody", "handlers", "cases")
#: the base probes (``paths.PROBES``) take each layout parameter (sequences, topk, steps) at 1, 2 and more: a comparison
#: of one with a number up to this went both ways on them already
TAKEN = 2
#: the values an operand may hold and still be one configuration value (read the same on every probe)
PLAIN = (int, float, str, bool, type(None))
#: an operand's value that is not ``PLAIN``; what ``Branches.read`` holds for an ``if`` whose operands took other values
#: on one probe than on another
VARIED = "varied"


def comparisons(test: ast.expr) -> list[tuple[ast.expr, bool, ast.expr]]:
    """(number, whether an equality, operand) of each comparison in ``test`` ordering against or equal to a number,
    written on either side of the operator: an int larger than ``TAKEN`` (``num_seqs <= 4``, ``16 < bs``, ``bs != 5``)
    or a name in capitals (or an attribute so named), a constant's, read when the test runs (``num_seqs <= MAX_SMALL``,
    ``bs < self.MAX_BS``)."""
    return [
        (side, isinstance(op, _EQUALS), other)
        for node in ast.walk(test)
        if isinstance(node, ast.Compare)
        for op, left, right in zip(node.ops, [node.left, *node.comparators], node.comparators)
        if isinstance(op, _ORDERS + _EQUALS)
        for side, other in ((left, right), (right, left))
        if _is_number(side)
    ]


def _is_number(side: ast.expr) -> bool:
    if isinstance(side, (ast.Name, ast.Attribute)):  # ``MAX_BS``, ``self.MAX_BS``
        return bool(_CONSTANT.fullmatch(side.id if isinstance(side, ast.Name) else side.attr))
    return isinstance(side, ast.Constant) and type(side.value) is int and side.value > TAKEN


def _read_free(operand: ast.expr) -> bool:
    """A name or a chain of attributes of one (``num_seqs``, ``self.fa_impl_ver``): a value the code holds, not one the
    test computes (a call's, a sum's, a subscript's)."""
    while isinstance(operand, ast.Attribute):
        operand = operand.value
    return isinstance(operand, ast.Name)


def _is_none_test(test: ast.Compare) -> bool:
    """``x is None``, ``self.rows is not None``."""
    return (
        _read_free(test.left)
        and all(isinstance(op, (ast.Is, ast.IsNot)) for op in test.ops)
        and all(isinstance(side, ast.Constant) and side.value is None for side in test.comparators)
    )


def _values_read(test: ast.expr) -> Optional[list[ast.expr]]:
    """The values the code holds that ``test`` reads (``_read_free``), where it combines only them and constants with
    ``and``, ``or``, ``not`` and comparisons (``self.fa_impl_ver == 3 and self.paged``; of ``x is None``, whether it
    is); None where it computes one (``f(bs) and self.fa_impl_ver == 3``: the ``if`` is taken as deciding on a layout
    parameter)."""
    if isinstance(test, ast.BoolOp):
        parts = [_values_read(value) for value in test.values]
    elif isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        parts = [_values_read(test.operand)]
    elif isinstance(test, ast.Compare) and _is_none_test(test):
        return [test]  # whether it is None: a plain value, where the object is not
    elif isinstance(test, ast.Compare):
        parts = [_values_read(side) for side in (test.left, *test.comparators)]
    else:
        return [] if isinstance(test, ast.Constant) or _is_number(test) else [test] if _read_free(test) else None
    return None if None in parts else [value for part in parts for value in part]


#: where a line may order against or equal a number larger than ``TAKEN`` or a name in capitals (an attribute's too),
#: after the operator or before it (``comparisons`` decides), or bound a value by one (``min(max_bs, 64)``:
#: ``bounds``); an arrow (``->``) and a shift (``<<``, ``>>=``) are none
ORDERING = re.compile(
    r"(?:(?<![-<>])[<>](?![<>])=?|[=!]=)[ \t]*(?:[3-9]|[1-9]\d|(?:[A-Za-z_]\w*\.)*[A-Z][A-Z0-9_])"
    r"|(?<![\w.])(?:[3-9]|[1-9]\d+|(?:[A-Za-z_]\w*\.)*[A-Z][A-Z0-9_]+)[ \t]*(?:[<>](?![<>])|[=!]=)"
    r"|\b(?:min|max)\((?=.*(?<![\w.])(?:[3-9]|[1-9]\d+|(?:[A-Za-z_]\w*\.)*[A-Z][A-Z0-9_]+)\b)"
)


_OPERATORS = ("<", ">", "==", "!=", "min(", "max(")
_QUOTE = re.compile("['\"]")


def ordering_lines(text: str) -> list[int]:
    """The lines of ``text`` where ``ORDERING`` matches, in order (only the lines holding one of ``_OPERATORS``
    searched; on a line with no quote, only up to a ``#``: what follows is a comment, or a string's text)."""
    lines, line, at, end = [], 1, 0, -1
    for operator in _places(text, _OPERATORS):
        if operator < end:  # on the line searched last
            continue
        start, end = text.rfind("\n", 0, operator) + 1, text.find("\n", operator) % (len(text) + 1)
        hash_at = text.find("#", start, end)
        code_end = hash_at if hash_at >= 0 and not _QUOTE.search(text, start, end) else end
        if ORDERING.search(text, start, code_end):
            line, at = line + text.count("\n", at, start), start
            lines.append(line)
    return lines


def _places(text: str, tokens: tuple[str, ...]) -> list[int]:
    """Where each of ``tokens`` stands in ``text``, in order (found by ``str.find``: a pattern of them, tried at every
    character, took ten times as long)."""
    places = []
    for token in tokens:
        at = text.find(token)
        while at >= 0:
            places.append(at)
            at = text.find(token, at + 1)
    return sorted(places)


def with_branches(module: ast.Module, text: str, filename: str, lines: Optional[list[int]] = None) -> ast.Module:
    """``module`` (``text`` parsed) with each ``if`` and conditional expression whose test compares with
    ``comparisons``' numbers and whose lines hold one of ``lines`` (``ordering_lines``) testing ``BRANCH((filename,
    line, the test's text, whether each is an equality), test, *those numbers)`` (``_recorded``). The parsed tree is
    never changed (a statement holding none is the parsed one, ``module`` itself where none does)."""
    body = _body(module.body, filename, ordering_lines(text) if lines is None else lines)
    return module if body is module.body else ast.Module(body=body, type_ignores=module.type_ignores)


def _body(body: list, filename: str, lines: list[int]) -> list:
    out = [_with_branches(stmt, filename, lines) for stmt in body]
    return body if all(new is old for new, old in zip(out, body)) else out


def _with_branches(stmt: ast.AST, filename: str, lines: list[int]) -> ast.AST:
    first = getattr(stmt, "lineno", None)  # a match statement's case has no lines of its own: its body has
    at = bisect.bisect_left(lines, first) if first is not None else None
    if at is not None and (at == len(lines) or lines[at] > (stmt.end_lineno or first)):  # none compares with a number
        return stmt
    fields = {
        name: new
        for name in BODIES
        if isinstance(old := getattr(stmt, name, None), list) and (new := _body(old, filename, lines)) is not old
    }
    if isinstance(stmt, ast.If):
        recorded = _recorded(stmt.test, filename, stmt.lineno)
        if recorded is not None:
            fields["test"] = recorded
    elif isinstance(stmt, ast.stmt):
        fields.update(_expressions(stmt, filename))
    return _with_fields(stmt, fields)


def _with_fields(node: Any, fields: dict[str, Any]) -> Any:
    """``node`` itself where ``fields`` is empty, else a copy holding them."""
    if not fields:
        return node
    new = copy.copy(node)
    for name, value in fields.items():
        setattr(new, name, value)
    return new


def _recorded(test: ast.expr, filename: str, line: int) -> Optional[ast.Call]:
    """``BRANCH((filename, line, the test's text, whether each is an equality), test, *the numbers compared with)``;
    where the test reads only values the code holds and constants (``_values_read``), each value handed to
    ``BRANCH.operand((filename, line), value)`` where the test reads it (never read again: ``x is not None and x.n ==
    5``). None where the test compares with no number (``comparisons``)."""
    compared = comparisons(test)
    if not compared:
        return None
    where = {k: getattr(test, k) for k in ("lineno", "col_offset", "end_lineno", "end_col_offset")}
    equalities = tuple(equality for _number, equality, _operand in compared)
    key = ast.Constant((filename, line, ast.unparse(test), equalities), **where)
    values = _values_read(test)
    handed = _operands_handed(test, (filename, line), values) if values is not None else test
    again = [ast.copy_location(copy.copy(number), number) for number, _equality, _operand in compared]
    return ast.Call(ast.Name(BRANCH, ast.Load(), **where), [key, handed, *again], [], **where)


def _expressions(node: ast.AST, filename: str) -> dict[str, Any]:
    """The fields of ``node`` (a statement's, but its bodies; an expression's) that hold a conditional expression
    whose test compares with a number (``x if num_seqs <= 4 else y``) or a bound (``min(max_bs, 64)``: ``bounds``), each
    a copy with that test ``_recorded``, that value handed to ``Branches.bound``."""
    fields: dict[str, Any] = {}
    for name, value in ast.iter_fields(node):
        if name in BODIES:
            continue
        if isinstance(value, ast.expr):
            new = _expression(value, filename)
            if new is not value:
                fields[name] = new
        elif isinstance(value, list):  # a call's keywords and a comprehension's loops hold expressions too
            items = [
                (
                    _expression(item, filename)
                    if isinstance(item, ast.expr)
                    else _with_fields(item, _expressions(item, filename)) if isinstance(item, _HOLDING) else item
                )
                for item in value
            ]
            if any(new is not old for new, old in zip(items, value)):
                fields[name] = items
    return fields


#: the parts of an expression that are no expressions but hold some (``f(n=...)``, ``[... for i in ...]``)
_HOLDING = (ast.keyword, ast.comprehension)


def _expression(node: ast.expr, filename: str) -> ast.expr:
    fields = _expressions(node, filename)
    recorded = _recorded(node.test, filename, node.test.lineno) if isinstance(node, ast.IfExp) else None
    if recorded is not None:
        fields["test"] = recorded
    bound = bounds(node) if isinstance(node, ast.Call) else None
    if bound is not None:  # ``min(max_bs, 64)``: the value handed to ``BRANCH.bound`` on its way in
        number, at = bound
        key = ast.Constant((filename, node.lineno, ast.unparse(node), (False,)))
        recorder = ast.Attribute(ast.Name(BRANCH, ast.Load()), "bound", ast.Load())
        args = list(fields.get("args", node.args))
        args[at] = ast.Call(recorder, [key, args[at], copy.copy(number)], [])
        fields["args"] = [ast.fix_missing_locations(ast.copy_location(arg, old)) for arg, old in zip(args, node.args)]
    return _with_fields(node, fields)


def bounds(call: ast.Call) -> Optional[tuple[ast.expr, int]]:
    """(the number, the place of the value it bounds) of ``min`` or ``max`` of a value and a number larger than
    ``TAKEN`` or a name in capitals (``min(max_bs, 64)``, ``max(MIN_BS, bs)``): an ``if`` ordering against it in
    disguise; None for any other call."""
    if not (isinstance(call.func, ast.Name) and call.func.id in ("min", "max") and len(call.args) == 2):
        return None
    if call.keywords or any(isinstance(arg, ast.Starred) for arg in call.args):
        return None
    numbers = [at for at, arg in enumerate(call.args) if _is_number(arg)]
    return (call.args[numbers[0]], 1 - numbers[0]) if len(numbers) == 1 else None


def _operands_handed(test: ast.expr, key: tuple[str, int], operands: list[ast.expr]) -> ast.expr:
    """A copy of ``test`` with each of ``operands`` read through ``BRANCH.operand(key, operand)``."""
    copies: dict = {}
    new = copy.deepcopy(test, copies)
    handed = {id(copies[id(operand)]) for operand in operands}

    class Hand(ast.NodeTransformer):
        def visit(self, node: ast.AST) -> ast.AST:
            if id(node) not in handed:
                return self.generic_visit(node)
            recorder = ast.Attribute(ast.Name(BRANCH, ast.Load()), "operand", ast.Load())
            return ast.copy_location(ast.Call(recorder, [ast.Constant(key), node], []), node)

    return ast.fix_missing_locations(Hand().visit(new))


class Branches:
    """Which way each ``if`` comparing with ``comparisons``' numbers went, in runs (outside one: a module's own code,
    not recorded), by its key: (file, line, test, the values its other side takes: one past an ordering's number, an
    equality's number); and by (file, line), the plain values its operands took where a way was recorded
    (``reading``: as its test runs; ``on_probe``: on the probe running), ``read`` the same on every probe so far
    (``VARIED``: not), ``other_context`` read on a probe of another context length than the base probes'."""

    def __init__(self) -> None:
        self.ways: dict[tuple[str, int, str, tuple[int, ...]], set[bool]] = {}
        self.reading: dict[tuple[str, int], set] = {}
        self.on_probe: dict[tuple[str, int], set] = {}
        self.read: dict[tuple[str, int], Any] = {}
        self.other_context: set[tuple[str, int]] = set()

    def __call__(self, key: tuple[str, int, str, tuple[bool, ...]], value: Any, *numbers: Any) -> Any:
        filename, line, test, equalities = key
        read = self.reading.pop((filename, line), None)
        other_side = tuple(  # a constant's number may be anything
            n + (not equality) for n, equality in zip(numbers, equalities) if type(n) is int and n > TAKEN
        )
        if type(value) is bool and other_side and Run.current is not None:  # an unknown's is decided both ways
            self.ways.setdefault((filename, line, test, other_side), set()).add(value)
            self.on_probe.setdefault((filename, line), set()).update(read or ())
        return value

    def bound(self, key: tuple[str, int, str, tuple[bool, ...]], value: Any, number: Any) -> Any:
        """``value``, which a ``min`` or ``max`` at ``key`` bounds by ``number`` (``bounds``), noted as the ``if`` ordering
        it against ``number`` would be."""
        if type(value) is int and type(number) is int:
            self(key, value <= number, number)
        return value

    def operand(self, key: tuple[str, int], value: Any) -> Any:
        """``value``, an operand of the comparisons of the ``if`` at ``key`` as its test reads it, noted in a run."""
        if Run.current is not None:
            self.reading.setdefault(key, set()).add((type(value), value) if type(value) in PLAIN else VARIED)
        return value

    def probed(self, other_context: bool) -> None:
        """The probe run last is over (``other_context``: it took another context length than the base probes)."""
        for where, values in self.on_probe.items():
            if not values or VARIED in values or self.read.setdefault(where, values) != values:
                self.read[where] = VARIED
            if other_context:
                self.other_context.add(where)
        self.on_probe.clear()
        self.reading.clear()

    def clear(self) -> None:
        for noted in (self.ways, self.reading, self.on_probe, self.read, self.other_context):
            noted.clear()

    def one_way(self) -> list[tuple[str, int, str, tuple[int, ...]]]:
        """The key of each that every run so far took the same way."""
        return [key for key, ways in self.ways.items() if len(ways) == 1]

    def varied(self, key: tuple[str, int, str, tuple[int, ...]]) -> bool:
        """Whether the operands of the ``if`` at ``key`` took other values on one probe than on another, or one not
        plain, or were not read (a call's, say): a layout parameter."""
        return self.read.get(key[:2], VARIED) == VARIED

    def configuration(self, key: tuple[str, int, str, tuple[int, ...]]) -> bool:
        """Whether the operands of the ``if`` at ``key`` took the same plain values on every probe, one of another
        context length among them (``self.fa_impl_ver == 3``): no layout parameter decides it."""
        return not self.varied(key) and key[:2] in self.other_context

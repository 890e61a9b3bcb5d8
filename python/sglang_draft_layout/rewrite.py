"""Apply the rules' edits to a file's text with libcst (``apply`` and ``diff`` only).

The rules name ast nodes (source ranges). Each edit's anchor is looked up in the
smallest piece of the file holding it (the innermost statement holding the anchor and the
statements the edit absorbs, or the run of statements of one block they lie in; pieces that
share lines are one), parsed on its own by libcst after a stand-in block line for each
statement holding it, so that its indentation stays; the anchor is the libcst node with
the same syntactic range (parentheses excluded, as in ast; a parenthesised tuple's range
includes them in both). Only those pieces are rewritten and spliced back: the rest of the
file is never touched.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from dataclasses import dataclass, fields
from typing import Mapping, Optional, Sequence

import libcst as cst
from libcst.metadata import CodeRange, MetadataWrapper, PositionProvider, WhitespaceInclusivePositionProvider

from .rules.base import Edit, Source, definition_start, removed_lines

#: a stand-in block line: an indented piece is parsed after one for each statement holding it
BLOCK = "class _:\n"
#: nodes whose range (libcst's PositionProvider) leaves out children an edit may name: a definition's decorators
#: (an indented block's range starts where its first statement's does, after the decorators)
_RANGE_LEAVES_OUT = (cst.Module, cst.FunctionDef, cst.ClassDef, cst.IndentedBlock)
#: expressions that never need the parentheses the node they replace had
ATOMS = (cst.Name, cst.Attribute, cst.Call, cst.Subscript)


class AnchorError(Exception):
    """An edit's ast node matches no libcst node (a rule bug)."""

    def __init__(self, node: ast.AST) -> None:
        super().__init__(f"{type(node).__name__} at line {node.lineno}")
        self.node = node


@dataclass
class Segment:
    """Lines [start, end) of a file, parsed by libcst as a module of their own."""

    start: int
    end: int
    module: cst.Module
    prefix: str

    def text(self, module: cst.Module) -> str:
        """The lines of ``module`` (this segment, possibly rewritten) without the prefix."""
        return module.code[len(self.prefix) :]


def _piece(source: Source, nodes: Sequence[ast.AST]) -> tuple[int, int, str]:
    """(start, end, prefix) of the lines parsed for ``nodes`` (an edit's anchor and the statements it absorbs): the
    innermost statement holding them, or the run of statements of one block they lie in, from the first one's
    ``definition_start``; the prefix holds a stand-in block line at the indentation of each statement around them
    (libcst takes the file's indent unit from the first). Where a blank or comment line stands above the first
    (libcst's leading line of it, which an edit may move), the run takes in the statement before it, or the one
    holding it, until none does or the run is the method of a top-level class or the top-level statement holding the
    nodes (``_bound``): what libcst parses then gives each statement the leading lines it had when that method or
    statement was parsed whole."""
    first, last = min(node.lineno for node in nodes), max(node.end_lineno for node in nodes)

    def holding(block: list[ast.stmt]) -> list[ast.stmt]:
        return [stmt for stmt in block if definition_start(source, stmt) < last and first <= stmt.end_lineno]

    levels = [(source.tree.body, holding(source.tree.body))]  # (a block, its statements holding the nodes)
    while len(run := levels[-1][1]) == 1 and not any(run[0] is node for node in nodes):
        blocks = [(block, held) for block in _blocks(run[0]) if (held := holding(block))]
        if len(blocks) != 1:
            break
        levels.append(blocks[0])
    bound = _bound(levels, nodes)
    body, run = levels.pop()
    if not run:
        raise AnchorError(nodes[0])
    while (
        bound is not None
        and not any(stmt is bound for stmt in run)
        and _spaced(source, definition_start(source, run[0]))
    ):
        at = next(i for i, stmt in enumerate(body) if stmt is run[0])
        if at:
            run = [body[at - 1], *run]
        else:
            body, run = levels.pop()
    indents: list[str] = []  # an ``elif``'s statement stands at its ``if``'s indentation: one block line for both
    for _block, around in levels:
        indent = _indent(source.lines[around[0].lineno - 1])
        if not indents or len(indent) > len(indents[-1]):
            indents.append(indent)
    end = run[-1].end_lineno  # and a block's footer, the comment lines after its last statement, up to the bound's end
    while _blocks(run[-1]) and bound is not None and end < bound.end_lineno and _spaced(source, end + 1):
        end += 1
    return definition_start(source, run[0]), end, "".join(indent + BLOCK for indent in indents)


def _bound(levels: list[tuple[list[ast.stmt], list[ast.stmt]]], nodes: Sequence[ast.AST]) -> Optional[ast.stmt]:
    """The statement a piece grows up to at most: the method of a top-level class holding ``nodes``, else the top-level
    statement holding them (None: they lie in several)."""
    top = levels[0][1]
    if len(top) != 1:
        return None
    if isinstance(top[0], ast.ClassDef) and top[0] not in nodes and len(levels) > 1 and len(levels[1][1]) == 1:
        if isinstance(levels[1][1][0], (ast.FunctionDef, ast.AsyncFunctionDef)):
            return levels[1][1][0]
    return top[0]


def _spaced(source: Source, start: int) -> bool:
    """Whether the line above line index ``start`` is blank or a comment (libcst's leading lines of the statement
    there, as the statements around it have them)."""
    return start > 0 and (not source.lines[start - 1].strip() or source.lines[start - 1].lstrip().startswith("#"))


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def _blocks(stmt: ast.stmt) -> list[list[ast.stmt]]:
    """The blocks of statements of ``stmt`` (an except handler's and a match case's included)."""
    blocks = [getattr(stmt, name, None) or [] for name in ("body", "orelse", "finalbody")]
    blocks += [clause.body for name in ("handlers", "cases") for clause in getattr(stmt, name, None) or []]
    return [block for block in blocks if block and isinstance(block[0], ast.stmt)]


def _pieces(source: Source, edits: Sequence[Edit]) -> list[tuple[tuple[int, int, str], list[Edit]]]:
    """The pieces parsed for ``edits`` and the edits of each: where two pieces share lines (one holds the other, or
    two runs of one block meet), one piece of both."""
    pieces: list[tuple[tuple[int, int, str], list[Edit]]] = []
    for piece, edit in sorted(
        ((_piece(source, [e.node, *e.absorb]), e) for e in edits), key=lambda p: (p[0][0], -p[0][1])
    ):
        if pieces and piece[0] < pieces[-1][0][1]:
            (start, end, prefix), held = pieces[-1]
            pieces[-1] = (start, max(end, piece[1]), prefix), [*held, edit]
        else:
            pieces.append((piece, [edit]))
    return pieces


def _parse(source: Source, start: int, end: int, prefix: str) -> Segment:
    module = cst.parse_module(prefix + "".join(source.lines[start:end]))
    if not prefix and module.header:  # libcst puts comments above the first statement in the module header
        first = module.body[0]
        module = module.with_changes(
            header=[], body=[first.with_changes(leading_lines=[*module.header, *first.leading_lines]), *module.body[1:]]
        )
    return Segment(start, end, module, prefix)


def _position(source: Source, segment: Segment, line: int, byte_col: int) -> tuple[int, int]:
    """A file position (ast: 1-based line, UTF-8 byte column) in the segment's libcst terms."""
    column = len(source.lines[line - 1].encode()[:byte_col].decode())
    return line - segment.start + segment.prefix.count("\n"), column


def _locate(
    source: Source, segment: Segment, anchors: Sequence[ast.AST]
) -> tuple[dict[int, cst.CSTNode], Mapping[cst.CSTNode, CodeRange]]:
    """``id(anchor) -> libcst node`` for every anchor in the segment, and the range of every node of the segment."""
    providers = [PositionProvider]
    if any(isinstance(a, ast.Tuple) for a in anchors):
        providers.append(WhitespaceInclusivePositionProvider)
    resolved = MetadataWrapper(segment.module, unsafe_skip_copy=True).resolve_many(providers)
    found = {}
    for anchor in anchors:
        start = _position(source, segment, anchor.lineno, anchor.col_offset)
        end = _position(source, segment, anchor.end_lineno, anchor.end_col_offset)
        found[id(anchor)] = _match(anchor, start, end, resolved)
    return found, resolved[PositionProvider]


def _match(anchor: ast.AST, start: tuple[int, int], end: tuple[int, int], resolved) -> cst.CSTNode:
    def at(position: CodeRange) -> tuple[int, int]:
        return position.start.line, position.start.column

    if isinstance(anchor, ast.stmt):
        for node, position in resolved[PositionProvider].items():
            if at(position) != start:
                continue
            if isinstance(node, cst.BaseCompoundStatement) or (
                isinstance(node, cst.SimpleStatementLine) and len(node.body) == 1
            ):
                return node
        raise AnchorError(anchor)
    ranges = resolved[WhitespaceInclusivePositionProvider if isinstance(anchor, ast.Tuple) else PositionProvider]
    for node, position in ranges.items():
        if (
            isinstance(node, cst.BaseExpression)
            and at(position) == start
            and ((position.end.line, position.end.column) == end)
        ):
            return node
    raise AnchorError(anchor)


class _ApplyEdits(cst.CSTTransformer):
    """Apply every edit to the node it names, children first, in one pass.

    ``absorbed`` pairs each statement an edit removes with the statement that takes over
    its comments (replaced or not; those inside it and at its end too, each on a line of its
    own: ``_inner_comments``), and says whether the removed one came first. One that
    came first leaves the blank lines above its comments to the statement after it (the
    lines around the statements between stay), its comments go right above the taker's
    own (after the taker's blank lines).

    Only the nodes whose range (``ranges``) holds one the edits name are entered (and those whose range leaves out
    some of their children: ``_RANGE_LEAVES_OUT``); the rest stay as parsed.
    """

    def __init__(
        self,
        edits: Sequence[tuple[Edit, cst.CSTNode]],
        absorbed: Sequence[tuple[cst.CSTNode, cst.CSTNode, bool]],
        ranges: Mapping[cst.CSTNode, CodeRange],
    ) -> None:
        super().__init__()
        named = [node for _edit, node in edits] + [node for stmt, taker, _first in absorbed for node in (stmt, taker)]
        self.ranges, self.named = ranges, [_ends(ranges[node]) for node in named]
        self.edits: dict[int, list[Edit]] = defaultdict(list)
        for edit, node in edits:
            self.edits[id(node)].append(edit)
        self.removed = {id(stmt) for stmt, _taker, _first in absorbed}
        self.comments_before: dict[int, list[cst.EmptyLine]] = defaultdict(list)
        self.comments: dict[int, list[cst.EmptyLine]] = defaultdict(list)
        self.blanks_left: dict[int, list[cst.EmptyLine]] = {}  # removed statement -> its blank lines
        self.blanks_before: dict[int, list[cst.EmptyLine]] = {}  # statement after it -> those lines
        for stmt, taker, first in absorbed:
            if first:
                self.blanks_left[id(stmt)], comments = _blanks_first(stmt.leading_lines)
                self.comments_before[id(taker)] += [*comments, *_inner_comments(stmt)]
            else:
                self.comments[id(taker)] += [*stmt.leading_lines, *_inner_comments(stmt)]

    def on_visit(self, node: cst.CSTNode) -> bool:
        body = node.body if isinstance(node, (cst.Module, cst.IndentedBlock)) else ()
        for stmt, after in zip(body, body[1:]):
            if id(stmt) in self.blanks_left:
                # a run of removed statements: the first blank lines of the run go on
                self.blanks_before[id(after)] = self.blanks_before.get(id(stmt)) or self.blanks_left[id(stmt)]
        return self._holds_a_named_node(node) and super().on_visit(node)

    def _holds_a_named_node(self, node: cst.CSTNode) -> bool:
        if node not in self.ranges or isinstance(node, _RANGE_LEAVES_OUT):
            return True
        start, end = _ends(self.ranges[node])
        return any(start <= first and last <= end for first, last in self.named)

    def on_leave(self, original_node: cst.CSTNode, updated_node: cst.CSTNode):
        if id(original_node) in self.removed:
            return cst.RemoveFromParent()
        node = updated_node
        blanks = self.blanks_before.get(id(original_node))
        if blanks and not _blanks_first(node.leading_lines)[0]:  # never two runs of blank lines
            node = node.with_changes(leading_lines=[*blanks, *node.leading_lines])
        edits = self.edits.get(id(original_node))
        if not edits:
            return node
        replacements = [e.replace for e in edits if e.replace is not None]
        assert len(replacements) <= 1, f"two rules rewrite the same node: {edits}"
        if replacements and isinstance(node, cst.BaseExpression):
            node = cst.parse_expression(replacements[0])
            if not node.lpar and not isinstance(node, ATOMS):  # ast's range excludes the parentheses
                node = node.with_changes(lpar=updated_node.lpar, rpar=updated_node.rpar)
        elif not isinstance(node, cst.BaseExpression):
            key = id(original_node)
            blank, own = _blanks_first(node.leading_lines)
            inner = []
            if replacements and not any(e.drop_inner_comments for e in edits):
                inner = [c for c in _inner_comments(node) if c.comment.value not in replacements[0]]
            comments = [*blank, *self.comments_before[key], *own, *inner, *self.comments[key]]
            if replacements:
                node = cst.parse_statement(replacements[0])
            node = node.with_changes(leading_lines=comments)
        groups = [[cst.parse_statement(text) for text in e.before] for e in edits if e.before]
        if not groups:
            return node
        separate = max(e.separate for e in edits)
        for group in groups[1:]:
            group[0] = group[0].with_changes(leading_lines=[*_blank(separate), *group[0].leading_lines])
        before = [stmt for group in groups for stmt in group]
        kept = list(node.leading_lines) if any(e.keep_comments for e in edits) else []
        moved = [] if kept else list(node.leading_lines)
        before[0] = before[0].with_changes(leading_lines=[*moved, *before[0].leading_lines])
        return cst.FlattenSentinel([*before, node.with_changes(leading_lines=[*_blank(separate), *kept])])


def _ends(position: CodeRange) -> tuple[tuple[int, int], tuple[int, int]]:
    return (position.start.line, position.start.column), (position.end.line, position.end.column)


def _inner_comments(stmt: cst.CSTNode) -> list[cst.EmptyLine]:
    """The comments written in ``stmt`` after its leading lines (inside its brackets, at its end),
    each as a line of its own: what a removed statement leaves to the one taking it over."""
    comments: list[cst.Comment] = []

    class Collect(cst.CSTVisitor):
        def visit_Comment(self, node: cst.Comment) -> None:
            comments.append(node)

    stmt.with_changes(leading_lines=()).visit(Collect())
    return [cst.EmptyLine(comment=comment) for comment in comments]


def _blanks_first(lines: Sequence[cst.EmptyLine]) -> tuple[list[cst.EmptyLine], list[cst.EmptyLine]]:
    """``lines`` split before their first comment: (the blank lines above it, the rest)."""
    first = next((i for i, line in enumerate(lines) if line.comment is not None), len(lines))
    return list(lines[:first]), list(lines[first:])


def _blank(count: int) -> list[cst.EmptyLine]:
    return [cst.EmptyLine(indent=False)] * count


def apply_edits(source: Source, edits: Sequence[Edit]) -> str:
    """The file's text with ``edits`` applied (raises AnchorError for an anchor libcst lacks); a removed
    definition's lines are cut as they are (``removed_lines``), apart from the pieces libcst rewrites.
    The same edits of the same text are rendered once a process (``_RENDERED``): a check and an apply of
    one tree render each file twice, and the tests render the same release files again and again."""
    key = (source.code, tuple(_edit_key(edit) for edit in edits))
    if key not in _RENDERED:
        if len(_RENDERED) >= _KEPT:
            del _RENDERED[next(iter(_RENDERED))]
        _RENDERED[key] = _apply_edits(source, edits)
    return _RENDERED[key]


#: (text, the edits' places and contents) -> the rendered text, the oldest of ``_KEPT`` let go first
_RENDERED: dict[tuple, str] = {}
_KEPT = 64


def _edit_key(edit: Edit) -> tuple:
    """What of an edit the rendering reads: its fields, an ast node by its place in the text."""

    def value(field: object) -> object:
        if isinstance(field, ast.AST):
            return (type(field).__name__, field.lineno, field.col_offset, field.end_lineno, field.end_col_offset)
        return tuple(map(value, field)) if isinstance(field, tuple) else field

    return tuple(value(getattr(edit, f.name)) for f in fields(edit))


def _apply_edits(source: Source, edits: Sequence[Edit]) -> str:
    replacements: dict[tuple[int, int], str] = {removed_lines(source, e.node): "" for e in edits if e.remove}
    for (start, end, prefix), piece_edits in _pieces(source, [e for e in edits if not e.remove]):
        segment = _parse(source, start, end, prefix)
        anchors = [e.node for e in piece_edits] + [s for e in piece_edits for s in e.absorb]
        nodes, ranges = _locate(source, segment, anchors)
        absorbed = [
            (nodes[id(stmt)], nodes[id(e.node)], stmt.lineno < e.node.lineno) for e in piece_edits for stmt in e.absorb
        ]
        transformer = _ApplyEdits([(e, nodes[id(e.node)]) for e in piece_edits], absorbed, ranges)
        replacements[segment.start, segment.end] = segment.text(segment.module.visit(transformer))
    lines = list(source.lines)
    for (start, end), text in sorted(replacements.items(), reverse=True):
        lines[start:end] = [text]
    return "".join(lines)

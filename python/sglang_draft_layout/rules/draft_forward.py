"""Per-step out_cache_loc in the EAGLE workers' ``draft_forward``.

Site: ``EagleDraftWorker.draft_forward`` (V2 worker, overlap scheduling) and, where a
release still has it, ``EAGLEWorker.draft_forward`` (v1, ``--disable-overlap-schedule``
or topk > 1), which reshape the flat draft buffer by hand:
``x = x.reshape(bs, self.topk, self.speculative_num_steps)`` then
``x = x.permute((2, 0, 1)).reshape(self.speculative_num_steps, -1)``.
Upstream (PR 26239) calls
``per_step_draft_out_cache_loc(x, bs, self.topk, self.speculative_num_steps)``.
Invariant: the worker writes step i's KV to the same slots that DeepSeek-V4 bakes into
its metadata, because both read the layout off one helper, which also checks the
buffer's length.

A fork's own spelling (any ``layout_patterns.out_cache_loc.out_cache_loc_layouts`` proves equal, a 3-d view
bound to a local included, statements between it and its move too, the move also in a block
below the view) is rewritten where it is, every split of the method in one apply; a bound view
read elsewhere, moved in several statements, inside a loop below it, into the body of a ``try``
below it or inside a lambda or comprehension, what it reads rebound before its move, two
splits in one statement, or the name a split binds bound another way elsewhere in the method (rows
laid out otherwise in a branch the probes need not take), are refused.

Not affected: the step-major split of SGLang 0.4.6.post5 and 0.4.7,
``x = x.view(bs, -1)`` then ``x[:, self.topk * i : self.topk * (i + 1)]`` (a
``[bs, steps, topk]`` layout, not the helper's ``[bs, topk, steps]``): the tree's own
layout, left as it is (rewriting it with the helper would move every draft slot).
"""

from __future__ import annotations

import ast
import re
from typing import Optional

from ..layout_patterns.ast_walk import called_name, factors, holding_statement, inside, is_self_attr, nodes_of
from ..layout_patterns.helper_names import PER_STEP_HELPER
from ..layout_patterns.out_cache_loc import Split, helper_calls, out_cache_loc_layouts, view_reads, view_rebinds
from ..layout_patterns.baking import WORKERS
from .base import EAGLE_UTILS, Edit, Finding, Rule, Source, State, locate_method

CALL = f"""{PER_STEP_HELPER}(
{{pad}}    {{buffer}},
{{pad}}    {{batch_size}},
{{pad}}    {{topk}},
{{pad}}    {{num_steps}},
{{pad}})"""


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def helper_edit(source: Source, method: ast.AST, split: Split) -> list[Edit]:
    """The edits that compute ``split`` with the helper, keeping the fork's own expressions.

    Two statements become one ``x = per_step_draft_out_cache_loc(...)``; a split inside
    an expression becomes the helper call there, and a 3-d view bound for it before
    (``Split.view``) goes, its comments kept (the statements between stay as they are).
    The call is exploded one argument per line (black keeps it so: magic trailing comma),
    indented from the line it starts on.
    """
    texts = {name: source.text(getattr(split, name)) for name in ("buffer", "batch_size", "topk", "num_steps")}
    if split.statements:
        target = split.statements[0].targets[0].id  # type: ignore[attr-defined]
        new = _assigned_call(source, split.statements[0], f"{target} = ", texts)
        return [Edit(split.statements[0], replace=new, absorb=tuple(split.statements[1:]))]
    holder = holding_statement(method, split.node)
    edit = _statement_anew(source, holder, split, texts)
    if edit is not None:
        return [edit] if split.view is None else [Edit(holder, replace=edit.replace, absorb=(split.view,))]
    pad = _indent(source.lines[split.node.lineno - 1])[len(_indent(source.lines[holder.lineno - 1])) :]
    in_place = Edit(split.node, replace=_one_line_call(source, holder, split, texts) or CALL.format(pad=pad, **texts))
    return [in_place] if split.view is None else [in_place, Edit(holder, absorb=(split.view,))]


def _statement_anew(source: Source, holder: ast.stmt, split: Split, texts: dict[str, str]) -> Optional[Edit]:
    """``x = <...>`` (any one target: ``self.x``, ``rows[i]``), ``x: T = <...>`` or ``return <...>`` holding the
    split on the lines of its value: the statement anew with the helper call, parentheses around its value
    dropped (None for any other statement)."""
    head = "return " if isinstance(holder, ast.Return) else ""
    if isinstance(holder, ast.Assign) and len(holder.targets) == 1:
        head = f"{source.text(holder.targets[0])} = "
    if isinstance(holder, ast.AnnAssign):
        head = f"{source.text(holder.target)}: {source.text(holder.annotation)} = "
    if not head or "\n" in head or holder.value is None:
        return None
    value = source.text(holder.value)
    start = len(source.text(_span(holder.value, split.node, end=False)))
    end = len(value) - len(source.text(_span(holder.value, split.node, end=True)))
    before, after = value[:start], _on_one_line(value[end:])
    if "\n" in before or after is None:
        return None
    if before or after:  # inside an expression of the statement
        call = _one_line_call(source, holder, split, texts)
        if call:
            return Edit(holder, replace=head + before + call + after + "\n")
    return Edit(holder, replace=_assigned_call(source, holder, head, texts, before, after))


def _one_line_call(source: Source, holder: ast.stmt, split: Split, texts: dict[str, str]) -> Optional[str]:
    """The helper call on one line, for a split inside an expression of a one-line statement that
    still fits the line length with it, as black leaves such a line (exploded there, the call would
    make black explode what holds it too); else None."""
    line = source.lines[holder.lineno - 1].rstrip("\n")
    call = f"{PER_STEP_HELPER}({', '.join(texts.values())})"
    if holder.end_lineno != holder.lineno or len(line) - len(source.text(split.node)) + len(call) > source.line_length:
        return None
    return call


def _assigned_call(
    source: Source, stmt: ast.stmt, head: str, texts: dict[str, str], before: str = "", after: str = ""
) -> str:
    """``stmt`` anew as ``head`` + ``before`` + the helper call + ``after``, as black writes it: a
    plain ``x = <call>`` (the call the whole value) whose first line does not fit the line length
    but fits as ``x = (`` gets the call in parentheses, one level in."""
    indent = len(_indent(source.lines[stmt.lineno - 1]))
    if (
        not before
        and not after
        and head.endswith(" = ")
        and indent + len(head) + len(CALL.split("\n")[0]) > source.line_length >= indent + len(head) + 1
    ):
        return f"{head}(\n    {CALL.format(pad='    ', **texts)}\n)\n"
    return head + before + CALL.format(pad="", **texts) + after + "\n"


def _on_one_line(text: str) -> Optional[str]:
    """``text`` (what follows the split in its statement) with the line breaks black put inside its
    brackets taken out (``[\\n    self.speculative_step_id\\n]``: black joins them once the split
    before them is the exploded call); None when a comment, a string or a trailing comma is there."""
    if "\n" not in text:
        return text
    if any(mark in text for mark in "#'\"") or re.search(r",\s*\n\s*[)\]}]", text):
        return None
    joined = re.sub(r"([(\[{])\s*\n\s*", r"\1", text)
    joined = re.sub(r"\s*\n\s*([)\]}])", r"\1", joined)
    joined = re.sub(r",\s*\n\s*", ", ", joined)
    return None if "\n" in joined else joined


def _span(outer: ast.expr, inner: ast.expr, end: bool) -> ast.AST:
    """A stand-in node covering ``outer`` up to ``inner``'s start (or from its end), to measure the text around it."""
    node = ast.Constant(None)
    if end:
        node.lineno, node.col_offset = inner.end_lineno, inner.end_col_offset
        node.end_lineno, node.end_col_offset = outer.end_lineno, outer.end_col_offset
    else:
        node.lineno, node.col_offset = outer.lineno, outer.col_offset
        node.end_lineno, node.end_col_offset = inner.lineno, inner.col_offset
    return node


#: what runs the code it holds otherwise than once, there and then -> how the refusal says the move is in it
LOOPS = {ast.For: "inside a loop", ast.AsyncFor: "inside a loop", ast.While: "inside a loop"}
DEFERRED = {
    ast.Lambda: "inside a lambda",
    ast.ListComp: "inside a comprehension",
    ast.SetComp: "inside a comprehension",
    ast.DictComp: "inside a comprehension",
    ast.GeneratorExp: "inside a comprehension",
}
TRIES = {kind: "into the body of a `try`" for kind in (ast.Try, getattr(ast, "TryStar", ast.Try))}


def _held_parts(node: ast.AST) -> list[ast.AST]:
    """The parts of ``node`` (of ``LOOPS``, ``DEFERRED`` or ``TRIES``) where a move is not run once, there and then."""
    if type(node) in LOOPS:
        return [*node.body, *node.orelse, *([node.test] if isinstance(node, ast.While) else [])]  # type: ignore[attr-defined]
    if type(node) in TRIES:
        return node.body if node.handlers else []  # type: ignore[attr-defined]
    return [node]


def _moved_into(method: ast.AST, split: Split) -> Optional[tuple[ast.AST, str]]:
    """(node, how) of the first of these holding the move of ``split``'s bound 3-d view but not the view: a loop's
    body or ``while`` test (the helper written at the move would run on every pass), a lambda or comprehension (it
    would run later or on every item, reading the buffer, and the names they bind, then), the body of a ``try``
    with handlers (the view's errors, a buffer of another length, raised before it, would be caught there)."""
    if split.view is None:
        return None
    found = [
        (node, how)
        for kind, how in {**LOOPS, **DEFERRED, **TRIES}.items()
        for node in nodes_of(method, kind)
        if not inside(split.view, node) and any(inside(split.node, part) for part in _held_parts(node))
    ]
    return min(found, key=lambda each: (each[0].lineno, each[0].col_offset), default=None)


def split_refusal(method: ast.AST, splits: list[Split]) -> Optional[tuple[int, str]]:
    """(line, why) when the splits of ``method`` cannot all be rewritten to the helper: a bound 3-d view
    moved in several statements, inside a loop below it, into the body of a ``try`` below it or inside a lambda
    or comprehension, read again elsewhere, what it reads rebound before its move, or two splits whose edits
    would meet in one statement; else None."""
    touched: set[int] = set()
    for split in splits:
        name = split.view.targets[0].id if split.view else ""  # type: ignore[attr-defined]
        shared = [s for s in splits if split.view is not None and s.view is split.view]
        moves = sorted({holding_statement(method, s.node).lineno for s in shared})
        if len(moves) > 1:
            return split.line, (
                f"the 3-d view `{name}` (line {split.line}) is moved in {len(moves)} places "
                f"(lines {', '.join(map(str, moves))}): rewrite the split by hand"
            )
        moved_into = _moved_into(method, split)
        if moved_into is not None:
            node, how = moved_into
            caught = ", whose handlers would catch its errors" if type(node) in TRIES else ""
            return split.line, (
                f"the 3-d view `{name}` (line {split.line}) is moved {how} "
                f"(line {node.lineno}){caught}: rewrite the split by hand"
            )
        reads = view_reads(method, split)
        if reads:
            return split.line, (
                f"the 3-d view `{name}` of its split is also read at line {reads[0].lineno}: "
                "rewriting the split would remove it"
            )
        rebinds = view_rebinds(split, holding_statement(method, split.node))
        if rebinds:
            what, line = rebinds[0]
            return split.line, (
                f"`{what}` is rebound at line {line} between the 3-d view `{name}` "
                f"(line {split.line}) and its move (line {split.node.lineno}): "
                "rewrite the split by hand"
            )
        statements = split.statements or [holding_statement(method, split.node)] + ([split.view] if split.view else [])
        for stmt in statements:
            if id(stmt) in touched:
                return stmt.lineno, (
                    f"two per-step out_cache_loc splits in one statement (line {stmt.lineno}): " "rewrite them by hand"
                )
            touched.add(id(stmt))
    return None


def split_finding(rule: Rule, source: Source, method: ast.AST, splits: list[Split], detail: str = "") -> Finding:
    """Every split of ``splits`` (in ``method``) via the helper, in one finding; unrecognised when one cannot be,
    or when the rows a split binds are bound another way elsewhere in the method (``rebound_elsewhere``)."""
    refusal = split_refusal(method, splits) or rebound_elsewhere(method, splits)
    if refusal is not None:
        return rule.report(State.UNRECOGNISED, *refusal)
    edits = [edit for split in splits for edit in helper_edit(source, method, split)]
    return rule.report(State.TO_PATCH, splits[0].line, detail, edits=edits, imports=[(EAGLE_UTILS, PER_STEP_HELPER)])


def step_major_split(method: ast.FunctionDef) -> Optional[ast.Subscript]:
    """``x[:, self.topk * i : self.topk * (i + 1)]``: step i's columns of a ``[bs, steps * topk]`` view."""
    for node in nodes_of(method, ast.Subscript):
        index = node.slice
        if not (
            isinstance(index, ast.Tuple)
            and len(index.elts) == 2
            and all(isinstance(part, ast.Slice) and part.step is None for part in index.elts)
        ):
            continue
        rows, columns = index.elts
        bounds = (columns.lower, columns.upper)
        if (
            rows.lower is None
            and rows.upper is None
            and None not in bounds
            and all(any(is_self_attr(f, "topk") for f in factors(bound)) for bound in bounds)
        ):
            return node
    return None


def _blocks(method: ast.AST) -> dict[int, tuple]:
    """id(statement) -> the blocks holding it, outermost first: (id of the compound statement, its field, the
    handler's index) of each; a block is a prefix of another's when the code of the first runs whenever the
    second's does."""
    found: dict[int, tuple] = {}

    def walk(body: list, path: tuple) -> None:
        for stmt in body:
            found[id(stmt)] = path
            for field in ("body", "orelse", "finalbody"):
                if isinstance(getattr(stmt, field, None), list) and not isinstance(stmt, ast.FunctionDef):
                    walk(getattr(stmt, field), (*path, (id(stmt), field, 0)))
            for index, handler in enumerate(getattr(stmt, "handlers", ())):
                walk(handler.body, (*path, (id(stmt), "handlers", index)))
            for index, case in enumerate(getattr(stmt, "cases", ())):
                walk(case.body, (*path, (id(stmt), "cases", index)))

    walk(getattr(method, "body", []), ())
    return found


def rebound_elsewhere(method: ast.AST, splits: list[Split]) -> Optional[tuple[int, str]]:
    """(line, why) when a name a split binds (``x = <split>``) is bound another way in a block of ``method`` that
    need not run when the split does (another branch, a loop's body): the rows laid out otherwise where the probes
    need not go (more sequences than they run, say), which neither the split's rewrite nor the probes would judge.
    The batch's buffer read before the split, upstream's helper and a contiguous copy or clone of the rows are no
    other layout; else None."""
    own, names, paths = set(), set(), []
    blocks = _blocks(method)
    for split in splits:
        holders = split.statements or [holding_statement(method, split.node)]
        own |= {id(stmt) for stmt in [*holders, *([split.view] if split.view else [])]}
        last = holders[-1]
        value = getattr(last, "value", None)  # the rows, or the step's row: not a call they are handed to
        rows = split.statements or value is split.node or isinstance(value, ast.Subscript) and value.value is split.node
        if rows and isinstance(last, ast.Assign) and len(last.targets) == 1 and isinstance(last.targets[0], ast.Name):
            names.add(last.targets[0].id)
            paths.append(blocks.get(id(last), ()))
    if not names:
        return None
    first = min(split.line for split in splits)
    for node in nodes_of(method, ast.Assign):
        bound = [t.id for t in node.targets if isinstance(t, ast.Name) and t.id in names]
        path = blocks.get(id(node))
        if id(node) in own or not bound or path is None or all(p[: len(path)] == path for p in paths):
            continue  # runs whenever the split does: its value is judged with it
        value = node.value
        helper = isinstance(value, ast.Subscript) and called_name(value.value) == PER_STEP_HELPER
        copied = (
            isinstance(value, ast.Call)
            and isinstance(value.func, ast.Attribute)
            and value.func.attr in ("contiguous", "clone")
            and isinstance(value.func.value, ast.Name)
            and value.func.value.id in names
        )
        read_before = isinstance(value, ast.Attribute) and node.lineno < first
        if not (read_before or copied or helper or called_name(value) == PER_STEP_HELPER):
            return node.lineno, (
                f"`{bound[0]}`, which its split binds, is also bound at line {node.lineno} "
                f"(`{ast.unparse(value)[:60]}`), which the probes need not run: rewrite the split by hand"
            )
    return None


def _find(rule: Rule, source: Source) -> Finding:
    method = locate_method(rule, source)
    if isinstance(method, Finding):
        return method
    splits = out_cache_loc_layouts(method)
    if splits:  # every one of them, also beside a helper call
        return split_finding(rule, source, method, splits)
    calls = helper_calls(method)
    if calls:
        return rule.report(State.PATCHED, calls[0].lineno)
    split = step_major_split(method)
    if split is not None:
        return rule.report(
            State.NOT_AFFECTED,
            split.lineno,
            "its own step-major split `x[:, self.topk * i : self.topk * (i + 1)]`, not the helper's layout",
        )
    return rule.report(
        State.UNRECOGNISED,
        method.lineno,
        "no `reshape(bs, topk, steps)` + `permute((2, 0, 1)).reshape(steps, -1)` of out_cache_loc",
    )


RULES = [
    Rule(
        id=f"draft-forward:{cls}",
        file=file,
        scope=f"{cls}.draft_forward",
        site="per-step out_cache_loc",
        upstream="PR 26239",
        find=_find,
    )
    for file, cls in WORKERS
]

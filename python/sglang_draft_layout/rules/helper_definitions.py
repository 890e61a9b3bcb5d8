"""The three layout helpers in SGLang's own modules: defined where absent, judged by body.

Mirrors upstream PR 27475 (``draft_kv_indices_buffer_width`` and
``draft_kv_indices_used_len`` in ``speculative/spec_utils.py``; 27486 added the int32
guard to the width) and PR 26239 (``per_step_draft_out_cache_loc`` in
``speculative/eagle_utils.py``). The inserted source is read from this package's own
functions, so the code SGLang runs is the code this package tests. Invariant: every
call site the other rules write has its helper defined in the module it imports from.

A definition already there is judged by its body, structurally (docstrings,
annotations and assert messages do not matter): our form or upstream's is patched;
upstream's earlier body (the width without its int32 guard, the per-step layout
without its length assert) is replaced by ours; any other body is unrecognised.

A tree without the module (``spec_utils.py`` before SGLang 0.5.3, ``eagle_utils.py`` in
0.5.3, which split it into ``eagle_info.py`` and ``spec_utils.py``) gets it created,
holding just the helpers and a docstring saying why the file exists (``new_module``),
when a site to patch imports from it; the engine decides that (``engine.plan``).
"""

from __future__ import annotations

import ast
import enum
import inspect
from typing import Callable, Optional

from ..imports import add_imports
from ..layout_patterns.ast_walk import factors
from ..speculative import eagle_utils, spec_utils
from .base import MODULE_SCOPE, Edit, Finding, Rule, Source, State, param_names

UPSTREAM = {"spec_utils": "PR 27475", "eagle_utils": "PR 26239"}
INT32_LIMIT = 2**31


class Body(enum.Enum):
    CURRENT = "current"
    EARLIER = "earlier"  # upstream's first form, before its guard was added


def _dump(text: str) -> str:
    return ast.dump(ast.parse(text, mode="eval").body)


def _same(node: Optional[ast.AST], text: str) -> bool:
    """``node`` is the expression ``text``, whatever its formatting."""
    return node is not None and ast.dump(node) == _dump(text)


def _statements(func: ast.FunctionDef) -> list[ast.stmt]:
    """The body without its docstring."""
    body = func.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        if isinstance(body[0].value.value, str):
            return body[1:]
    return body


def _judge(
    func: ast.FunctionDef,
    arity: int,
    value: Callable[[ast.expr], bool],
    check: Callable[..., bool],
    returned: Optional[Callable[[ast.expr], bool]] = None,
) -> Optional[Body]:
    """The form of ``func``: ``return <returned>`` (default: the value), with or without
    ``assert <check>`` before it; locals bound to the value may stand for it.
    """
    if len(param_names(func)) != arity:
        return None
    *before, last = _statements(func) or [None]
    if not isinstance(last, ast.Return):
        return None
    bound: set[str] = set()

    def is_value(node: ast.expr) -> bool:
        return value(node) or (isinstance(node, ast.Name) and node.id in bound)

    checked = False
    for stmt in before:
        if (
            isinstance(stmt, ast.Assign)
            and len(stmt.targets) == 1
            and isinstance(stmt.targets[0], ast.Name)
            and value(stmt.value)
        ):
            bound.add(stmt.targets[0].id)
        elif isinstance(stmt, ast.Assert) and check(stmt.test, is_value):
            checked = True
        else:
            return None
    if not (returned or is_value)(last.value):
        return None
    if checked:
        return Body.CURRENT
    return Body.EARLIER if not before else None


def _width(func: ast.FunctionDef) -> Optional[Body]:
    names = param_names(func)

    def product(node: ast.expr) -> bool:
        operands = factors(node)
        return all(isinstance(f, ast.Name) for f in operands) and sorted(f.id for f in operands) == sorted(names)

    def guard(test: ast.expr, is_value) -> bool:
        return (
            isinstance(test, ast.Compare)
            and [type(op) for op in test.ops] == [ast.Lt]
            and is_value(test.left)
            and isinstance(test.comparators[0], (ast.BinOp, ast.Constant))
            and ast.literal_eval(_power(test.comparators[0])) == INT32_LIMIT
        )

    return _judge(func, 3, product, guard)


def _power(node: ast.expr) -> ast.expr:
    """``2**31`` as a literal ast.literal_eval reads (it refuses powers)."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
        base, exponent = ast.literal_eval(node.left), ast.literal_eval(node.right)
        if isinstance(base, int) and isinstance(exponent, int) and 0 <= exponent <= 64:
            return ast.Constant(base**exponent)
    return node if isinstance(node, ast.Constant) else ast.Constant(None)


def _used_len(func: ast.FunctionDef) -> Optional[Body]:
    if len(param_names(func)) != 4:
        return None
    seq_lens_sum, topk, bs, num_steps = param_names(func)
    body = _statements(func)
    returns = len(body) == 1 and isinstance(body[0], ast.Return)
    return Body.CURRENT if returns and _same(body[0].value, f"{seq_lens_sum} * {topk} + {bs} * {num_steps}") else None


def _per_step(func: ast.FunctionDef) -> Optional[Body]:
    if len(param_names(func)) != 4:
        return None
    buffer, batch_size, topk, num_steps = param_names(func)
    layout = f"{buffer}.view({batch_size}, {topk}, {num_steps}).permute(2, 0, 1).reshape({num_steps}, -1)"
    length = f"{batch_size} * {topk} * {num_steps}"

    def length_check(test: ast.expr, is_value) -> bool:
        if not (isinstance(test, ast.Compare) and [type(op) for op in test.ops] == [ast.Eq]):
            return False
        sides = [test.left, test.comparators[0]]
        return any(_same(a, f"{buffer}.shape[0]") and is_value(b) for a, b in (sides, sides[::-1]))

    return _judge(func, 4, lambda node: _same(node, length), length_check, lambda node: _same(node, layout))


JUDGES = {
    spec_utils.draft_kv_indices_buffer_width.__name__: _width,
    spec_utils.draft_kv_indices_used_len.__name__: _used_len,
    eagle_utils.per_step_draft_out_cache_loc.__name__: _per_step,
}


def _find(helper: Callable, rule: Rule, source: Source) -> Finding:
    helper_source = inspect.getsource(helper)
    imports = (("torch", ""),) if "torch." in helper_source else ()
    defined = source.function(helper.__name__)
    if defined is not None:
        body = JUDGES[helper.__name__](defined)
        if body is Body.CURRENT:
            return rule.report(State.PATCHED, defined.lineno)
        if body is Body.EARLIER:
            return rule.report(
                State.TO_PATCH,
                defined.lineno,
                "upstream's earlier body, replaced by ours",
                edits=[Edit(defined, replace=helper_source, drop_inner_comments=True)],
                imports=imports,
            )
        return rule.report(State.UNRECOGNISED, defined.lineno, f"def {helper.__name__} has a body no rule knows")
    definitions = source.definitions()
    if not definitions:
        return rule.report(State.UNRECOGNISED, detail="no top-level function to insert the helper before")
    anchor = definitions[0]
    edit = Edit(anchor, before=(helper_source,), separate=2, keep_comments=True)
    return rule.report(State.TO_PATCH, anchor.lineno, edits=[edit], imports=imports)


def _rule(helper: Callable, module_name: str) -> Rule:
    return Rule(
        id=f"helper:{helper.__name__}",
        file=f"srt/speculative/{module_name}.py",
        scope=MODULE_SCOPE,
        site=f"def {helper.__name__}",
        upstream=UPSTREAM[module_name],
        find=lambda rule, source: _find(helper, rule, source),
        counts_as_site=False,
    )


RULES = [
    _rule(spec_utils.draft_kv_indices_buffer_width, "spec_utils"),
    _rule(spec_utils.draft_kv_indices_used_len, "spec_utils"),
    _rule(eagle_utils.per_step_draft_out_cache_loc, "eagle_utils"),
]


#: each helper module: its helpers, and why a tree may lack it (the created file's docstring)
MODULES: dict[str, tuple[list[Callable], str]] = {
    "srt/speculative/spec_utils.py": (
        [spec_utils.draft_kv_indices_buffer_width, spec_utils.draft_kv_indices_used_len],
        "this tree keeps its speculative utilities in eagle_utils.py\n" "(SGLang before 0.5.3 had no spec_utils.py)",
    ),
    "srt/speculative/eagle_utils.py": (
        [eagle_utils.per_step_draft_out_cache_loc],
        "this tree splits its speculative utilities into eagle_info.py\n" "and spec_utils.py, as SGLang 0.5.3 did",
    ),
}
TO_CREATE = "to create: the tree has no {file}; apply creates it holding just the helpers"
CREATED_DOCSTRING = '''"""Multi-step EAGLE draft layout helpers, where upstream SGLang keeps them ({upstream}).

Created by sglang-draft-layout: {why}.
It holds just the helpers, so that the patched call sites import them from the module
upstream 0.5.13 imports them from; the rest of the tree's layout is left as it was.
"""
'''


def new_module(relative: str, line_length: int = 88) -> str:
    """The text of a helper module the tree lacks: docstring, its imports, the helpers."""
    helpers, why = MODULES[relative]
    upstream = UPSTREAM[relative.rsplit("/", 1)[1].removesuffix(".py")]
    sources = [inspect.getsource(helper) for helper in helpers]
    code = CREATED_DOCSTRING.format(upstream=upstream, why=why) + "".join(f"\n\n{source}" for source in sources)
    imports = [("torch", "")] if any("torch." in source for source in sources) else []
    return add_imports(code, imports, line_length)

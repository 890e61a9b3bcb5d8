"""The multi-step EAGLE draft layout forms, recognised in Python's own ``ast``.

One module for what SGLang's draft attention backends and EAGLE workers compute about
the draft layout, written out inline or through upstream's helpers
(``draft_kv_indices_buffer_width``, ``draft_kv_indices_used_len``,
``per_step_draft_out_cache_loc``). The patch rules use these patterns to find their
sites; ``inline_draft_layout`` and ``draft_layout_classes`` report a whole module.
Standard library only (``ast``, ``typing``): a generated test embeds this source
verbatim to check a fork's own files with nothing else installed.
"""

from __future__ import annotations

import ast
from typing import Dict, FrozenSet, Iterator, List, Optional, Tuple

WIDTH_HELPER = "draft_kv_indices_buffer_width"
USED_LEN_HELPER = "draft_kv_indices_used_len"
PER_STEP_HELPER = "per_step_draft_out_cache_loc"
KERNEL = "generate_draft_decode_kv_indices"
HELPERS = (WIDTH_HELPER, USED_LEN_HELPER, PER_STEP_HELPER)

#: (statements, target, buffer, batch size) of a hand-written per-step out_cache_loc
Layout = Tuple[List[ast.stmt], ast.Name, ast.expr, ast.expr]

#: the draft layout forms a function can hold (``draft_layout_forms``)
ROWS = "kv_indices rows"  # (self.speculative_num_steps, width) from max_context_len
STEP_LENGTH = "used length"  # seq_lens_sum * topk + bs * (i + 1), or the helper
CAPACITY = "capacity length"  # the same through self.speculative_num_steps
LAUNCH = "kernel launch"  # generate_draft_decode_kv_indices[grid](...)
OUT_CACHE_LOC = "per-step out_cache_loc"  # [bs, topk, num_steps] split per step


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


def used_len_operands(expr: ast.AST) -> Optional[Tuple[ast.expr, ast.expr, ast.expr]]:
    """(seq_lens_sum, bs, steps) of ``seq_lens_sum * self.topk + bs * steps``, any order.

    ``steps`` is a sum such as ``(i + 1)`` (a step's slice) or
    ``self.speculative_num_steps`` (the capacity a launch needs).
    """
    if not (isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add)):
        return None
    for prefix, appended in ((expr.left, expr.right), (expr.right, expr.left)):
        prefix_factors, appended_factors = factors(prefix), factors(appended)
        topk = [f for f in prefix_factors if is_self_attr(f, "topk")]
        steps = [
            f
            for f in appended_factors
            if isinstance(f, ast.BinOp)
            and isinstance(f.op, ast.Add)
            or is_self_attr(f, "speculative_num_steps")
        ]
        if (
            len(prefix_factors) == len(appended_factors) == 2
            and topk
            and len(steps) == 1
        ):
            seq_lens_sum = next(f for f in prefix_factors if f is not topk[0])
            bs = next(f for f in appended_factors if f is not steps[0])
            return seq_lens_sum, bs, steps[0]
    return None


def row_allocations(func: ast.AST) -> List[Tuple[ast.Assign, ast.Tuple]]:
    """``x = torch.empty|zeros((self.speculative_num_steps, width), ...)`` and its shape."""
    found = []
    for node in nodes_of(func, ast.Assign):
        if not isinstance(node.value, ast.Call):
            continue
        call = node.value
        allocates = (
            isinstance(call.func, ast.Attribute)
            and call.func.attr in ("empty", "zeros")
            and isinstance(call.func.value, ast.Name)
            and call.func.value.id == "torch"
        )
        shape = call.args[0] if call.args else None
        if (
            allocates
            and isinstance(shape, ast.Tuple)
            and len(shape.elts) == 2
            and is_self_attr(shape.elts[0], "speculative_num_steps")
        ):
            found.append((node, shape))
    return found


def local_bindings(func: ast.AST) -> Dict[str, ast.Assign]:
    """``name -> name = <value>``: each local's last plain assignment in ``func``."""
    bound: Dict[str, ast.Assign] = {}
    for node in nodes_of(func, ast.Assign):
        if len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            bound[node.targets[0].id] = node
    return bound


def width_binding(width: ast.expr, func: ast.AST) -> Optional[ast.Assign]:
    """The assignment a row width names, when it is a local: ``width = <value>``."""
    if isinstance(width, ast.Name):
        return local_bindings(func).get(width.id)
    return None


def is_helper_width(width: ast.expr, func: ast.AST) -> bool:
    """A row width computed by ``draft_kv_indices_buffer_width`` (directly or via a local)."""
    binding = width_binding(width, func)
    return called_name(binding.value if binding else width) == WIDTH_HELPER


def is_inline_width(width: ast.expr, func: ast.AST) -> bool:
    """A row width written as a product with ``self.max_context_len`` (directly or via a local)."""
    binding = width_binding(width, func)
    product = binding.value if binding else width
    return any(is_self_attr(f, "max_context_len") for f in factors(product))


def step_slices(func: ast.AST) -> List[ast.Subscript]:
    """``row[i][: end]``: a kv_indices row cut to its used length."""
    return [
        node
        for node in nodes_of(func, ast.Subscript)
        if isinstance(node.value, ast.Subscript)
        and isinstance(node.slice, ast.Slice)
        and node.slice.lower is None
        and node.slice.upper is not None
        and node.slice.step is None
    ]


def kernel_launches(func: ast.AST) -> List[ast.Expr]:
    """Statements ``generate_draft_decode_kv_indices[grid](...)``."""
    found = []
    for node in nodes_of(func, ast.Expr):
        if not isinstance(node.value, ast.Call):
            continue
        kernel = node.value.func
        if isinstance(kernel, ast.Subscript):
            kernel = kernel.value
            name = getattr(kernel, "id", None) or getattr(kernel, "attr", None)
            if name == KERNEL:
                found.append(node)
    return found


def _method_call(node: ast.AST, name: str) -> Optional[ast.Call]:
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        if node.func.attr == name:
            return node
    return None


def _split_3d(node: ast.AST) -> Optional[ast.Call]:
    """``x.reshape|view(bs, self.topk, self.speculative_num_steps)``."""
    call = _method_call(node, "reshape") or _method_call(node, "view")
    if call is None or len(call.args) != 3 or call.keywords:
        return None
    _bs, topk, steps = call.args
    if is_self_attr(topk, "topk") and is_self_attr(steps, "speculative_num_steps"):
        return call
    return None


def _steps_first(node: ast.AST) -> Optional[ast.expr]:
    """The receiver of ``<x>.permute((2, 0, 1)).reshape(self.speculative_num_steps, -1)``."""
    reshape = _method_call(node, "reshape")
    if reshape is None or len(reshape.args) != 2:
        return None
    steps, rest = reshape.args
    if not is_self_attr(steps, "speculative_num_steps"):
        return None
    if not (isinstance(rest, ast.UnaryOp) and isinstance(rest.op, ast.USub)):
        return None
    if not (isinstance(rest.operand, ast.Constant) and rest.operand.value == 1):
        return None
    permute = _method_call(reshape.func.value, "permute")
    if permute is None:
        return None
    order = permute.args
    if len(order) == 1 and isinstance(order[0], ast.Tuple):
        order = order[0].elts
    values = [getattr(o, "value", None) for o in order]
    return permute.func.value if values == [2, 0, 1] else None


def _assigned(stmt: ast.stmt) -> Optional[ast.Assign]:
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
        if isinstance(stmt.targets[0], ast.Name):
            return stmt
    return None


def out_cache_loc_layouts(func: ast.AST) -> List[Layout]:
    """Hand-written per-step out_cache_loc layouts, in one statement or two.

    ``x = x.reshape(bs, self.topk, self.speculative_num_steps)`` then
    ``x = x.permute((2, 0, 1)).reshape(self.speculative_num_steps, -1)``
    (``view`` and ``permute(2, 0, 1)`` too), or both chained in one assignment.
    """
    found: List[Layout] = []
    holders = [*nodes_of(func, ast.stmt), *nodes_of(func, ast.excepthandler)]
    for node in holders if isinstance(func, ast.stmt) else [func, *holders]:
        for field in ("body", "orelse", "finalbody"):
            body = getattr(node, field, None)
            if not isinstance(body, list):
                continue
            for index, stmt in enumerate(body):
                one = _assigned(stmt)
                if one is None:
                    continue
                split = _split_3d(_steps_first(one.value))
                if split is not None:
                    found.append(
                        ([stmt], one.targets[0], split.func.value, split.args[0])
                    )
                    continue
                split = _split_3d(one.value)
                second = _assigned(body[index + 1]) if index + 1 < len(body) else None
                if split is None or second is None:
                    continue
                target = one.targets[0]
                receiver = _steps_first(second.value)
                if (
                    isinstance(receiver, ast.Name)
                    and receiver.id == target.id == second.targets[0].id
                ):
                    found.append(
                        ([stmt, second], target, split.func.value, split.args[0])
                    )
    return found


def _inline_forms(func: ast.AST) -> Iterator[Tuple[int, str]]:
    """(line, what) of each draft layout ``func`` computes without the helpers."""
    for stmt, shape in row_allocations(func):
        width = shape.elts[1]
        if not is_helper_width(width, func) and is_inline_width(width, func):
            yield stmt.lineno, f"row width without {WIDTH_HELPER}"
    for node in nodes_of(func, ast.BinOp):
        if used_len_operands(node):
            yield node.lineno, f"used length without {USED_LEN_HELPER}"
    for stmts, _target, _buffer, _bs in out_cache_loc_layouts(func):
        yield stmts[0].lineno, f"per-step out_cache_loc without {PER_STEP_HELPER}"


def methods(cls: ast.ClassDef) -> List[ast.FunctionDef]:
    """The functions defined in the class body."""
    return [
        s for s in cls.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))
    ]


def _classes(tree: ast.Module) -> List[ast.ClassDef]:
    return [n for n in in_order(tree) if isinstance(n, ast.ClassDef)]


def inline_draft_layout(tree: ast.Module) -> List[Tuple[str, str, int, str]]:
    """(class, method, line, what) for every draft layout computed inline in a class."""
    return [
        (cls.name, method.name, line, what)
        for cls in _classes(tree)
        for method in methods(cls)
        for line, what in _inline_forms(method)
    ]


def _used_length_form(steps: ast.expr) -> str:
    return CAPACITY if is_self_attr(steps, "speculative_num_steps") else STEP_LENGTH


def draft_layout_forms(func: ast.AST) -> FrozenSet[str]:
    """The draft layout forms ``func`` holds, written inline or through the helpers."""
    forms = set()
    if kernel_launches(func):
        forms.add(LAUNCH)
    for _stmt, shape in row_allocations(func):
        width = shape.elts[1]
        if is_helper_width(width, func) or is_inline_width(width, func):
            forms.add(ROWS)
    for node in nodes_of(func, ast.BinOp):
        operands = used_len_operands(node)
        if operands:
            forms.add(_used_length_form(operands[2]))
    if out_cache_loc_layouts(func):
        forms.add(OUT_CACHE_LOC)
    for call in nodes_of(func, ast.Call):
        name = called_name(call)
        if name == USED_LEN_HELPER and len(call.args) == 4:  # type: ignore[attr-defined]
            forms.add(_used_length_form(call.args[3]))  # type: ignore[attr-defined]
        elif name == PER_STEP_HELPER:
            forms.add(OUT_CACHE_LOC)
    return frozenset(forms)


def draft_layout_methods(
    cls: ast.ClassDef,
) -> List[Tuple[ast.FunctionDef, FrozenSet[str]]]:
    """(method, its forms) for each method of ``cls`` that holds a draft layout form."""
    found = [(method, draft_layout_forms(method)) for method in methods(cls)]
    return [(method, forms) for method, forms in found if forms]


def draft_layout_classes(tree: ast.Module) -> List[str]:
    """Classes with draft layout arithmetic or a draft kernel launch, inline or via the helpers."""
    return [cls.name for cls in _classes(tree) if draft_layout_methods(cls)]

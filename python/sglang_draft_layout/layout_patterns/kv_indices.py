"""The kv_indices spellings: the rows and their width, a step's used length, a row cut to it, the
kernel launch.
"""

from __future__ import annotations

import ast
from typing import Dict, FrozenSet, List, Optional, Tuple

from .ast_walk import called_name, factors, is_self_attr, nodes_of
from .helper_names import KERNEL, WIDTH_HELPER


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
            if isinstance(f, ast.BinOp) and isinstance(f.op, ast.Add) or is_self_attr(f, "speculative_num_steps")
        ]
        if len(prefix_factors) == len(appended_factors) == 2 and topk and len(steps) == 1:
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


def _has_topk(product: ast.expr) -> bool:
    return any(is_self_attr(f, "topk") or isinstance(f, ast.Name) and f.id == "topk" for f in factors(product))


def narrow_rows(func: ast.AST) -> FrozenSet[int]:
    """Lines of the inline kv_indices row widths of ``func`` without the topk factor."""
    found = set()
    for stmt, shape in row_allocations(func):
        width = shape.elts[1]
        binding = width_binding(width, func)
        product = binding.value if binding else width
        if is_inline_width(width, func) and not _has_topk(product):
            found.add(stmt.lineno)
    return frozenset(found)

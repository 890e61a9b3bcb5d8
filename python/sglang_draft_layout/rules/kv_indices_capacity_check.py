"""Capacity assert in ``*MultiStepDraftBackend.common_template`` (FlashInfer, FlashInfer-MLA).

Site: just before ``generate_draft_decode_kv_indices`` fills the rows. SGLang <= 0.5.12
has no check, so an undersized row (the missing topk factor of 27338 / 27460) is
overrun silently. Upstream (PR 27475) first binds
``required_kv_indices_len = draft_kv_indices_used_len(seq_lens_sum, self.topk, bs, self.speculative_num_steps)``
and asserts it fits the row (through ``assert_buffer_fits``, a utility later releases
added; here a plain ``assert`` with the same facts, since older trees lack it).
Invariant: the kernel never runs on a row narrower than what it will write; host
integers only, so the check costs no device sync.

A fork that cherry-picked upstream's pre-helper fixes (27338 FlashInfer, 27460
FlashInfer-MLA) checks already, with an inline
``required_kv_indices_len = seq_lens_sum * self.topk + bs * self.speculative_num_steps``
and its own assert: the length becomes ``draft_kv_indices_used_len(...)``, the fork's
assert and message stay, and nothing is added beside them.
"""

from __future__ import annotations

import ast
from typing import Optional

from ..layout_patterns.ast_walk import called_name, in_order, is_self_attr, nodes_of
from ..layout_patterns.helper_names import USED_LEN_HELPER
from ..layout_patterns.kv_indices import kernel_launches, step_slices, used_len_operands
from .base import SPEC_UTILS, Edit, Finding, Rule, Source, State, locate_method, param_names
from .draft_backends import DRAFT_BACKENDS

REQUIRED = "required_kv_indices_len"
CHECK = """
assert {required} <= {row}.shape[1], (
    f"EAGLE draft kv_indices row too small: need {{{required}}} > "
    f"width {{{row}.shape[1]}} (topk={{self.topk}}, "
    f"num_seqs={{{bs} // self.topk}}, seq_lens_sum={{{seq_lens_sum}}}, "
    f"num_steps={{self.speculative_num_steps}}); size rows with "
    "draft_kv_indices_buffer_width(num_seqs, topk, max_context_len)"
)
"""


def required_binding(name: str, seq_lens_sum: str, bs: str) -> str:
    """``name = draft_kv_indices_used_len(..., self.speculative_num_steps)``, wrapped as black writes it."""
    return f"{name} = {USED_LEN_HELPER}(\n    {seq_lens_sum}, self.topk, {bs}, self.speculative_num_steps\n)\n"


def slice_operands(method: ast.FunctionDef) -> Optional[tuple[ast.expr, ast.expr, ast.expr]]:
    """(row buffer, seq_lens_sum, bs) read off the per-step slice, in either form."""
    for subscript in step_slices(method):
        end = subscript.slice.upper
        row = subscript.value.value
        if called_name(end) == USED_LEN_HELPER and len(end.args) == 4:
            return row, end.args[0], end.args[2]
        operands = used_len_operands(end)
        if operands:
            return row, operands[0], operands[1]
    return None


def unbound_at(method: ast.FunctionDef, launch: ast.stmt, operands: tuple[ast.expr, ...]) -> list[str]:
    """Names the operands read that are neither parameters nor assigned before ``launch``."""
    bound = set(param_names(method))
    for node in nodes_of(method, ast.Name):
        if isinstance(node.ctx, ast.Store) and node.lineno < launch.lineno:
            bound.add(node.id)
    read = {n.id for operand in operands for n in in_order(operand) if isinstance(n, ast.Name)}
    return sorted(read - bound - {"self"})


def _is_row_width(node: ast.expr) -> bool:
    """``<row>.shape[1]``."""
    return (
        isinstance(node, ast.Subscript)
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "shape"
        and isinstance(node.slice, ast.Constant)
        and node.slice.value == 1
    )


def _capacity_length(node: ast.AST) -> Optional[tuple[ast.expr, ast.expr, ast.expr]]:
    """The operands of ``seq_lens_sum * self.topk + bs * self.speculative_num_steps``."""
    operands = used_len_operands(node)
    return operands if operands and is_self_attr(operands[2], "speculative_num_steps") else None


def inline_capacity_check(method: ast.FunctionDef) -> Optional[tuple[ast.AST, str, tuple[ast.expr, ...]]]:
    """The fork's own check (27338 / 27460): (node to rewrite, bound name or "", operands).

    ``name = <capacity length>`` then ``assert name <= row.shape[1]``, or the length
    written inside the assert.
    """
    checked = [
        node.test.left
        for node in nodes_of(method, ast.Assert)
        if isinstance(node.test, ast.Compare)
        and [type(op) for op in node.test.ops] == [ast.LtE]
        and _is_row_width(node.test.comparators[0])
    ]
    for node in nodes_of(method, ast.Assign):
        if len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            operands = _capacity_length(node.value)
            if operands and any(isinstance(left, ast.Name) and left.id == name for left in checked):
                return node, name, operands
    for left in checked:
        if _capacity_length(left):
            return left, "", _capacity_length(left)
    return None


def has_capacity_check(method: ast.FunctionDef) -> bool:
    """A ``draft_kv_indices_used_len(..., self.speculative_num_steps)`` or ``assert_buffer_fits`` call."""
    for node in nodes_of(method, ast.Call):
        name = called_name(node)
        if name == "assert_buffer_fits":
            return True
        if name == USED_LEN_HELPER and len(node.args) == 4 and is_self_attr(node.args[3], "speculative_num_steps"):
            return True
    return False


def _find(rule: Rule, source: Source) -> Finding:
    method = locate_method(rule, source)
    if isinstance(method, Finding):
        return method
    if has_capacity_check(method):
        return rule.report(State.PATCHED, method.lineno)
    inline = inline_capacity_check(method)
    if inline:
        node, name, operands = inline
        seq_lens_sum, bs = source.text(operands[0]), source.text(operands[1])
        length = f"{USED_LEN_HELPER}({seq_lens_sum}, self.topk, {bs}, self.speculative_num_steps)"
        if name:
            length = required_binding(name, seq_lens_sum, bs)
        return rule.report(
            State.TO_PATCH,
            node.lineno,
            "the fork's own check (27338/27460): its length via the helper",
            edits=[Edit(node, replace=length)],
            imports=[(SPEC_UTILS, USED_LEN_HELPER)],
        )
    launches, operands = kernel_launches(method), slice_operands(method)
    if not launches or operands is None:
        missing = "kernel launch" if not launches else "per-step slice"
        return rule.report(State.UNRECOGNISED, method.lineno, f"no {missing} to anchor the capacity check")
    launch = launches[0]
    unbound = unbound_at(method, launch, operands)
    if unbound:
        return rule.report(
            State.UNRECOGNISED, launch.lineno, f"{', '.join(unbound)} not yet assigned at the kernel launch"
        )
    row, seq_lens_sum, bs = (source.text(operand) for operand in operands)
    required = required_binding(REQUIRED, seq_lens_sum, bs)
    check = CHECK.format(required=REQUIRED, row=row, bs=bs, seq_lens_sum=seq_lens_sum).lstrip()
    return rule.report(
        State.TO_PATCH,
        launch.lineno,
        edits=[Edit(launch, before=(required, check), separate=1)],
        imports=[(SPEC_UTILS, USED_LEN_HELPER)],
    )


RULES = [
    Rule(
        id=f"capacity-check:{backend.name}",
        file=backend.file,
        scope=f"{backend.cls}.common_template",
        site="kv_indices capacity check",
        upstream="PR 27475 (27338, 27460)",
        find=_find,
    )
    for backend in DRAFT_BACKENDS
    if backend.capacity_check
]

"""Capacity assert in ``*MultiStepDraftBackend.common_template`` (FlashInfer, FlashInfer-MLA).

Site: just before ``generate_draft_decode_kv_indices`` fills the rows. SGLang <= 0.5.12
has no check, so an undersized row (the missing topk factor of 27338 / 27460) is
overrun silently. Upstream (PR 27475) first binds
``required_kv_indices_len = draft_kv_indices_used_len(seq_lens_sum, self.topk, bs, self.speculative_num_steps)``
and asserts it fits the row (through ``assert_buffer_fits``, a utility later releases
added; here a plain ``assert`` with the same facts, since older trees lack it).
Invariant: the kernel never runs on a row narrower than what it will write; host
integers only, so the check costs no device sync.
"""

from __future__ import annotations

from typing import Optional

import libcst as cst
import libcst.matchers as m
from libcst.helpers import parse_template_statement

from .base import (
    SPEC_UTILS, Edit, Finding, Rule, Source, State, calls, code, locate_method, param_names, self_attr, statements,
)
from .draft_backends import DRAFT_BACKENDS
from .kv_indices_step_slice import HELPER, old_used_len_operands, step_slices

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


def slice_operands(method: cst.FunctionDef) -> Optional[tuple[cst.BaseExpression, cst.BaseExpression, cst.BaseExpression]]:
    """(row buffer, seq_lens_sum, bs) read off the per-step slice, in either form."""
    for subscript in step_slices(method):
        end = subscript.slice[0].slice.upper
        row = subscript.value.value
        if m.matches(end, m.Call(func=m.Name(HELPER), args=[m.Arg(), m.Arg(), m.Arg(), m.Arg()])):
            return row, end.args[0].value, end.args[2].value
        operands = old_used_len_operands(end)
        if operands:
            return row, operands[0], operands[1]
    return None


def kernel_launch(method: cst.FunctionDef) -> Optional[cst.SimpleStatementLine]:
    launch = m.Expr(m.Call(func=m.Subscript(value=m.Name("generate_draft_decode_kv_indices")
                                          | m.Attribute(attr=m.Name("generate_draft_decode_kv_indices")))))
    return next((stmt for stmt in statements(method) if m.matches(stmt.body[0], launch)), None)


def unbound_at(method: cst.FunctionDef, launch: cst.SimpleStatementLine, operands) -> list[str]:
    """Names the operands read that are neither parameters nor assigned before ``launch``."""
    bound = set(param_names(method))
    for stmt in statements(method):
        if stmt is launch:
            break
        bound |= {t.target.value for t in m.findall(stmt, m.AssignTarget(target=m.Name()))}
    read = set()
    for operand in operands:
        attributes = {id(a.attr) for a in m.findall(operand, m.Attribute())}
        read |= {n.value for n in m.findall(operand, m.Name()) if id(n) not in attributes}
    return sorted(read - bound - {"self"})


def has_capacity_check(method: cst.FunctionDef) -> bool:
    full_length = m.Call(func=m.Name(HELPER), args=[m.Arg(), m.Arg(), m.Arg(), m.Arg(self_attr("speculative_num_steps"))])
    return any(m.findall(stmt, full_length | calls("assert_buffer_fits")) for stmt in statements(method))


def _find(rule: Rule, source: Source) -> Finding:
    method = locate_method(rule, source)
    if isinstance(method, Finding):
        return method
    if has_capacity_check(method):
        return rule.report(State.PATCHED, source.line(method))
    launch, operands = kernel_launch(method), slice_operands(method)
    if launch is None or operands is None:
        missing = "kernel launch" if launch is None else "per-step slice"
        return rule.report(State.UNRECOGNISED, source.line(method), f"no {missing} to anchor the capacity check")
    row, seq_lens_sum, bs = operands
    unbound = unbound_at(method, launch, operands)
    if unbound:
        return rule.report(State.UNRECOGNISED, source.line(launch),
                           f"{', '.join(unbound)} not yet assigned at the kernel launch")
    names = dict(required=REQUIRED, row=code(row), bs=code(bs), seq_lens_sum=code(seq_lens_sum))
    required = parse_template_statement(
        f"{REQUIRED} = {HELPER}(\n    {{seq_lens_sum}}, self.topk, {{bs}}, self.speculative_num_steps\n)\n",
        seq_lens_sum=seq_lens_sum, bs=bs,
    )
    check = cst.parse_statement(CHECK.format(**names).lstrip())
    return rule.report(
        State.TO_PATCH, source.line(launch),
        edits=[Edit(launch, before=(required, check), separate=1)],
        imports=[(SPEC_UTILS, HELPER)],
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

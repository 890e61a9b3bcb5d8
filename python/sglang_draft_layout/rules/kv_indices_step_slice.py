"""Per-step kv_indices slice in ``*MultiStepDraftBackend.common_template``.

Site: the loop over draft steps hands step i the front of its kv_indices row,
``kv_indices_buffer[i][: seq_lens_sum * self.topk + bs * (i + 1)]``.
Upstream (PR 27475) writes the end as
``draft_kv_indices_used_len(seq_lens_sum, self.topk, bs, i + 1)``.
Invariant: step i reads exactly the entries the draft kernel wrote for it (each
branch's prefix, then its i + 1 draft slots), computed by the same helper that
checks the row's capacity.
"""

from __future__ import annotations

from typing import Optional

import libcst as cst
import libcst.matchers as m
from libcst.helpers import parse_template_expression

from .base import (
    SPEC_UTILS, Edit, Finding, Rule, Source, State, factors, locate_method, self_attr, take, walk,
)
from .draft_backends import DRAFT_BACKENDS

HELPER = "draft_kv_indices_used_len"


def old_used_len_operands(expr: cst.BaseExpression) -> Optional[tuple[cst.BaseExpression, ...]]:
    """(seq_lens_sum, bs, steps) of ``seq_lens_sum * self.topk + bs * (steps)``, any order."""
    if not m.matches(expr, m.BinaryOperation(operator=m.Add())):
        return None
    for prefix, appended in ((expr.left, expr.right), (expr.right, expr.left)):
        prefix_factors, appended_factors = factors(prefix), factors(appended)
        if len(prefix_factors) != 2 or not take(prefix_factors, self_attr("topk")):
            continue
        steps = [f for f in appended_factors if m.matches(f, m.BinaryOperation(operator=m.Add()))]
        if len(appended_factors) != 2 or len(steps) != 1:
            continue
        bs = next(f for f in appended_factors if f is not steps[0])
        return prefix_factors[0], bs, steps[0]
    return None


def step_slices(method: cst.FunctionDef) -> list[cst.Subscript]:
    """Subscripts ``row[i][: end]`` in ``method``: a kv_indices row cut to its used length."""
    cut_row = m.Subscript(value=m.Subscript(), slice=[m.SubscriptElement(slice=m.Slice(lower=None))])
    return [
        node for node in walk(method.body)
        if m.matches(node, cut_row) and node.slice[0].slice.upper is not None
    ]


def _find(rule: Rule, source: Source) -> Finding:
    method = locate_method(rule, source)
    if isinstance(method, Finding):
        return method
    candidates = step_slices(method)
    for subscript in candidates:
        end = subscript.slice[0].slice.upper
        if m.matches(end, m.Call(func=m.Name(HELPER))):
            return rule.report(State.PATCHED, source.line(subscript))
        operands = old_used_len_operands(end)
        if operands:
            seq_lens_sum, bs, steps = operands
            new_end = parse_template_expression(
                HELPER + "({seq_lens_sum}, self.topk, {bs}, {steps})", seq_lens_sum=seq_lens_sum, bs=bs, steps=steps
            )
            return rule.report(
                State.TO_PATCH, source.line(subscript),
                edits=[Edit(end, rewrite=lambda _old: new_end)],
                imports=[(SPEC_UTILS, HELPER)],
            )
    where = source.line(candidates[0]) if candidates else source.line(method)
    return rule.report(State.UNRECOGNISED, where, "no per-step slice `row[i][: seq_lens_sum * topk + bs * (i + 1)]`")


RULES = [
    Rule(
        id=f"step-slice:{backend.name}",
        file=backend.file,
        scope=f"{backend.cls}.common_template",
        site="per-step kv_indices slice",
        upstream="PR 27475",
        find=_find,
    )
    for backend in DRAFT_BACKENDS
]

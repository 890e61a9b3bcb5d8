"""Per-step kv_indices slice in ``*MultiStepDraftBackend.common_template``.

Site: the loop over draft steps hands step i the front of its kv_indices row,
``kv_indices_buffer[i][: seq_lens_sum * self.topk + bs * (i + 1)]``.
Upstream (PR 27475) writes the end as
``draft_kv_indices_used_len(seq_lens_sum, self.topk, bs, i + 1)``.
Invariant: step i reads exactly the entries the draft kernel wrote for it (each
branch's prefix, then its i + 1 draft slots), computed by the same helper that
checks the row's capacity. A second slice of the same rows (in a branch, say) refuses the site: the
probes need not run it.
"""

from __future__ import annotations

import ast

from ..layout_patterns.ast_walk import called_name
from ..layout_patterns.helper_names import USED_LEN_HELPER
from ..layout_patterns.kv_indices import step_slices, used_len_operands
from .base import SPEC_UTILS, Edit, Finding, Rule, Source, State, locate_method
from .draft_backends import DRAFT_BACKENDS


def _kept_value(source: Source, row: ast.Subscript, steps: ast.expr) -> str:
    """The detail of a step count other than upstream's ``i + 1`` (``i``: the row's index),
    which the patch keeps: a fork's own value is the fork's call."""
    upstream = f"{source.text(row.slice)} + 1"
    if ast.dump(steps) == ast.dump(ast.parse(upstream, mode="eval").body):
        return ""
    return f"keeps the fork's value `{source.text(steps)}` (upstream: `{upstream}`)"


def _second_slice(candidates: list[ast.Subscript], found: ast.Subscript) -> str:
    """Why another slice of the rows ``found`` cuts (in another branch, say) refuses the site: the probes need
    not run it, so neither its value nor a rewrite of it could be judged. Empty: there is none."""
    rows = ast.dump(found.value.value)
    again = [s for s in candidates if s is not found and ast.dump(s.value.value) == rows]
    if not again:
        return ""
    return (
        f"a second slice of `{ast.unparse(found.value.value)}` rows at line {again[0].lineno} "
        f"(`{ast.unparse(again[0])}`), which the probes need not run: one per-step slice only"
    )


def _find(rule: Rule, source: Source) -> Finding:
    method = locate_method(rule, source)
    if isinstance(method, Finding):
        return method
    candidates = step_slices(method)
    for subscript in candidates:
        end = subscript.slice.upper
        helper = called_name(end) == USED_LEN_HELPER
        operands = None if helper else used_len_operands(end)
        if not helper and not operands:
            continue
        second = _second_slice(candidates, subscript)
        if second:
            return rule.report(State.UNRECOGNISED, subscript.lineno, second)
        if helper:
            steps = end.args[3] if isinstance(end, ast.Call) and len(end.args) == 4 else None
            detail = _kept_value(source, subscript.value, steps) if steps is not None else ""
            return rule.report(State.PATCHED, subscript.lineno, detail)
        seq_lens_sum, bs, steps = (source.text(operand) for operand in operands)
        return rule.report(
            State.TO_PATCH,
            subscript.lineno,
            _kept_value(source, subscript.value, operands[2]),
            edits=[Edit(end, replace=f"{USED_LEN_HELPER}({seq_lens_sum}, self.topk, {bs}, {steps})")],
            imports=[(SPEC_UTILS, USED_LEN_HELPER)],
        )
    where = candidates[0].lineno if candidates else method.lineno
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

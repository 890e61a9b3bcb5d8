"""The multi-step EAGLE draft attention backends whose kv_indices rows the rules size.

Each ``*MultiStepDraftBackend`` fills one kv_indices row per draft step with
``generate_draft_decode_kv_indices`` (launched over (num_steps, num_seqs, topk)) in
``common_template``, allocating the rows in ``init_forward_metadata`` (eager) and
``init_cuda_graph_state`` (CUDA graphs). One table rather than four copies of each rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import libcst as cst
import libcst.matchers as m
from libcst.helpers import parse_template_statement

from .base import (
    SPEC_UTILS, Edit, Finding, Rule, Source, State, code, factors, locate_method, self_attr, statements, take,
)

WIDTH_HELPER = "draft_kv_indices_buffer_width"
#: the local name upstream binds the row width to before allocating
WIDTH_NAME = "kv_indices_width"


@dataclass(frozen=True)
class DraftBackend:
    name: str
    file: str
    cls: str
    #: upstream added the always-on capacity assert to common_template here
    capacity_check: bool


DRAFT_BACKENDS = (
    DraftBackend("flashinfer", "srt/layers/attention/flashinfer_backend.py",
                 "FlashInferMultiStepDraftBackend", capacity_check=True),
    DraftBackend("flashinfer_mla", "srt/layers/attention/flashinfer_mla_backend.py",
                 "FlashInferMLAMultiStepDraftBackend", capacity_check=True),
    DraftBackend("triton", "srt/layers/attention/triton_backend.py",
                 "TritonMultiStepDraftBackend", capacity_check=False),
    DraftBackend("aiter", "srt/layers/attention/aiter_backend.py",
                 "AiterMultiStepDraftBackend", capacity_check=False),
)


def row_allocation(method: cst.FunctionDef) -> Optional[tuple[cst.SimpleStatementLine, cst.Tuple]]:
    """The statement allocating the kv_indices rows, ``x = torch.empty|zeros((self.speculative_num_steps, width), ...)``, and its shape tuple."""
    allocation = m.Call(
        func=m.Attribute(value=m.Name("torch"), attr=m.Name("empty") | m.Name("zeros")),
        args=[m.Arg(value=m.Tuple(elements=[m.Element(self_attr("speculative_num_steps")), m.Element()])),
              m.ZeroOrMore()],
    )
    for stmt in statements(method):
        for small in stmt.body:
            if m.matches(small, m.Assign(value=allocation)):
                return stmt, small.value.args[0].value
    return None


def width_assignments(method: cst.FunctionDef) -> dict[str, cst.Call]:
    """Local names bound to ``draft_kv_indices_buffer_width(...)`` in ``method``."""
    bound = {}
    for stmt in statements(method):
        for small in stmt.body:
            if m.matches(small, m.Assign(targets=[m.AssignTarget(m.Name())], value=m.Call(func=m.Name(WIDTH_HELPER)))):
                bound[small.targets[0].target.value] = small.value
    return bound


def find_row_width(rule: Rule, source: Source, num_seqs_of: Callable[[cst.FunctionDef, list[cst.BaseExpression]], Optional[cst.BaseExpression]]) -> Finding:
    """State of a kv_indices row-width site, and the rewrite to upstream's form.

    ``num_seqs_of(method, rest)`` names the sequence count, given the width's factors
    left once ``self.max_context_len`` and ``self.topk`` are taken out; None if unknown.
    """
    method = locate_method(rule, source)
    if isinstance(method, Finding):
        return method
    found = row_allocation(method)
    if found is None:
        return rule.report(State.UNRECOGNISED, source.line(method), "no `torch.empty/zeros((self.speculative_num_steps, width), ...)` row allocation")
    stmt, shape = found
    width = shape.elements[1].value
    if m.matches(width, m.Call(func=m.Name(WIDTH_HELPER))) or (
        m.matches(width, m.Name()) and width.value in width_assignments(method)
    ):
        return rule.report(State.PATCHED, source.line(stmt))
    rest = factors(width)
    num_seqs = None
    if take(rest, self_attr("max_context_len")):
        take(rest, self_attr("topk"))
        num_seqs = num_seqs_of(method, rest)
    if num_seqs is None:
        return rule.report(State.UNRECOGNISED, source.line(stmt), f"row width `{code(width)}` is no known form")
    width_stmt = parse_template_statement(
        f"{WIDTH_NAME} = {WIDTH_HELPER}(\n    {{num_seqs}}, self.topk, self.max_context_len\n)\n",
        num_seqs=num_seqs,
    )
    if m.findall(shape, m.Comment()):  # keep the tuple and its comments; swap the width alone
        shape_edit = Edit(width, rewrite=lambda _old: cst.Name(WIDTH_NAME))
    else:  # upstream's one-line shape
        new_shape = cst.parse_expression(f"(self.speculative_num_steps, {WIDTH_NAME})")
        shape_edit = Edit(shape, rewrite=lambda _old: new_shape)
    return rule.report(
        State.TO_PATCH, source.line(stmt),
        edits=[shape_edit, Edit(stmt, before=(width_stmt,))],
        imports=[(SPEC_UTILS, WIDTH_HELPER)],
    )

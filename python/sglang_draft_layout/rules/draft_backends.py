"""The multi-step EAGLE draft attention backends whose kv_indices rows the rules size.

Each ``*MultiStepDraftBackend`` fills one kv_indices row per draft step with
``generate_draft_decode_kv_indices`` (launched over (num_steps, num_seqs, topk)) in
``common_template``, allocating the rows in ``init_forward_metadata`` (eager) and
``init_cuda_graph_state`` (CUDA graphs). One table rather than four copies of each rule.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Callable, Optional

from ..layout_patterns.ast_walk import factors, is_self_attr
from ..layout_patterns.helper_names import WIDTH_HELPER
from ..layout_patterns.kv_indices import is_helper_width, row_allocations, width_binding
from .base import SPEC_UTILS, Edit, Finding, Rule, Source, State, locate_method

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
    DraftBackend(
        "flashinfer",
        "srt/layers/attention/flashinfer_backend.py",
        "FlashInferMultiStepDraftBackend",
        capacity_check=True,
    ),
    DraftBackend(
        "flashinfer_mla",
        "srt/layers/attention/flashinfer_mla_backend.py",
        "FlashInferMLAMultiStepDraftBackend",
        capacity_check=True,
    ),
    DraftBackend(
        "triton", "srt/layers/attention/triton_backend.py", "TritonMultiStepDraftBackend", capacity_check=False
    ),
    DraftBackend("aiter", "srt/layers/attention/aiter_backend.py", "AiterMultiStepDraftBackend", capacity_check=False),
)

#: names the sequence count, given the method and the width's factors left once
#: ``self.max_context_len`` and ``self.topk`` are taken out; None if unknown
NumSeqsOf = Callable[[Source, ast.FunctionDef, list[ast.expr]], Optional[str]]


def take(items: list[ast.expr], attribute: str) -> bool:
    """Remove the first ``self.<attribute>`` from ``items``; whether there was one."""
    for index, item in enumerate(items):
        if is_self_attr(item, attribute):
            del items[index]
            return True
    return False


def _another_sizing(method: ast.FunctionDef, allocations: list[tuple[ast.Assign, ast.Tuple]]) -> str:
    """Why the rows are sized more than one way in ``method`` (another allocation to the same target, or the
    width's local bound twice: in two branches, say), which refuses the site: the probes need not run each,
    so neither its value nor a rewrite of it could be judged. Empty: sized once."""
    target = ast.dump(allocations[0][0].targets[0])
    again = [stmt for stmt, _shape in allocations[1:] if ast.dump(stmt.targets[0]) == target]
    if again:
        return f"a second kv_indices row allocation at line {again[0].lineno}, which the probes need not run: one only"
    width = allocations[0][1].elts[1]
    if isinstance(width, ast.Name):
        lines = sorted(n.lineno for n in ast.walk(method) if isinstance(n, ast.Name) and n.id == width.id
                       and isinstance(n.ctx, ast.Store))  # fmt: skip
        if len(lines) > 1:
            where = ", ".join(map(str, lines))
            return f"the row width `{width.id}` is bound at lines {where}, which the probes need not all run: once only"
    return ""


def _rows_first(method: ast.FunctionDef, allocations: list[tuple[ast.Assign, ast.Tuple]]) -> list:
    """``allocations`` with those whose width counts ``max_context_len`` (directly or through its local: kv_indices
    rows) first, each in its order: a ``(steps, max_bs + 1)`` indptr allocated before the rows is not the site."""

    def counts_context(width: ast.expr) -> bool:
        binding = width_binding(width, method)
        value = binding.value if binding else width
        return any(isinstance(n, ast.Attribute) and n.attr == "max_context_len" for n in ast.walk(value))

    return sorted(allocations, key=lambda allocation: not counts_context(allocation[1].elts[1]))


def find_row_width(rule: Rule, source: Source, num_seqs_of: NumSeqsOf, with_topk: str = "") -> Finding:
    """State of a kv_indices row-width site, and the rewrite to upstream's form.

    ``with_topk``: the detail of a width that has the topk factor already (a fork's fix).
    """
    method = locate_method(rule, source)
    if isinstance(method, Finding):
        return method
    allocations = _rows_first(method, row_allocations(method))
    if not allocations:
        return rule.report(
            State.UNRECOGNISED,
            method.lineno,
            "no `torch.empty/zeros((self.speculative_num_steps, width), ...)` row allocation",
        )
    stmt, shape = allocations[0]
    width = shape.elts[1]
    again = _another_sizing(method, allocations)
    if again:
        return rule.report(State.UNRECOGNISED, stmt.lineno, again)
    if is_helper_width(width, method):
        return rule.report(State.PATCHED, stmt.lineno)
    binding = width_binding(width, method)  # a local the fork binds the width to
    product = binding.value if binding else width
    rest = factors(product)
    num_seqs = None
    has_topk = False
    if take(rest, "max_context_len"):
        has_topk = take(rest, "topk")
        num_seqs = num_seqs_of(source, method, rest)
    if num_seqs is None:
        return rule.report(State.UNRECOGNISED, stmt.lineno, f"row width `{source.text(product)}` is no known form")
    name = binding.targets[0].id if binding else WIDTH_NAME
    width_stmt = f"{name} = {WIDTH_HELPER}(\n    {num_seqs}, self.topk, self.max_context_len\n)\n"
    detail = with_topk if has_topk else ""
    if binding is not None:  # the local's value becomes the helper call; the allocation stays
        return rule.report(
            State.TO_PATCH,
            binding.lineno,
            detail or f"the fork's local `{name}`: its value via the helper",
            edits=[Edit(binding, replace=width_stmt)],
            imports=[(SPEC_UTILS, WIDTH_HELPER)],
        )
    if "#" in source.text(shape):  # keep the tuple and its comments; swap the width alone
        shape_edit = Edit(width, replace=WIDTH_NAME)
    else:  # upstream's one-line shape
        shape_edit = Edit(shape, replace=f"(self.speculative_num_steps, {WIDTH_NAME})")
    return rule.report(
        State.TO_PATCH,
        stmt.lineno,
        detail,
        edits=[shape_edit, Edit(stmt, before=(width_stmt,))],
        imports=[(SPEC_UTILS, WIDTH_HELPER)],
    )

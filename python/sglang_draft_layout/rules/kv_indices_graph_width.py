"""CUDA-graph kv_indices row width in ``*MultiStepDraftBackend.init_cuda_graph_state``.

Site: the rows captured into the draft CUDA graphs. SGLang <= 0.5.12 sizes them
``max_bs * self.max_context_len`` (FlashInfer, FlashInfer-MLA: the topk factor is
missing, so for topk > 1 the kernel writes past the row into graph-pool memory,
upstream 27338 / 27460) or ``max_num_tokens * self.max_context_len`` (Triton, Aiter).
Upstream (PR 27475) writes
``kv_indices_width = draft_kv_indices_buffer_width(max_bs, self.topk, self.max_context_len)``.
Invariant: every row holds ``draft_kv_indices_used_len(..., speculative_num_steps)``
for any batch up to max_bs whose sequences fit the context.

Not affected: the one-parameter ``init_cuda_graph_state(self, max_bs)`` (SGLang 0.4.6.post5
to 0.4.7.post1), which the draft CUDA-graph runner calls with ``max_num_token`` (max_bs *
topk, branches): its ``max_bs * self.max_context_len`` already counts every branch, and
``draft_kv_indices_buffer_width(max_bs, self.topk, ...)`` would make it topk times too wide.
Such a tree predates the narrow row altogether (``one_parameter_frame``).
"""

from __future__ import annotations

import ast
from dataclasses import replace
from typing import Optional

from ..layout_patterns.ast_walk import factors, is_self_attr
from ..layout_patterns.kv_indices import row_allocations, width_binding
from .base import Finding, Rule, Source, State, locate_method, param_names
from .draft_backends import DRAFT_BACKENDS, find_row_width

PER_BRANCH = "init_cuda_graph_state(self, max_bs) gets max_bs * topk branches: its rows hold every branch already"


def max_bs_parameter(_source: Source, method: ast.FunctionDef, rest: list[ast.expr]) -> Optional[str]:
    """``max_bs`` (the method's first parameter) when the width counts max_bs or max_num_tokens rows."""
    names = param_names(method)
    if len(rest) != 1 or len(names) < 3 or not (isinstance(rest[0], ast.Name) and rest[0].id in names[1:3]):
        return None
    return names[1]


def counts_branches(method: ast.FunctionDef) -> bool:
    """The one-parameter form: ``init_cuda_graph_state(self, max_bs)`` allocating ``max_bs * self.max_context_len`` rows."""
    names = param_names(method)
    allocations = row_allocations(method)
    if len(names) != 2 or not allocations:
        return False
    width = allocations[0][1].elts[1]
    binding = width_binding(width, method)
    operands = factors(binding.value if binding else width)
    return (
        len(operands) == 2
        and any(is_self_attr(f, "max_context_len") for f in operands)
        and any(isinstance(f, ast.Name) and f.id == names[1] for f in operands)
    )


def _find(rule: Rule, source: Source) -> Finding:
    method = locate_method(rule, source)
    if not isinstance(method, Finding) and counts_branches(method):
        return rule.report(State.NOT_AFFECTED, row_allocations(method)[0][0].lineno, PER_BRANCH)
    return find_row_width(
        rule,
        source,
        max_bs_parameter,
        with_topk="the fork's topk factor (27338/27460) kept; its width to draft_kv_indices_buffer_width",
    )


RULES = [
    Rule(
        id=f"graph-width:{backend.name}",
        file=backend.file,
        scope=f"{backend.cls}.init_cuda_graph_state",
        site="CUDA-graph kv_indices row width",
        upstream="PR 27475 (27338, 27460)",
        find=_find,
    )
    for backend in DRAFT_BACKENDS
]


GRAPH_WIDTH_RULES = {rule.id for rule in RULES}
TREE_PER_BRANCH = (
    "the tree's draft CUDA-graph rows count branches (init_cuda_graph_state(self, max_bs)): "
    "no narrow row, nothing to fix"
)


def one_parameter_frame(findings: list[Finding]) -> list[Finding]:
    """A whole tree's findings, settled by its draft CUDA-graph frame.

    Where every CUDA-graph row site present counts branches (reported not affected), the
    tree predates both the narrow row (SGLang 0.4.8) and the helpers' frame (rows per
    sequence times topk): every site to patch is reported not affected too and nothing is
    written, since its eager rows, slices and out_cache_loc split have no bug to fix and a
    half-converted tree would size its graph rows outside the helpers. One-parameter sites
    beside two-parameter ones are a mix no rule knows: unrecognised.
    """
    graph = [f for f in findings if f.rule.id in GRAPH_WIDTH_RULES]
    per_branch = [f for f in graph if f.state is State.NOT_AFFECTED]
    if not per_branch:
        return findings
    if any(f.state in (State.TO_PATCH, State.PATCHED) for f in graph):
        mixed = "one-parameter init_cuda_graph_state beside the two-parameter form of other draft backends"
        return [replace(f, state=State.UNRECOGNISED, detail=mixed) if f in per_branch else f for f in findings]
    return [
        (
            replace(f, state=State.NOT_AFFECTED, detail=TREE_PER_BRANCH, edits=(), imports=())
            if f.state is State.TO_PATCH
            else f
        )
        for f in findings
    ]

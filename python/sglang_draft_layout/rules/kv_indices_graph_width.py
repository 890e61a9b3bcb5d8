"""CUDA-graph kv_indices row width in ``*MultiStepDraftBackend.init_cuda_graph_state``.

Site: the rows captured into the draft CUDA graphs. SGLang <= 0.5.12 sizes them
``max_bs * self.max_context_len`` (FlashInfer, FlashInfer-MLA: the topk factor is
missing, so for topk > 1 the kernel writes past the row into graph-pool memory,
upstream 27338 / 27460) or ``max_num_tokens * self.max_context_len`` (Triton, Aiter).
Upstream (PR 27475) writes
``kv_indices_width = draft_kv_indices_buffer_width(max_bs, self.topk, self.max_context_len)``.
Invariant: every row holds ``draft_kv_indices_used_len(..., speculative_num_steps)``
for any batch up to max_bs whose sequences fit the context.
"""

from __future__ import annotations

import ast
from typing import Optional

from .base import Finding, Rule, Source, param_names
from .draft_backends import DRAFT_BACKENDS, find_row_width


def max_bs_parameter(_source: Source, method: ast.FunctionDef, rest: list[ast.expr]) -> Optional[str]:
    """``max_bs`` (the method's first parameter) when the width counts max_bs or max_num_tokens rows."""
    names = param_names(method)
    if len(rest) != 1 or len(names) < 3 or not (isinstance(rest[0], ast.Name) and rest[0].id in names[1:3]):
        return None
    return names[1]


def _find(rule: Rule, source: Source) -> Finding:
    return find_row_width(rule, source, max_bs_parameter,
                          with_topk="the fork's topk factor (27338/27460) kept; its width to draft_kv_indices_buffer_width")


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

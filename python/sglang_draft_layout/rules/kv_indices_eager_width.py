"""Eager kv_indices row width in ``*MultiStepDraftBackend.init_forward_metadata``.

Site: the per-forward allocation of the draft kv_indices rows,
``torch.empty((self.speculative_num_steps, forward_batch.batch_size * self.topk * self.max_context_len), ...)``.
Upstream (PR 27475) binds the width first,
``kv_indices_width = draft_kv_indices_buffer_width(forward_batch.batch_size, self.topk, self.max_context_len)``,
and allocates ``(self.speculative_num_steps, kv_indices_width)``. Invariant: the eager
row and the CUDA-graph row are sized by one formula, topk factor included; dtype,
device and empty-versus-zeros stay as the site had them.
"""

from __future__ import annotations

import ast
from typing import Optional

from .base import Finding, Rule, Source
from .draft_backends import DRAFT_BACKENDS, find_row_width


def batch_size_factor(source: Source, _method: ast.FunctionDef, rest: list[ast.expr]) -> Optional[str]:
    """The one factor left beside topk and max_context_len, when it is ``<batch>.batch_size``."""
    if len(rest) == 1 and isinstance(rest[0], ast.Attribute) and rest[0].attr == "batch_size":
        return source.text(rest[0])
    return None


def _find(rule: Rule, source: Source) -> Finding:
    return find_row_width(rule, source, batch_size_factor)


RULES = [
    Rule(
        id=f"eager-width:{backend.name}",
        file=backend.file,
        scope=f"{backend.cls}.init_forward_metadata",
        site="eager kv_indices row width",
        upstream="PR 27475",
        find=_find,
    )
    for backend in DRAFT_BACKENDS
]

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

from typing import Optional

import libcst as cst
import libcst.matchers as m

from .base import Finding, Rule, Source
from .draft_backends import DRAFT_BACKENDS, find_row_width


def batch_size_factor(_method: cst.FunctionDef, rest: list[cst.BaseExpression]) -> Optional[cst.BaseExpression]:
    """The one factor left beside topk and max_context_len, when it is ``<batch>.batch_size``."""
    if len(rest) == 1 and m.matches(rest[0], m.Attribute(attr=m.Name("batch_size"))):
        return rest[0]
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

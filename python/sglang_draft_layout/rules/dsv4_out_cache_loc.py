"""Per-step out_cache_loc in ``DeepseekV4AttnBackend.init_forward_metadata`` (decode branch).

Site: the decode branch, ``self.init_forward_metadata_decode(..., out_cache_loc=forward_batch.out_cache_loc)``.
DeepSeek-V4 bakes each draft step's KV write targets (c4/c128 compression) into its
metadata at init time, so in a multi-step draft it must receive that step's
``[bs * topk]`` slots, not the whole ``[bs * topk * num_steps]`` buffer: SGLang 0.5.12
fails ``AssertionError: req_pool_indices.shape=... out_cache_loc.shape=...`` at the
first draft decode with ``--disable-cuda-graph`` (CUDA graphs bypass this path).
Upstream (PR 26239) slices with
``per_step_draft_out_cache_loc(...)[self.speculative_step_id]`` when
``self.topk > 0 and self.speculative_num_steps > 1``.
Invariant: the metadata's write targets are the slots the draft worker writes at this step.
"""

from __future__ import annotations

import ast
from typing import Iterator

from ..layout_patterns import PER_STEP_HELPER, called_name, in_order, is_self_attr
from .base import EAGLE_UTILS, Edit, Finding, Rule, Source, State

CLASS = "DeepseekV4AttnBackend"
PRELUDE = """
# DSv4 bakes this step's KV write target (c4/c128) into metadata,
# so slice the shared multi-step out_cache_loc now, not at forward time.
out_cache_loc = {batch}.out_cache_loc
"""
STEP_SLICE = f"""
if self.topk > 0 and self.speculative_num_steps > 1:
    out_cache_loc = {PER_STEP_HELPER}(
        out_cache_loc,
        {{batch}}.batch_size,
        self.topk,
        self.speculative_num_steps,
    )[self.speculative_step_id]
"""


def out_cache_loc_argument(node: ast.AST) -> ast.keyword | None:
    """The ``out_cache_loc=`` argument of a ``self.init_forward_metadata_decode(...)`` call."""
    if not (isinstance(node, ast.Call) and is_self_attr(node.func, "init_forward_metadata_decode")):
        return None
    return next((k for k in node.keywords if k.arg == "out_cache_loc"), None)


def decode_branches(source: Source) -> Iterator[ast.If]:
    """``if <...>.is_decode_or_idle():`` blocks of the class's methods that build decode metadata."""
    for method in source.methods(CLASS):
        for node in in_order(method):
            if isinstance(node, ast.If) and called_name(node.test) == "is_decode_or_idle" and any(
                out_cache_loc_argument(n) for stmt in node.body for n in in_order(stmt)
            ):
                yield node


def _find(rule: Rule, source: Source) -> Finding:
    if source.cls(CLASS) is None:
        return rule.report(State.ABSENT, detail=f"no class {CLASS}")
    unknown_line = None
    for branch in decode_branches(source):
        if any(called_name(n) == PER_STEP_HELPER for stmt in branch.body for n in in_order(stmt)):
            return rule.report(State.PATCHED, branch.lineno)
        for stmt in branch.body:
            loc = next(filter(None, map(out_cache_loc_argument, in_order(stmt))), None)
            if loc is None:
                continue
            if not (isinstance(loc.value, ast.Attribute) and loc.value.attr == "out_cache_loc"):
                unknown_line = stmt.lineno
                break
            batch = source.text(loc.value.value)
            before = (PRELUDE.format(batch=batch).lstrip(), STEP_SLICE.format(batch=batch).lstrip())
            return rule.report(
                State.TO_PATCH, stmt.lineno,
                edits=[Edit(loc.value, replace="out_cache_loc"), Edit(stmt, before=before)],
                imports=[(EAGLE_UTILS, PER_STEP_HELPER)],
            )
    return rule.report(State.UNRECOGNISED, unknown_line,
                       "no decode branch passing `forward_batch.out_cache_loc` to init_forward_metadata_decode")


RULES = [
    Rule(
        id="dsv4-out-cache-loc",
        file="srt/layers/attention/deepseek_v4_backend.py",
        scope=f"{CLASS}.init_forward_metadata",
        site="per-step out_cache_loc (decode)",
        upstream="PR 26239",
        find=_find,
    )
]

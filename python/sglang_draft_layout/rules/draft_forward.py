"""Per-step out_cache_loc in the EAGLE workers' ``draft_forward``.

Site: ``EagleDraftWorker.draft_forward`` (V2 worker, overlap scheduling) and, where a
release still has it, ``EAGLEWorker.draft_forward`` (v1, ``--disable-overlap-schedule``
or topk > 1), which reshape the flat draft buffer by hand:
``x = x.reshape(bs, self.topk, self.speculative_num_steps)`` then
``x = x.permute((2, 0, 1)).reshape(self.speculative_num_steps, -1)``.
Upstream (PR 26239) calls
``per_step_draft_out_cache_loc(x, bs, self.topk, self.speculative_num_steps)``.
Invariant: the worker writes step i's KV to the same slots that DeepSeek-V4 bakes into
its metadata, because both read the layout off one helper, which also checks the
buffer's length.

Not affected: the step-major split of SGLang 0.4.6.post5 and 0.4.7,
``x = x.view(bs, -1)`` then ``x[:, self.topk * i : self.topk * (i + 1)]`` (a
``[bs, steps, topk]`` layout, not the helper's ``[bs, topk, steps]``): the tree's own
layout, left as it is (rewriting it with the helper would move every draft slot).
"""

from __future__ import annotations

import ast

from typing import Optional

from ..layout_patterns import PER_STEP_HELPER, called_name, factors, is_self_attr, nodes_of, out_cache_loc_layouts
from .base import EAGLE_UTILS, Edit, Finding, Rule, Source, State, locate_method

WORKERS = (
    ("srt/speculative/eagle_worker_v2.py", "EagleDraftWorker"),
    ("srt/speculative/eagle_worker.py", "EAGLEWorker"),
)
CALL = f"""
{{target}} = {PER_STEP_HELPER}(
    {{buffer}},
    {{batch_size}},
    self.topk,
    self.speculative_num_steps,
)
"""


def step_major_split(method: ast.FunctionDef) -> Optional[ast.Subscript]:
    """``x[:, self.topk * i : self.topk * (i + 1)]``: step i's columns of a ``[bs, steps * topk]`` view."""
    for node in nodes_of(method, ast.Subscript):
        index = node.slice
        if not (isinstance(index, ast.Tuple) and len(index.elts) == 2
                and all(isinstance(part, ast.Slice) and part.step is None for part in index.elts)):
            continue
        rows, columns = index.elts
        bounds = (columns.lower, columns.upper)
        if rows.lower is None and rows.upper is None and None not in bounds \
                and all(any(is_self_attr(f, "topk") for f in factors(bound)) for bound in bounds):
            return node
    return None


def _find(rule: Rule, source: Source) -> Finding:
    method = locate_method(rule, source)
    if isinstance(method, Finding):
        return method
    helper_calls = [n for n in nodes_of(method, ast.Call) if called_name(n) == PER_STEP_HELPER]
    if helper_calls:
        return rule.report(State.PATCHED, helper_calls[0].lineno)
    for stmts, target, buffer, batch_size in out_cache_loc_layouts(method):
        new = CALL.format(target=target.id, buffer=source.text(buffer), batch_size=source.text(batch_size)).lstrip()
        return rule.report(State.TO_PATCH, stmts[0].lineno,
                           edits=[Edit(stmts[0], replace=new, absorb=tuple(stmts[1:]))],
                           imports=[(EAGLE_UTILS, PER_STEP_HELPER)])
    split = step_major_split(method)
    if split is not None:
        return rule.report(State.NOT_AFFECTED, split.lineno,
                           "its own step-major split `x[:, self.topk * i : self.topk * (i + 1)]`, not the helper's layout")
    return rule.report(State.UNRECOGNISED, method.lineno,
                       "no `reshape(bs, topk, steps)` + `permute((2, 0, 1)).reshape(steps, -1)` of out_cache_loc")


RULES = [
    Rule(
        id=f"draft-forward:{cls}",
        file=file,
        scope=f"{cls}.draft_forward",
        site="per-step out_cache_loc",
        upstream="PR 26239",
        find=_find,
    )
    for file, cls in WORKERS
]

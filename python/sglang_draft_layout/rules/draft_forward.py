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
"""

from __future__ import annotations

import ast

from ..layout_patterns import PER_STEP_HELPER, called_name, nodes_of, out_cache_loc_layouts
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

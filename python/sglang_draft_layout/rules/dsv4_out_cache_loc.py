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

from typing import Iterator

import libcst as cst
import libcst.matchers as m
from libcst.helpers import parse_template_statement

from .base import EAGLE_UTILS, Edit, Finding, Rule, Source, State, walk

HELPER = "per_step_draft_out_cache_loc"
CLASS = "DeepseekV4AttnBackend"
PRELUDE = """
# DSv4 bakes this step's KV write target (c4/c128) into metadata,
# so slice the shared multi-step out_cache_loc now, not at forward time.
out_cache_loc = {batch}.out_cache_loc
"""
STEP_SLICE = f"""
if self.topk > 0 and self.speculative_num_steps > 1:
    out_cache_loc = {HELPER}(
        out_cache_loc,
        {{batch}}.batch_size,
        self.topk,
        self.speculative_num_steps,
    )[self.speculative_step_id]
"""
DECODE_CALL = m.Call(
    func=m.Attribute(value=m.Name("self"), attr=m.Name("init_forward_metadata_decode")),
    args=[m.ZeroOrMore(), m.Arg(keyword=m.Name("out_cache_loc")), m.ZeroOrMore()],
)


def decode_branches(source: Source) -> Iterator[cst.If]:
    """``if <...>.is_decode_or_idle():`` blocks of the class's methods that build decode metadata."""
    decode_test = m.Call(func=m.Attribute(attr=m.Name("is_decode_or_idle")))
    for method in source.methods(CLASS, mentioning="is_decode_or_idle"):
        for node in walk(method.body):
            if m.matches(node, m.If(test=decode_test)) and any(m.findall(node.body, DECODE_CALL)):
                yield node


def _find(rule: Rule, source: Source) -> Finding:
    if not source.has_class(CLASS):
        return rule.report(State.ABSENT, detail=f"no class {CLASS}")
    unknown_line = None
    for branch in decode_branches(source):
        if m.findall(branch.body, m.Call(func=m.Name(HELPER))):
            return rule.report(State.PATCHED, source.line(branch))
        for stmt in branch.body.body:
            calls = m.findall(stmt, DECODE_CALL)
            if not calls:
                continue
            loc = next(arg for arg in calls[0].args if arg.keyword and arg.keyword.value == "out_cache_loc")
            if not m.matches(loc.value, m.Attribute(attr=m.Name("out_cache_loc"))):
                unknown_line = source.line(stmt)
                break
            batch = loc.value.value
            before = (
                parse_template_statement(PRELUDE.lstrip(), batch=batch),
                parse_template_statement(STEP_SLICE.lstrip(), batch=batch),
            )
            return rule.report(
                State.TO_PATCH, source.line(stmt),
                edits=[Edit(loc.value, rewrite=lambda _old: cst.Name("out_cache_loc")), Edit(stmt, before=before)],
                imports=[(EAGLE_UTILS, HELPER)],
            )
    return rule.report(State.UNRECOGNISED, unknown_line, "no decode branch passing `forward_batch.out_cache_loc` to init_forward_metadata_decode")


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

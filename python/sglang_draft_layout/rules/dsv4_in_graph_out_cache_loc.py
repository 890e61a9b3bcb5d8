"""Per-step out_cache_loc in the DeepSeek-V4 backends' ``init_forward_metadata_in_graph``.

Site: the SWA KV-store write target that 0.5.13's DeepSeek-V4 backends (CUDA
``DeepseekV4AttnBackend``, ROCm ``DeepseekV4HipRadixBackend``) compute once per forward inside
the CUDA graph, ``metadata.core_attn_metadata.swa_out_cache_loc =
self.token_to_kv_pool.translate_loc_from_full_to_swa(out_cache_loc)``. In a multi-step draft the
multi-step backend calls each step's ``init_forward_metadata_in_graph`` with the whole draft
batch, so the per-step backend must translate its own step's ``[bs * topk]`` row, not the whole
``[bs * topk * num_steps]`` buffer. Upstream 0.5.13 (the method is new there; 0.5.12 and the
forks copied from May-2026 main have none: not in this release) slices it with
``per_step_draft_out_cache_loc(...)[self.speculative_step_id]`` when the batch is decode (or idle),
``self.topk > 0`` and ``self.speculative_num_steps > 1``, mirroring the eager init's slice
(``dsv4_out_cache_loc``). Invariant: the write target is the slots the draft worker writes at this
step, split from the flat buffer exactly once on the path multi-step backend -> per-step backend.

Who splits on the path is the one split-once verdict (``proof.split_once``, ``IN_GRAPH``): every path
into the method run on the probes, the multi-step caller's in-graph method (the CUDA graph's path) and its
eager ``init_forward_metadata`` (which calls this method after building the metadata), the write target
being what ``translate_loc_from_full_to_swa`` is handed. The per-step code splits: the helper there
(patched), a split of the fork's own rewritten to the helper where it is, or one elsewhere left as it is
(by hand). A multi-step caller hands each step its row on every path: handled by the fork's caller. Never
split: upstream's slice inserted ahead of the statement that translates ``forward_batch.out_cache_loc``
itself or a local bound once to it, proven by the verdict on the result. Split twice, for some paths or
topk only, or anything the run cannot follow: refused, naming the path and probe.
"""

from __future__ import annotations

import ast
from typing import Optional

from ..layout_patterns.ast_walk import holding_statement, nodes_of
from ..layout_patterns.baking import IN_GRAPH, SWA_TARGET, baked_at
from ..layout_patterns.helper_names import PER_STEP_HELPER
from ..layout_patterns.out_cache_loc import helper_calls, out_cache_loc_layouts
from . import dsv4_hip_out_cache_loc, dsv4_out_cache_loc
from .base import EAGLE_UTILS, Edit, Finding, Rule, Source, State
from .draft_forward import split_finding
from .who_splits import CALLER, IN_GRAPH as IN_GRAPH_PHASE, NEVER, NONE, PER_STEP, split_of

#: (file, per-step class, its multi-step caller) of every backend with this site
SITES = (
    (dsv4_out_cache_loc.DSV4_FILE, dsv4_out_cache_loc.CLASS, dsv4_out_cache_loc.MULTI_STEP),
    (dsv4_hip_out_cache_loc.FILE, dsv4_hip_out_cache_loc.CLASS, dsv4_hip_out_cache_loc.MULTI_STEP),
)
CONDITION = (
    "{batch}.forward_mode.is_decode_or_idle()",
    "self.topk > 0",
    "self.speculative_num_steps > 1",
)
SLICE = f"""
    # Multi-step draft decode shares one out_cache_loc buffer across
    # steps; mirror the eager init's per-step slice.
    out_cache_loc = {PER_STEP_HELPER}(
        out_cache_loc,
        {{batch}}.batch_size,
        self.topk,
        self.speculative_num_steps,
    )[self.speculative_step_id]
"""


def step_slice(batch: str, indent: int, line_length: int) -> str:
    """Upstream's guarded slice, its condition on one line where black would put it there."""
    joined = f"if {' and '.join(CONDITION)}:".format(batch=batch)
    header = (
        joined
        if indent + len(joined) <= line_length
        else "if (\n" + "".join(f"    {'and ' if i else ''}{part}\n" for i, part in enumerate(CONDITION)) + "):"
    )
    return (header + SLICE).format(batch=batch).strip() + "\n"


def _bound_once(method: ast.FunctionDef, name: str) -> Optional[ast.Assign]:
    """``name = <value>``, the one binding of ``name`` in ``method``."""
    stores = [n for n in nodes_of(method, ast.Name) if n.id == name and not isinstance(n.ctx, ast.Load)]
    assigns = [
        a
        for a in nodes_of(method, ast.Assign)
        if len(a.targets) == 1 and isinstance(a.targets[0], ast.Name) and a.targets[0].id == name
    ]
    return assigns[0] if len(stores) == 1 and len(assigns) == 1 else None


def _is_batch_loc(node: ast.expr) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "out_cache_loc" and isinstance(node.value, ast.Name)


def _same_block(method: ast.FunctionDef, first: ast.stmt, second: ast.stmt) -> bool:
    return any(
        first in body and second in body
        for node in nodes_of(method, ast.stmt) + [method]
        for body in (getattr(node, "body", []), getattr(node, "orelse", []))
        if isinstance(body, list)
    )


def _find(rule: Rule, source: Source) -> Finding:
    cls = rule.scope.split(".")[0]
    if source.cls(cls) is None:
        return rule.report(State.ABSENT, detail=f"no class {cls}")
    method = source.method(cls, IN_GRAPH)
    if method is None:
        return rule.report(State.ABSENT, detail=f"{cls} has no {IN_GRAPH} (0.5.13 added it)")
    if SWA_TARGET not in source.text(source.cls(cls)):
        return rule.report(State.NOT_AFFECTED, method.lineno, f"no {SWA_TARGET}(...) of the draft buffer in {cls}")
    verdict = split_of(source, cls, IN_GRAPH_PHASE)
    splits, helpers = out_cache_loc_layouts(method), helper_calls(method)
    calls = baked_at(method, IN_GRAPH)
    line = calls[0].lineno if calls else method.lineno
    if verdict.who == CALLER:
        return rule.report(State.BY_CALLER, line, f"{verdict.caller} at {verdict.at}")
    if verdict.who == PER_STEP and splits:
        return split_finding(rule, source, method, splits, f"the fork's own split: via {PER_STEP_HELPER}")
    if verdict.who in (PER_STEP, NONE) and helpers:  # NONE: upstream's split, where no probe reaches it
        return rule.report(State.PATCHED, helpers[0].lineno)
    if verdict.who == PER_STEP:
        return rule.report(
            State.BY_HAND, line, "the fork's own code splits it per step (run on the probes): left as it is"
        )
    if verdict.who not in (NEVER, NONE):  # NONE: unreached before the rewrite (the eager init raises); judged after
        return rule.report(State.UNRECOGNISED, line, f"the per-step out_cache_loc path: {verdict.why}")
    if len(calls) != 1:
        return rule.report(
            State.UNRECOGNISED, line, f"{IN_GRAPH} calls {SWA_TARGET} {len(calls)} times: rewrite it by hand"
        )
    call = calls[0]
    stmt = holding_statement(method, call)
    indent = stmt.col_offset
    arg = call.args[0] if len(call.args) == 1 else None
    if arg is not None and _is_batch_loc(arg):
        batch = source.text(arg.value)
        before = (f"out_cache_loc = {batch}.out_cache_loc\n", step_slice(batch, indent, source.line_length))
        edits = [Edit(arg, replace="out_cache_loc"), Edit(stmt, before=before)]
    else:
        bound = _bound_once(method, arg.id) if isinstance(arg, ast.Name) else None
        if bound is None or not _is_batch_loc(bound.value) or not _same_block(method, bound, stmt):
            return rule.report(
                State.UNRECOGNISED,
                call.lineno,
                f"the write target of {SWA_TARGET} is neither the batch's out_cache_loc nor a local "
                "bound once to it in the same block: rewrite it by hand",
            )
        batch = source.text(bound.value.value)
        slice_text = step_slice(batch, indent, source.line_length)
        if arg.id != "out_cache_loc":
            slice_text = slice_text.replace("out_cache_loc = ", f"{arg.id} = ").replace(
                "        out_cache_loc,\n", f"        {arg.id},\n"
            )
        edits = [Edit(stmt, before=(slice_text,))]
    return rule.report(
        State.TO_PATCH,
        call.lineno,
        edits=edits,
        imports=[(EAGLE_UTILS, PER_STEP_HELPER)],
        proven_by_split_once=rule.scope,
    )


RULES = [
    Rule(
        id=f"dsv4-in-graph-out-cache-loc:{cls}",
        file=file,
        scope=f"{cls}.{IN_GRAPH}",
        site="per-step out_cache_loc (in graph)",
        upstream="PR 26239",
        find=_find,
        reads=(multi_step,),
    )
    for file, cls, multi_step in SITES
]

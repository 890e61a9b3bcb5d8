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
Invariant: the metadata's write targets are the slots the draft worker writes at this step,
split from the flat buffer exactly once on the path multi-step backend -> per-step backend.

A fork's own fix is the same site: a split of its own feeding ``out_cache_loc=`` (inline,
through a local or a chain of locals each bound once, ``loc = rows[self.speculative_step_id]``,
or in a method of the class the site calls, at any depth of ``self.`` calls; any spelling
``layout_patterns.out_cache_loc.out_cache_loc_layouts`` proves equal) is rewritten to the helper where it
is, every such split in the one apply (say one per branch).

Who splits on the path is read off the harness's runs of it (``who_splits``): the multi-step caller
handing each step's backend the batch, or the per-step code alone. The caller splits: handled by the
fork's caller, nothing added here. The per-step code splits: its own split rewritten to the helper, or by hand in a callee (left).
Never split: upstream's slice added. Twice, where the per-step code splits as upstream does (the
helper) and a caller of this file hands each step its row (a fork that merged upstream): the caller's
split taken out (``layout_patterns.caller_split``), upstream's kept, where the runs of the result split it
once (``who_splits.split_after``); likewise a fork's split in a callee of the per-step
code (``init_forward_metadata_decode`` rebinding its ``out_cache_loc`` to the step's row). Anything
else (twice otherwise, for some topk only, a caller this tool cannot follow) is refused, unless the
fork keeps this site (``keeps_path``: the keep comment on a method of the path or its statement
handing ``out_cache_loc=`` on, or ``--keep`` naming it); a keep on the caller keeps the caller's own
layout, not the double split.

The judgement is per (file, per-step class, multi-step caller) (``decode_rule``): this module's rule
is DeepSeek-V4's CUDA backend; ``dsv4_hip_out_cache_loc`` is the ROCm backend's, with the same logic.
"""

from __future__ import annotations

import ast
from typing import Iterator, Optional

from ..layout_patterns.ast_walk import (
    called_name,
    comprehension_targets,
    in_order,
    inside,
    is_self_attr,
    nodes_of,
    self_called,
    self_reached,
)
from ..layout_patterns.helper_names import PER_STEP_HELPER
from ..layout_patterns.keep import KEEP_PRAGMA
from ..layout_patterns.out_cache_loc import Split, helper_calls, out_cache_loc_layouts
from ..layout_patterns.baking import baking_methods, keeps_path
from .base import EAGLE_UTILS, Edit, Finding, Rule, Source, State
from .caller_split import callee_split_removal, caller_split_removal
from .draft_forward import split_finding
from .splice import spliced
from .who_splits import CALLER, NEVER, PER_STEP, TWICE, split_after, split_of


CLASS = "DeepseekV4AttnBackend"
#: the multi-step backend that calls each step's DeepseekV4AttnBackend.init_forward_metadata
MULTI_STEP = "DeepseekV4MultiStepBackend"
DSV4_FILE = "srt/layers/attention/deepseek_v4_backend.py"
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


def decode_branches(source: Source, cls: str = CLASS) -> Iterator[tuple[ast.FunctionDef, ast.If]]:
    """(method, ``if <...>.is_decode_or_idle():`` block) of the class's methods that build decode metadata."""
    for method in source.methods(cls):
        for node in in_order(method):
            if (
                isinstance(node, ast.If)
                and called_name(node.test) == "is_decode_or_idle"
                and any(out_cache_loc_argument(n) for stmt in node.body for n in in_order(stmt))
            ):
                yield method, node


def _alias(expr: ast.expr) -> Optional[str]:
    """``name`` of ``name`` or ``name[self.speculative_step_id]``: a local standing for another's value."""
    if isinstance(expr, ast.Subscript) and is_self_attr(expr.slice, "speculative_step_id"):
        expr = expr.value
    return expr.id if isinstance(expr, ast.Name) else None


def _aliased(method: ast.FunctionDef, feeding: list[ast.expr], seen: set[str]) -> tuple[list[ast.expr], str]:
    """The values a chain of local aliases leads back to from ``feeding`` (``loc = rows``,
    ``loc = rows[self.speculative_step_id]``, ``rows = <split>``), each local of the chain bound
    once in ``method`` (why ""); ([], why) when one is bound more than once."""
    stores: dict[str, list[int]] = {a.arg: [a.lineno] for a in nodes_of(method.args, ast.arg)}
    inner = comprehension_targets(method)
    for name in nodes_of(method, ast.Name):
        if not isinstance(name.ctx, ast.Load) and id(name) not in inner:
            stores.setdefault(name.id, []).append(name.lineno)
    values = {
        a.targets[0].id: a.value
        for a in nodes_of(method, ast.Assign)
        if len(a.targets) == 1 and isinstance(a.targets[0], ast.Name)
    }
    values.update(
        (a.target.id, a.value)
        for a in nodes_of(method, ast.AnnAssign)  # rows: Tensor = <split>
        if isinstance(a.target, ast.Name) and a.value is not None
    )
    found: list[ast.expr] = []
    chain = [name for name in map(_alias, feeding) if name]
    while chain:
        name = chain.pop()
        if name in seen:
            continue
        seen.add(name)
        lines = stores.get(name, [])
        if len(lines) > 1:
            return [], (
                f"out_cache_loc= comes through `{name}`, bound more than once in {method.name} "
                f"(lines {', '.join(map(str, lines))}): rewrite its split by hand"
            )
        if lines and name in values:
            found.append(values[name])
            chain += filter(None, [_alias(values[name])])
    return found, ""


def _fed_by(
    source: Source, method: ast.FunctionDef, value: ast.expr, cls_name: str = CLASS
) -> tuple[list[Split], list[ast.Call], str, str]:
    """The fork's own per-step split feeding ``out_cache_loc=value``, hand-written or via the helper,
    and where: in ``value``, in the values of the locals it names (and of the chain of locals bound
    once that those alias), or in the first method holding one that it reaches through ``self.<name>(...)``
    calls there, at any depth (``self_reached``); ``where`` "": nothing found; ``why`` not "" when a
    local of that chain is bound more than once."""
    names = {n.id for n in in_order(value) if isinstance(n, ast.Name)}
    feeding = [value] + [
        a.value
        for a in nodes_of(method, ast.Assign)
        if any(isinstance(t, ast.Name) and t.id in names for t in a.targets)
    ]
    chained, why = _aliased(method, feeding[1:], set(names))
    if why:
        return [], [], "", why
    feeding += chained
    splits = [s for s in out_cache_loc_layouts(method) if any(inside(s.node, e) for e in feeding)]
    helpers = [c for c in helper_calls(method) if any(inside(c, e) for e in feeding)]
    if splits or helpers:
        return splits, helpers, method.name, ""
    cls = source.cls(cls_name)
    called = {
        c.func.attr
        for e in feeding
        for c in in_order(e)
        if isinstance(c, ast.Call) and is_self_attr(c.func, getattr(c.func, "attr", ""))
    }
    for each in (
        m
        for callee in self_called(cls, method)
        if callee.name in called
        for m in self_reached(cls, callee)
        if m is not method
    ):
        splits, helpers = out_cache_loc_layouts(each), helper_calls(each)
        if splits or helpers:
            return splits, helpers, each.name, ""
    return [], [], "", ""


def _find(rule: Rule, source: Source) -> Finding:
    """The decode branch of the per-step class ``rule.scope`` names, chosen by who splits on the path into it
    (``who_splits.split_of``: the harness's runs of it)."""
    cls = rule.scope.split(".")[0]
    if source.cls(cls) is None:
        return rule.report(State.ABSENT, detail=f"no class {cls}")
    unknown_line = None
    for method, branch in decode_branches(source, cls):
        for stmt in branch.body:
            loc = next(filter(None, map(out_cache_loc_argument, in_order(stmt))), None)
            if loc is None:
                continue
            in_branch = [c for s in branch.body for c in helper_calls(s)]
            splits, helpers, where, why = _fed_by(source, method, loc.value, cls)
            if why:
                return rule.report(State.UNRECOGNISED, stmt.lineno, why)
            if in_branch and not splits:
                helpers, where = in_branch, method.name
            plain = isinstance(loc.value, ast.Attribute) and loc.value.attr == "out_cache_loc"
            if not (plain or splits or helpers):
                unknown_line = stmt.lineno
                break
            verdict = split_of(source, cls)
            if verdict.who == CALLER and plain:  # reported here, naming where the caller splits
                return rule.report(State.BY_CALLER, stmt.lineno, f"{verdict.caller} at {verdict.at}")
            if verdict.who == PER_STEP and plain:
                return rule.report(
                    State.BY_HAND,
                    stmt.lineno,
                    "the fork's own code splits it per step (run on the probes): left as it is",
                )
            if verdict.who == NEVER and plain:
                batch = source.text(loc.value.value)
                before = (PRELUDE.format(batch=batch).lstrip(), STEP_SLICE.format(batch=batch).lstrip())
                return rule.report(
                    State.TO_PATCH,
                    stmt.lineno,
                    edits=[Edit(loc.value, replace="out_cache_loc"), Edit(stmt, before=before)],
                    imports=[(EAGLE_UTILS, PER_STEP_HELPER)],
                )
            if verdict.who == PER_STEP:  # the fork's own split, once on every path
                if splits:  # every one of them, also beside a helper call
                    return split_finding(
                        rule,
                        source,
                        source.method(cls, where),
                        splits,
                        f"the fork's own split (in {where}): via {PER_STEP_HELPER}",
                    )
                return rule.report(State.PATCHED, helpers[0].lineno if where != method.name else branch.lineno)
            if keeps_path(source.lines, baking_methods(source.cls(cls))):
                return rule.report(State.KEPT, stmt.lineno, KEEP_PRAGMA)
            removal, fork_split, line = (
                _upstream_side(source, cls, method, verdict) if helpers and not splits else ([], "", 0)
            )
            if removal:
                return rule.report(
                    State.TO_PATCH,
                    line,
                    f"{fork_split} splits it again after upstream's split in {cls}.{where}: "
                    "the fork's split taken out, upstream's kept",
                    edits=removal,
                    proven_by_split_once=rule.scope,
                )
            if verdict.who == TWICE and where:  # else the per-step code splits nowhere: the runs say what is wrong
                at = f"line {verdict.line}" if verdict.file == source.path else verdict.at
                return rule.report(
                    State.UNRECOGNISED,
                    stmt.lineno,
                    f"splits the per-step out_cache_loc twice: here "
                    f"(in {where}) and in its caller {verdict.caller} ({at}); keep one of them",
                )
            why = verdict.why or f"its own split (in {where}) never takes effect: each step bakes the whole buffer"
            return rule.report(State.UNRECOGNISED, stmt.lineno, f"the per-step out_cache_loc path: {why}")
    return rule.report(
        State.UNRECOGNISED,
        unknown_line,
        "no decode branch passing `forward_batch.out_cache_loc` to init_forward_metadata_decode",
    )


def _upstream_side(source: Source, cls: str, decode: ast.FunctionDef, verdict) -> tuple[list[Edit], str, int]:
    """Where ``cls``'s own code splits as upstream does and the path still does not split once: the edits
    that take the fork's split out, its ``Class.method`` and line; ([], "", 0) when none is proven.

    The fork's split is the multi-step caller's of this file that the verdict names (twice), or else
    one in a method of ``cls`` that ``decode`` reaches (the callee handed the row); taken out by
    ``caller_split_removal`` / ``callee_split_removal``, written only where the split-once verdict on the
    result split it once (``split_after``), never in a method with a keep comment."""

    def kept(owner: str, name: str) -> bool:
        defined = source.method(owner, name)
        return any(KEEP_PRAGMA in line for line in source.lines[defined.lineno - 1 : defined.end_lineno])

    if verdict.who == TWICE:
        owner, _, name = verdict.caller.partition(".")
        candidates = [(owner, name, caller_split_removal)]
    else:
        candidates = [(cls, m.name, callee_split_removal) for m in self_reached(source.cls(cls), decode)[1:]]
    for owner, name, removal in candidates:
        if source.cls(owner) is None or source.method(owner, name) is None or kept(owner, name):
            continue  # a method the fork keeps stays as written: the double split is refused
        edits, _why = removal(source, owner, name)
        if edits and split_after(source, spliced(source, edits), cls).who in (CALLER, PER_STEP):
            taken = [n for e in edits if not e.remove for n in (e.absorb or [e.node])]
            return edits, f"{owner}.{name}", min(n.lineno for n in taken)
    return [], "", 0


def decode_rule(id: str, file: str, cls: str, multi_step: str) -> Rule:
    """The rule of one DeepSeek-V4-like decode branch: the per-step class ``cls`` of ``file``, driven
    per step by ``multi_step``; the same judgement for every such backend (``_find``)."""
    return Rule(
        id=id,
        file=file,
        scope=f"{cls}.init_forward_metadata",
        site="per-step out_cache_loc (decode)",
        upstream="PR 26239",
        find=_find,
        reads=(multi_step,),
    )


RULES = [decode_rule("dsv4-out-cache-loc", DSV4_FILE, CLASS, MULTI_STEP)]

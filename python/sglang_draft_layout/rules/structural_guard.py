"""The structural guard: draft layouts in classes no rule names.

The other rule modules find their sites by class name (the four upstream draft
backends, DeepSeek-V4, the EAGLE workers). This module finds the rest by structure:
any top-level class in a file under ``srt/layers/attention/`` or ``srt/speculative/``
whose methods launch ``generate_draft_decode_kv_indices``, allocate
``(self.speculative_num_steps, width)`` rows from a ``max_context_len`` product (also
through a local), slice rows with ``seq_lens_sum * topk + bs * (...)`` or split a
``[bs, topk, num_steps]`` out_cache_loc per step, inline or through the helpers
(``layout_patterns.forms.draft_layout_forms``). Each such method gets the rules of the forms
it holds, the rule modules' own ``find`` applied to that class and method:

* kv_indices rows: the row-width find (rows counted by ``<batch>.batch_size`` or by
  the method's ``max_bs`` / ``max_num_tokens`` parameter);
* a kernel launch or a per-step used length: the per-step slice find;
* a capacity length: the capacity-check find (the fork's own check, its length via the helper);
* per-step out_cache_loc: the ``draft_forward`` find.

Capacity check: upstream added it only to FlashInfer and FlashInfer-MLA. A discovered
class must have it where it launches the kernel itself and subclasses one of those two
backends (it overrides the method upstream checks); elsewhere it is not required.
A form no rule knows is unrecognised, so ``apply`` refuses. Classes that only inherit
or delegate per step hold no form and are never reported.

Split once: each class under ``srt/layers/attention/`` that no rule names and that bakes out_cache_loc
at init, or in the CUDA graph as DeepSeek-V4's in-graph method does (``layout_patterns.baking``): in
DeepSeek-V4's decode form (a port), DeepSeek-V4's rule; otherwise who splits on its path, read off the
harness's runs (``who_splits``). Split once, by a caller or by the per-step code: patched. Never, twice,
or not as upstream splits it: unrecognised. The site is the per-step backend's first statement handing ``out_cache_loc=``
on (in the graph: its first ``translate_loc_from_full_to_swa`` call); a keep on a method of its path or
on that statement (``proof.baking.keeps_path``, or ``--keep`` naming it) keeps it; a keep on a caller
keeps the caller's own layout only.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import re
from typing import Callable, Collection

from ..layout_patterns.ast_walk import methods
from ..layout_patterns.baking import (
    ATTENTION,
    BAKING_STARTS,
    IN_GRAPH as IN_GRAPH_METHOD,
    SWA_TARGET,
    WORKERS,
    baked_at,
    baking_methods,
    keeps_path,
)
from ..layout_patterns.forms import CAPACITY, LAUNCH, OUT_CACHE_LOC, ROWS, STEP_LENGTH, draft_layout_forms
from ..layout_patterns.helper_names import HELPERS, KERNEL
from ..layout_patterns.keep import KEEP_PRAGMA
from . import draft_forward, dsv4_out_cache_loc, kv_indices_capacity_check, kv_indices_step_slice
from .base import Finding, Rule, Source, State
from .draft_backends import DRAFT_BACKENDS, find_row_width
from .dsv4_out_cache_loc import decode_branches
from .kv_indices_eager_width import batch_size_factor
from .kv_indices_graph_width import max_bs_parameter
from .who_splits import CALLER, EAGER, IN_GRAPH, NONE, PER_STEP, class_verdict, split_of

#: the calls that move the steps dimension first in a per-step out_cache_loc split
_MOVES = ("permute", "movedim", "transpose", "swapaxes", "swapdims")
#: a file matters only if it names the steps and one of these
_LAYOUT_TOKENS = ("generate_draft_decode_kv_indices", "max_context_len", ".init_forward_metadata(", *_MOVES)
#: the text every form shows: a row shape ``(self.speculative_num_steps, ...``, a
#: product with ``self.topk`` added to another product (a used length), the steps beside a
#: ``permute``, the kernel, or a helper; a class or method without it is never parsed or walked
_FORM_TEXT = re.compile(
    r"\((?:\s|#[^\n]*)*self\.speculative_num_steps\s*,"
    r"|self\.topk\s*(?:\*\s*[\w.]+\s*)?\+\s*(?:\(|[\w.]+\s*\*)|\+\s*(?:[\w.]+\s*\*\s*)?self\.topk"
    rf"|{KERNEL}|{'|'.join(HELPERS)}"
)
#: a text ``_FORM_TEXT`` finds holds one of these
_FORM_TOKENS = ("self.speculative_num_steps", "self.topk", KERNEL, *HELPERS)
_MOVES_BUT_PERMUTE = ("movedim", "transpose", "swapaxes", "swapdims")
#: a move other than permute chained on a call's result (``x.view(...).movedim(-1, 0)``), as a split writes it
_CHAINED_MOVE = re.compile(rf"\)\s*\.(?:{'|'.join(_MOVES_BUT_PERMUTE)})\(")
#: a move other than permute called on what precedes it: a split when that is a name bound to a view
_MOVE_CALL = re.compile(rf"\.(?:{'|'.join(_MOVES_BUT_PERMUTE)})\(")
_CHECKED_BACKENDS = {backend.cls for backend in DRAFT_BACKENDS if backend.capacity_check}


def names_draft_layout(text: str) -> bool:
    """The cheap text test a file passes before its class blocks are looked at."""
    return "speculative_num_steps" in text and any(token in text for token in _LAYOUT_TOKENS)


def _moves_a_bound_view(text: str) -> bool:
    """A name bound to ``<...>.view(...)`` or ``<...>.reshape(...)`` that a move other than permute is called on
    (``rows.movedim(-1, 0)``). The name is read back from each move (a pattern starting at a name tries every word)."""
    names = {_word_before(text, found.start()) for found in _MOVE_CALL.finditer(text)} - {""}
    return (
        bool(names)
        and re.search(rf"\b(?:{'|'.join(sorted(names))})\s*=\s*[\w.]+\.(?:view|reshape)\(", text) is not None
    )


def _word_before(text: str, end: int) -> str:
    """The run of word characters (``\\w``) that ends at ``end``."""
    start = end
    while start and (text[start - 1].isalnum() or text[start - 1] == "_"):
        start -= 1
    return text[start:end]


def may_hold_draft_layout(text: str) -> bool:
    """The text test a class block or method passes before it is parsed or walked: a form, or
    a split path's end (a multi-step backend calling its per-step backends' ``init_forward_metadata``,
    or a per-step backend handing ``out_cache_loc=`` on at init)."""
    steps = "speculative_num_steps" in text
    caller = steps and ".init_forward_metadata(" in text and ("attn_backends" in text or ".out_cache_loc = " in text)
    per_step = "speculative_step_id" in text and "out_cache_loc=" in text and "def init_forward_metadata" in text
    other_move = any(move in text for move in _MOVES_BUT_PERMUTE)  # before the regular expressions: cheap
    moved = steps and ("permute" in text or other_move and (_CHAINED_MOVE.search(text) or _moves_a_bound_view(text)))
    shown = any(token in text for token in _FORM_TOKENS)  # one of them is in any text _FORM_TEXT finds: cheap
    return bool(moved or caller or per_step or shown and _FORM_TEXT.search(text))


def _row_width(rule: Rule, source: Source) -> Finding:
    """Rows counted by a batch's size or by the method's max_bs / max_num_tokens parameter."""
    return find_row_width(rule, source, lambda *args: batch_size_factor(*args) or max_bs_parameter(*args))


ROW_WIDTH = Rule("row-width", "", "", "kv_indices row width", "PR 27475 (27338, 27460)", _row_width)
STEP_SLICE = kv_indices_step_slice.RULES[0]
CAPACITY_CHECK = kv_indices_capacity_check.RULES[0]
DRAFT_FORWARD = draft_forward.RULES[0]


#: upstream's V2 EAGLE worker under its first name (0.5.3.post2, 0.5.3.post3: its ``draft_forward`` is the
#: draft side that ``EagleDraftWorker.draft_forward``, a rule's site, later holds): a site of the change itself,
#: brought to upstream's form as the rules' classes are, whatever it computes
FIRST_NAMES = {(file, "EAGLEWorkerV2") for file, cls in WORKERS if cls == "EagleDraftWorker"}

#: a guard site's class that no draft path runs (no kernel launch of its own, no multi-step driver)
NO_PATH = "no draft path runs its class on the probes: left as the fork wrote it"


def _with_advice(find: Callable[[Rule, Source], Finding], rule: Rule, source: Source) -> Finding:
    """The template's finding for ``rule``'s class and method; a site to patch says which helper to use. A site
    to patch whose class's draft path already gives upstream's values is left (correct, by hand); one whose
    class no draft path runs is left too: a rewrite there could not be judged. A class the rules read, and
    upstream's classes under a first name (``FIRST_NAMES``), are brought to upstream's form, whatever they
    compute."""
    finding = find(rule, source)
    if finding.state is not State.TO_PATCH:
        return finding
    from . import RULES

    cls = rule.scope.split(".")[0]
    if (rule.file, cls) in FIRST_NAMES or any(r.file == rule.file and cls in r.reads for r in RULES):
        return finding
    verdict = class_verdict(source, cls)
    if verdict is None:
        return dataclasses.replace(finding, state=State.NOT_AFFECTED, detail=NO_PATH, edits=(), imports=())
    if verdict.upstream:
        detail = f"its own layout gives upstream's values on {verdict.judged} probes: left as it is"
        return dataclasses.replace(finding, state=State.BY_HAND, detail=detail, edits=(), imports=())
    if not finding.detail:
        helpers = ", ".join(name for _module, name in finding.imports)
        finding = dataclasses.replace(finding, detail=f"found by structure: use {helpers}")
    return finding


def _templates(cls: ast.ClassDef, forms: Collection[str]) -> list[Rule]:
    templates = []
    if ROWS in forms:
        templates.append(ROW_WIDTH)
    if LAUNCH in forms or STEP_LENGTH in forms:
        templates.append(STEP_SLICE)
    subclasses_checked = any(
        getattr(base, "id", getattr(base, "attr", None)) in _CHECKED_BACKENDS for base in cls.bases
    )
    if CAPACITY in forms or (LAUNCH in forms and subclasses_checked):
        templates.append(CAPACITY_CHECK)
    if OUT_CACHE_LOC in forms:
        templates.append(DRAFT_FORWARD)
    return templates


def _split_once(rule: Rule, source: Source) -> Finding:
    """A per-step backend no rule names that bakes out_cache_loc at init: in DeepSeek-V4's decode form (a port
    of it), DeepSeek-V4's rule (upstream's slice where nobody splits); else who splits on its path
    (``who_splits.split_of``): once (patched) or refused; found at its first statement handing
    ``out_cache_loc=`` on, kept as ``keeps_path`` says."""
    name, start = rule.scope.split(".")
    cls = source.cls(name)
    path = baking_methods(cls, start) if cls is not None else []
    if not path:
        return rule.report(State.ABSENT, detail=f"no per-step path into {rule.scope}")
    line = min(n.lineno for m in path for n in baked_at(m, start))
    if keeps_path(source.lines, path):
        return rule.report(State.KEPT, line, KEEP_PRAGMA)
    if start == "init_forward_metadata" and any(decode_branches(source, name)):
        return _with_advice(dsv4_out_cache_loc._find, rule, source)
    verdict = split_of(source, name, IN_GRAPH if start == IN_GRAPH_METHOD else EAGER)
    if verdict.who in (CALLER, PER_STEP):
        return rule.report(State.PATCHED, line)
    if verdict.who == NONE:
        return rule.report(State.NOT_AFFECTED, line, f"{verdict.why}: nothing to split")
    return rule.report(State.UNRECOGNISED, line, f"the per-step out_cache_loc path: {verdict.why or verdict.who}")


SPLIT_ONCE = Rule("split-once", "", "", "per-step out_cache_loc split once", "PR 26239", _split_once)


def _baking_scopes(relative: str, source: Source, named: Collection[str]) -> list[str]:
    """``Class.init_forward_metadata`` (``Class.init_forward_metadata_in_graph``) of each class under
    srt/layers/attention, no rule naming it, that bakes out_cache_loc at init (in the CUDA graph)
    (``proof.baking.baking_methods``, as the written CPU test finds them)."""
    if not relative.startswith(ATTENTION) or not _may_bake(source.code):
        return []

    return [
        f"{cls.name}.{start}"
        for cls in source.definitions()
        if isinstance(cls, ast.ClassDef) and cls.name not in named and _may_bake(source.text(cls))
        for start in BAKING_STARTS
        if baking_methods(cls, start)
    ]


def _may_bake(text: str) -> bool:
    """The file's text test (``_baking_scopes``) on one class: what it bakes, it names."""
    return "out_cache_loc=" in text or SWA_TARGET in text


def _guard_rule(template: Rule, relative: str, scope: str, **changes: object) -> Rule:
    """``template`` as the structural guard's rule for ``relative``'s ``scope``."""
    return dataclasses.replace(
        template,
        id=f"guard:{template.id.split(':')[0]}:{relative}:{scope}",
        file=relative,
        scope=scope,
        site=f"{template.site} (structural guard)",
        **changes,
    )


def guard_rules(relative: str, source: Source, named: Collection[str]) -> list[Rule]:
    """A rule per draft layout form of each class in the file that no rule names (``named``), and
    one per class no rule names that bakes out_cache_loc at init (its split-once verdict)."""
    rules = [_guard_rule(SPLIT_ONCE, relative, scope) for scope in _baking_scopes(relative, source, named)]
    for cls in source.definitions():
        if not isinstance(cls, ast.ClassDef) or cls.name in named or not may_hold_draft_layout(source.text(cls)):
            continue
        for method in methods(cls):
            if not may_hold_draft_layout(source.text(method)):
                continue
            for template in _templates(cls, draft_layout_forms(method)):
                rules.append(
                    _guard_rule(
                        template,
                        relative,
                        f"{cls.name}.{method.name}",
                        find=functools.partial(_with_advice, template.find),
                    )
                )
    return rules

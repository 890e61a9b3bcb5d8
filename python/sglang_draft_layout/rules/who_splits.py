"""Who splits the per-step out_cache_loc on a DeepSeek-V4-like path, read off the harness's runs of it.

The DeepSeek-V4 rules ask this of the tree as it is (``split_of``) to choose their edit: the multi-step
caller already hands each step its row (CALLER: nothing to add), the per-step code splits it (PER_STEP),
nobody does (NEVER: upstream's slice added), both do (TWICE: a fork that merged upstream), no probe sees a
step bake its write target in the phase (NONE), or the runs show something else (WRONG, ``why`` says
what). ``split_after`` asks it of a rewrite in memory (which of a fork's splits to take out). The written edit is judged again with the whole tree (``judgement``).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, replace
from typing import Optional

from ..harness.invariant import Verdict
from ..harness.judged import verdict_of
from ..harness.tensors import FACADE
from .base import Source

CALLER, PER_STEP, NEVER, TWICE, WRONG = "caller", "per-step backend", "never", "twice", "wrong"
#: no probe saw a step bake its write target in this phase (nothing there to split, or not reached)
NONE = "nothing baked"


@dataclass(frozen=True)
class Split:
    who: str
    why: str = ""
    caller: str = ""  # CALLER, TWICE: the ``Class.method`` handing each step its row (a multi-step backend, a worker)
    line: Optional[int] = None  # where it sets each step's row, else where that method is defined
    file: str = ""  # the caller's file, under the package

    @property
    def at(self) -> str:
        return f"{self.file}:{self.line}"


def _texts(source: Source, code: Optional[str] = None) -> dict[str, str]:
    texts = {relative: other.code for relative, other in source.others.items()}
    texts[source.path] = code if code is not None else source.code
    return texts


#: the phases of a per-step out_cache_loc path: each per-step backend's eager init, and its in-graph method
EAGER, IN_GRAPH = "eager", "in graph"


def class_verdict(source: Source, cls: str) -> Optional[Verdict]:
    """The verdict of the draft path running ``cls`` in the tree as the engine read it (None: no path runs it)."""
    return verdict_of(source.package, FACADE, _texts(source), source.path, cls)


def split_of(source: Source, cls: str, phase: str = EAGER) -> Split:
    """Who splits in ``phase`` of the path running ``cls`` (a per-step backend), in the tree as the engine read it."""
    return _read(source, class_verdict(source, cls), phase)


def split_after(source: Source, code: str, cls: str, phase: str = EAGER) -> Split:
    """The same, with ``code`` in place of ``source``'s file."""
    return _read(source, verdict_of(source.package, FACADE, _texts(source, code), source.path, cls), phase)


def _defining(source: Source, cls: str, name: str) -> tuple[str, Optional[ast.AST]]:
    """(the class of ``source`` defining ``cls.name``, its method) along ``cls``'s bases in the same file, as Python
    looks it up (a mixin's ``init_forward_metadata``); (``cls``, None) where none of them does."""
    todo, seen = [cls], set()
    while todo:
        current = todo.pop(0)
        node = source.cls(current)
        if node is None or current in seen:
            continue
        seen.add(current)
        method = source.method(current, name)
        if method is not None:
            return current, method
        todo += [base.id for base in node.bases if isinstance(base, ast.Name)]
    return cls, None


def _read(source: Source, verdict: Optional[Verdict], phase: str = EAGER) -> Split:
    """Who splits in ``phase``, read off ``verdict`` (the path's, None: no path runs it)."""
    if verdict is None:
        return Split(WRONG, "no draft path runs it")
    mine = [line for line in verdict.problems if f": {phase}: " in line]
    own = [line for line in verdict.own if f": {phase}: " in line]
    handed = {who for p, who in verdict.split if p == phase} - {"either"}
    verdict = replace(verdict, problems=tuple(mine), own=tuple(own), split="/".join(sorted(handed)))
    if verdict.cannot:
        return Split(WRONG, f"it cannot be run on the probes: {verdict.cannot}")
    name = "init_forward_metadata_in_graph" if phase == IN_GRAPH else "init_forward_metadata"
    driver, file = verdict.driven_by or verdict.path, source.path
    if verdict.driven_by is not None and phase == EAGER:  # the worker inits each step with its row
        name, file = "draft_forward", driver.module
    holder = source.others.get(file, source) if file != source.path else source
    owner, method = driver.cls, None
    if not verdict.path.alone or driver is not verdict.path:
        owner, method = _defining(holder, driver.cls, name)
    caller, line = f"{owner}.{name}", None
    if isinstance(method, ast.FunctionDef):  # where it sets each step's row, else its def line
        sets = [a.lineno for a in ast.walk(method) if isinstance(a, ast.Assign)
                and any(isinstance(t, ast.Attribute) and t.attr == "out_cache_loc" for t in a.targets)]  # fmt: skip
        line = min(sets, default=method.lineno)
    if not verdict.problems and phase not in verdict.baked:
        return Split(NONE, f"no probe sees a step bake its out_cache_loc ({phase})")
    if verdict.upstream:
        return Split(CALLER, caller=caller, line=line, file=file) if verdict.split == "caller" else Split(PER_STEP)
    why = verdict.problems[0] if verdict.problems else "no probe reaches where it bakes out_cache_loc"
    if verdict.split == "caller":  # every step handed its row by the caller, and split again
        return Split(TWICE, why, caller=caller, line=line, file=file)
    if verdict.own or not verdict.problems:
        return Split(WRONG, why)
    return Split(NEVER, why)

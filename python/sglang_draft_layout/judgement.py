"""The tree's draft paths run on probes, before the rewrite and after it: what the plan is written or refused by.

``verdicts`` runs every draft path of the modules under the guarded folders (``harness.paths.draft_paths``)
on the tree as it is or with texts in place of some files (the rewritten ones, in memory), and holds each
against upstream's invariant (``harness.invariant.judge``). The engine writes a plan only when every path
of the rewritten tree gives upstream's values (``path_findings``); what the paths gave before is reported.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Collection, Mapping, Optional

from .harness.invariant import Verdict, guarded_modules, inits_steps
from .harness.judged import begin_tree, cancel_begun, judge_tree, line_blocks
from .harness.paths import STEPS, WORKER, DraftPath
from .harness.tensors import FACADE
from .layout_patterns.baking import IN_GRAPH as IN_GRAPH_METHOD
from .layout_patterns.keep import KEEP_PRAGMA, keeps_class
from .rules.base import Finding, Rule, State
from .rules.who_splits import IN_GRAPH as IN_GRAPH_PHASE


def verdicts(package: Optional[Path], texts: Mapping[str, str]) -> dict[DraftPath, Verdict]:
    """Each draft path of the tree's guarded modules (``guarded_modules``; ``texts``, by path under the package,
    stand in for their files) and its verdict."""
    return judge_tree(package, FACADE, texts, guarded_modules(package, texts))


def begin(package: Optional[Path], texts: Mapping[str, str], before: Optional[Mapping] = None) -> None:
    """Begin ``verdicts``' judging (in a child process where it can): the caller goes on. ``before``: the verdicts of
    the tree before its rewrite, whose workers say who likely inits each step (``apart.Judging``'s guess)."""
    workers = {path: verdict for path, verdict in (before or {}).items() if path.kind == WORKER}
    begin_tree(package, FACADE, texts, guarded_modules(package, texts), (inits_steps(workers),) if workers else ())


def classes(path: DraftPath) -> set[str]:
    """The classes whose code the path runs as its own."""
    return {path.cls, *path.per_step}


def describe(verdict: Verdict) -> str:
    """One line: upstream's values, or the first way the path differs (and how many more)."""
    if verdict.cannot:
        return f"cannot be run on the probes: {verdict.cannot}"
    if not verdict.problems:
        return f"upstream's values on {verdict.judged} probes" if verdict.judged else "no draft layout on the probes"
    more = f" (and {len(verdict.problems) - 1} more)" if len(verdict.problems) > 1 else ""
    return f"{verdict.problems[0]}{more}"


PATH_SITE = "draft path, run on the probes"


def _sites(findings: Collection[Finding], states: Collection[State]) -> set[tuple[str, str]]:
    return {(f.rule.file, f.rule.scope.split(".")[0]) for f in findings if f.state in states}


#: the states of a site whose class's paths are judged (not absent, kept, or left to the tree's own layout)
JUDGED_STATES = [s for s in State if s not in (State.ABSENT, State.KEPT, State.NOT_AFFECTED)]


def kept(
    verdicts: Mapping[DraftPath, Verdict], findings: Collection[Finding], whole: Collection[DraftPath] = ()
) -> list[str]:
    """``module:Class`` of each path through a site's class the fork keeps, and of each it keeps ``whole``
    (``kept_whole``): what the written CPU test leaves out."""
    kept_sites = _sites(findings, [State.KEPT])
    return sorted(
        f"{path.module}:{path.cls}"
        for path in verdicts
        if {(path.module, name) for name in classes(path)} & kept_sites or path in whole
    )


def kept_whole(verdicts: Mapping[DraftPath, Verdict], texts: Mapping[str, str]) -> set[DraftPath]:
    """The paths the fork keeps whole: the keep comment on the ``class`` line of the path's class (``keeps_class``)."""
    return {path for path in verdicts if path.module in texts and keeps_class(texts[path.module], path.cls)}


def path_findings(
    after: Mapping[DraftPath, Verdict],
    findings: Collection[Finding],
    rewrites: Mapping[str, tuple[str, str]],
    whole: Collection[DraftPath] = (),
) -> list[Finding]:
    """An unrecognised finding for each draft path that, in the rewritten tree (the tree as it is, where no site is
    left to patch), does not give upstream's values; and for each through a site's class that cannot be run or runs
    none of a rewritten class's code on any probe: unless a site of its classes is kept by the fork or not affected
    (its rows count branches: the tree's own layout) (``rewrites``: each rewritten file's text and the rewrite's,
    for ``on_disk``). A path the fork keeps ``whole`` (``kept_whole``) is a kept finding instead. (A path through
    no site's class that cannot be run is another backend's that the probes cannot build: never refused. A path
    of a file with an unrecognised site is not judged again: the engine rewrites no such file, and that site
    refuses the plan already.)"""
    kept, rewritten = _sites(findings, [State.KEPT]), _sites(findings, [State.TO_PATCH])
    sited, left = _sites(findings, JUDGED_STATES), _sites(findings, [State.NOT_AFFECTED])
    unrecognised = {file for file, _cls in _sites(findings, [State.UNRECOGNISED])}
    when = "after the rewrite" if rewritten else "as the tree is"
    found = []
    for path, verdict in after.items():
        own = {(path.module, name) for name in classes(path)}
        if own & kept or own & left or path.module in unrecognised:
            continue
        unseen = not verdict.judged and not verdict.problems and bool(own & rewritten) and path.kind != STEPS
        unseen = (
            unseen
            or path.kind == STEPS
            and IN_GRAPH_PHASE not in verdict.baked
            and any(
                (f.rule.file, f.rule.scope.split(".")[0]) in own and f.rule.scope.endswith(f".{IN_GRAPH_METHOD}")
                for f in findings
                if f.state is State.TO_PATCH
            )
        )  # a rewritten in-graph method no probe reaches
        if verdict.upstream or not (verdict.problems or own & sited and (verdict.cannot or unseen)):
            continue
        why = describe(verdict) if verdict.cannot or not unseen else "the rewritten code never runs on the probes"
        rule = Rule(f"path:{path.module}:{path.cls}", path.module, f"{path.cls}.<{path.kind}>", PATH_SITE, "", _no_find,
                    counts_as_site=False)  # fmt: skip
        said = f"{when}, {on_disk(why, rewrites)}"
        if path in whole:
            found.append(rule.report(State.KEPT, detail=f"{KEEP_PRAGMA} on its class: {said}"))
        else:
            found.append(rule.report(State.UNRECOGNISED, detail=said))
    return found


#: a line of the package as the harness names it (``srt/layers/attention/flashinfer_backend.py:1561``)
_PLACE = re.compile(r"\b(srt/[\w/]+\.py):(\d+)\b")


def on_disk(why: str, rewrites: Mapping[str, tuple[str, str]]) -> str:
    """``why`` with each line it names in a rewritten file (module -> its text, the rewrite's) numbered as the file
    on disk has it, or said to be a line the rewrite wrote (``judged.line_blocks``: the lines it left as they were)."""
    blocks: dict[str, list] = {}

    def place(match: re.Match) -> str:
        module, line = match.group(1), int(match.group(2))
        if module not in rewrites:
            return match.group(0)
        if module not in blocks:
            blocks[module] = line_blocks(*rewrites[module])
        old = next(
            (i1 + line - j1 for tag, i1, _i2, j1, j2 in blocks[module] if tag == "equal" and j1 < line <= j2), None
        )
        return f"{module}:{old}" if old is not None else f"{module}:{line} (a line the rewrite wrote)"

    return _PLACE.sub(place, why)


def _no_find(rule: Rule, _source: object) -> Finding:
    return rule.report(State.ABSENT)


def with_before(findings: Collection[Finding], before: Mapping[DraftPath, Verdict]) -> list[Finding]:
    """Each finding with what its path gave before the rewrite (``Finding.judged``)."""
    by_class = {(path.module, name): verdict for path, verdict in before.items() for name in classes(path)}
    return [
        (
            replace(f, judged=describe(by_class[key]))
            if (key := (f.rule.file, f.rule.scope.split(".")[0])) in by_class
            else f
        )
        for f in findings
    ]

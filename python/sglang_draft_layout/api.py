"""The Python API: ``check``, ``diff`` and ``apply`` a tree, each returning a :class:`Report`.

The CLI prints these reports; nothing here prints. Every item of a report is one helper
definition, one call site or one test file written into a fork, counted once, and its
state is the word the rules report (``rules.base.State``, ``fork_tests.FileState``), so
the vocabulary grows with them::

    from sglang_draft_layout import api

    report = api.check("path/to/sglang-fork")
    if report.exit_code == 1:
        api.apply("path/to/sglang-fork", tests=False)

Bad input raises :class:`TargetError` (the message names the file, and the site) and
writes nothing.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

from . import __version__, engine, judgement
from .engine import Plan
from .fork_tests import FileState, GeneratedFile
from .rules.base import MODULE_SCOPE, Finding, State
from .stale_keeps import StaleKeep
from .target import Target, TargetError, resolve

__all__ = ["Options", "Item", "WrittenFile", "Report", "check", "diff", "apply", "TargetError", "SCHEMA_VERSION"]

#: the version of ``Report.to_json``'s layout (docs/json.md); raised on any incompatible change
SCHEMA_VERSION = 1

HELPER, CALL_SITE, TEST, TEMP_FILE, KEEP_COMMENT = "helper", "call site", "test", "temp file", "keep comment"
#: a draft path run on the probes that does not give upstream's values, refused or kept (``judgement.path_findings``)
DRAFT_PATH = "draft path"
#: the past form of a state whose work ``apply`` just did; other ``to <verb>`` states get ``<verb>ed now``
_DONE = {"to patch": "patched now", "to write": "written now", "stale": "rewritten now", "to remove": "removed now"}


@dataclass(frozen=True)
class Options:
    """What a run covers besides the sites: one field per CLI flag, passed to the engine
    under the same name (``tests``: the test files written into a fork checkout)."""

    tests: Optional[bool] = None  # None: written with a patch (kept up to date once there); True: always; False: never
    cpu_suite: Optional[str] = None  # the fork's suite for the CPU test (default: from its run_suite.py)
    cuda_suite: Optional[str] = None  # the fork's suite for the GPU test; naming one asks for the test
    gpu_test: bool = False  # also write the GPU test (about 240 s of per-commit GPU CI)
    keep: tuple[str, ...] = ()  # ``FILE:Class.method`` sites kept as the fork wrote them (like KEEP_PRAGMA)

    def engine_kwargs(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def cli_flags(self) -> list[str]:
        """The command-line flags that give these options (those left at their default are left
        out): ``tests=False`` is ``--no-tests``, ``x_y=True`` ``--x-y``, ``x_y="v"`` ``--x-y v``,
        a tuple one flag per value."""
        flags = []
        for option in dataclasses.fields(self):
            value, flag = getattr(self, option.name), "--" + option.name.replace("_", "-")
            if value == option.default:
                continue
            if isinstance(value, bool):
                flags.append(flag if value else flag.replace("--", "--no-", 1))
            else:
                for each in value if isinstance(value, (tuple, list)) else (value,):
                    flags += [flag, str(each)]
        return flags


@dataclass(frozen=True)
class Item:
    """One helper definition, call site or fork test file, as a report lists it."""

    kind: str  # HELPER, CALL_SITE, DRAFT_PATH, TEST, TEMP_FILE or KEEP_COMMENT
    file: str  # relative to the target root, with forward slashes
    line: Optional[int]
    scope: str  # Class.method; a helper's function name; a test file's description
    site: str  # what the site is ("per-step kv_indices slice")
    state: str  # "patched", "to patch", "patched now", "to write", ...
    detail: str  # why, or what the site keeps (may be "")
    upstream: str  # the upstream change it mirrors ("PR 27475"); "" for a test file
    rule: str  # the rule's id; the test file's template for a test
    needs_action: bool  # ``apply`` would change it (after apply: it just did)
    error: bool  # no rule recognises its form: nothing can be written
    #: what the draft path through its class gave before the rewrite, run on the probes ("" where none)
    judged: str = field(default="", compare=False, hash=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "line": self.line,
            "class_method": self.scope,
            "kind": self.kind,
            "site": self.site,
            "state": self.state,
            "detail": self.detail,
            "upstream": self.upstream,
            "rule": self.rule,
            "needs_action": self.needs_action,
            "error": self.error,
            "judged": self.judged,
        }


@dataclass(frozen=True)
class WrittenFile:
    """A file ``apply`` wrote (``diff``: would write); ``new``: it did not exist before."""

    path: str  # relative to the target root
    new: bool


@dataclass(frozen=True)
class Report:
    command: str  # "check", "diff" or "apply"
    target: Target
    options: Options
    items: tuple[Item, ...]
    files: tuple[WrittenFile, ...] = ()  # apply: written; diff: the patch's files; check: ()
    patch: str = ""  # diff: the unified diff (``git apply`` at the target root)
    notes: tuple[str, ...] = ()  # one line for each fork test not written, and why
    plan: Optional[Plan] = field(default=None, repr=False, compare=False)

    @property
    def errors(self) -> list[Item]:
        return [item for item in self.items if item.error]

    @property
    def to_do(self) -> list[Item]:
        """Items ``apply`` would change (after ``apply``: the ones it changed)."""
        return [item for item in self.items if item.needs_action]

    @property
    def exit_code(self) -> int:
        """check: 0 nothing to do, 1 something to do, 2 a site no rule recognises; diff and apply: 0, or 2."""
        if self.errors:
            return 2
        return 1 if self.command == "check" and self.to_do else 0

    def kinds(self) -> dict[str, int]:
        """How many helpers, call sites and tests (in the order first listed)."""
        return dict(Counter(item.kind for item in self.items))

    def states(self) -> dict[str, int]:
        """How many items are in each state (in the order first listed)."""
        return dict(Counter(item.state for item in self.items))

    def counts(self) -> dict[str, dict[str, int]]:
        """How many items of each kind are in each state (kinds and states in the order first
        listed): helpers and call sites counted apart, so each kind's states add up to its count."""
        counts: dict[str, Counter] = {}
        for item in self.items:
            counts.setdefault(item.kind, Counter())[item.state] += 1
        return {kind: dict(states) for kind, states in counts.items()}

    def to_json(self) -> dict[str, Any]:
        """The report as docs/json.md describes it (``schema_version`` SCHEMA_VERSION)."""
        target = self.target
        return {
            "schema_version": SCHEMA_VERSION,
            "tool": {"name": "sglang-draft-layout", "version": __version__},
            "command": self.command,
            "target": {
                "root": str(target.root),
                "package": str(target.package),
                "release": target.version,
                "release_source": target.release_source,
                "release_note": target.version_source,
                "git_describe": target.git_describe,
            },
            "exit_code": self.exit_code,
            "summary": {
                "total": len(self.items),
                "kinds": self.kinds(),
                "states": self.states(),
                "by_kind": self.counts(),
            },
            "sites": [item.to_json() for item in self.items],
            "files": [{"path": f.path, "new": f.new} for f in self.files],
            "notes": list(self.notes),
        }


def done(state: str) -> str:
    """The state an item that needed action is in once ``apply`` wrote it."""
    if state in _DONE:
        return _DONE[state]
    verb = state.removeprefix("to ")
    return f"{verb}{'d' if verb.endswith('e') else 'ed'} now"


def _relative(path: Path, target: Target) -> str:
    return path.relative_to(target.root).as_posix()


def _finding_item(finding: Finding, target: Target, applied: bool) -> Item:
    rule = finding.rule
    error = finding.state is State.UNRECOGNISED
    needs_action = not error and (bool(finding.edits) or finding.state.value.startswith("to "))
    state = done(finding.state.value) if applied and needs_action else finding.state.value
    helper = rule.scope == MODULE_SCOPE
    return Item(
        kind=CALL_SITE if rule.counts_as_site else DRAFT_PATH if rule.site == judgement.PATH_SITE else HELPER,
        file=_relative(target.package / rule.file, target),
        line=finding.line if finding.state is not State.ABSENT else None,
        scope=rule.site.removeprefix("def ") if helper else rule.scope,
        site="helper definition" if helper and rule.site.startswith("def ") else rule.site,
        state=state,
        detail=finding.detail,
        upstream=rule.upstream,
        rule=rule.id,
        needs_action=needs_action,
        error=error,
        judged=finding.judged,
    )


def _test_item(generated: GeneratedFile, target: Target, applied: bool) -> Item:
    needs_action = generated.state is not FileState.PRESENT
    state = done(generated.state.value) if applied and needs_action else generated.state.value
    return Item(
        kind=TEST,
        file=_relative(generated.path, target),
        line=None,
        scope=generated.what,
        site="",
        state=state,
        detail="",
        upstream="",
        rule=generated.path.name,
        needs_action=needs_action,
        error=False,
    )


def _leftover_item(leftover: Path, plan: Plan, applied: bool) -> Item:
    """A temp file an interrupted ``apply`` left (``transaction.TEMP_NAME``): ``apply`` removes it
    when it is a version of the file beside it, and keeps (and names) anything else."""
    kept = applied and leftover not in plan.removed
    state = "kept" if kept else done("to remove") if applied else "to remove"
    detail = "not a version of the file beside it; remove it yourself" if kept else "left by an interrupted apply"
    return Item(
        kind=TEMP_FILE,
        file=_relative(leftover, plan.target),
        line=None,
        scope="leftover temp file",
        site="",
        state=state,
        detail=detail,
        upstream="",
        rule="leftover",
        needs_action=not kept,
        error=False,
    )


#: a keep comment's state while it is on code that follows upstream (``stale_keeps``), and once ``apply`` removed it
STALE, REMOVED = "stale", "removed now"


def _keep_item(keep: StaleKeep, target: Target, applied: bool) -> Item:
    """A keep comment that only patched sites honour: ``apply`` removes it (``StaleKeep.by_hand``: leaves it)."""
    rule = keep.finding.rule
    needs_action = not keep.by_hand
    if needs_action:
        detail = "its site follows upstream: it keeps nothing" + ("" if applied else "; `apply` removes it")
    else:
        detail = f"its site follows upstream: it keeps nothing; {keep.by_hand}"
    return Item(
        kind=KEEP_COMMENT,
        file=_relative(target.package / keep.file, target),
        line=keep.line,
        scope=rule.site.removeprefix("def ") if rule.scope == MODULE_SCOPE else rule.scope,
        site=rule.site,
        state=REMOVED if applied and needs_action else STALE,
        detail=detail,
        upstream=rule.upstream,
        rule=f"keep:{rule.id}",
        needs_action=needs_action,
        error=False,
    )


def report(command: str, plan: Plan, options: Options, applied: bool = False) -> Report:
    """The report of ``plan`` (``applied``: its changes were just written); a stale keep comment follows the
    site it is on."""
    target = plan.target
    items = tuple(
        [
            *(
                item
                for f in plan.findings
                for item in [
                    _finding_item(f, target, applied),
                    *(_keep_item(k, target, applied) for k in plan.stale_keeps if k.finding.rule is f.rule),
                ]
            ),
            *(_test_item(g, target, applied) for g in plan.generated),
            *(_leftover_item(leftover, plan, applied) for leftover in plan.leftovers),
        ]
    )
    files = tuple(WrittenFile(_relative(c.path, target), c.old is None) for c in plan.changes)
    patch = plan.diff() if command == "diff" and not any(i.error for i in items) else ""
    return Report(command, target, options, items, files, patch, plan.notes, plan)


def _options(options: Optional[Options], overrides: dict[str, Any]) -> Options:
    return dataclasses.replace(options or Options(), **overrides)


def _target(path: Union[str, Path, Target, None]) -> Target:
    return path if isinstance(path, Target) else resolve(None if path is None else str(path))


def check(path: Union[str, Path, Target, None] = None, options: Optional[Options] = None, **overrides: Any) -> Report:
    """Every item's state; writes nothing and never loads libcst. ``path``: any folder inside
    the tree (None: the SGLang installed in this Python); ``overrides``: Options fields."""
    chosen = _options(options, overrides)
    plan = engine.plan(_target(path), render_changes=False, **chosen.engine_kwargs())
    return report("check", plan, chosen)


def diff(path: Union[str, Path, Target, None] = None, options: Optional[Options] = None, **overrides: Any) -> Report:
    """The patch (``Report.patch``) and the files it touches; writes nothing."""
    chosen = _options(options, overrides)
    plan = engine.plan(_target(path), **chosen.engine_kwargs())
    return report("diff", plan, chosen)


def apply(path: Union[str, Path, Target, None] = None, options: Optional[Options] = None, **overrides: Any) -> Report:
    """Patch the tree: every file or none; raises TargetError (nothing written) on bad input."""
    chosen = _options(options, overrides)
    plan = engine.apply(_target(path), **chosen.engine_kwargs())
    return report("apply", plan, chosen, applied=True)

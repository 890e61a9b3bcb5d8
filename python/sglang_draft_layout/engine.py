"""Run the rules over a tree: one plan of edits, then all files written or none."""

from __future__ import annotations

import ast
import contextlib
import copy
import difflib
import fcntl
import functools
import gc
import importlib
import os
from collections import Counter, defaultdict
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Collection, Iterator, Optional, Sequence

from . import fork_tests, judgement, stale_keeps, transaction, verdict_cache
from .harness.apart import each_apart
from .harness.invariant import guarded_modules
from .harness.paths import sizes_rows
from .imports import add_imports
from .layout_patterns.ast_walk import parsing_once
from .layout_patterns.keep import KEEP_PRAGMA, has_keep_pragma
from .rules import RULES, helper_definitions
from .rules.base import MODULE_SCOPE, Finding, Rule, Source, State
from .rules.kv_indices_graph_width import one_parameter_frame
from .rules.splice import spliced
from .rules.structural_guard import guard_rules, may_hold_draft_layout, names_draft_layout
from .stored import StoredText, lines
from .target import Target, TargetError
from .transaction import TEMP_NAME, FileWrite, Interrupted  # noqa: F401 (Interrupted: for callers)


class PatchError(TargetError):
    """The tree can't be patched as it is; nothing was written."""


class Refused(PatchError):
    """A site no rule knows: ``plan`` (naming every such site) is not written; the message names the first."""

    def __init__(self, plan: Plan) -> None:
        super().__init__(describe(plan.unrecognised[0], plan.target) + "; nothing written")
        self.plan = plan


def _has_keep_pragma(source: Source, rule: Rule, line: Optional[int]) -> bool:
    """KEEP_PRAGMA on the def line(s) of the rule's method or on the statement the finding names."""
    if KEEP_PRAGMA[2:] not in source.code:  # no comment of it anywhere in the file
        return False
    method = source.method(*rule.scope.split(".")) if rule.scope != MODULE_SCOPE else None
    return has_keep_pragma(source.lines, method, line, source.tree)


def keep_matches(spec: str, rule: Rule) -> bool:
    """``--keep FILE:Class.method`` names this rule's site (FILE: under the package, under the
    fork root, absolute, or the file name alone)."""
    file, _, scope = spec.rpartition(":")
    file = file.replace("\\", "/")
    return (
        scope == rule.scope
        and bool(file)
        and (file == rule.file or file.endswith("/" + rule.file) or f"sglang/{rule.file}".endswith("/" + file))
    )


def _kept(finding: Finding, source: Optional[Source], keep: Collection[str]) -> Finding:
    """A site to patch or unrecognised that the maintainer keeps (pragma or --keep) is kept by the fork."""
    if source is None or finding.state not in (State.TO_PATCH, State.UNRECOGNISED):
        return finding
    if any(keep_matches(spec, finding.rule) for spec in keep):
        how = "--keep"
    elif _has_keep_pragma(source, finding.rule, finding.line):
        how = KEEP_PRAGMA
    else:
        return finding
    return replace(finding, state=State.KEPT, edits=(), imports=(), detail=how)


@dataclass(frozen=True)
class FileChange:
    """One file the plan writes: its text as the rules read and wrote it (``\\n`` line ends), and its bytes."""

    path: Path
    old: Optional[str]  # None: a file the patch creates
    new: str
    before: Optional[bytes] = None  # the file's bytes as read (None: created)
    after: bytes = b""  # the bytes written: ``new`` in the file's encoding, BOM and line ends
    real: Optional[Path] = None  # where the bytes go: ``path`` with its symlinks resolved
    encoding: str = "utf-8"

    @classmethod
    def of(cls, path: Path, stored: Optional[StoredText], new: str) -> "FileChange":
        """The change of ``path`` (read as ``stored``; None: a file the patch creates) to ``new``."""
        if stored is None:
            return cls(path, None, new, None, new.encode("utf-8"), path.parent.resolve() / path.name)
        return cls(path, stored.text, new, stored.raw, stored.encode(new), path.resolve(), stored.encoding)

    def as_write(self) -> FileWrite:
        return FileWrite(self.path, self.real or self.path, self.before, self.after)


@dataclass(frozen=True)
class Plan:
    target: Target
    findings: tuple[Finding, ...]
    changes: tuple[FileChange, ...]
    generated: tuple[fork_tests.GeneratedFile, ...] = ()  # a fork's own test files (fork_tests)
    leftovers: tuple[Path, ...] = ()  # the tool's own temp files found beside the files it reads
    removed: tuple[Path, ...] = ()  # those ``apply`` removed: each a version of the file beside it
    notes: tuple[str, ...] = ()  # one line for each fork test not written, and why
    stale_keeps: tuple[stale_keeps.StaleKeep, ...] = ()  # keep comments only patched sites honour

    def count(self, state: State) -> int:
        return sum(f.state is state for f in self.findings)

    @property
    def unrecognised(self) -> list[Finding]:
        return [f for f in self.findings if f.state is State.UNRECOGNISED]

    def diff(self) -> str:
        """The changes as a git diff, paths relative to the target as named (``git apply`` there)."""
        return "".join(
            _git_diff(change, change.path.relative_to(self.target.root).as_posix()) for change in self.changes
        )


def _git_diff(change: FileChange, path: str) -> str:
    """One file's ``diff --git`` section (the file's own line ends); a file that does not exist yet is created."""
    old = None if change.before is None else change.before.decode(change.encoding)
    new = change.after.decode(change.encoding)
    header = f"diff --git a/{path} b/{path}\n"
    if old is None:
        header += "new file mode 100644\n"
    body = "".join(
        difflib.unified_diff(
            lines(old or ""),
            lines(new),
            "/dev/null" if old is None else f"a/{path}",
            f"b/{path}",
        )
    )
    return header + body


def render(path: Path, source: Source, findings: Sequence[Finding], line_length: int = 88) -> str:
    """The file's new text: every to-patch finding's edits, then its imports.

    The edits are applied with libcst (``rewrite.py``, imported only here: ``check``
    never loads libcst); then the imports are added where isort and black would write
    them (see ``imports.add_imports``).
    """
    import libcst as cst

    from .rewrite import AnchorError, apply_edits

    to_patch = [f for f in findings if f.state is State.TO_PATCH]
    try:
        code = apply_edits(source, [e for f in to_patch for e in f.edits])
    except AnchorError as error:
        raise PatchError(
            f"{path}:{error.node.lineno}: an edit's anchor maps to no libcst node (a rule bug); " "nothing written"
        ) from None
    except cst.ParserSyntaxError as error:
        raise TargetError(
            f"{path}:{error.raw_line}: not valid Python ({error.message.splitlines()[0]}); " "nothing written"
        ) from None
    return add_imports(code, sorted({i for f in to_patch for i in f.imports}), line_length)


#: why a site whose statement shares its line is unrecognised (libcst keeps such a line whole)
SHARED_LINE = (
    "more than one statement on this line (`;` or a one-line block): put each on a line of its own, as black does"
)


def _own_lines(finding: Finding, source: Optional[Source]) -> Finding:
    """A site to patch whose edits touch a statement sharing its line with another statement is
    unrecognised there: the rewrite edits whole statements, and such a line is one to libcst."""
    if source is None or finding.state is not State.TO_PATCH:
        return finding
    touched = [node for edit in finding.edits for node in (edit.node, *edit.absorb) if isinstance(node, ast.stmt)]
    if not touched:
        return finding
    scope = finding.rule.scope
    within = source.method(*scope.split(".")) if scope != MODULE_SCOPE else None
    if within is None or any(not within.lineno <= n.lineno <= within.end_lineno for n in touched):
        within = source.tree  # a statement sharing a line lies in the block holding the site's statements
    starts = Counter(s.lineno for s in ast.walk(within) if isinstance(s, ast.stmt))
    shared = sorted(node.lineno for node in touched if starts[node.lineno] > 1)
    return (
        replace(finding, state=State.UNRECOGNISED, line=shared[0], detail=SHARED_LINE, edits=()) if shared else finding
    )


#: the detail of a site inside code that another site's rewrite takes out
TAKEN_OUT = "taken out with the split it belongs to"


def _taken_out(findings: Sequence[Finding]) -> list[Finding]:
    """A site in code that another site's rewrite takes out (``Edit.absorb``, ``Edit.remove``: a fork's own
    split) has nothing left to patch: one whose edits all lie there, or one without edits at a line of a
    method taken out whole."""
    absorbed: list[tuple[int, str, int, int]] = []  # (id of the finding taking it out, file, first, last)
    removed: list[tuple[int, str, int, int]] = []
    for finding in (f for f in findings if f.state is State.TO_PATCH):
        for edit in finding.edits:
            absorbed += [(id(finding), finding.rule.file, n.lineno, n.end_lineno) for n in edit.absorb]
            if edit.remove:
                removed.append((id(finding), finding.rule.file, edit.node.lineno, edit.node.end_lineno))

    def inside(finding: Finding) -> bool:
        def others(taken: list[tuple[int, str, int, int]]) -> list[tuple[int, int]]:
            return [(a, b) for owner, file, a, b in taken if owner != id(finding) and file == finding.rule.file]

        if finding.edits:
            spans = others(absorbed + removed)
            return bool(spans) and all(
                any(a <= e.node.lineno and e.node.end_lineno <= b for a, b in spans) for e in finding.edits
            )
        return finding.line is not None and any(a <= finding.line <= b for a, b in others(removed))

    return [
        replace(f, state=State.NOT_AFFECTED, detail=TAKEN_OUT, edits=(), imports=()) if inside(f) else f
        for f in findings
    ]


def _parse(path: Path, relative: str, code: str, classes: Optional[Collection[str]] = None) -> Source:
    """The file whole, or (``classes`` given) only its class blocks that name a draft layout or one of ``classes``."""

    def wanted(block: str) -> bool:
        return may_hold_draft_layout(block) or any(f"class {name}" in block for name in classes)

    try:
        return Source(relative, code) if classes is None else Source.class_blocks(relative, code, wanted)
    except SyntaxError as error:
        raise _not_valid_python(path, error) from None


def _not_valid_python(path: object, error: SyntaxError) -> TargetError:
    return TargetError(f"{path}:{error.lineno}: not valid Python ({error.msg}); nothing written")


def _compiles(path: Path, new: str, old: Optional[str] = None) -> None:
    """A text the plan rewrote is valid Python, compiled whole (the harness compiles a function when it runs it):
    where not, the file as it is (``old``) was not (a TargetError naming its line), else the rewrite is a rule bug."""
    try:
        compile(new, str(path), "exec", dont_inherit=True)
    except SyntaxError as error:
        if old is not None:
            try:
                compile(old, str(path), "exec", dont_inherit=True)
            except SyntaxError as own:
                raise _not_valid_python(path, own) from None
        raise _invalid_rewrite(path, error) from None


def _invalid_rewrite(path: object, error: SyntaxError) -> PatchError:
    return PatchError(
        f"{path}:{error.lineno}: rewriting made invalid Python ({error.msg}; a rule bug); nothing written"
    )


def _rules_by_file(rules: Sequence[Rule]) -> dict[str, list[Rule]]:
    grouped: dict[str, list[Rule]] = defaultdict(list)
    for rule in rules:
        grouped[rule.file].append(rule)
    return grouped


def _sources(
    target: Target, rules: Sequence[Rule], gate: transaction.SignalGate
) -> tuple[dict[str, Source], dict[str, StoredText]]:
    """Each file the rules read, and each other file of the structural guard's folders whose
    text names a draft layout, each read and parsed once: whole where a rule judges
    module-level definitions, else by the class blocks that matter (``_parse``); each draft
    CUDA-graph runner too, not parsed (the harness runs it); and each one's bytes
    (``StoredText``). A file that cannot be decoded is a TargetError naming it.
    The tree's draft paths begin to be judged once the files are read (``judgement.begin``)."""
    by_file, stored, runners = _rules_by_file(rules), {}, set()
    for relative in by_file:
        gate.check()
        if (target.package / relative).is_file():
            stored[relative] = StoredText.read(target.package / relative)
    for relative in guarded_modules(target.package):
        gate.check()
        if relative not in by_file:
            text = StoredText.read_naming(target.package / relative, _GUARDED_WORDS)
            if text is None:
                continue
            if names_draft_layout(text.text):
                stored[relative] = text
            elif sizes_rows(text.text):  # a draft CUDA-graph runner: the harness runs it, no rule reads it
                stored[relative] = text
                runners.add(relative)
    judgement.begin(target.package, _texts(stored))
    sources = {
        relative: (
            Source.class_blocks(relative, text.text, lambda _block: False)  # read by the harness, with the others
            if relative in runners
            else _parse(
                target.package / relative,
                relative,
                text.text,
                _parsed_classes(relative, by_file[relative]) if relative in by_file else _read_classes(relative),
            )
        )
        for relative, text in stored.items()
    }
    return sources, stored


#: a guarded module holds one of these where the structural guard (``names_draft_layout``) or the harness
#: (``sizes_rows``) reads it
_GUARDED_WORDS = (b"speculative_num_steps", b"draft_attn_backend")


def _texts(stored: dict[str, StoredText]) -> dict[str, str]:
    """The texts read, by path under the package."""
    return {relative: text.text for relative, text in stored.items()}


def _parsed_classes(relative: str, rules: Sequence[Rule]) -> Optional[set[str]]:
    """The classes of a file parsed (``_parse``): None, the whole file, where a rule judges module-level definitions."""
    return (
        None if any(rule.file == relative and rule.scope == MODULE_SCOPE for rule in rules) else _read_classes(relative)
    )


def _named_classes(relative: str) -> set[str]:
    """The classes of a file that a rule names (the structural guard leaves them to it)."""
    return {rule.scope.split(".")[0] for rule in RULES if rule.file == relative and rule.scope != MODULE_SCOPE}


def _read_classes(relative: str) -> set[str]:
    """The classes of a file the rules read: those they name and the callers they look at."""
    return _named_classes(relative) | {name for rule in RULES if rule.file == relative for name in rule.reads}


def _module_file(module: str) -> Optional[str]:
    """``srt/speculative/spec_utils.py`` for ``sglang.srt.speculative.spec_utils``; None for a third-party module."""
    return module.removeprefix("sglang.").replace(".", "/") + ".py" if module.startswith("sglang.") else None


def _modules_to_create(findings: Sequence[Finding], target: Target) -> set[str]:
    """The helper modules (files relative to the package) that sites to patch import but the tree lacks."""
    needed = {_module_file(module) for f in findings if f.state is State.TO_PATCH for module, _name in f.imports}
    return {
        relative
        for relative in needed
        if relative in helper_definitions.MODULES
        and not (target.package / relative).exists()
        and not (target.package / relative[:-3]).exists()
    }


def _helper_module_missing(finding: Finding, target: Target, created: Collection[str]) -> Finding:
    """A site to patch whose helper's module file is absent (and not created) is unrecognised."""
    for module, _name in finding.imports:
        relative = _module_file(module)
        if (
            finding.state is State.TO_PATCH
            and relative
            and relative not in created
            and not (target.package / relative).is_file()
        ):
            package = target.package / relative[:-3]
            why = (
                f"is the package {package}, which no rule edits"
                if package.is_dir()
                else f"{target.package / relative} is absent and no rule creates it"
            )
            return replace(finding, state=State.UNRECOGNISED, edits=(), detail=f"its helper's module {why}")
    return finding


def plan(
    target: Target,
    rules: Sequence[Rule] = RULES,
    render_changes: bool = True,
    tests: Optional[bool] = None,
    cpu_suite: Optional[str] = None,
    cuda_suite: Optional[str] = None,
    gpu_test: bool = False,
    keep: Collection[str] = (),
) -> Plan:
    """Every rule's finding and (with ``render_changes``) the new text of every file that changes; writes nothing.

    Besides ``rules``, the structural guard's rules for classes no rule names
    (``rules.structural_guard``). ``tests``: a fork checkout's own test files
    (``fork_tests``, registered to the suites ``cpu_suite``/``cuda_suite`` name or the fork's
    run_suite.py offers; the GPU test with ``gpu_test``) are part of the plan: with a site
    left to patch, where already written, or always (True); False: never. ``keep``:
    ``FILE:Class.method`` sites kept as the fork wrote them, like those marked with
    KEEP_PRAGMA (each must name a site). A helper module the tree lacks is created
    (``FileChange.old`` None) when a site to patch imports from it; a tree whose draft
    CUDA-graph rows count branches is not affected (``one_parameter_frame``).
    ``leftovers``: the tool's temp files beside the files read or written. SIGINT, SIGTERM
    and SIGHUP are held, and raise ``Interrupted`` between files (libcst must not be
    stopped halfway).
    """
    with transaction.signal_gate() as gate:
        gate.holding = True  # and on after planning: the command's output is not cut short
        test_options = (
            None if tests is False else fork_tests.TestOptions(cpu_suite, cuda_suite, gpu_test, tests is True)
        )
        with parsing_once(), verdict_cache.in_use(), _without_cyclic_gc():
            try:
                return _plan(target, rules, render_changes, test_options, keep, gate)
            except SyntaxError as error:  # a file of the tree the harness read (``_parse`` reads the rules' files)
                raise _not_valid_python(error.filename, error) from None
            finally:
                judgement.cancel_begun()


@contextlib.contextmanager
def _without_cyclic_gc() -> Iterator[None]:
    """Python's cycle collector off while a plan is made: parsing and the harness's runs make millions of
    objects and few cycles, and the collector's passes over them cost a third of a check and more (a few MB
    of cycles wait for the next collection)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _findings(
    target: Target, by_file: dict[str, list[Rule]], sources: dict[str, Source], keep: Collection[str]
) -> tuple[list[Finding], set[str]]:
    """Every rule's finding in the files read (``sources``), and the helper modules the patch creates."""
    findings = one_parameter_frame(
        [
            (
                rule.find(rule, sources[relative])
                if relative in sources
                else rule.report(State.ABSENT, detail=f"no {relative}")
            )
            for relative, file_rules in by_file.items()
            for rule in file_rules
        ]
    )
    findings = _taken_out(findings)
    created = _modules_to_create(findings, target)
    findings = [
        (
            replace(f, state=State.TO_PATCH, detail=helper_definitions.TO_CREATE.format(file=f.rule.file))
            if f.rule.file in created
            else _kept(
                _own_lines(_helper_module_missing(f, target, created), sources.get(f.rule.file)),
                sources.get(f.rule.file),
                keep,
            )
        )
        for f in findings
    ]
    return findings, created


def _stale_keeps(
    target: Target,
    by_file: dict[str, list[Rule]],
    sources: dict[str, Source],
    findings: Sequence[Finding],
    keep: Collection[str],
) -> list[stale_keeps.StaleKeep]:
    """The keep comments that patched sites alone honour (``stale_keeps.candidates``) and whose removal leaves
    every site's state as it is: the rules run again on the file without it (a rule may read a keep
    comment elsewhere than on its own site: a per-step backend's path, a caller's method)."""
    states = [(f.rule.id, f.state, f.line) for f in findings]
    stale = []
    for candidate in stale_keeps.candidates(findings, sources, target.line_length):
        trial = {relative: copy.copy(source) for relative, source in sources.items()}
        path, relative = target.package / candidate.file, candidate.file
        text = stale_keeps.blanked(sources[relative].lines, candidate)
        trial[relative] = _parse(path, relative, text, _parsed_classes(relative, by_file.get(relative, [])))
        for source in trial.values():
            source.others, source.line_length, source.package = trial, target.line_length, target.package
        if [(f.rule.id, f.state, f.line) for f in _findings(target, by_file, trial, keep)[0]] == states:
            stale.append(candidate)
    return stale


def _without_stale_keeps(
    target: Target,
    changes: list[FileChange],
    stale: Sequence[stale_keeps.StaleKeep],
    stored: dict[str, StoredText],
) -> tuple[list[FileChange], list[stale_keeps.StaleKeep]]:
    """``changes`` with the stale keep comments ``apply`` removes taken out (a file changed for them alone
    added), and the stale keeps as they then are: one in lines a rewrite changed is left to the next run."""
    by_path = {change.path: change for change in changes}
    for relative in dict.fromkeys(keep.file for keep in stale if not keep.by_hand):
        path, keeps = target.package / relative, [k for k in stale if k.file == relative and not k.by_hand]
        change = by_path.get(path)
        new = stale_keeps.removed(stored[relative].text, keeps, target.line_length, change.new if change else None)
        if new is None:
            why = "in lines the patch rewrites: run `apply` again"
            stale = [stale_keeps.by_hand(k, why) if k in keeps else k for k in stale]
            continue
        _compiles(path, new)
        by_path[path] = FileChange.of(path, stored[relative], new)
    return list(by_path.values()), list(stale)


def _plan(
    target: Target,
    rules: Sequence[Rule],
    render_changes: bool,
    test_options: Optional[fork_tests.TestOptions],
    keep: Collection[str],
    gate: transaction.SignalGate,
) -> Plan:
    changes: list[FileChange] = []
    sources, stored = _sources(target, rules, gate)
    for source in sources.values():
        source.others = sources  # the callers a rule looks at (``Rule.reads``)
        source.line_length = target.line_length
        source.package = target.package
    guarded = [
        rule for relative, source in sources.items() for rule in guard_rules(relative, source, _named_classes(relative))
    ]
    by_file = _rules_by_file([*rules, *guarded])
    if render_changes and _lacks_a_helper(sources):  # it will render: libcst imported once, before two processes fork
        importlib.import_module(f"{__package__}.rewrite")
    findings, created = _findings(target, by_file, sources, keep)
    texts = _texts(stored)
    before = judgement.verdicts(target.package, texts)
    findings = judgement.with_before(findings, before)
    to_render: list[tuple[Path, str, Optional[StoredText], list[Finding], list[Rule], Callable[[], str]]] = []
    for relative, file_rules in by_file.items():
        gate.check()
        path = target.package / relative
        file_findings = [f for f in findings if f.rule.file == relative]
        if (
            not render_changes
            or any(f.state is State.UNRECOGNISED for f in file_findings)
            or not any(f.state is State.TO_PATCH for f in file_findings)
        ):
            continue
        new = (
            functools.partial(helper_definitions.new_module, relative, target.line_length)
            if relative in created
            else functools.partial(render, path, sources[relative], file_findings, target.line_length)
        )
        to_render.append((path, relative, stored.get(relative), file_findings, file_rules, new))  # created: none
    # each file rendered by one of two processes where they may (libcst's rendering is most of an apply's time)
    news = each_apart([new for *_file, new in to_render])
    rendered = [_rendered(*file, new) for (*file, _make), new in zip(to_render, news)]
    changes = [FileChange.of(path, text, new) for path, _relative, text, _rules, new in rendered]
    unsafe: list[Exception] = []  # what checking the rendered files raised (a rule bug), raised where not refused

    def check_rendered() -> None:
        try:
            _check_rendered(target, rendered, sources, keep)
        except Exception as error:  # as if checked after the verdicts: a refused plan is not checked
            unsafe.append(error)

    after, rewritten = _judged_after(
        target, findings, sources, texts, changes, created, render_changes, before, meanwhile=check_rendered
    )
    judged = after if after is not None else before
    whole = judgement.kept_whole(judged, texts)
    kept = judgement.kept(judged, findings, whole)
    rewritten_files = {relative: (texts[relative], new) for relative, new in rewritten.items() if relative in texts}
    paths = judgement.path_findings(judged, findings, rewritten_files, whole)
    refused = [f for f in paths if f.state is State.UNRECOGNISED]
    stale = _stale_keeps(target, by_file, sources, findings, keep)
    if unsafe and isinstance(unsafe[0], TargetError) and not isinstance(unsafe[0], PatchError):
        raise unsafe[0]  # a file of the tree's that is not valid Python (``_compiles``), refused or not
    if refused:  # a refused tree is not written: what its rules find in it after rendering is moot
        changes = []
    else:
        if unsafe:
            raise unsafe[0]
        if render_changes:
            changes, stale = _without_stale_keeps(target, changes, stale, stored)
    findings += paths
    unknown = [spec for spec in keep if not any(keep_matches(spec, f.rule) for f in findings)]
    if unknown:
        raise TargetError(
            f"--keep {unknown[0]}: no site of {target.package} is FILE:Class.method "
            "(check lists each site's file and Class.method)"
        )
    up_to_date = not any(f.state in (State.TO_PATCH, State.UNRECOGNISED) for f in findings)
    generated, notes = fork_tests.generated_files(target, test_options, up_to_date, kept) if test_options else ([], [])
    if render_changes:
        changes += [_generated_change(g) for g in generated if g.state is not fork_tests.FileState.PRESENT]
        notes += [  # who splits changes: said in one line
            f"{f.rule.file}:{f.line}: {f.detail}"
            for f in findings
            if f.state is State.TO_PATCH and f.proven_by_split_once
        ]
        _refuse_links_out_of_tree(target, changes)
    folders = [text.path.resolve().parent for text in stored.values()] + [g.path.parent for g in generated]
    return Plan(
        target,
        tuple(findings),
        tuple(changes),
        tuple(generated),
        tuple(transaction.leftovers(folders)),
        notes=tuple(notes),
        stale_keeps=tuple(stale),
    )


def _lacks_a_helper(sources: dict[str, Source]) -> bool:
    """Whether a helper module of the tree lacks one of upstream's helpers (``helper_definitions.MODULES``)."""
    return any(
        relative not in sources or any(sources[relative].function(helper.__name__) is None for helper in helpers)
        for relative, (helpers, _why) in helper_definitions.MODULES.items()
    )


def _judged_after(
    target: Target,
    findings: Sequence[Finding],
    sources: dict[str, Source],
    texts: dict[str, str],
    changes: Sequence[FileChange],
    created: Collection[str],
    rendered: bool,
    before: dict,
    meanwhile: Callable[[], None],
) -> tuple[Optional[dict], dict[str, str]]:
    """The verdicts of the rewritten tree's draft paths (None: nothing to rewrite), judged once: on the text to
    be written where it was rendered (``apply``, ``diff``), else on the edits spliced in as text (``check``); and
    the texts judged in place of files (by path under the package). ``meanwhile`` is called once the judging has
    begun (while a child judges, where two processes may); ``before``: the tree's verdicts before the rewrite."""
    to_patch = [f for f in findings if f.state is State.TO_PATCH]
    if not to_patch:
        meanwhile()
        return None, {}
    if rendered:
        new = {change.path.relative_to(target.package).as_posix(): change.new for change in changes}
    else:
        new = {
            relative: (
                helper_definitions.new_module(relative, target.line_length)
                if relative in created
                else _as_a_program(sources[relative], [f for f in to_patch if f.rule.file == relative])
            )
            for relative in {f.rule.file for f in to_patch}
        }
    after = {**texts, **new}
    try:
        judgement.begin(target.package, after, before)
        meanwhile()
        return judgement.verdicts(target.package, after), new
    except SyntaxError as error:  # in a text the harness read in place of its file: the rewrite's, not the tree's
        if error.filename in {str(target.package / relative) for relative in new}:
            raise _invalid_rewrite(error.filename, error) from None
        raise


def _as_a_program(source: Source, findings: Sequence[Finding]) -> str:
    """The file with the findings' edits spliced in and their imports bound at its end: the same program as
    the rendered file, for ``check`` to run without libcst (``render`` writes the imports where isort would)."""
    imports = sorted({i for f in findings for i in f.imports})
    lines = [f"from {module} import {name}\n" if name else f"import {module}\n" for module, name in imports]
    return spliced(source, [e for f in findings for e in f.edits]).rstrip("\n") + "\n" + "".join(lines)


def _rendered(
    path: Path,
    relative: str,
    stored: Optional[StoredText],
    findings: Sequence[Finding],
    file_rules: Sequence[Rule],
    new: str,
) -> tuple[Path, str, Optional[StoredText], list[Rule], str]:
    """One file rendered: (path, relative, its text as read, the rules to find their sites in upstream's form in
    ``new``, ``new``)."""
    # correct by hand, or taken out: not rewritten
    left = {f.rule.id for f in findings if f.state is State.BY_HAND or f.detail == TAKEN_OUT}
    return path, relative, stored, [r for r in file_rules if r.id not in left], new


def _generated_change(generated: fork_tests.GeneratedFile) -> FileChange:
    """A fork test file written whole, in the form of the file it replaces if there is one."""
    return FileChange.of(generated.path, generated.stored, generated.text)


def _refuse_links_out_of_tree(target: Target, changes: Sequence[FileChange]) -> None:
    """A file reached through a symlink is written where the link leads, which must lie in the
    tree and be no other file of the plan."""
    trees = {target.root.resolve(), target.package.resolve()}
    seen: dict[Path, Path] = {}
    for change in changes:
        real = change.real or change.path
        if not any(real.is_relative_to(tree) for tree in trees):
            raise PatchError(f"{change.path}: a symlink to {real}, outside the tree {target.root}; nothing written")
        if real in seen:
            raise PatchError(f"{change.path}: the same file as {seen[real]} (a symlink); nothing written")
        seen[real] = change.path


def _check_rendered(
    target: Target,
    rendered: Sequence[tuple[Path, str, Optional[StoredText], Sequence[Rule], str]],
    sources: dict[str, Source],
    keep: Collection[str] = (),
) -> None:
    """Every rewritten text compiles and every rule now finds its site in upstream's form, each file read
    beside the others as rewritten (a rule may look at the tree's other files)."""
    new_sources = {}
    for path, relative, stored, rules, new in rendered:
        _compiles(path, new, stored.text if stored is not None else None)
        new_sources[relative] = _parse(path, relative, new, _parsed_classes(relative, rules))
    others = {**sources, **new_sources}
    for path, relative, _stored, rules, _new in rendered:
        source = new_sources[relative]
        source.others, source.package, source.line_length = others, target.package, target.line_length
        for rule in rules:
            finding = _kept(rule.find(rule, source), source, keep)
            if finding.state not in (State.PATCHED, State.ABSENT, State.BY_CALLER, State.BY_HAND, State.KEPT):
                raise PatchError(
                    f"{path}: {rule.scope}: {rule.site} is {finding.state.value} after rewriting (a rule bug); "
                    "nothing written"
                )


def describe(finding: Finding, target: Target) -> str:
    """``file:line: Class.method: site: detail``; an unrecognised site also says how to keep it."""
    rule = finding.rule
    where = f"{target.package / rule.file}" + (f":{finding.line}" if finding.line else "")
    text = f"{where}: {rule.scope}: {rule.site}: {finding.detail or finding.state.value}"
    if finding.state is State.UNRECOGNISED:
        keeps = [f"{rule.file}:{rule.scope}"] if rule.scope != MODULE_SCOPE else []
        text += "; " + (PATH_HINT if rule.site == judgement.PATH_SITE else refusal_hint(keeps))
    return text


#: what to do about a draft path that gives other values than upstream's (``judgement.path_findings``)
PATH_HINT = (
    "make it give upstream's values (docs/sites.md) or keep the fork's code "
    f"(`{KEEP_PRAGMA}` at the end of its class's `class` line or alone on the line before it)"
)


def refusal_hint(keeps: Sequence[str], lines: str = "that line") -> str:
    """What to do about a site no rule knows: keep the fork's code (the comment on ``lines``, or
    ``--keep`` each FILE:Class.method of ``keeps``) or rewrite it; a helper (no ``keeps``): rewrite it."""
    rewrite = "rewrite it to a form docs/sites.md lists"
    if not keeps:
        return rewrite
    flags = ", ".join(f"`--keep {keep}`" for keep in keeps)
    return f"keep the fork's code (`{KEEP_PRAGMA}` at the end of {lines} or alone on the line before it, or {flags}) or {rewrite}"


@contextlib.contextmanager
def tree_lock(target: Target) -> Iterator[None]:
    """Serialise applies to one tree across processes: a lock on the package folder itself (no lock file left
    anywhere; a read-only tree can be locked too)."""
    folder = os.open(target.package, os.O_RDONLY)
    try:
        fcntl.flock(folder, fcntl.LOCK_EX)
        yield
    finally:
        os.close(folder)  # the lock goes with it


def write(changes: Sequence[FileChange]) -> None:
    """Write every change or none (``transaction.write``: SIGINT, SIGTERM and SIGHUP are held and
    the tree restored on any of them or on any error; ``Interrupted`` says what the tree holds)."""
    transaction.write([change.as_write() for change in changes])


def _is_a_version(leftover: Path, plan_: Plan) -> bool:
    """The leftover's bytes are a version of the file beside it: its current bytes, the plan's
    old or new bytes of it, or its old bytes of a run that patched it since (the patch of the
    leftover is the file now), or the start of one of these (a temp file's write cut short)."""
    beside = leftover.with_name(TEMP_NAME.match(leftover.name).group("name"))
    try:
        data = leftover.read_bytes()
    except OSError:
        return False
    versions = [
        version
        for change in plan_.changes
        if (change.real or change.path) == beside.resolve()
        for version in (change.before, change.after)
        if version is not None
    ]
    try:
        current: Optional[bytes] = beside.read_bytes()
    except OSError:
        current = None
    if any(version.startswith(data) for version in [*versions, *([current] if current is not None else [])]):
        return True
    return current is not None and _patched_bytes(plan_.target, beside, data) == current


def _patched_bytes(target: Target, path: Path, data: bytes) -> Optional[bytes]:
    """The bytes ``apply`` would write for ``path`` if it held ``data`` (None: no change, or no rule reads it)."""
    real_package = target.package.resolve()
    if not path.resolve().is_relative_to(real_package):
        return None
    relative = path.resolve().relative_to(real_package).as_posix()
    try:
        stored = StoredText.decode(path, data)
        whole = any(rule.scope == MODULE_SCOPE for rule in RULES if rule.file == relative)
        source = _parse(path, relative, stored.text, None if whole else _read_classes(relative))
        source.line_length = target.line_length
        file_rules = [rule for rule in RULES if rule.file == relative]
        file_rules += guard_rules(relative, source, _named_classes(relative))
        findings = [_own_lines(rule.find(rule, source), source) for rule in file_rules]
        if any(f.state is State.UNRECOGNISED for f in findings) or not any(f.state is State.TO_PATCH for f in findings):
            return None
        rendered = [
            _rendered(path, relative, stored, findings, file_rules, render(path, source, findings, target.line_length))
        ]
        _check_rendered(target, rendered, {})
        return FileChange.of(path, stored, rendered[0][4]).after
    except (TargetError, SyntaxError):  # SyntaxError: the harness's, reading ``data`` (a write cut short, say)
        return None


def _remove_leftovers(plan_: Plan) -> Plan:
    """The plan with the leftovers removed that are versions of the file beside them (``_is_a_version``)."""
    removed = []
    for leftover in plan_.leftovers:
        if _is_a_version(leftover, plan_):
            try:
                leftover.unlink()
            except FileNotFoundError:
                continue
            except OSError as error:
                raise TargetError(f"{leftover}: removing: {error.strerror or error}; nothing written") from None
            removed.append(leftover)
    return replace(plan_, removed=tuple(removed))


def apply(
    target: Target,
    tests: Optional[bool] = None,
    cpu_suite: Optional[str] = None,
    cuda_suite: Optional[str] = None,
    gpu_test: bool = False,
    keep: Collection[str] = (),
) -> Plan:
    """Patch the tree: plan, refuse on anything unrecognised, remove the tool's own leftovers,
    write all files or none (``tests``: with a fork checkout's own test files; ``keep``: sites
    kept as the fork wrote them; the rest as ``plan`` takes them). SIGINT, SIGTERM
    and SIGHUP raise ``Interrupted``: held, and acted on between files (``plan``, ``write``)."""
    with transaction.signal_gate() as gate:
        gate.holding = False  # waiting for another apply's lock: a signal ends the wait at once
        with tree_lock(target):
            gate.holding = True
            result = plan(target, tests=tests, cpu_suite=cpu_suite, cuda_suite=cuda_suite, gpu_test=gpu_test, keep=keep)
            if result.unrecognised:
                raise Refused(result)
            result = _remove_leftovers(result)
            gate.check()
            write(result.changes)
    return result

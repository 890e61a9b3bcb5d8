"""Run the rules over a tree: one plan of edits, then all files written or none."""

from __future__ import annotations

import contextlib
import difflib
import fcntl
import hashlib
import os
import stat
import tempfile
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Collection, Iterator, Optional, Sequence

from . import fork_tests
from .imports import add_imports
from .layout_patterns import KEEP_PRAGMA, has_keep_pragma
from .rules import RULES
from .rules.base import MODULE_SCOPE, Finding, Rule, Source, State
from .rules.structural_guard import GUARDED_FOLDERS, guard_rules, may_hold_draft_layout, names_draft_layout
from .target import Target, TargetError


class PatchError(TargetError):
    """The tree can't be patched as it is; nothing was written."""


def _has_keep_pragma(source: Source, rule: Rule, line: Optional[int]) -> bool:
    """KEEP_PRAGMA on the def line(s) of the rule's method or on the statement the finding names."""
    method = source.method(*rule.scope.split(".")) if rule.scope != MODULE_SCOPE else None
    return has_keep_pragma(source.lines, method, line, source.tree)


def keep_matches(spec: str, rule: Rule) -> bool:
    """``--keep FILE:Class.method`` names this rule's site (FILE: under the package, under the
    fork root, absolute, or the file name alone)."""
    file, _, scope = spec.rpartition(":")
    file = file.replace("\\", "/")
    return scope == rule.scope and bool(file) and (
        file == rule.file or file.endswith("/" + rule.file) or f"sglang/{rule.file}".endswith("/" + file))


def _kept(finding: Finding, source: Source, keep: Collection[str]) -> Finding:
    """A site to patch or unrecognised that the maintainer keeps (pragma or --keep) is kept by the fork."""
    if finding.state not in (State.TO_PATCH, State.UNRECOGNISED):
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
    path: Path
    old: Optional[str]  # None: a file the patch creates
    new: str


@dataclass(frozen=True)
class Plan:
    target: Target
    findings: tuple[Finding, ...]
    changes: tuple[FileChange, ...]
    generated: tuple[fork_tests.GeneratedFile, ...] = ()  # a fork's own test files (fork_tests)

    def count(self, state: State) -> int:
        return sum(f.state is state for f in self.findings)

    @property
    def unrecognised(self) -> list[Finding]:
        return [f for f in self.findings if f.state is State.UNRECOGNISED]

    def diff(self) -> str:
        """The changes as a git diff, paths relative to the target as named (``git apply`` there)."""
        return "".join(_git_diff(change, change.path.relative_to(self.target.root).as_posix())
                       for change in self.changes)


def _git_diff(change: FileChange, path: str) -> str:
    """One file's ``diff --git`` section; a file that does not exist yet (``old`` None) is created."""
    old = change.old
    header = f"diff --git a/{path} b/{path}\n"
    if old is None:
        header += "new file mode 100644\n"
    body = "".join(difflib.unified_diff(
        (old or "").splitlines(keepends=True), change.new.splitlines(keepends=True),
        "/dev/null" if old is None else f"a/{path}", f"b/{path}",
    ))
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
        raise PatchError(f"{path}:{error.node.lineno}: an edit's anchor maps to no libcst node (a rule bug); "
                         "nothing written") from None
    except cst.ParserSyntaxError as error:
        raise TargetError(f"{path}:{error.raw_line}: not valid Python ({error.message.splitlines()[0]}); "
                          "nothing written") from None
    return add_imports(code, sorted({i for f in to_patch for i in f.imports}), line_length)


def _parse(path: Path, relative: str, code: str, classes: Optional[Collection[str]] = None) -> Source:
    """The file whole, or (``classes`` given) only its class blocks that name a draft layout or one of ``classes``."""
    def wanted(block: str) -> bool:
        return may_hold_draft_layout(block) or any(f"class {name}" in block for name in classes)

    try:
        return Source(relative, code) if classes is None else Source.class_blocks(relative, code, wanted)
    except SyntaxError as error:
        raise TargetError(f"{path}:{error.lineno}: not valid Python ({error.msg}); nothing written") from None


def _rules_by_file(rules: Sequence[Rule]) -> dict[str, list[Rule]]:
    grouped: dict[str, list[Rule]] = defaultdict(list)
    for rule in rules:
        grouped[rule.file].append(rule)
    return grouped


def _sources(target: Target, rules: Sequence[Rule]) -> dict[str, Source]:
    """Each file the rules read, and each other file of the structural guard's folders whose
    text names a draft layout, each read and parsed once: whole where a rule judges
    module-level definitions, else by the class blocks that matter (``_parse``)."""
    sources = {}
    for relative, file_rules in _rules_by_file(rules).items():
        path = target.package / relative
        if path.is_file():
            whole = any(rule.scope == MODULE_SCOPE for rule in file_rules)
            sources[relative] = _parse(path, relative, path.read_text(encoding="utf-8"),
                                       None if whole else _read_classes(relative))
    for folder in GUARDED_FOLDERS:
        for path in sorted((target.package / folder).rglob("*.py")):
            relative = path.relative_to(target.package).as_posix()
            if relative not in sources:
                code = path.read_text(encoding="utf-8")
                if names_draft_layout(code):
                    sources[relative] = _parse(path, relative, code, _read_classes(relative))
    return sources


def _named_classes(relative: str) -> set[str]:
    """The classes of a file that a rule names (the structural guard leaves them to it)."""
    return {rule.scope.split(".")[0] for rule in RULES if rule.file == relative and rule.scope != MODULE_SCOPE}


def _read_classes(relative: str) -> set[str]:
    """The classes of a file the rules read: those they name and the callers they look at."""
    return _named_classes(relative) | {name for rule in RULES if rule.file == relative for name in rule.reads}


def _helper_module_missing(finding: Finding, target: Target) -> Finding:
    """A site to patch whose helper's module file is absent (code older than these rules) is unrecognised."""
    for module, _name in finding.imports:
        relative = module.removeprefix("sglang.").replace(".", "/") + ".py"
        first_party = module.startswith("sglang.")
        if finding.state is State.TO_PATCH and first_party and not (target.package / relative).is_file():
            return replace(finding, state=State.UNRECOGNISED, edits=(),
                           detail=f"its helper's module {target.package / relative} is absent (code older than these rules)")
    return finding


def plan(target: Target, rules: Sequence[Rule] = RULES, render_changes: bool = True, tests: bool = True,
         keep: Collection[str] = ()) -> Plan:
    """Every rule's finding and (with ``render_changes``) the new text of every file that changes; writes nothing.

    Besides ``rules``, the structural guard's rules for classes no rule names
    (``rules.structural_guard``). ``tests``: a fork checkout's own test files
    (``fork_tests``) are part of the plan. ``keep``: ``FILE:Class.method`` sites kept as
    the fork wrote them, like those marked with KEEP_PRAGMA (each must name a site).
    """
    findings: list[Finding] = []
    changes: list[FileChange] = []
    sources = _sources(target, rules)
    guarded = [rule for relative, source in sources.items()
               for rule in guard_rules(relative, source, _named_classes(relative))]
    for relative, file_rules in _rules_by_file([*rules, *guarded]).items():
        path = target.package / relative
        if relative not in sources:
            findings += [rule.report(State.ABSENT, detail=f"no {relative}") for rule in file_rules]
            continue
        source = sources[relative]
        source.others = sources
        old = source.code
        file_findings = [_kept(_helper_module_missing(rule.find(rule, source), target), source, keep)
                         for rule in file_rules]
        findings += file_findings
        if render_changes and any(f.state is State.TO_PATCH for f in file_findings) and not any(
            f.state is State.UNRECOGNISED for f in file_findings
        ):
            _parse(path, relative, old)  # a file written must be valid Python as a whole, not only its classes
            new = render(path, source, file_findings, target.line_length)
            _check_rendered(path, relative, new, file_rules, keep, sources)
            changes.append(FileChange(path, old, new))
    unknown = [spec for spec in keep if not any(keep_matches(spec, f.rule) for f in findings)]
    if unknown:
        raise TargetError(f"--keep {unknown[0]}: no site of {target.package} is FILE:Class.method "
                          "(check lists each site's file and Class.method)")
    generated = tuple(fork_tests.generated_files(target)) if tests else ()
    if render_changes:
        changes += [FileChange(g.path, g.old, g.text) for g in generated if g.state is not fork_tests.FileState.PRESENT]
    return Plan(target, tuple(findings), tuple(changes), generated)


def _check_rendered(path: Path, relative: str, new: str, rules: Sequence[Rule], keep: Collection[str] = (),
                    others: Optional[dict[str, Source]] = None) -> None:
    """The rewritten text compiles and every rule now finds its site in upstream's form."""
    try:
        compile(new, str(path), "exec")
    except SyntaxError as error:
        raise PatchError(f"{path}:{error.lineno}: rewriting made invalid Python ({error.msg}; a rule bug); "
                         "nothing written") from None
    source = _parse(path, relative, new)
    source.others = others or {}
    for rule in rules:
        finding = _kept(rule.find(rule, source), source, keep)
        if finding.state not in (State.PATCHED, State.ABSENT, State.BY_CALLER, State.KEPT):
            raise PatchError(f"{path}: {rule.scope}: {rule.site} is {finding.state.value} after rewriting (a rule bug); nothing written")


def describe(finding: Finding, target: Target) -> str:
    """``file:line: Class.method: site: detail``; an unrecognised site also says how to keep it."""
    rule = finding.rule
    where = f"{target.package / rule.file}" + (f":{finding.line}" if finding.line else "")
    text = f"{where}: {rule.scope}: {rule.site}: {finding.detail or finding.state.value}"
    if finding.state is State.UNRECOGNISED and rule.scope != MODULE_SCOPE:
        text += f" (to keep the fork's code there: `{KEEP_PRAGMA}` on that line or --keep {rule.file}:{rule.scope})"
    return text


@contextlib.contextmanager
def tree_lock(target: Target) -> Iterator[None]:
    """Serialise applies to one tree across processes (a lock file outside the tree)."""
    key = hashlib.sha256(str(target.package.resolve()).encode()).hexdigest()[:16]
    with open(Path(tempfile.gettempdir()) / f"sglang-draft-layout-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _writable(path: Path) -> bool:
    mode = path.stat().st_mode
    return bool(mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)) and os.access(path, os.W_OK) \
        and os.access(path.parent, os.W_OK)


def _replace(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temp file and rename, keeping its mode."""
    mode = stat.S_IMODE(path.stat().st_mode)
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temp, mode)
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise


def _existing_ancestor(path: Path) -> Path:
    while not path.exists():
        path = path.parent
    return path


def _create(path: Path, text: str, created_dirs: list[Path]) -> None:
    """Write the new file ``path`` (mode 0666 less the umask), making its missing folders."""
    missing = [folder for folder in reversed(path.parents) if not folder.exists()]
    for folder in missing:
        folder.mkdir()
        created_dirs.append(folder)
    umask = os.umask(0)
    os.umask(umask)
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    os.chmod(temp, 0o666 & ~umask)
    Path(temp).write_text(text, encoding="utf-8")
    os.replace(temp, path)


def write(changes: Sequence[FileChange]) -> None:
    """Write every change or none: on any failure the files already written are restored
    (files and folders created are removed)."""
    for change in changes:
        if change.old is None:
            if change.path.exists():
                raise PatchError(f"{change.path}: changed while planning; nothing written")
            if not os.access(_existing_ancestor(change.path.parent), os.W_OK):
                raise PatchError(f"{change.path}: read-only folder; nothing written")
            continue
        if not _writable(change.path):
            raise PatchError(f"{change.path}: read-only; nothing written")
        if change.path.read_text(encoding="utf-8") != change.old:
            raise PatchError(f"{change.path}: changed while planning; nothing written")
    written: list[FileChange] = []
    created_dirs: list[Path] = []
    try:
        for change in changes:
            if change.old is None:
                _create(change.path, change.new, created_dirs)
            else:
                _replace(change.path, change.new)
            written.append(change)
        for change in written:
            compile(change.path.read_text(encoding="utf-8"), str(change.path), "exec")
    except BaseException:
        for change in reversed(written):
            if change.old is None:
                change.path.unlink()
            else:
                _replace(change.path, change.old)
        for folder in reversed(created_dirs):
            folder.rmdir()
        raise


def apply(target: Target, tests: bool = True, keep: Collection[str] = ()) -> Plan:
    """Patch the tree: plan, refuse on anything unrecognised, write all files or none
    (``tests``: with a fork checkout's own test files; ``keep``: sites kept as the fork wrote them)."""
    with tree_lock(target):
        result = plan(target, tests=tests, keep=keep)
        if result.unrecognised:
            raise PatchError(describe(result.unrecognised[0], target) + "; nothing written")
        write(result.changes)
    return result

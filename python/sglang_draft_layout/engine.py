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
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional, Sequence

import libcst as cst
import libcst.matchers as m
from libcst.helpers import get_full_name_for_node
from libcst.metadata import MetadataWrapper

from .rules import RULES
from .rules.base import Edit, Finding, Rule, Source, State
from .target import Target, TargetError


class PatchError(TargetError):
    """The tree can't be patched as it is; nothing was written."""


@dataclass(frozen=True)
class FileChange:
    path: Path
    old: str
    new: str


@dataclass(frozen=True)
class Plan:
    target: Target
    findings: tuple[Finding, ...]
    changes: tuple[FileChange, ...]

    def count(self, state: State) -> int:
        return sum(f.state is state for f in self.findings)

    @property
    def unrecognised(self) -> list[Finding]:
        return [f for f in self.findings if f.state is State.UNRECOGNISED]

    def diff(self) -> str:
        root = self.target.package.parent
        return "".join(
            "".join(difflib.unified_diff(
                change.old.splitlines(keepends=True), change.new.splitlines(keepends=True),
                f"a/{change.path.relative_to(root)}", f"b/{change.path.relative_to(root)}",
            ))
            for change in self.changes
        )


class _ApplyEdits(cst.CSTTransformer):
    """Apply every edit to the node it names, children first, in one pass."""

    def __init__(self, edits: Sequence[Edit]) -> None:
        super().__init__()
        self.edits: dict[int, list[Edit]] = defaultdict(list)
        for edit in edits:
            self.edits[id(edit.node)].append(edit)

    def on_leave(self, original_node: cst.CSTNode, updated_node: cst.CSTNode):
        edits = self.edits.get(id(original_node))
        if not edits:
            return updated_node
        rewrites = [e.rewrite for e in edits if e.rewrite]
        assert len(rewrites) <= 1, f"two rules rewrite the same node: {edits}"
        node = rewrites[0](updated_node) if rewrites else updated_node
        groups = [list(e.before) for e in edits if e.before]
        if not groups or isinstance(node, cst.RemovalSentinel):
            return node
        separate = max(e.separate for e in edits)
        for group in groups[1:]:
            group[0] = group[0].with_changes(leading_lines=[*_blank(separate), *group[0].leading_lines])
        before = [stmt for group in groups for stmt in group]
        kept = list(node.leading_lines) if any(e.keep_comments for e in edits) else []
        moved = [] if kept else list(node.leading_lines)
        before[0] = before[0].with_changes(leading_lines=[*moved, *before[0].leading_lines])
        return cst.FlattenSentinel([*before, node.with_changes(leading_lines=[*_blank(separate), *kept])])


def _blank(count: int) -> list[cst.EmptyLine]:
    return [cst.EmptyLine(indent=False)] * count


_IMPORT_LINE = m.SimpleStatementLine(body=[m.ImportFrom() | m.Import()])
_DOCSTRING_OR_STRICT = m.SimpleStatementLine(
    body=[m.Assign(targets=[m.AssignTarget(target=m.Name("__strict__"))]) | m.Expr(value=m.SimpleString())]
)


def _import_names(stmt: cst.SimpleStatementLine) -> Optional[list[str]]:
    """The dotted module names an import line names; None for a relative import."""
    node = stmt.body[0]
    if isinstance(node, cst.ImportFrom):
        if node.relative or node.module is None:
            return None
        return [get_full_name_for_node(node.module)]
    return [get_full_name_for_node(alias.name) for alias in node.names]


def _concerns(names: Optional[list[str]], modules: set[str]) -> bool:
    if names is None:
        return True
    return any(n == mod or n.startswith(mod + ".") or mod.startswith(n + ".") for n in names for mod in modules)


def add_imports(module: cst.Module, imports: Sequence[tuple[str, str]]) -> cst.Module:
    """``module`` with ``(module, name)`` imports added by libcst's AddImportsVisitor.

    AddImportsVisitor reads and rewrites only the module's leading import block (after a
    docstring or ``__strict__`` line) and the leading blank lines of the first statement
    after it, and of that block only the imports of the modules it adds; yet it visits every
    node of the module, slowly. So it is run on a copy holding that block, with every import
    of another module replaced by a one-name stand-in import (still an import line, so the
    block keeps its length), plus a stand-in for the statement after the block (same
    leading lines); the original statements are then put back in place of the stand-ins.
    The same text as running it on the whole module, several times faster.
    """
    from libcst.codemod import CodemodContext
    from libcst.codemod.visitors import AddImportsVisitor

    context = CodemodContext()
    for module_name, name in imports:
        AddImportsVisitor.add_needed_import(context, module_name, name or None)
    modules = {module_name for module_name, _name in imports}
    body = list(module.body)
    end = 1 if body and m.matches(body[0], _DOCSTRING_OR_STRICT) else 0
    while end < len(body) and m.matches(body[end], _IMPORT_LINE):
        end += 1
    head: list[cst.BaseStatement] = body[:end]
    originals: dict[str, cst.BaseStatement] = {}
    for index in range(len(head)):
        stmt = head[index]
        if m.matches(stmt, _IMPORT_LINE) and not _concerns(_import_names(stmt), modules):
            name = f"_sglang_draft_layout_stand_in_{index}"
            originals[name] = stmt
            head[index] = cst.SimpleStatementLine(body=[cst.Import(names=[cst.ImportAlias(name=cst.Name(name))])])
    rest = body[end:]
    if rest:
        head.append(cst.SimpleStatementLine(body=[cst.Pass()], leading_lines=rest[0].leading_lines))
    visited = MetadataWrapper(module.with_changes(body=head), unsafe_skip_copy=True).visit(AddImportsVisitor(context))
    new_body = []
    for stmt in visited.body:
        node = stmt.body[0] if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 else None
        if isinstance(node, cst.Import) and len(node.names) == 1 and isinstance(node.names[0].name, cst.Name) \
                and node.names[0].name.value in originals:
            stmt = originals.pop(node.names[0].name.value)
        new_body.append(stmt)
    if originals:  # every stand-in must come back (a libcst whose AddImportsVisitor drops lines)
        raise PatchError(f"adding imports lost {len(originals)} import line(s) (a libcst change); nothing written")
    if rest:
        stand_in = new_body.pop()
        new_body += [rest[0].with_changes(leading_lines=stand_in.leading_lines), *rest[1:]]
    return visited.with_changes(body=new_body)


def render(source: Source, findings: Sequence[Finding]) -> str:
    """The file's new text with every to-patch finding's edits and imports applied.

    Only the segments the rules parsed are rewritten and spliced back; the imports go
    into the header through libcst's AddImportsVisitor (see ``add_imports``).
    """
    to_patch = [f for f in findings if f.state is State.TO_PATCH]
    apply_edits = _ApplyEdits([e for f in to_patch for e in f.edits])
    header = source.header()
    replacements = {
        (segment.start, segment.end): segment.text(segment.module.visit(apply_edits))
        for segment in source.segments.values()
    }
    with_imports = add_imports(header.module.visit(apply_edits), sorted({i for f in to_patch for i in f.imports}))
    if with_imports.body:  # a header that was empty ends its new import line too
        with_imports = with_imports.with_changes(has_trailing_newline=True)
    replacements[header.start, header.end] = header.text(with_imports)
    lines = list(source.lines)
    for (start, end), text in sorted(replacements.items(), reverse=True):
        lines[start:end] = [text]
    return "".join(lines)


def _parse(path: Path, relative: str, code: str) -> Source:
    try:
        return Source(relative, code)
    except SyntaxError as error:
        raise TargetError(f"{path}:{error.lineno}: not valid Python ({error.msg}); nothing written") from None
    except cst.ParserSyntaxError as error:
        raise TargetError(f"{path}:{error.raw_line}: not valid Python ({error.message.splitlines()[0]}); nothing written") from None


def _rules_by_file(rules: Sequence[Rule]) -> dict[str, list[Rule]]:
    grouped: dict[str, list[Rule]] = defaultdict(list)
    for rule in rules:
        grouped[rule.file].append(rule)
    return grouped


def plan(target: Target, rules: Sequence[Rule] = RULES, render_changes: bool = True) -> Plan:
    """Every rule's finding and (with ``render_changes``) the new text of every file that changes; writes nothing."""
    findings: list[Finding] = []
    changes: list[FileChange] = []
    for relative, file_rules in _rules_by_file(rules).items():
        path = target.package / relative
        if not path.is_file():
            findings += [rule.report(State.ABSENT, detail=f"no {relative}") for rule in file_rules]
            continue
        old = path.read_text(encoding="utf-8")
        source = _parse(path, relative, old)
        file_findings = [rule.find(rule, source) for rule in file_rules]
        findings += file_findings
        if render_changes and any(f.state is State.TO_PATCH for f in file_findings) and not any(
            f.state is State.UNRECOGNISED for f in file_findings
        ):
            new = render(source, file_findings)
            _check_rendered(path, relative, new, file_rules)
            changes.append(FileChange(path, old, new))
    return Plan(target, tuple(findings), tuple(changes))


def _check_rendered(path: Path, relative: str, new: str, rules: Sequence[Rule]) -> None:
    """The rewritten text compiles and every rule now finds its site in upstream's form."""
    try:
        compile(new, str(path), "exec")
    except SyntaxError as error:
        raise PatchError(f"{path}:{error.lineno}: rewriting made invalid Python ({error.msg}; a rule bug); "
                         "nothing written") from None
    source = _parse(path, relative, new)
    for rule in rules:
        finding = rule.find(rule, source)
        if finding.state not in (State.PATCHED, State.ABSENT):
            raise PatchError(f"{path}: {rule.scope}: {rule.site} is {finding.state.value} after rewriting (a rule bug); nothing written")


def describe(finding: Finding, target: Target) -> str:
    rule = finding.rule
    where = f"{target.package / rule.file}" + (f":{finding.line}" if finding.line else "")
    return f"{where}: {rule.scope}: {rule.site}: {finding.detail or finding.state.value}"


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


def write(changes: Sequence[FileChange]) -> None:
    """Write every change or none: on any failure the files already written are restored."""
    for change in changes:
        if not _writable(change.path):
            raise PatchError(f"{change.path}: read-only; nothing written")
        if change.path.read_text(encoding="utf-8") != change.old:
            raise PatchError(f"{change.path}: changed while planning; nothing written")
    written: list[FileChange] = []
    try:
        for change in changes:
            _replace(change.path, change.new)
            written.append(change)
        for change in written:
            compile(change.path.read_text(encoding="utf-8"), str(change.path), "exec")
    except BaseException:
        for change in reversed(written):
            _replace(change.path, change.old)
        raise


def apply(target: Target) -> Plan:
    """Patch the tree: plan, refuse on anything unrecognised, write all files or none."""
    with tree_lock(target):
        result = plan(target)
        if result.unrecognised:
            raise PatchError(describe(result.unrecognised[0], target) + "; nothing written")
        write(result.changes)
    return result

"""What a rule is and what it reports; the file as Python's own ``ast`` sees it.

Rules decide from the stdlib ``ast`` alone (``check`` never imports libcst). An edit
names an ast node of the file (a statement or an expression: a source range) and the
source text to put there; ``rewrite.py`` applies it with libcst when a file is written.
"""

from __future__ import annotations

import ast
import enum
from pathlib import Path
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence, Union

from ..harness.judged import TOP_LEVEL_START, parsed
from ..layout_patterns.ast_walk import parse

SPEC_UTILS = "sglang.srt.speculative.spec_utils"
EAGLE_UTILS = "sglang.srt.speculative.eagle_utils"

#: the scope of a rule that judges module-level definitions (its file is parsed whole)
MODULE_SCOPE = "<module>"
Definition = Union[ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef]


class State(enum.Enum):
    PATCHED = "patched"
    TO_PATCH = "to patch"
    ABSENT = "not in this release"
    #: a site whose own form has no bug to fix (e.g. CUDA-graph rows counted per branch already)
    NOT_AFFECTED = "not affected"
    UNRECOGNISED = "unrecognised"
    KEPT = "kept by the fork"  # the maintainer's pragma or --keep: left as the fork wrote it
    BY_CALLER = "handled by the fork's caller"  # a caller already splits the layout: nothing to add here
    #: the fork's own code gives upstream's layout in a form no rule rewrites (proven on the probes): left as it is
    BY_HAND = "correct, by hand"


@dataclass(frozen=True)
class Edit:
    """A change at one ast node of the file.

    ``replace`` is the node's new source: an expression for an expression node, a
    statement (dedented) for a statement; the statement (replaced or not) keeps the
    comments above it, and takes over those of the statements in ``absorb``, which are
    removed (their comments in source order around its own). A replaced statement's
    comments inside it and at its end go above it too (those ``replace`` does not hold
    already), unless ``drop_inner_comments`` (a stale helper definition replaced whole).
    ``before`` are statements (dedented source) inserted ahead of the statement
    ``node``; they take over its leading comments and blank lines, unless
    ``keep_comments`` (a top-level definition keeps the comment above it).
    ``separate`` is the number of blank lines kept between the inserted statements and
    the node (and between the groups of several edits).
    ``remove`` deletes the node (a method) whole: its decorators, the comment lines right
    above it and the blank lines above those.
    """

    node: ast.AST
    replace: Optional[str] = None
    before: tuple[str, ...] = ()
    absorb: tuple[ast.stmt, ...] = ()
    separate: int = 0
    keep_comments: bool = False
    drop_inner_comments: bool = False
    remove: bool = False


@dataclass(frozen=True)
class Finding:
    """One site as a rule found it in one file."""

    rule: "Rule"
    state: State
    line: Optional[int] = None
    detail: str = ""
    edits: tuple[Edit, ...] = ()
    #: (module, name) pairs the rewritten file must import at module level.
    imports: tuple[tuple[str, str], ...] = ()
    #: what the draft path through the site's class gave before the rewrite, run on the probes (``judgement``)
    judged: str = ""
    #: the per-step ``Class.method`` whose split-once verdict proves the rewrite, where it changes who splits
    #: (a caller's duplicate split taken out, a slice added on DeepSeek-V4's in-graph path:
    #: ``proof.validate.prove_split_once``) rather than a layout the fork computed
    proven_by_split_once: str = ""


@dataclass(frozen=True)
class Rule:
    """One call site (or helper definition) of one SGLang file.

    ``file`` is relative to the ``sglang`` package; ``scope`` is ``Class.method``;
    ``find`` reads the file's ast and reports the site's state with the edits that
    would bring it to upstream's form.
    """

    id: str
    file: str
    scope: str
    site: str
    upstream: str
    find: Callable[["Rule", "Source"], Finding] = field(compare=False, repr=False)
    counts_as_site: bool = True
    #: other classes of the file the rule reads (a caller of its site): always parsed
    reads: tuple[str, ...] = ()

    def report(
        self,
        state: State,
        line: Optional[int] = None,
        detail: str = "",
        edits: Sequence[Edit] = (),
        imports: Sequence[tuple[str, str]] = (),
        proven_by_split_once: str = "",
    ) -> Finding:
        return Finding(
            self, state, line, detail, tuple(edits), tuple(imports), proven_by_split_once=proven_by_split_once
        )


def code_lines(code: str) -> list[str]:
    """The lines of ``code`` (``\\n`` line ends) as Python numbers them: a form feed or other
    character ``str.splitlines`` breaks at does not end a line."""
    *ended, last = code.split("\n")
    return [line + "\n" for line in ended] + ([last] if last else [])


class Source:
    """One file (its text with ``\\n`` line ends: ``stored.StoredText``): its lines and Python's ast of it."""

    def __init__(self, path: str, code: str) -> None:
        self._start(path, code)
        self.tree = parse(code, path)

    def _start(self, path: str, code: str) -> None:
        self.path = path
        self.code = code
        self.lines = code_lines(code)
        #: the tree's other files as the engine read them (relative path -> Source), for rules that
        #: look at a site's callers elsewhere; empty when the file is judged alone
        self.others: dict[str, Source] = {}
        #: the tree's black line length (``Target.line_length``), for a rule writing a long line as black would
        self.line_length = 88
        #: the tree's ``sglang`` folder, for the proofs to read a base class in another module (None: judged alone)
        self.package: Optional[Path] = None

    @classmethod
    def class_blocks(cls, path: str, code: str, wanted: Callable[[str], bool]) -> "Source":
        """The file with only its top-level classes whose text is ``wanted`` parsed.

        The text is cut at top-level ``class``/``def`` lines (with their decorators);
        each wanted class block is parsed alone, at its lines of the file. If a block does not parse on its own, the whole file is parsed.
        """
        source = cls.__new__(cls)
        source._start(path, code)
        starts = [i for i, line in enumerate(source.lines) if TOP_LEVEL_START.match(line)]
        starts = [s for i, s in enumerate(starts) if i == 0 or not source.lines[starts[i - 1]].startswith("@")]
        body: list[ast.stmt] = []
        for start, end in zip(starts, [*starts[1:], len(source.lines)]):
            text = "".join(source.lines[start:end])
            if not wanted(text):
                continue
            try:  # blank lines ahead give the file's line numbers, no pass over the tree; the harness's block too
                block = parsed("\n" * start + text, path)
            except SyntaxError:
                return cls(path, code)
            body += [stmt for stmt in block.body if isinstance(stmt, ast.ClassDef)]
        source.tree = ast.Module(body=body, type_ignores=[])
        return source

    def other_trees(self) -> dict[str, ast.Module]:
        """``others`` as trees: relative path -> its ast."""
        return {relative: other.tree for relative, other in self.others.items()}

    def text(self, node: ast.AST) -> str:
        """The source of ``node`` as written (ast columns are UTF-8 byte offsets)."""
        lines = [line.encode() for line in self.lines[node.lineno - 1 : node.end_lineno]]
        lines[-1] = lines[-1][: node.end_col_offset]
        lines[0] = lines[0][node.col_offset :]
        return b"".join(lines).decode()

    def definitions(self) -> list[Definition]:
        """The top-level classes and functions."""
        kinds = (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
        return [s for s in self.tree.body if isinstance(s, kinds)]

    def cls(self, name: str) -> Optional[ast.ClassDef]:
        return next((s for s in self.definitions() if isinstance(s, ast.ClassDef) and s.name == name), None)

    def methods(self, class_name: str) -> list[ast.FunctionDef]:
        cls = self.cls(class_name)
        return [s for s in cls.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))] if cls else []

    def method(self, class_name: str, method_name: str) -> Optional[ast.FunctionDef]:
        """The method as Python keeps it: of a name defined twice in the class body, the last definition."""
        return next((s for s in reversed(self.methods(class_name)) if s.name == method_name), None)

    def function(self, name: str) -> Optional[ast.FunctionDef]:
        """The top-level function ``name``."""
        return next((s for s in self.definitions() if not isinstance(s, ast.ClassDef) and s.name == name), None)


def definition_start(source: Source, stmt: ast.stmt) -> int:
    """Index of a statement's first line: its decorators, and the comment lines right above them."""
    start = min([stmt.lineno, *(d.lineno for d in getattr(stmt, "decorator_list", ()))]) - 1
    indent = source.lines[start][: len(source.lines[start]) - len(source.lines[start].lstrip())]
    while start > 0 and source.lines[start - 1].startswith(indent + "#"):
        start -= 1
    return start


def removed_lines(source: Source, stmt: ast.stmt) -> tuple[int, int]:
    """Line indexes [start, end) an ``Edit.remove`` deletes: ``definition_start`` and the blank lines above."""
    start = definition_start(source, stmt)
    while start > 0 and not source.lines[start - 1].strip():
        start -= 1
    return start, stmt.end_lineno


def param_names(func: ast.FunctionDef) -> list[str]:
    return [a.arg for a in (*func.args.posonlyargs, *func.args.args)]


def locate_method(rule: Rule, source: Source) -> Union[ast.FunctionDef, Finding]:
    """The method named by ``rule.scope``, or the finding that says why there is none.

    A missing class means the release has no such backend (absent); a class without
    the method is a restructured site that no rule recognises.
    """
    class_name, method_name = rule.scope.split(".")
    if source.cls(class_name) is None:
        return rule.report(State.ABSENT, detail=f"no class {class_name}")
    method = source.method(class_name, method_name)
    if method is None:
        return rule.report(State.UNRECOGNISED, detail=f"class {class_name} has no {method_name}()")
    return method

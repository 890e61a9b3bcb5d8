"""What a rule is, what it reports, and the structural matchers the rules share."""

from __future__ import annotations

import ast
import contextlib
import enum
import re
from dataclasses import dataclass, field
from typing import Callable, Iterator, Optional, Sequence

import libcst as cst
import libcst.matchers as m
from libcst.metadata import MetadataWrapper, PositionProvider

try:
    from libcst._nodes.internal import CodegenState
except ImportError:  # pragma: no cover - a libcst without it: start_lines falls back
    CodegenState = None

SPEC_UTILS = "sglang.srt.speculative.spec_utils"
EAGLE_UTILS = "sglang.srt.speculative.eagle_utils"


class State(enum.Enum):
    PATCHED = "patched"
    TO_PATCH = "to patch"
    ABSENT = "not in this release"
    UNRECOGNISED = "unrecognised"


#: Rewrites one node of the original module: receives the node with its children
#: already rewritten and returns its replacement.
Rewrite = Callable[[cst.CSTNode], cst.CSTNode]


@dataclass(frozen=True)
class Edit:
    """A change to one node of the parsed file.

    ``rewrite`` replaces the node; ``before`` are statements inserted ahead of it (the
    node is then a statement), which take over the node's leading comments and blank
    lines, unless ``keep_comments`` (a top-level definition keeps the comment above it).
    ``separate`` is the number of blank lines kept between the inserted statements and
    the node (and between the groups of several edits).
    """

    node: cst.CSTNode
    rewrite: Optional[Rewrite] = None
    before: tuple[cst.BaseStatement, ...] = ()
    separate: int = 0
    keep_comments: bool = False


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


@dataclass(frozen=True)
class Rule:
    """One call site (or helper definition) of one SGLang file.

    ``file`` is relative to the ``sglang`` package; ``scope`` is ``Class.method``;
    ``find`` reads the parsed file and reports the site's state with the edits
    that would bring it to upstream's form.
    """

    id: str
    file: str
    scope: str
    site: str
    upstream: str
    find: Callable[["Rule", "Source"], Finding] = field(compare=False, repr=False)
    counts_as_site: bool = True

    def report(self, state: State, line: Optional[int] = None, detail: str = "",
               edits: Sequence[Edit] = (), imports: Sequence[tuple[str, str]] = ()) -> Finding:
        return Finding(self, state, line, detail, tuple(edits), tuple(imports))


_NEWLINE = re.compile(r"\r\n?|\n")


if CodegenState is not None:
    @dataclass
    class _StartLineState(CodegenState):
        """libcst's codegen state, keeping only what PositionProvider gives as start.line.

        Mirrors ``PositionProvidingCodegenState`` (a node's start is where its syntactic
        position is recorded, else where its codegen began) without building a CodeRange
        for every node or going through MetadataWrapper: about 7x faster.
        """

        line: int = 1
        starts: dict = field(default_factory=dict)  # id(node) -> start line
        stack: list = field(default_factory=list)

        def add_indent_tokens(self) -> None:
            self.tokens.extend(self.indent_tokens)

        def add_token(self, value: str) -> None:
            self.tokens.append(value)
            if "\n" in value or "\r" in value:
                self.line += len(_NEWLINE.split(value)) - 1

        def before_codegen(self, node: cst.CSTNode) -> None:
            self.stack.append(self.line)

        def after_codegen(self, node: cst.CSTNode) -> None:
            start = self.stack.pop()
            self.starts.setdefault(id(node), start)

        @contextlib.contextmanager
        def record_syntactic_position(self, node: cst.CSTNode, *, start_node: Optional[cst.CSTNode] = None,
                                      end_node: Optional[cst.CSTNode] = None) -> Iterator[None]:
            start = self.line
            try:
                yield
            finally:
                self.starts[id(node)] = self.starts[id(start_node)] if start_node is not None else start


def start_lines(module: cst.Module) -> dict[int, int]:
    """``id(node) -> PositionProvider's start.line`` for every node of ``module``."""
    if CodegenState is not None:
        try:
            state = _StartLineState(default_indent=module.default_indent, default_newline=module.default_newline)
            module._codegen(state)
            return state.starts
        except Exception:  # pragma: no cover - libcst's codegen internals changed: use the public provider
            pass
    resolved = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    return {id(node): position.start.line for node, position in resolved.items()}


class Source:
    """One file, parsed by libcst only where a rule looks.

    Python's own parser indexes the file's classes, methods and functions (fast);
    libcst then parses just the pieces a rule asks for (a method, a top-level
    definition, or the header before the first definition, where the module's imports
    live), each as a segment of its own. Rewrites are made on those segments and
    spliced back in place of their lines: the rest of the file is never touched.
    """

    def __init__(self, path: str, code: str) -> None:
        self.path = path
        self.lines = code.splitlines(keepends=True)
        self.tree = ast.parse(code, filename=path)
        self.segments: dict[tuple[int, int], Segment] = {}
        self._lines: dict[int, int] = {}  # id(node) -> line in the file

    def _segment(self, start: int, end: int, prefix: str = "", positions: bool = True,
                 definition: bool = False) -> "Segment":
        if (start, end) not in self.segments:
            module = cst.parse_module(prefix + "".join(self.lines[start:end]))
            if definition and module.header:  # libcst puts comments above the first statement in the module header
                first = module.body[0]
                module = module.with_changes(
                    header=[], body=[first.with_changes(leading_lines=[*module.header, *first.leading_lines]),
                                     *module.body[1:]])
            shift = start - prefix.count("\n")
            if positions:
                for node_id, line in start_lines(module).items():
                    self._lines[node_id] = line + shift
            self.segments[start, end] = Segment(start, end, module, prefix)
        return self.segments[start, end]

    def _definitions(self) -> list[ast.stmt]:
        return [s for s in self.tree.body if isinstance(s, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]

    def _class(self, name: str) -> Optional[ast.ClassDef]:
        return next((s for s in self._definitions() if isinstance(s, ast.ClassDef) and s.name == name), None)

    def _start(self, stmt: ast.stmt) -> int:
        """Index of a definition's first line: its decorators, and the comment lines right above them."""
        start = min([stmt.lineno, *(d.lineno for d in stmt.decorator_list)]) - 1
        indent = self.lines[start][: len(self.lines[start]) - len(self.lines[start].lstrip())]
        while start > 0 and self.lines[start - 1].startswith(indent + "#"):
            start -= 1
        return start

    def _parse_definition(self, stmt: ast.stmt, prefix: str = "", positions: bool = True) -> cst.CSTNode:
        module = self._segment(self._start(stmt), stmt.end_lineno, prefix, positions, definition=not prefix).module
        return module.body[0].body.body[0] if prefix else module.body[0]

    def line(self, node: cst.CSTNode) -> Optional[int]:
        return self._lines.get(id(node))

    def has_class(self, name: str) -> bool:
        return self._class(name) is not None

    def methods(self, class_name: str, mentioning: Optional[str] = None) -> list[cst.FunctionDef]:
        """The class's methods (those naming ``mentioning`` anywhere, if given), parsed."""
        cls = self._class(class_name)
        found = []
        for stmt in cls.body if cls else []:
            if not isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if mentioning and not any(
                getattr(n, "id", None) == mentioning or getattr(n, "attr", None) == mentioning for n in ast.walk(stmt)
            ):
                continue
            found.append(self._parse_definition(stmt, prefix="class _:\n"))
        return found

    def method(self, class_name: str, method_name: str) -> Optional[cst.FunctionDef]:
        cls = self._class(class_name)
        for stmt in cls.body if cls else []:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and stmt.name == method_name:
                return self._parse_definition(stmt, prefix="class _:\n")
        return None

    def function_names(self) -> set[str]:
        """Names of the top-level functions."""
        return {s.name for s in self._definitions() if not isinstance(s, ast.ClassDef)}

    def first_definition(self) -> Optional[tuple[cst.BaseCompoundStatement, int]]:
        """The first top-level def or class, and its line."""
        definitions = self._definitions()
        if not definitions:
            return None
        return self._parse_definition(definitions[0], positions=False), definitions[0].lineno

    def header(self) -> "Segment":
        """Everything before the first top-level definition: where module imports live."""
        definitions = self._definitions()
        end = self._start(definitions[0]) if definitions else len(self.lines)
        return self._segment(0, end, positions=False)


@dataclass
class Segment:
    """Lines [start, end) of a file, parsed as a module of their own.

    A method is parsed inside a stand-in ``class _:`` line (``prefix``) so that its
    indentation stays as it is in the file.
    """

    start: int
    end: int
    module: cst.Module
    prefix: str = ""

    def text(self, module: cst.Module) -> str:
        """The lines of ``module`` (this segment, possibly rewritten) without the prefix."""
        return module.code[len(self.prefix):]


# ---- structural helpers --------------------------------------------------------

def code(node: cst.CSTNode) -> str:
    return cst.Module(body=[]).code_for_node(node)


def self_attr(name: str) -> m.Attribute:
    return m.Attribute(value=m.Name("self"), attr=m.Name(name))


def calls(name: str) -> m.Call:
    """A call of ``name`` or ``anything.name``."""
    return m.Call(func=m.Name(name) | m.Attribute(attr=m.Name(name)))


def param_names(func: cst.FunctionDef) -> list[str]:
    return [p.name.value for p in func.params.params]


def walk(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """Every node below ``node`` in source order, ``node`` included."""
    yield node
    for child in node.children:
        yield from walk(child)


def statements(func: cst.FunctionDef) -> Iterator[cst.SimpleStatementLine]:
    """Every simple statement line in ``func``, nested blocks included."""
    for node in walk(func.body):
        if isinstance(node, cst.SimpleStatementLine):
            yield node


def strip_parens(expr: cst.BaseExpression) -> cst.BaseExpression:
    if getattr(expr, "lpar", None):
        return expr.with_changes(lpar=[], rpar=[])
    return expr


def factors(expr: cst.BaseExpression) -> list[cst.BaseExpression]:
    """The factors of a product ``a * b * c`` (parentheses ignored); [expr] otherwise."""
    if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, cst.Multiply):
        return factors(expr.left) + factors(expr.right)
    return [strip_parens(expr)]


def take(items: list[cst.BaseExpression], matcher: m.BaseMatcherNode) -> bool:
    """Remove the first item matching ``matcher``; whether one was removed."""
    for index, item in enumerate(items):
        if m.matches(item, matcher):
            del items[index]
            return True
    return False


def locate_method(rule: Rule, source: Source) -> "cst.FunctionDef | Finding":
    """The method named by ``rule.scope``, or the finding that says why there is none.

    A missing class means the release has no such backend (absent); a class without
    the method is a restructured site that no rule recognises.
    """
    class_name, method_name = rule.scope.split(".")
    if not source.has_class(class_name):
        return rule.report(State.ABSENT, detail=f"no class {class_name}")
    method = source.method(class_name, method_name)
    if method is None:
        return rule.report(State.UNRECOGNISED, detail=f"class {class_name} has no {method_name}()")
    return method

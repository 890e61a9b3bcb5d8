"""Add imports to a module where isort (profile black, first party ``sglang``) and black put them.

Python's ``ast`` finds the top-level import statements; libcst builds the one statement
that is added or extended, which is spliced in place of its lines. No other line changes.
"""

from __future__ import annotations

import ast
import io
import re
import sys
from typing import TYPE_CHECKING, Optional, Sequence

from .layout_patterns.ast_walk import parse

if TYPE_CHECKING:
    import libcst as cst

FIRST_PARTY_PACKAGE = "sglang"
INDENT = "    "
# isort's sections, in the order it writes them
FUTURE, STDLIB, THIRD_PARTY, FIRST_PARTY, LOCAL_FOLDER = range(5)


def add_imports(code: str, imports: Sequence[tuple[str, str]], line_length: int = 88) -> str:
    """``code`` importing every ``(module, name)`` at module level (``name`` empty: ``import module``).

    Names go into the first top-level ``from module import ...`` of the same module when
    there is one, else into a new statement at isort's sorted place among the module's
    top-level imports. One line if it fits ``line_length``, else one name per line.
    """
    names_by_module: dict[str, list[str]] = {}
    for module, name in imports:
        names = names_by_module.setdefault(module, [])
        if name not in names:
            names.append(name)
    for module, names in names_by_module.items():
        if "" in names:
            code = _add_straight_import(code, module)
        if any(names):
            code = _add_from_import(code, module, [name for name in names if name], line_length)
    return code


def _add_straight_import(code: str, module: str) -> str:
    tree = _top_level(code, module)
    if any(
        isinstance(stmt, ast.Import) and any(a.name == module and not a.asname for a in stmt.names)
        for stmt in tree.body
    ):
        return code
    import libcst as cst

    statement = cst.SimpleStatementLine([cst.Import([cst.ImportAlias(_dotted(module))])])
    return _insert(code, tree, module, is_from=False, statement=statement)


def _add_from_import(code: str, module: str, names: list[str], line_length: int) -> str:
    tree = _top_level(code, module)
    from_imports = [
        stmt for stmt in tree.body if isinstance(stmt, ast.ImportFrom) and stmt.level == 0 and stmt.module == module
    ]
    bound = {alias.name for stmt in from_imports for alias in stmt.names if alias.asname in (None, alias.name)}
    missing = [name for name in names if name not in bound]
    if not missing:
        return code
    import libcst as cst

    lines = _lines(code)
    extendable = next(
        (stmt for stmt in from_imports if all(alias.name != "*" and not alias.asname for alias in stmt.names)), None
    )
    if extendable is None:
        aliases = [cst.ImportAlias(cst.Name(name)) for name in sorted(missing, key=_name_key)]
        new = cst.ImportFrom(module=_dotted(module), names=aliases)
        return _insert(
            code, tree, module, is_from=True, statement=_formatted(cst.SimpleStatementLine([new]), line_length)
        )
    start, end = extendable.lineno - 1, extendable.end_lineno
    statement = cst.parse_statement("".join(lines[start:end]))
    old = next(node for node in statement.body if isinstance(node, cst.ImportFrom))
    aliases = [*old.names, *(cst.ImportAlias(cst.Name(name)) for name in missing)]
    aliases.sort(key=lambda alias: _name_key(alias.name.value))
    statement = statement.deep_replace(old, old.with_changes(names=aliases))
    exploded = old.rpar is not None and old.names[-1].comma is not cst.MaybeSentinel.DEFAULT
    rendered = _render(_formatted(statement, line_length, exploded), _newline(code))
    return "".join([*lines[:start], rendered, *lines[end:]])


#: a line at the margin that starts a definition (its decorator's, if any)
_DEFINITION = re.compile(r"^(?:class\b|def\b|async[ \t]+def\b|@)", re.MULTILINE)


def _top_level(code: str, module: str) -> ast.Module:
    """The module's top-level statements, as far as importing ``module`` reads them: those above its first definition
    (``_insert``'s header), parsed alone where no later line at the margin says ``import``, ``from`` or ``module``'s
    last part (no later top-level statement imports it) and they parse so (the cut lies between statements); else the
    whole module (a rendered file is parsed for nothing else)."""
    first = _DEFINITION.search(code)
    later = rf"^(?=[^\s#]).*\b(?:import|from|{re.escape(module.rsplit('.', 1)[-1])})\b"
    if first is not None and not re.search(later, code[first.start() :], re.MULTILINE):
        try:
            return ast.parse(code[: first.start()])
        except (SyntaxError, ValueError):
            pass
    return parse(code)


def _formatted(
    statement: "cst.SimpleStatementLine", line_length: int, exploded: bool = False
) -> "cst.SimpleStatementLine":
    """The from-import statement on one line if it fits (and holds no comment), else one name per line.

    ``exploded`` keeps it one name per line anyway (black's magic trailing comma).
    """
    import libcst as cst

    node = next(node for node in statement.body if isinstance(node, cst.ImportFrom))
    names = list(node.names)
    one_line = statement.deep_replace(
        node,
        node.with_changes(
            lpar=None,
            rpar=None,
            names=[
                alias.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))) for alias in names[:-1]
            ]
            + [names[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)],
        ),
    )
    has_inner_comment = "#" in _render(node, "\n")
    if not exploded and not has_inner_comment and len(_render(one_line, "\n").rstrip("\n")) <= line_length:
        return one_line
    exploded_names = []
    for index, alias in enumerate(names):
        indent = "" if index == len(names) - 1 else INDENT
        after = alias.comma.whitespace_after if isinstance(alias.comma, cst.Comma) else None
        if isinstance(after, cst.ParenthesizedWhitespace):  # keeps the comments that follow the name
            whitespace = after.with_changes(last_line=cst.SimpleWhitespace(indent))
        else:
            whitespace = _newline_then(indent)
        exploded_names.append(alias.with_changes(comma=cst.Comma(whitespace_after=whitespace)))
    if node.lpar is not None and isinstance(node.lpar.whitespace_after, cst.ParenthesizedWhitespace):
        lpar = node.lpar
    elif statement.trailing_whitespace.comment:  # isort moves the line's comment behind the parenthesis
        lpar = cst.LeftParen(whitespace_after=_newline_then(INDENT, statement.trailing_whitespace))
        statement = statement.with_changes(trailing_whitespace=cst.TrailingWhitespace())
    else:
        lpar = cst.LeftParen(whitespace_after=_newline_then(INDENT))
    node = next(node for node in statement.body if isinstance(node, cst.ImportFrom))
    return statement.deep_replace(node, node.with_changes(lpar=lpar, rpar=cst.RightParen(), names=exploded_names))


def _newline_then(indent: str, first_line: Optional["cst.TrailingWhitespace"] = None) -> "cst.ParenthesizedWhitespace":
    import libcst as cst

    return cst.ParenthesizedWhitespace(
        first_line=first_line or cst.TrailingWhitespace(), indent=True, last_line=cst.SimpleWhitespace(indent)
    )


def _insert(code: str, tree: ast.Module, module: str, is_from: bool, statement: "cst.SimpleStatementLine") -> str:
    """``code`` with ``statement`` (importing ``module``) where isort would put it among the header's imports.

    The header is what lies between the module's opening string and its first definition.
    Its runs of import statements (code between them, such as an ``if`` block, splits them)
    are sorted by isort one by one; the statement joins its section in the first run whose
    modules of that section sort around it (else in the first run holding the section),
    or starts the section in the first run.
    """
    lines = _lines(code)
    newline = _newline(code)
    text = _render(statement, newline)
    section = _section(module, 0)
    key = _statement_key(is_from, module)
    body = tree.body
    first = _first_after_opening_string(body)
    end = next(
        (
            index
            for index, stmt in enumerate(body)
            if index >= first and isinstance(stmt, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        ),
        len(body),
    )
    runs = _import_runs(body[first:end])
    sections = [in_section for run in runs if (in_section := [s for s in run if _section_of(s) == section])]
    if sections:
        in_section = next((stmts for stmts in sections if _key_of(stmts[0]) <= key <= _key_of(stmts[-1])), sections[0])
        following = next((stmt for stmt in in_section if _key_of(stmt) >= key), None)
        at = _comment_start(lines, following) if following else in_section[-1].end_lineno
        new_lines = [text]
    elif runs and (earlier := [stmt for stmt in runs[0] if _section_of(stmt) < section]):
        at, new_lines = earlier[-1].end_lineno, [newline, text]
    elif runs:  # only later sections (relative imports): a section of its own above them
        at, new_lines = _comment_start(lines, runs[0][0]), [text, newline]
    elif first:  # no imports: a block of its own below the opening string
        at, new_lines = body[first - 1].end_lineno, [newline, text]
    else:  # no imports, no opening string: below a shebang, encoding or license comment
        at = 0
        while at < len(lines) and lines[at].startswith("#"):
            at += 1
        new_lines = [newline, text, newline] if at else [text, newline]
    return "".join([*lines[:at], *new_lines, *lines[at:]])


def _first_after_opening_string(body: list[ast.stmt]) -> int:
    """Index of the first top-level statement below the module's opening string (0 if it has none)."""
    index = 0
    while index < len(body) and isinstance(body[index], ast.ImportFrom) and body[index].module == "__future__":
        index += 1
    stmt = body[index] if index < len(body) else None
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str):
        return index + 1
    return 0


def _import_runs(body: list[ast.stmt]) -> list[list[ast.stmt]]:
    """The runs of consecutive top-level import statements (isort sorts each run apart)."""
    runs: list[list[ast.stmt]] = []
    previous_is_import = False
    for stmt in body:
        is_import = isinstance(stmt, (ast.Import, ast.ImportFrom))
        if is_import:
            if previous_is_import:
                runs[-1].append(stmt)
            else:
                runs.append([stmt])
        previous_is_import = is_import
    return runs


def _comment_start(lines: list[str], stmt: ast.stmt) -> int:
    """Index of the statement's first line, or of the comment lines right above it (isort keeps them together)."""
    at = stmt.lineno - 1
    while at > 0 and lines[at - 1].lstrip().startswith("#"):
        at -= 1
    return at


def _module_of(stmt: ast.stmt) -> str:
    return stmt.names[0].name if isinstance(stmt, ast.Import) else stmt.module or ""


def _section_of(stmt: ast.stmt) -> int:
    return _section(_module_of(stmt), getattr(stmt, "level", 0))


def _section(module: str, level: int) -> int:
    """isort's section: __future__, standard library, third party, first party (sglang), relative."""
    top = module.split(".")[0]
    if level:
        return LOCAL_FOLDER
    if module == "__future__":
        return FUTURE
    if top == FIRST_PARTY_PACKAGE:
        return FIRST_PARTY
    if top in sys.stdlib_module_names:
        return STDLIB
    return THIRD_PARTY


def _key_of(stmt: ast.stmt) -> tuple:
    return _statement_key(isinstance(stmt, ast.ImportFrom), _module_of(stmt))


def _statement_key(is_from: bool, module: str) -> tuple:
    """isort's order in a section: ``import x`` lines first, then ``from x import``, by module name."""
    return is_from, _natural(module.lower())


def _name_key(name: str) -> list:
    """isort's order of names (order_by_type): CONSTANTS, then Classes, then functions, case-insensitively."""
    if name.isupper() and len(name) > 1:
        kind = "A"
    elif name[:1].isupper():
        kind = "B"
    else:
        kind = "C"
    return _natural(kind + name.lower())


def _natural(text: str) -> list:
    """isort's natural order: runs of digits compare as numbers."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def _dotted(module: str) -> "cst.BaseExpression":
    import libcst as cst

    node: cst.BaseExpression = cst.Name(module.split(".")[0])
    for part in module.split(".")[1:]:
        node = cst.Attribute(value=node, attr=cst.Name(part))
    return node


def _render(node: "cst.CSTNode", newline: str) -> str:
    import libcst as cst

    return cst.Module([], default_newline=newline).code_for_node(node)


def _lines(code: str) -> list[str]:
    """The lines of ``code`` as Python counts them (``\\n``, ``\\r\\n`` or ``\\r``), with their ends."""
    return io.StringIO(code, newline="").readlines()


def _newline(code: str) -> str:
    found = re.search(r"\r\n|\r|\n", code)
    return found.group() if found else "\n"

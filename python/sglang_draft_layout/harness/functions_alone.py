"""A module's code with its branch recording (``branches.with_branches``), its functions holding an ``if`` to record
parsed alone: the tool's compiling (``judged.compiled``), not embedded in the written test, which parses the module.
"""

from __future__ import annotations

import __future__
import ast
import copy
import dis
import functools
import inspect
import types
from typing import Callable, Iterator, Optional

from .branches import with_branches


#: the compiler flags of ``from __future__`` statements, which a module's code keeps in its own flags
FUTURES = functools.reduce(
    int.__or__, (getattr(__future__, name).compiler_flag for name in __future__.all_feature_names)
)


def code_with_branches(
    code: types.CodeType,
    text: str,
    filename: str,
    ordering: list[int],
    parsed_class: Callable[[types.CodeType], Optional[ast.ClassDef]] = lambda cls: None,
) -> Optional[types.CodeType]:
    """``code`` (``text`` compiled) as ``with_branches`` would have it, the module not parsed: each top-level function
    and method of a top-level class whose lines hold one of ``ordering`` (``ordering_lines``) parsed alone at its lines
    (``_function_alone``; a method taken from its class statement where ``parsed_class`` has it parsed already) and,
    where it has an ``if`` to record, compiled again in its place; None (parse the module) where such a line lies
    outside those functions or a function parsed alone does not compile as in the module."""
    lines = text.split("\n")  # split as Python numbers lines (a form feed ends none)
    ends, replaced, indents, imported = {}, {}, {}, None
    for line in ordering:
        found = _function_at(code, line)
        if found is None:
            return None
        cls, function = found
        if id(function) not in ends:
            alone = _method_of(parsed_class(cls), cls, function, lines) if cls is not None else None
            if alone is None:
                alone = _function_alone(cls, function, lines, filename, indents)
            if alone is None:
                return None
            ends[id(function)], module = alone
            with_ifs = with_branches(module, text, filename, ordering)
            if with_ifs is not module:
                imported = _imported(code) if imported is None else imported
                plain, new = (
                    _defined(_compiled(m, imported, filename, code), cls, function) for m in (module, with_ifs)
                )
                if plain != function:
                    return None
                replaced[id(function)] = new
        if line > ends[id(function)]:
            return None
    return _replaced(code, replaced) if replaced else code


def _function_at(code: types.CodeType, line: int) -> Optional[tuple[Optional[types.CodeType], types.CodeType]]:
    """The top-level function (class None) or method of a top-level class (its body's code) of the module's ``code``
    starting last at or before ``line``."""
    outer = _defined_before(code, line)
    if outer is None or outer.co_flags & inspect.CO_NEWLOCALS:
        return outer and (None, outer)
    function = _defined_before(outer, line)  # in a class body
    return (outer, function) if function is not None and function.co_flags & inspect.CO_NEWLOCALS else None


def _defined_before(code: types.CodeType, line: int) -> Optional[types.CodeType]:
    """The function or class body defined last in ``code``'s body at or before ``line``."""
    defined = [c for c in code.co_consts if isinstance(c, types.CodeType) and c.co_name.isidentifier()]
    return max((c for c in defined if c.co_firstlineno <= line), key=lambda c: c.co_firstlineno, default=None)


def _function_alone(
    cls: Optional[types.CodeType], function: types.CodeType, lines: list[str], filename: str, indents: dict
) -> Optional[tuple[int, ast.Module]]:
    """The last line of ``function``'s statement and of the comment lines after it (``_end``), and the tree of that text
    parsed at its lines (a method under a ``class`` line of its class's name); None where the function is not a
    statement of the module's body or of a top-level class's (it is indented under another statement), or its text
    does not parse as that statement alone."""
    first = function.co_firstlineno
    if _indent(lines[(cls or function).co_firstlineno - 1]) != 0:
        return None
    if cls is not None and _indent(lines[first - 1]) != _least_indent(cls, first, lines, indents):
        return None
    end = _end(function, lines)
    head = "\n" * (first - 1) if cls is None else "\n" * (first - 2) + f"class {cls.co_name}:\n"
    try:
        module = ast.parse(head + "\n".join(lines[first - 1 : end]), filename)
    except SyntaxError:
        return None
    statement = module.body[0] if len(module.body) == 1 else None
    if cls is not None:
        if not isinstance(statement, ast.ClassDef) or statement.name != cls.co_name or len(statement.body) != 1:
            return None
        statement = statement.body[0]
    if not isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)) or statement.name != function.co_name:
        return None
    return end, module


def _method_of(
    statement: Optional[ast.ClassDef], cls: types.CodeType, function: types.CodeType, lines: list[str]
) -> Optional[tuple[int, ast.Module]]:
    """``_function_alone``'s answer read off the class statement of ``cls`` parsed already: ``function``'s statement
    in its body (its first line, a decorator's or its own, ``function``'s), the class holding it alone."""
    for node in statement.body if statement is not None else ():
        if (
            isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.name == function.co_name
            and min([node.lineno, *(d.lineno for d in node.decorator_list)]) == function.co_firstlineno
        ):
            alone = copy.copy(statement)  # the statement read, never changed
            alone.body = [node]
            return _end(function, lines), ast.Module(body=[alone], type_ignores=[])
    return None


def _least_indent(cls: types.CodeType, last: int, lines: list[str], indents: dict) -> int:
    """The least indent of a code line of the class ``cls`` (its header's, at the margin, aside) up to line ``last``,
    later lines than any asked before read on from where ``indents`` (by class) left off: the indent of its statements
    where a method at ``last`` has it (none is indented less)."""
    read, least = indents.get(id(cls), (cls.co_firstlineno, 0))
    for text in lines[read:last]:
        if _is_code(text) and _indent(text) and (not least or _indent(text) < least):
            least = _indent(text)
    indents[id(cls)] = (max(read, last), least)
    return least


def _end(function: types.CodeType, lines: list[str]) -> int:
    """The line before the first code line after ``function``'s code indented no more than its first line."""
    indent, end = _indent(lines[function.co_firstlineno - 1]), max(code_lines(function))
    while end < len(lines) and not (_is_code(lines[end]) and _indent(lines[end]) <= indent):
        end += 1
    return end


def _indent(text: str) -> int:
    return len(text) - len(text.lstrip())


def _is_code(text: str) -> bool:
    """Whether a line starts code: not blank, not a comment, not closing a bracket."""
    return text.strip()[:1] not in ("", "#", ")", "]", "}")


def _imported(code: types.CodeType) -> list[str]:
    """The names the module's ``code`` binds by importing (``import a.b``, ``from a import b as c``): the compiler looks
    them up (a method called on one is loaded as an attribute)."""
    names, importing = [], False
    for instruction in dis.get_instructions(code):
        if importing and instruction.opname in ("STORE_NAME", "STORE_GLOBAL"):
            names.append(instruction.argval)
        importing = instruction.opname in ("IMPORT_NAME", "IMPORT_FROM")
    return list(dict.fromkeys(names))


def _compiled(module: ast.Module, imported: list[str], filename: str, code: types.CodeType) -> types.CodeType:
    """``module`` compiled after an import of each of the ``imported`` names, with the ``from __future__`` flags of the
    module's ``code``."""
    where = {"lineno": 1, "col_offset": 0, "end_lineno": 1, "end_col_offset": 0}
    imports = [ast.Import([ast.alias(name, **where) for name in imported], **where)] if imported else []
    return compile(
        ast.Module([*imports, *module.body], []), filename, "exec", code.co_flags & FUTURES, dont_inherit=True
    )


def _defined(code: types.CodeType, cls: Optional[types.CodeType], function: types.CodeType) -> Optional[types.CodeType]:
    """The code of ``function`` (of class ``cls``) in ``code``, compiled from ``_function_alone``'s tree."""
    for name in (cls.co_name, function.co_name) if cls is not None else (function.co_name,):
        code = next((c for c in code.co_consts if isinstance(c, types.CodeType) and c.co_name == name), None)
        if code is None:
            return None
    return code if _qualname(code) == _qualname(function) else None


def _qualname(code: types.CodeType) -> str:
    return getattr(code, "co_qualname", code.co_name)  # Python 3.10 has none: the code's equality decides


def _replaced(code: types.CodeType, replaced: dict[int, types.CodeType]) -> types.CodeType:
    """``code`` with each function in its constants, and in its class bodies', replaced where ``replaced`` has its
    id."""
    consts = tuple(
        _replaced(c, replaced) if isinstance(c, types.CodeType) and not c.co_flags & inspect.CO_NEWLOCALS
        else replaced.get(id(c), c)
        for c in code.co_consts
    )  # fmt: skip
    return code if all(new is old for new, old in zip(consts, code.co_consts)) else code.replace(co_consts=consts)


def code_lines(code: types.CodeType) -> Iterator[int]:
    """The line of every instruction of ``code`` and of the code nested in it."""
    yield from (line for _start, _end, line in code.co_lines() if line is not None)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from code_lines(const)

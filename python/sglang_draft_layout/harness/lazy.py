"""A module's code with its functions compiled when first called (the tool's compiling, ``judged.compiled``; not
embedded in the written test, which compiles each module whole).

Parsing is most of compiling, and a path runs few of a module's functions. Each top-level function and each method
of a top-level class whose body starts on a line of its own, and is neither ``async`` nor a generator, is compiled
as a stub: its ``def`` (with what it evaluates: decorators, defaults, annotations) at its lines, the body a call of
``HOOK``, which compiles the function from its own lines (``with_branches`` where one of them may order against a
number: each ordering line must lie in such a body, else the module is compiled whole) and runs it. The cuts are read
off the text with its strings and comments masked; a function compiled alone must be the one statement of its lines,
with the stub's name, first line and parameters, else it is taken from the module compiled whole.
"""

from __future__ import annotations

import __future__
import ast
import bisect
import dis
import functools
import itertools
import operator
import re
import sys
import types
from dataclasses import dataclass
from typing import Any, Optional

from .branches import with_branches
from .world import compile_module

#: the name each stub calls (``Tree.builtins``): ``HOOK(key, __class__ or None)``
HOOK = "__sglang_draft_layout_lazy__"
#: the compiler flags of ``from __future__`` statements, which a module's code keeps in its own flags
FUTURES = functools.reduce(
    int.__or__, (getattr(__future__, name).compiler_flag for name in __future__.all_feature_names)
)
_VARARGS, _VARKEYWORDS = 0x04, 0x08
_IMPORTS = {dis.opmap["IMPORT_NAME"], dis.opmap["IMPORT_FROM"]}
_STORES = {dis.opmap["STORE_NAME"], dis.opmap["STORE_GLOBAL"]}
_CACHE = dis.opmap.get("CACHE")  # Python 3.11 on: the inline cache units after an instruction
#: a comment or a string, as Python's tokenizer reads them (a prefix changes neither's extent)
_TOKEN = re.compile(
    r"#[^\n]*"
    r"|'''[^'\\]*(?:(?:\\.|'(?!''))[^'\\]*)*'''"
    r'|"""[^"\\]*(?:(?:\\.|"(?!""))[^"\\]*)*"""'
    r"|'[^'\\\n]*(?:\\.[^'\\\n]*)*'"
    r'|"[^"\\\n]*(?:\\.[^"\\\n]*)*"',
    re.DOTALL,
)
_TABS = re.compile(r"^ *[\t\f]", re.MULTILINE)
#: a line starting code at the margin, in the masked text (a string's inside is NUL); one indented 1 to 4 (a class body's)
#: (each after its newline: a search for a literal is fast)
_TOP_LINE = re.compile(r"\n[^\s\x00]")
_CLASS_LINE = re.compile(r"\n {1,4}[^\s\x00]")
#: what a ``def`` header's end is found by: its brackets and colons
_HEADER = re.compile(r"[()\[\]{}:]")
_DEF = re.compile(r"def[ \t]+(\w+)")
_CLASS = re.compile(r"class[ \t]+(\w+)")
#: the words that make a function a generator, and those that give its code the class cell
_YIELD, _CLASS_CELL = ("yield",), ("super", "__class__")


@dataclass(frozen=True)
class Lazy:
    """A function compiled when first called: the module ``text`` it is in, its class (None: top-level), the last
    line of its statement, the ordering lines in it and the module's code (with stubs)."""

    text: str
    filename: str
    cls: Optional[str]
    last: int
    ordering: tuple[int, ...]
    module: types.CodeType


#: each stub's function, by its key (an index); the code each is compiled to, once a process
_LAZY: list[Lazy] = []
_CODE: dict[int, types.CodeType] = {}
#: the stub functions of each key whose code is not compiled yet (``bind``)
_STUBS: dict[int, list[types.FunctionType]] = {}


def _mask(match: re.Match) -> str:
    """A comment as spaces, a string as its opening quote and NULs, each line kept."""
    token = match.group()
    if token[0] == "#":
        return " " * len(token)
    if "\n" not in token:
        return token[0] + "\x00" * (len(token) - 1)
    return token[0] + "\n".join("\x00" * len(line) for line in token[1:].split("\n"))


def lazy_code(text: str, filename: str, ordering: list[int]) -> Optional[types.CodeType]:
    """``text``'s code with its functions as stubs (``HOOK``); None where one of ``ordering``'s lines (1-based) lies
    outside a stub's body, an indent holds a tab, or the text with stubs does not compile."""
    masked = _TOKEN.sub(_mask, text)
    if ("\t" in masked or "\f" in masked) and _TABS.search(masked):
        return None
    lines = masked.split("\n")
    firsts = list(map(operator.add, itertools.accumulate(map(len, lines), initial=0), range(len(lines))))
    generators, cells = _words(masked, _YIELD), _words(masked, _CLASS_CELL)
    cuts = []  # (the header's last line, its colon's offset, the body's last line, class, reads __class__), 0-based
    top = _statement_starts(masked, firsts, _TOP_LINE, 0, len(masked))
    for (n, _indent), stop in zip(top, [*(m for m, _indent in top[1:]), len(lines)]):
        name = _CLASS.match(lines[n])
        if _DEF.match(lines[n]):
            cuts.append(_cut(masked, firsts, generators, cells, firsts[n], stop, None))
        elif name is not None:
            heads = _statement_starts(
                masked, firsts, _CLASS_LINE, firsts[n], firsts[stop] if stop < len(lines) else len(masked)
            )
            inner = heads[0][1] if heads else 0
            for (m, indent), next_head in zip(heads, [*(m for m, _indent in heads[1:]), stop]):
                if indent == inner and _DEF.match(lines[m], inner):
                    cuts.append(_cut(masked, firsts, generators, cells, firsts[m] + inner, next_head, name.group(1)))
    cuts = [cut for cut in cuts if cut is not None]
    bodies = [(header + 2, last + 1) for header, _colon, last, _cls, _cell in cuts]  # 1-based, in order
    if not all(_in_body(bodies, line) for line in ordering):
        return None
    stubbed, key = text.split("\n"), len(_LAZY)
    for offset, (header, colon, last, _cls, cell) in enumerate(cuts):
        stubbed[header] = text[firsts[header] : colon + 1] + f" return {HOOK}({key + offset}, {cell})"
        stubbed[header + 1 : last + 1] = [""] * (last - header)
    try:
        code = compile("\n".join(stubbed), filename, "exec", dont_inherit=True)
    except SyntaxError:
        return None
    for (first, last), (_header, _colon, _last, cls, _cell) in zip(bodies, cuts):
        mine = tuple(line for line in ordering if first <= line <= last)
        _LAZY.append(Lazy(text, filename, cls, last, mine, code))
    return code


def _in_body(bodies: list[tuple[int, int]], line: int) -> bool:
    at = bisect.bisect_right(bodies, (line, float("inf"))) - 1
    return at >= 0 and bodies[at][0] <= line <= bodies[at][1]


def _statement_starts(
    masked: str, firsts: list[int], pattern: re.Pattern, start: int, end: int
) -> list[tuple[int, int]]:
    """(0-based line, indent) of each line ``pattern`` matches in ``masked[start:end]`` that starts a statement: code,
    outside brackets, not continuing a line (``firsts``: the offset of each line)."""
    found, depth, at = [], 0, start
    if (
        start == 0 and masked[:1] not in ("", "\x00") and not masked[0].isspace()
    ):  # the first line: no newline starts it
        found.append((0, 0))
    for match in pattern.finditer(masked, start, end):
        place = match.start() + 1
        segment = masked[at:place]
        depth += segment.count("(") + segment.count("[") + segment.count("{")
        depth -= segment.count(")") + segment.count("]") + segment.count("}")
        at = place
        if depth == 0 and not (place >= 2 and masked[place - 2] == "\\"):
            found.append((bisect.bisect_right(firsts, place) - 1, match.end() - place - 1))
    return found


def _words(masked: str, words: tuple[str, ...]) -> list[int]:
    """The offsets of ``words`` standing alone (not part of a longer name) in ``masked``, in order."""
    found = []
    for word in words:
        at = masked.find(word)
        while at >= 0:
            end = at + len(word)
            if not (
                masked[at - 1 : at].isidentifier()
                or masked[end : end + 1].isidentifier()
                or masked[end : end + 1].isdigit()
            ):
                found.append(at)
            at = masked.find(word, end)
    return sorted(found)


def _cut(
    masked: str, firsts: list[int], generators: list[int], cells: list[int], at: int, stop: int, cls: Optional[str]
) -> Optional[tuple[int, int, int, Optional[str], Optional[str]]]:
    """The cut of the ``def`` at offset ``at``, its statement ending before line ``stop``: (the header's last line,
    its colon's offset, the body's last line, cls, "__class__" where the body reads it, else None); None where the
    body shares the header's line, the function is a generator, or a top-level function reads ``__class__``."""
    depth, colon = 0, -1
    for token in _HEADER.finditer(masked, at):
        mark = token.group()
        if mark == ":" and not depth:
            colon = token.start()
            break
        depth += mark in "([{" or -(mark in ")]}")
    header = bisect.bisect_right(firsts, colon) - 1
    if colon < 0 or header >= stop - 1 or masked[colon + 1 : firsts[header + 1] - 1].strip():
        return None
    body = (firsts[header + 1], firsts[stop] if stop < len(firsts) else len(masked))
    if _within(generators, *body) or (cls is None and _within(cells, *body)):
        return None
    return header, colon, stop - 1, cls, "__class__" if _within(cells, *body) else None


def _within(offsets: list[int], start: int, end: int) -> bool:
    at = bisect.bisect_left(offsets, start)
    return at < len(offsets) and offsets[at] < end


def call(key: int, cls: Optional[type]) -> Any:
    """``HOOK``: the function of stub ``key`` (of class ``cls`` where it reads ``__class__``), called with the
    stub's arguments."""
    frame = sys._getframe(1)
    stub, values = frame.f_code, frame.f_locals
    code = _CODE.get(key)
    if code is None:
        code = _CODE[key] = _compiled(key, stub)
        for function in _STUBS.pop(key, ()):
            _swap(function, code)
    closure = (types.CellType(cls),) if code.co_freevars else None
    function = types.FunctionType(code, frame.f_globals, stub.co_name, None, closure)
    names, count, kwonly = stub.co_varnames, stub.co_argcount, stub.co_kwonlyargcount
    args = [values[name] for name in names[:count]]
    kwargs = {name: values[name] for name in names[count : count + kwonly]}
    rest = count + kwonly
    if stub.co_flags & _VARARGS:
        args += values[names[rest]]
        rest += 1
    if stub.co_flags & _VARKEYWORDS:
        kwargs.update(values[names[rest]])
    return function(*args, **kwargs)


def bind(namespace: dict) -> None:
    """Note the stub functions of a module's ``namespace`` (its functions, its classes' methods, properties' and
    wrappers' functions): each takes its function's code once compiled, and is called without ``HOOK`` after."""
    todo, seen = list(namespace.values()), set()
    while todo:
        value = todo.pop()
        if id(value) in seen:
            continue
        seen.add(id(value))
        if isinstance(value, type) and value.__module__ == namespace.get("__name__"):
            todo += vars(value).values()
        elif isinstance(value, (staticmethod, classmethod)):
            todo.append(value.__func__)
        elif isinstance(value, property):
            todo += [value.fget, value.fset, value.fdel]
        elif isinstance(value, types.FunctionType):
            if HOOK in value.__code__.co_names:
                key = next(c for c in value.__code__.co_consts if type(c) is int)
                if key in _CODE:
                    _swap(value, _CODE[key])
                else:
                    _STUBS.setdefault(key, []).append(value)
            wrapped = value.__dict__.get("__wrapped__")
            if wrapped is not None:
                todo.append(wrapped)


def _swap(function: types.FunctionType, code: types.CodeType) -> None:
    """``function`` (a stub) runs ``code`` from now on, where its closure fits it."""
    if len(function.__closure__ or ()) == len(code.co_freevars):
        function.__code__ = code


@functools.lru_cache(maxsize=8)
def _lines(text: str) -> list[str]:
    return text.split("\n")


def _compiled(key: int, stub: types.CodeType) -> types.CodeType:
    """The code of stub ``key``'s function: its lines compiled alone (after the module's imports, which the
    compiler reads: a method called on a module imported is an attribute called), with its ``if``s recorded."""
    lazy = _LAZY[key]
    first, alone = stub.co_firstlineno, None
    head = ["\n"] * (first - 1 - bool(lazy.cls)) + ([f"class {lazy.cls}:\n"] if lazy.cls else [])
    imported = _imported(lazy.module)
    if imported and head and head[0] == "\n":  # a blank line to hold them (the function's lines keep their numbers)
        head[0] = f"import {', '.join(imported)}\n"
    text = "".join(head) + "\n".join(_lines(lazy.text)[first - 1 : lazy.last])
    try:
        if lazy.ordering:
            module: Any = with_branches(ast.parse(text, lazy.filename), text, lazy.filename, list(lazy.ordering))
        else:
            module = text
        futures = lazy.module.co_flags & FUTURES
        alone = _defined(compile(module, lazy.filename, "exec", futures, dont_inherit=True), lazy.cls, stub)
    except SyntaxError:
        pass
    if alone is None or _header(alone) != _header(stub):
        alone = _from_whole(lazy, stub)
    return alone


@functools.lru_cache(maxsize=32)
def _imported(code: types.CodeType) -> tuple[str, ...]:
    """The names the module's ``code`` binds by importing (``import a.b``, ``from a import b as c``): each store of a
    name right after an import, read off the bytecode (inline cache units skipped, an argument past 255 held by the
    ``EXTENDED_ARG`` units before it)."""
    names, importing, extended, raw = [], False, 0, code.co_code
    for at in range(0, len(raw), 2):
        op, arg = raw[at], raw[at + 1] | extended
        extended = arg << 8 if op == dis.EXTENDED_ARG else 0
        if op == dis.EXTENDED_ARG or op == _CACHE:
            continue
        if importing and op in _STORES:
            names.append(code.co_names[arg])
        importing = op in _IMPORTS
    return tuple(dict.fromkeys(names))


def _defined(code: types.CodeType, cls: Optional[str], stub: types.CodeType) -> Optional[types.CodeType]:
    """The one function of ``stub``'s name in ``code`` (a module of one statement: the class ``cls`` holding it, or
    the function), else None."""
    for name in (cls, stub.co_name) if cls else (stub.co_name,):
        found = [c for c in code.co_consts if isinstance(c, types.CodeType) and c.co_name == name]
        if len(found) != 1:
            return None
        code = found[0]
    return code


def _qualname(code: Any) -> str:
    """``code``'s qualified name (Python 3.11 on), or its name (3.10, whose code objects keep none)."""
    return getattr(code, "co_qualname", code.co_name)


def _header(code: types.CodeType) -> tuple:
    count = code.co_argcount + code.co_kwonlyargcount + bool(code.co_flags & _VARARGS)
    count += bool(code.co_flags & _VARKEYWORDS)
    return (_qualname(code), code.co_firstlineno, code.co_posonlyargcount, code.co_argcount,
            code.co_kwonlyargcount, code.co_flags & (_VARARGS | _VARKEYWORDS), code.co_varnames[:count])  # fmt: skip


def _from_whole(lazy: Lazy, stub: types.CodeType) -> types.CodeType:
    """``stub``'s function as the module compiled whole has it (``world.compile_module``)."""
    todo = [compile_module(lazy.text, lazy.filename)]
    while todo:
        code = todo.pop()
        if _qualname(code) == _qualname(stub) and code.co_firstlineno == stub.co_firstlineno:
            return code
        todo += [c for c in code.co_consts if isinstance(c, types.CodeType)]
    raise RuntimeError(f"{lazy.filename}:{stub.co_firstlineno}: no function {_qualname(stub)} in the module")

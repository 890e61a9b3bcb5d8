"""harness/lazy.py: a module's functions compiled when first called, each the code the module compiled whole has.

The cuts are read off the text with strings and comments masked; what a stub cannot stand for (a generator, an
``async def``, a body on the header's line, a nested class's method) is compiled with the module; an ordering line
outside a stub's body has the module compiled whole; a function whose lines do not compile alone as the stub's is
taken from the module compiled whole.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import inspect
import types

import pytest

from sglang_draft_layout.harness import lazy
from sglang_draft_layout.harness.branches import BRANCH, Branches, ordering_lines, with_branches
from sglang_draft_layout.harness.unknown import Run

MODULE = '''\
from __future__ import annotations

import torch
from os import path as osp

LIMIT = 1 << 20  # a module's line: no if


def kernel_source(bs):
    """A kernel's text, at the margin inside the string:
class NotAClass:
def not_a_function():
    """
    code = """
def kernel(x):
    return x
"""
    total = (bs +
1)  # a bracket continued at the margin
    more = bs + \\
    1
    if bs > 16:
        return code, "many", total, more
    return code, "few", total, more


class Backend:
    """Up to 16 rows (a docstring's line)."""

    ROWS = 16

    def __init__(self, num_seqs: int, *, topk: int = 1) -> None:
        self.rows = torch.empty(num_seqs) if num_seqs > 1 else None  # torch: an imported name's attribute
        self.topk = topk
        if num_seqs <= 12:
            self.small = osp.join("a", str(num_seqs))
        # more than 4: a comment after its last line

    @staticmethod
    def width(bs, /, topk=2, *steps, scale=1, **extra):
        return (bs * topk + sum(steps)) * scale, sorted(extra)

    @property
    def area(self):
        return self.topk * 2

    def one_line(self): return "one"

    def steps(self, n):
        for i in range(n):
            yield i

    async def later(self):
        return 1

    class Inner:
        def f(self):
            return "inner"

    def __repr__(self):
        return "Backend(" + super().__repr__()[:0] + ")"


class Child(Backend):
    def __init__(self, num_seqs):
        super().__init__(num_seqs, topk=3)


def helper(bs):
    def inner(n: int) -> bool:
        return n >= 8

    if bs > 16 and inner(bs):
        return [bs, bs]
    return [bs]
'''


def _namespace(code: types.CodeType, branches: Branches) -> dict:
    hooks = {BRANCH: branches, lazy.HOOK: lazy.call}
    namespace = {"__builtins__": {**builtins.__dict__, **hooks}, "__name__": "m"}
    exec(code, namespace)
    return namespace


def _whole(text: str) -> types.CodeType:
    return compile(with_branches(ast.parse(text), text, "m.py"), "m.py", "exec", dont_inherit=True)


def _codes(code: types.CodeType):
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)


def _run(namespace: dict) -> list:
    backend, child = namespace["Backend"](20, topk=2), namespace["Child"](3)
    return [
        namespace["kernel_source"](20),
        namespace["kernel_source"](2),
        namespace["helper"](20),
        backend.small if hasattr(backend, "small") else None,
        child.topk,
        child.small,
        namespace["Backend"].width(3, 4, 5, 6, scale=2, b=1, a=2),
        child.area,
        backend.one_line(),
        list(backend.steps(3)),
        inspect.iscoroutinefunction(namespace["Backend"].later),
        namespace["Backend"].Inner().f(),
        repr(child),
    ]


def test_a_module_compiled_lazily_runs_as_the_module_compiled_whole():
    code = lazy.lazy_code(MODULE, "m.py", ordering_lines(MODULE))
    assert code is not None
    stubs = {c.co_qualname for c in _codes(code) if lazy.HOOK in c.co_names}
    assert stubs == {
        "kernel_source", "Backend.__init__", "Backend.width", "Backend.area", "Backend.__repr__", "Child.__init__",
        "helper",
    }  # fmt: skip
    lazily, whole = Branches(), Branches()
    with Run():
        assert _run(_namespace(code, lazily)) == _run(_namespace(_whole(MODULE), whole))
    assert lazily.ways == whole.ways and len(whole.ways) == 3  # the ifs recorded: kernel_source's, __init__'s, helper's


def test_each_function_compiled_alone_is_the_code_the_module_compiled_whole_has():
    """With the module's ``from __future__`` flags and its imported names (the compiler calls a method of an
    imported module as an attribute), each ``if`` recorded as ``with_branches`` records it."""
    code = lazy.lazy_code(MODULE, "m.py", ordering_lines(MODULE))
    whole = {(c.co_qualname, c.co_firstlineno): c for c in _codes(_whole(MODULE))}
    stubs = [c for c in _codes(code) if lazy.HOOK in c.co_names]
    for stub in stubs:
        key = next(c for c in stub.co_consts if type(c) is int)
        assert lazy._compiled(key, stub) == whole[(stub.co_qualname, stub.co_firstlineno)]
    assert len(stubs) == 7


def test_a_stub_called_passes_its_arguments_and_takes_its_functions_code_once_bound():
    code = lazy.lazy_code(MODULE, "m.py", ordering_lines(MODULE))
    namespace = _namespace(code, Branches())
    width = namespace["Backend"].width
    assert lazy.HOOK in width.__code__.co_names
    assert width(1, 2, 3, scale=3, z=0) == ((1 * 2 + 3) * 3, ["z"])  # through the hook, unbound
    assert lazy.HOOK in width.__code__.co_names
    lazy.bind(namespace)
    repr(namespace["Child"](2))  # Child.__init__ reads __class__ (super()), so does Backend.__repr__
    assert width(2) == (4, [])
    for function in (width, namespace["Child"].__init__, namespace["Backend"].__repr__, namespace["Backend"].__init__):
        assert lazy.HOOK not in function.__code__.co_names, function
    assert lazy.HOOK in namespace["helper"].__code__.co_names  # not called yet
    assert inspect.signature(namespace["helper"]).parameters.keys() == {"bs"}


def test_a_function_whose_lines_do_not_compile_alone_as_its_stub_is_taken_from_the_module_compiled_whole(monkeypatch):
    code = lazy.lazy_code(MODULE, "m.py", ordering_lines(MODULE))
    stub = next(c for c in _codes(code) if c.co_qualname == "kernel_source")
    key = next(c for c in stub.co_consts if type(c) is int)
    inside = MODULE.split("\n").index("def kernel(x):") + 1  # a line inside a string: a cut there does not compile
    lazy._LAZY[key] = dataclasses.replace(lazy._LAZY[key], last=inside)
    taken = []
    monkeypatch.setattr(lazy, "_from_whole", lambda *args: taken.append(args) or _from_whole(*args))
    whole = {(c.co_qualname, c.co_firstlineno): c for c in _codes(_whole(MODULE))}
    assert lazy._compiled(key, stub) == whole[("kernel_source", stub.co_firstlineno)] and len(taken) == 1


_from_whole = lazy._from_whole


@pytest.mark.parametrize(
    "text",
    [
        "import sys\nif sys.maxsize > 16:\n    X = 1\n\n\ndef f(n):\n    return n\n",  # a module's if
        "class A:\n    ROWS = 4 if LIMIT > 16 else 2\n\n    def f(self):\n        return 1\n",  # a class body's
        "def f(n):\n    def g():\n        return 1\n    return [i for i in range(n) if i > 4]\n\n\nclass A:\n    pass\n"
        "\n\ndef h(x=8 if BIG > 16 else 1):\n    return x\n",  # a header's
        "class A:\n    def f(self, n):\n        for i in range(n):\n            if i > 4:\n                yield i\n",
        "def f(n):\n\tif n > 4:\n\t\treturn n\n",  # a tab
        "import sys\nif sys:\n    def f(n):\n        if n > 4:\n            return n\n",  # a function under an if
        "class A:\n    if True:\n        def f(self, n):\n            if n > 4:\n                return n\n",
    ],
    ids=["module", "class-body", "header", "generator", "tab", "under-an-if", "method-under-an-if"],
)
def test_an_ordering_line_outside_a_stub_body_or_a_tab_has_the_module_compiled_whole(text):
    assert ordering_lines(text)
    assert lazy.lazy_code(text, "w.py", ordering_lines(text)) is None


def test_the_names_a_module_binds_by_importing_are_read_off_its_code():
    """Read with ``dis`` (no opcode table of one Python: 3.12 has no IMPORT_STAR)."""
    source = "import os\nimport os.path as osp\nfrom json import *\nfrom sys import argv, path as p\nX = 1\n"
    assert lazy._imported(compile(source, "i.py", "exec")) == ("os", "osp", "argv", "p")


def test_an_imported_name_past_the_256th_name_is_read_too():
    """Its store follows an EXTENDED_ARG (0.5.23's ``srt/managers/scheduler.py`` binds 196 by importing)."""
    source = "".join(f"n{i} = 1\n" for i in range(300)) + "from os import path as p300\nimport sys\n"
    assert lazy._imported(compile(source, "i.py", "exec")) == ("p300", "sys")


def test_a_function_is_named_by_its_qualified_name_where_python_keeps_one_else_by_its_name():
    """Python 3.10's code objects have no ``co_qualname`` (the tool supports 3.10): the stub and its function are
    then matched by name and first line."""
    code = compile("class A:\n    def f(self):\n        pass\n", "m.py", "exec").co_consts[0].co_consts[1]
    assert lazy._qualname(code) == getattr(code, "co_qualname", "f")
    assert lazy._qualname(types.SimpleNamespace(co_name="f")) == "f"

"""Run methods of SGLang's real classes on CPU, without SGLang's import graph.

The methods' source is cut out of an unpacked release tree with ``ast`` (never copied into
this repository) and compiled into a stand-in class whose module globals the test
provides: the real Triton kernel under the interpreter, the helpers as the patch inserted
them into that tree, and stubs for the CUDA-only collaborators. The code under test is the
release's own text, patched or not.
"""

from __future__ import annotations

import __future__
import ast
import math
import sys
import types
from pathlib import Path
from typing import Iterable

#: value a guarded allocation is filled with, and its trailing guard band
GUARD_FILL = -7
GUARD = 4096


def load_methods(file: Path, class_name: str, methods: Iterable[str], namespace: dict) -> type:
    """A class holding ``methods`` of ``class_name`` as written in ``file``, run against ``namespace``."""
    text = file.read_text()
    tree = ast.parse(text)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name)
    wanted = set(methods)
    body = [
        ast.get_source_segment(text, n, padded=True)
        for n in cls.body
        if isinstance(n, ast.FunctionDef) and n.name in wanted
    ]
    found = {n.name for n in cls.body if isinstance(n, ast.FunctionDef)} & wanted
    if found != wanted:
        raise LookupError(f"{file}: {class_name} lacks {sorted(wanted - found)}")
    source = f"class {class_name}:\n" + "\n".join(body)
    code = compile(
        source, f"{file}:{class_name}", "exec", flags=__future__.annotations.compiler_flag, dont_inherit=True
    )
    exec(code, namespace)
    return namespace[class_name]


def top_level_function(file: Path, name: str, namespace: dict):
    """The top-level function ``name`` of ``file`` (e.g. a helper the patch inserted)."""
    text = file.read_text()
    node = next(n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef) and n.name == name)
    exec(
        compile(
            ast.get_source_segment(text, node),
            str(file),
            "exec",
            flags=__future__.annotations.compiler_flag,
            dont_inherit=True,
        ),
        namespace,
    )
    return namespace[name]


def guarded_torch(allocations: list):
    """``torch`` whose ``zeros``/``empty`` ignore ``device`` and put a guard band after each buffer.

    Each allocation is the front of one flat tensor filled with GUARD_FILL and GUARD
    entries longer (``zeros`` zeroes the front); ``allocations`` receives the flat tensors,
    so a write past the end shows in their tails.
    """
    import torch

    shim = types.ModuleType("torch")
    shim.__dict__.update(torch.__dict__)

    def allocate(shape, *, dtype=None, device=None, zero: bool, **_):
        shape = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
        count = math.prod(shape)
        flat = torch.full((count + GUARD,), GUARD_FILL, dtype=dtype or torch.float32)
        front = flat[:count].view(shape)
        if zero:
            front.zero_()
        allocations.append(flat)
        return front

    shim.zeros = lambda shape, **kw: allocate(shape, zero=True, **kw)
    shim.empty = lambda shape, **kw: allocate(shape, zero=False, **kw)
    return shim


def fake_sglang_module(monkeypatch, name: str, **attributes) -> None:
    """Make ``import name`` (and its parents) find a stub holding ``attributes``."""
    parts = name.split(".")
    for depth in range(1, len(parts) + 1):
        dotted = ".".join(parts[:depth])
        existing = sys.modules.get(dotted)
        module = existing if getattr(existing, "__stub__", False) else types.ModuleType(dotted)
        module.__stub__ = True
        module.__path__ = []
        monkeypatch.setitem(sys.modules, dotted, module)
    for key, value in attributes.items():
        setattr(sys.modules[name], key, value)

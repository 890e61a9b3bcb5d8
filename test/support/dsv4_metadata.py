"""SGLang's DeepSeek-V4 compression-metadata kernel, runnable on CPU, and what the DSv4 NextN
draft layer is built with, read off the release wheels.

``sglang/srt/layers/attention/dsv4/metadata_kernel.py`` imports only ``typing``, ``torch`` and
``triton``, so it is loaded as it ships, by file path out of the unpacked wheel (see
sglang_release.pristine_tree; nothing of SGLang is copied into this repository), under
``TRITON_INTERPRET=1``: ``init_compression_metadata`` (which DeepseekV4AttnBackend imports as
``_init_compression_metadata_triton``) then launches ``_init_compressed_attn_metadata_kernel``
with Triton's interpreter on CPU tensors.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

from .sglang_release import pristine_tree

METADATA_KERNEL = "sglang/srt/layers/attention/dsv4/metadata_kernel.py"
KERNEL_NAME = "_init_compressed_attn_metadata_kernel"
NEXTN_MODEL = "sglang/srt/models/deepseek_v4_nextn.py"
DSV4_MODEL = "sglang/srt/models/deepseek_v4.py"
DSV4_BACKEND = "sglang/srt/layers/attention/deepseek_v4_backend.py"
# What metadata_kernel.py may import for it to load outside SGLang.
ALLOWED_IMPORTS = {"typing", "torch", "triton", "triton.language"}


def imported_modules(text: str) -> set[str]:
    """Every module a source file imports (``import x``, ``from x import y``)."""
    found = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            found.add(node.module)
    return found


def load_metadata_module(version: str = "0.5.12") -> ModuleType:
    """sglang==version's metadata_kernel.py, its Triton kernel interpreted on CPU."""
    os.environ["TRITON_INTERPRET"] = "1"
    path = pristine_tree(version) / METADATA_KERNEL
    extra = imported_modules(path.read_text()) - ALLOWED_IMPORTS
    if extra:
        raise LookupError(f"{METADATA_KERNEL} of sglang=={version} also imports {sorted(extra)}")
    name = f"_sglang_dsv4_metadata_kernel_{version.replace('.', '_')}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[name] = module
    module = sys.modules[name]
    kernel = getattr(module, KERNEL_NAME)
    if type(kernel).__name__ != "InterpretedFunction":
        raise RuntimeError(
            f"{KERNEL_NAME} was built as {type(kernel).__name__}, not interpreted: "
            "set TRITON_INTERPRET=1 before anything imports triton"
        )
    return module


def module_constant(text: str, name: str) -> object:
    """The literal value of the module-level assignment ``name = <literal>``."""
    for node in ast.parse(text).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise LookupError(f"no module-level {name} =")


def call_keywords(text: str, callee: str) -> list[dict[str, str]]:
    """For every call of ``callee(...)``: its keyword arguments, each as source text."""
    return [
        {kw.arg: ast.unparse(kw.value) for kw in node.keywords}
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.Call) and ast.unparse(node.func) == callee
    ]


def guards_of_assignment(text: str, target: str) -> list[list[str]]:
    """For every assignment ``target = <call>`` (e.g. ``self.compressor``): the tests of the
    ``if`` statements it is nested in, innermost last, as source text."""
    found = []

    def visit(nodes: list[ast.AST], guards: list[str]) -> None:
        for node in nodes:
            if (
                isinstance(node, ast.Assign)
                and isinstance(node.value, ast.Call)
                and any(ast.unparse(t) == target for t in node.targets)
            ):
                found.append(guards)
            if isinstance(node, ast.If):
                test = ast.unparse(node.test)
                visit(node.body, guards + [test])
                visit(node.orelse, guards + [f"not ({test})"])
            else:
                visit(list(ast.iter_child_nodes(node)), guards)

    visit([ast.parse(text)], [])
    return found

"""A tree's modules, executed as Python binds them, with what lies outside the draft path unknown.

Each module of the tree that a path needs is compiled from the tree's text (or a text given in its
place: the patched tree, in memory) and executed in a namespace of its own, once. Its imports go
through ``Tree.load``: ``torch`` is the harness's torch (``tensors.Torch``, or real torch in the
written test); the standard library is itself; a name from the tree's own modules is an ``Unknown``,
except the layout helpers and the draft kernel (``OWN``), which are what the tree's module binds, and
a class used as a base, which is the tree's class; any other package is unknown.
"""

from __future__ import annotations

import ast
import builtins
import functools
import sys
import types
from pathlib import Path
from typing import Any, Callable, Optional

from .branches import BRANCH, Branches, ordering_lines, with_branches
from .unknown import (
    TREE_FILES,
    Run,
    ServerArgsDict,
    Unknown,
    batch_sizes_to_capture,
    cuda_graph_max_batch_size,
    one_gpu,
    parallel,
    server_args,
)

KERNEL = "generate_draft_decode_kv_indices"
#: the names a path calls from other modules of the tree that run as the tree defines them: the helpers, the
#: kernel, and the capacity check of later releases (``layers/attention/utils.py``)
OWN = frozenset({"per_step_draft_out_cache_loc", "draft_kv_indices_buffer_width", "draft_kv_indices_used_len", KERNEL,
                 "assert_buffer_fits"})  # fmt: skip


#: standard modules that would print: the tree's logging and warnings go nowhere
QUIET = frozenset({"logging", "warnings"})


def _quiet(*_args: Any, **_kwargs: Any) -> None:
    """The tree's ``print``."""


#: what SGLang's modules ask of the server that the run's world answers: its args, each era its own way
#: (``unknown.server_args``), the batch sizes a CUDA-graph runner captures and the largest it may
#: (``unknown.batch_sizes_to_capture``, ``unknown.cuda_graph_max_batch_size``), its parallel sizes (one GPU)
SERVER = {
    "get_global_server_args": server_args,
    "get_server_args": server_args,
    "get_spec": server_args,
    "global_server_args_dict": ServerArgsDict(),
    "get_batch_sizes_to_capture": batch_sizes_to_capture,
    "get_cuda_graph_max_batch_size": cuda_graph_max_batch_size,
    **dict.fromkeys(("get_attention_tp_size", "get_attention_cp_size", "get_attention_dp_size"), one_gpu),
    "get_parallel": parallel,
}


def _decoded(data: bytes) -> str:
    """A module's text as Python's ``open`` reads it: UTF-8, universal newlines."""
    return data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")


class Tree:
    """An SGLang tree: its ``sglang`` folder (``package``; None: only the texts ``texts`` holds) and the ``torch`` its
    code imports (``tensors.FACADE``, ``torch_backend.FACADE``); ``texts``: path under the package -> source."""

    def __init__(self, package: Optional[Path], torch: Any) -> None:
        self.package, self.torch, self.texts, self.parsed = package, torch, {}, {}
        self.namespaces: dict[str, dict] = {}
        self.names: dict[str, str] = {}  # module name -> its path under the package
        self._assigned: dict[type, frozenset[str]] = {}
        self._probe_classes: dict[type, type] = {}
        self._relative: dict[str, Optional[str]] = {}
        self.found: dict[str, bool] = {}  # path under the package -> whether the tree has it, asked without reading it
        self.scanned: set[str] = set()  # paths whose bytes were searched and lack the word asked for (``mentions``)
        self.branches = Branches()  # which way each ``if`` of its code ordering against a number went in the runs
        self.memo: dict = {}  # what the paths found out about the tree once (``paths.graph_frame``)
        self.builtins = dict(builtins.__dict__, __import__=self.load, print=_quiet, **{BRANCH: self.branches})

    def text(self, relative: str) -> Optional[str]:
        if relative not in self.texts and self.package is not None:
            self.texts[relative] = _decoded((self.package / relative).read_bytes()) if self.has(relative) else None
        return self.texts.get(relative)

    def mentions(self, relative: str, word: str) -> bool:
        """Whether the tree's module holds ``word``: its bytes searched, decoded (``text``) only where they hold it (most
        modules a path is looked for in are read for this alone)."""
        if relative not in self.texts and self.package is not None and self.has(relative):
            data = (self.package / relative).read_bytes()
            if word.encode() not in data:
                self.scanned.add(relative)
                return False
            self.texts[relative] = _decoded(data)  # its text, from the bytes at hand
        text = self.text(relative)
        return text is not None and word in text

    def has(self, relative: str) -> bool:
        """Whether the tree has ``relative`` (a text stands in for it, or the file is there), not read for it."""
        if relative in self.texts:
            return self.texts[relative] is not None
        if relative not in self.found:
            self.found[relative] = self.package is not None and (self.package / relative).is_file()
        return self.found[relative]

    def parse(self, text: str, filename: str) -> ast.Module:
        return ast.parse(text, filename)

    def compile(self, text: str, filename: str) -> types.CodeType:
        return compile_module(text, filename, self.parse)

    def syntax(self, relative: str) -> Optional[ast.Module]:
        if relative not in self.parsed:
            text = self.text(relative)
            # the file's own name: a SyntaxError names it, as Python's would (the tool reports it)
            self.parsed[relative] = self.parse(text, self.filename(relative)) if text is not None else None
        return self.parsed[relative]

    def relative(self, dotted: str) -> Optional[str]:
        """``sglang.a.b`` -> ``a/b.py`` (or ``a/b/__init__.py``), where the tree has it."""
        if dotted not in self._relative:
            stem = dotted.removeprefix("sglang.").replace(".", "/")
            candidates = (f"{stem}.py", f"{stem}/__init__.py") if dotted.startswith("sglang.") else ()
            self._relative[dotted] = next((r for r in candidates if self.has(r)), None)
        return self._relative[dotted]

    def filename(self, relative: str) -> str:
        return str(self.package / relative) if self.package is not None else f"sglang/{relative}"

    def module(self, relative: str) -> dict:
        """The module's namespace, executed once (outside any run); a statement that raises leaves the
        names it binds unknown."""
        if relative in self.namespaces:
            return self.namespaces[relative]
        dotted = "sglang." + relative.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        package = dotted if relative.endswith("__init__.py") else dotted.rpartition(".")[0]
        filename = self.filename(relative)
        module = types.ModuleType(f"{dotted} (sglang-draft-layout {id(self):x})")  # never the real one's name
        namespace = module.__dict__
        namespace.update(__package__=package, __file__=filename, __builtins__=self.builtins)
        self.namespaces[relative], self.names[module.__name__] = namespace, relative
        TREE_FILES.add(filename)
        outer, Run.current = Run.current, None
        sys.modules[module.__name__] = module  # for what runs at import (dataclasses reads it), then gone
        try:
            exec(self.compile(self.text(relative), filename), namespace)
        except Exception:
            self._statement_by_statement(self.syntax(relative), self.text(relative), filename, namespace)
        finally:
            Run.current = outer
            del sys.modules[module.__name__]
        return namespace

    def _statement_by_statement(self, tree: ast.Module, text: str, filename: str, namespace: dict) -> None:
        # each statement compiled after the module's future statements, as it was in the module
        futures = [s for s in tree.body if isinstance(s, ast.ImportFrom) and s.module == "__future__"]
        for stmt, compiled in zip(tree.body, with_branches(tree, text, filename).body):
            try:
                body = [stmt] if any(stmt is f for f in futures) else [*futures, compiled]
                code = compile(ast.Module(body=body, type_ignores=[]), filename, "exec", dont_inherit=True)
                exec(code, namespace)
            except Exception:
                for name in _bound_names(stmt):
                    namespace[name] = Unknown(name)

    def load(self, name: str, globals: Optional[dict] = None, locals: Any = None, fromlist: Any = (),
             level: int = 0) -> Any:  # fmt: skip
        """``__import__`` for the tree's modules."""
        if level:
            base = (globals or {}).get("__package__", "").rsplit(".", level - 1)[0]
            name = f"{base}.{name}" if name else base
        top = name.partition(".")[0]
        if top == "torch":
            return self.torch
        if top == "sglang":
            return ModuleView(self, name if fromlist else "sglang")
        if top in sys.stdlib_module_names and top not in QUIET:
            return Standard(builtins.__import__(name, globals, locals, fromlist, 0))
        return Unknown(name if fromlist else top)

    def probe_class(self, cls: type) -> type:
        """``cls`` as the harness builds it: its own ``__init__`` runs; an attribute that other code of the class
        assigns later (the scheduler's setup calls, CUDA-graph state) is unknown until then, any other absent."""
        if cls not in self._probe_classes:
            outer = getattr(cls, "__getattr__", None)

            def assigned() -> frozenset[str]:  # read off the class's code once asked (a worker's never is)
                return self.assigned(cls)

            def missing(instance: Any, name: str) -> Any:
                if outer is not None:
                    return outer(instance, name)
                if name.startswith("__") or name not in assigned():
                    raise AttributeError(f"{cls.__name__!r} object has no attribute {name!r}")
                value = instance.__dict__[name] = Unknown(f"self.{name}")
                return value

            names = {"__getattr__": missing, "__module__": cls.__module__, "__qualname__": cls.__qualname__,
                     "assigned": staticmethod(assigned)}  # fmt: skip
            self._probe_classes[cls] = type(cls.__name__, (cls,), names)
        return self._probe_classes[cls]

    def assigned(self, cls: type) -> frozenset[str]:
        """The attributes the tree's code of ``cls`` and its bases assigns to ``self``."""
        if cls not in self._assigned:
            stores = []
            for c in cls.__mro__:
                node = self.class_node(c)
                if node is not None:
                    stores.append(_self_stores(node))
            self._assigned[cls] = frozenset().union(*stores)
        return self._assigned[cls]

    def class_node(self, cls: type) -> Optional[ast.ClassDef]:
        """The tree's ``class`` statement of ``cls`` (the last of that name in its module)."""
        relative = self.names.get(getattr(cls, "__module__", ""))
        body = self.syntax(relative).body if relative else []
        return next((s for s in reversed(body) if isinstance(s, ast.ClassDef) and s.name == cls.__name__), None)


@functools.lru_cache(maxsize=128)
def _self_stores(node: ast.ClassDef) -> frozenset[str]:
    """The attributes the code of the class statement ``node`` assigns to ``self``: each ``self.x`` in a store
    context (what ``ast.walk`` finds, walked without its generator's cost)."""
    found, todo = set(), [node]
    while todo:
        at = todo.pop()
        if type(at) is ast.Attribute and type(at.ctx) is ast.Store and getattr(at.value, "id", "") == "self":
            found.add(at.attr)
        for field in at._fields:
            value = getattr(at, field, None)
            if type(value) is list:
                todo += [item for item in value if isinstance(item, ast.AST)]
            elif isinstance(value, ast.AST):
                todo.append(value)
    return frozenset(found)


def compile_module(
    text: str,
    filename: str,
    parse: Callable[[str, str], ast.Module] = ast.parse,
    lines: Optional[list[int]] = None,
) -> types.CodeType:
    """The code of ``text``, each ``if`` ordering against a number handing its test to ``Tree.branches``
    (``with_branches``; ``lines``: its ``ordering_lines``, where known); compiled from the text where none may (no
    ``ast`` tree made: a sixth of parsing it)."""
    lines = ordering_lines(text) if lines is None else lines
    if not lines:
        return compile(text, filename, "exec", dont_inherit=True)
    return compile(with_branches(parse(text, filename), text, filename, lines), filename, "exec", dont_inherit=True)


def _bound_names(stmt: ast.stmt) -> list[str]:
    """The names a top-level statement binds (what it would have left unknown had it raised)."""
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [stmt.name]
    names = []
    for node in ast.walk(stmt):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.append(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names += [(a.asname or a.name).partition(".")[0] for a in node.names]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
    return names


class Standard:
    """A standard module as the tree sees it: itself, except that a function handed an unknown gives an unknown
    (``os.path.exists(<server_args.speculative_token_map>)``), as the tree's own code does."""

    def __init__(self, module: types.ModuleType) -> None:
        self._module = module

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._module, name)
        if isinstance(value, types.ModuleType):
            return Standard(value)
        if not isinstance(value, (types.FunctionType, types.BuiltinFunctionType)):
            return value

        def call(*args: Any, **kwargs: Any) -> Any:
            if any(isinstance(a, Unknown) for a in (*args, *kwargs.values())):
                return Unknown(f"{self._module.__name__}.{name}")(*args, **kwargs)
            return value(*args, **kwargs)

        return call


class ModuleView:
    """A module of the tree as another module imports it: its submodules, the helpers and kernel as it
    binds them (``OWN``: an ImportError where it binds none), any other name unknown (a base: its class)."""

    def __init__(self, tree: Tree, dotted: str) -> None:
        self._tree, self._dotted = tree, dotted

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        tree, dotted = self._tree, f"{self._dotted}.{name}"
        if tree.relative(dotted) is not None:
            return ModuleView(tree, dotted)
        if name in SERVER:
            return SERVER[name]
        relative = tree.relative(self._dotted)
        if relative is None:
            return Unknown(dotted)
        if name in OWN:
            namespace = tree.module(relative)
            if name not in namespace:
                raise ImportError(f"cannot import name {name!r} from {self._dotted!r}")
            return namespace[name]
        return Unknown(dotted, resolve=lambda: tree.module(relative).get(name))

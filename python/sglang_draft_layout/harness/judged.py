"""The harness as the tool runs it, above what the written CPU test embeds (``invariant.judge_paths``).

A tree here may have texts standing in for its files (the rewrite, in memory: ``Rewritten``), each parsed and
compiled once a process. Every layout statement the rewrite wrote must run on some probe (``coverage``), else
the path cannot be judged. ``judge_tree`` judges each tree once a process (and, with a ``store``, once while
its files stay the same: the tool's ``verdict_cache``); ``verdict_of`` is a class's verdict in it.
"""

from __future__ import annotations

import ast
import difflib
import hashlib
import inspect
import re
import types
from dataclasses import replace
from pathlib import Path
from typing import Any, Collection, Mapping, Optional

from .apart import Judging
from .branches import ordering_lines
from .coverage import Lines, layout_statements
from .invariant import Verdict, guarded_modules, judge
from .lazy import HOOK, bind, call, lazy_code
from .paths import DraftPath
from .unknown import in_package
from .world import Tree, compile_module

#: text -> its tree, (file name, text) -> its code, for every tree of the process (a check judges the tree before and
#: after the rewrite: the files it does not rewrite are parsed and compiled once); the oldest let go past _TEXTS_KEPT
_PARSED: dict[str, ast.Module] = {}
_CODE: dict[tuple[str, str], types.CodeType] = {}
_TEXTS_KEPT = 128


def _remember(memo: dict, key: tuple, make: Any) -> Any:
    if key not in memo:
        if len(memo) >= _TEXTS_KEPT:
            del memo[next(iter(memo))]
        memo[key] = make()
    return memo[key]


def parsed(text: str, filename: str) -> ast.Module:
    """The tree of ``text``, parsed once a process under whichever file name it came first (callers read it, never
    change it): a class block the rules parse (``rules.base.Source.class_blocks``) is the one ``_class_statement``
    parses."""
    return _remember(_PARSED, text, lambda: ast.parse(text, filename))


def compiled(text: str, filename: str) -> types.CodeType:
    """The code of ``text`` (``world.compile_module``'s, its functions compiled when first called where they can be:
    ``lazy.lazy_code``), compiled once a process: the tree before and after its rewrite share the files not
    rewritten."""

    def compile_text() -> types.CodeType:
        lines = ordering_lines(text)
        code = lazy_code(text, filename, lines)
        return code if code is not None else compile_module(text, filename, parsed, lines)

    return _remember(_CODE, (filename, text), compile_text)


class Rewritten(Tree):
    """A tree with ``texts`` (path under the package -> source) standing in for its files (``given``)."""

    def __init__(self, package: Optional[Path], torch: Any, texts: Mapping[str, str]) -> None:
        super().__init__(package, torch)
        self.builtins[HOOK] = call
        self.texts.update(texts)
        self.given = frozenset(texts)

    def parse(self, text: str, filename: str) -> ast.Module:
        return parsed(text, filename)

    def compile(self, text: str, filename: str) -> types.CodeType:
        return compiled(text, filename)

    def module(self, relative: str) -> dict:
        """``Tree.module``, its stub functions bound (``lazy.bind``) once executed."""
        if relative in self.namespaces:
            return self.namespaces[relative]
        namespace = super().module(relative)
        bind(namespace)
        return namespace

    def class_node(self, cls: type) -> Optional[ast.ClassDef]:
        """``Tree.class_node``, the class parsed alone where it can be (``_class_statement``)."""
        relative = self.names.get(getattr(cls, "__module__", ""))
        text = self.text(relative) if relative else None
        if text is not None:
            filename = self.filename(relative)
            node = _class_statement(self.compile(text, filename), text, filename, cls.__name__)
            if node is not False:
                return node
        return super().class_node(cls)

    def rewritten(self, relative: str) -> set[int]:
        """The lines of the text standing in for ``relative`` that differ from its file (none: no text given)."""
        text, path = self.texts.get(relative), self.package / relative if self.package is not None else None
        if relative not in self.given or text is None or path is None or not path.is_file():
            return set()
        old = path.read_bytes().decode("utf-8", "replace")
        return {n + 1 for tag, _i1, _i2, j1, j2 in line_blocks(old, text) if tag != "equal" for n in range(j1, j2)}


def line_blocks(old: str, new: str) -> list[tuple[str, int, int, int, int]]:
    """``difflib``'s opcodes of ``new`` against ``old``, line by line (0-based, the whole texts'): the lines alike at
    both ends matched first, the diff only between; once a process for the same texts (the paths through a file and
    the refusals naming its lines ask again)."""
    return _remember(_BLOCKS, (old, new), lambda: _line_blocks(old, new))


_BLOCKS: dict[tuple[str, str], list[tuple[str, int, int, int, int]]] = {}


def _line_blocks(old: str, new: str) -> list[tuple[str, int, int, int, int]]:
    before, after = old.splitlines(), new.splitlines()
    same, short = 0, min(len(before), len(after))
    while same < short and before[same] == after[same]:
        same += 1
    end = 0
    while end < short - same and before[-1 - end] == after[-1 - end]:
        end += 1
    matcher = difflib.SequenceMatcher(
        None, before[same : len(before) - end], after[same : len(after) - end], autojunk=False
    )
    blocks = [("equal", 0, same, 0, same)] if same else []
    blocks += [(tag, same + i1, same + i2, same + j1, same + j2) for tag, i1, i2, j1, j2 in matcher.get_opcodes()]
    return blocks + ([("equal", len(before) - end, len(before), len(after) - end, len(after))] if end else [])


_CLASSES: dict[tuple[str, str, str], Any] = {}


#: a line that starts a top-level definition or its decorators: a file's blocks are cut at them
TOP_LEVEL_START = re.compile(r"(@|class\s|def\s|async\s+def\s)")


def _class_statement(code: types.CodeType, text: str, filename: str, name: str) -> Any:
    """The last top-level ``class name`` of ``text`` parsed alone, once per process: ``_class_block``, as the rules cut
    and parse it (``parsed``); False where that block does not parse starting with that class (the class is not at the
    margin, say): parse the module."""

    def parse() -> Any:
        bodies = [
            c for c in code.co_consts
            if isinstance(c, types.CodeType) and c.co_name == name and not c.co_flags & inspect.CO_NEWLOCALS
        ]  # fmt: skip
        if not bodies:
            return None
        try:  # at its lines
            module = parsed(_class_block(text.split("\n"), bodies[-1]), filename)
        except SyntaxError:
            return False
        if not module.body or not isinstance(module.body[0], ast.ClassDef) or module.body[0].name != name:
            return False
        return module.body[0]

    return _remember(_CLASSES, (filename, text, name), parse)


def _class_block(lines: list[str], body: types.CodeType) -> str:
    """The text of the class whose body's code is ``body`` at its lines (blank lines ahead): from that code's first
    line to the next line at the margin starting a definition other than its own (``TOP_LEVEL_START``); ``lines``:
    the module's text split at each newline, as Python numbers lines (a form feed ends none)."""
    start = body.co_firstlineno - 1
    end, decorated = len(lines), lines[start].startswith("@")
    for n in range(start + 1, len(lines)):
        if TOP_LEVEL_START.match(lines[n]):
            if not decorated:
                end = n
                break
            decorated = lines[n].startswith("@")
    return "\n" * start + "\n".join(lines[start:end]) + ("\n" if end < len(lines) else "")


def _layout_lines(tree: Rewritten, path: DraftPath) -> Lines:
    """The layout statements a rewrite wrote (``Rewritten.rewritten``) in the path's classes and their bases in
    the tree, to be traced (``coverage``): the rewrite is judged on every line of layout it wrote."""
    namespace, statements, seen = tree.module(path.module), [], set()
    for name in (path.cls, *path.per_step):
        for cls in getattr(namespace.get(name), "__mro__", ()):
            relative = tree.names.get(cls.__module__)
            if relative is not None and (relative, cls.__name__) not in seen:
                seen.add((relative, cls.__name__))
                written = tree.rewritten(relative)
                if written and (node := tree.class_node(cls)) is not None:
                    statements += layout_statements(tree.filename(relative), [node], written)
    return Lines(statements)


def judge_traced(tree: Rewritten, path: DraftPath, by_worker: Optional[DraftPath] = None) -> Verdict:
    """``invariant.judge``, each layout statement the rewrite wrote in the path's classes traced: one that no
    probe runs is a problem."""
    lines = _layout_lines(tree, path)
    verdict = judge(tree, path, by_worker, lines)
    unrun = [
        f"{in_package(s.filename)}:{s.first}: a per-step split that no probe runs "
        f"(`{s.text[:80]}`): cannot be judged"
        for s in lines.unrun()
    ]
    if not unrun or verdict.cannot:
        return verdict
    return replace(verdict, problems=tuple(dict.fromkeys((*verdict.problems, *unrun))))


#: (package, the texts judged, the modules) -> each path's verdict; the oldest of ``_KEPT`` let go
_JUDGED: dict[tuple, dict[DraftPath, Verdict]] = {}
_KEPT = 64
#: where verdicts outlive the process (the tool's ``verdict_cache``; None: judged in every process)
store: Any = None


def _key(package: Optional[Path], torch: Any, texts: Mapping[str, str], modules: Collection[str]) -> tuple:
    given = tuple(sorted((m, _digest(t)) for m, t in texts.items()))
    return str(package), getattr(torch, "__name__", type(torch).__qualname__), given, tuple(sorted(modules))


#: text -> its digest: a plan asks for the same texts' key several times
_DIGESTS: dict[str, str] = {}


def _digest(text: str) -> str:
    return _remember(_DIGESTS, text, lambda: hashlib.sha1(text.encode()).hexdigest())


#: the judgings begun (``begin_tree``) and not yet asked for, by ``judge_tree``'s key
_BEGUN: dict[tuple, Judging] = {}


def begin_tree(
    package: Optional[Path], torch: Any, texts: Mapping[str, str], modules: Collection[str], guess: tuple = ()
) -> None:
    """Begin ``judge_tree``'s judging of these paths, in a child process where it can (``apart.Judging``, with its
    ``guess``), for ``judge_tree`` to finish: the caller goes on meanwhile. ``cancel_begun`` ends those never asked
    for."""
    key = _key(package, torch, texts, modules)
    if key in _JUDGED or key in _BEGUN:
        return
    found = store.load(key, package) if store else None
    if found is not None:
        _judged(key, found)
    else:
        _BEGUN[key] = _judging(package, torch, texts, modules, guess)


def _judging(
    package: Optional[Path], torch: Any, texts: Mapping[str, str], modules: Collection[str], guess: tuple = ()
) -> Judging:
    return Judging(Rewritten(package, torch, texts), modules, judge_traced, guess)


def cancel_begun() -> None:
    while _BEGUN:
        _BEGUN.popitem()[1].cancel()


def judge_tree(
    package: Optional[Path], torch: Any, texts: Mapping[str, str], modules: Collection[str]
) -> dict[DraftPath, Verdict]:
    """Each draft path of ``modules`` (under the package; ``texts`` stand in for files) and its verdict, on
    ``torch`` (``Tree``), judged once per process for the same texts."""
    key = _key(package, torch, texts, modules)
    if key not in _JUDGED:
        found = store.load(key, package) if store and key not in _BEGUN else None
        if found is None:
            judging = _BEGUN.pop(key, None) or _judging(package, torch, texts, modules)
            found, read = judging.finish()
            if store:
                store.save(key, package, found, read)
        _judged(key, found)
    return _JUDGED[key]


def _judged(key: tuple, found: dict[DraftPath, Verdict]) -> None:
    if len(_JUDGED) >= _KEPT:
        del _JUDGED[next(iter(_JUDGED))]
    _JUDGED[key] = found


def verdict_of(
    package: Optional[Path], torch: Any, texts: Mapping[str, str], module: str, cls: str
) -> Optional[Verdict]:
    """The verdict of the path running ``cls`` of ``module`` as its own (its multi-step backend's, for a per-step
    backend), on the tree with ``texts``; None where no draft path runs it."""
    found = judge_tree(package, torch, texts, guarded_modules(package, texts))
    return next((v for p, v in found.items() if p.module == module and cls in (p.cls, *p.per_step)), None)

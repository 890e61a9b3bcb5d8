"""The CI suites a fork checkout runs, read from its own ``test/run_suite.py`` with ``ast``.

The file is never imported (it imports the fork's SGLang). Every era of upstream's file
assigns ``PER_COMMIT_SUITES`` (and ``NIGHTLY_SUITES``, later ``OTHER_SUITES``) at module
level: a dict from ``HWBackend.X`` to a list of suite names. From v0.5.10 on it also
defines ``validate_all_suites`` and calls it on every run: a test registered to a suite
not in those dicts (for a backend in ``_SUITE_CHECKED_BACKENDS``, where that set exists)
makes every CI job fail.

The suite for each written test is chosen by role (``choose_suite``), deterministically,
from the backend's per-commit list:

* CPU (the cheap CPU test): a per-commit CPU suite of the common runner, that is without a
  token naming a special runner or cadence (``arm64``, ``intel``, ``tp``, ``extra`` ...);
  staged names (``stage-a-...``, ``base-b-...``) before unstaged ones (``default``), the
  earliest stage first, then the file's order.
* CUDA (the 240 s GPU test): a per-commit suite for one GPU (``1-gpu``, ``1gpu``) that is
  small (``small``) or names no size, never ``large`` or a runner model (``h100``,
  ``b200`` ...) or a special kind (``kernel``, ``diffusion``, ``deepep``, ``extra`` ...);
  ``small`` before unsized, then a stage after the first (the first stage, ``-a-``, is
  the fast gate every PR waits on) before the first, the earliest such stage first, then
  the file's order.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional

from .target import TargetError

RUN_SUITE = Path("test") / "run_suite.py"
SUITE_DICTS = ("PER_COMMIT_SUITES", "NIGHTLY_SUITES", "OTHER_SUITES")
#: tokens of a suite name that mean a special runner, cadence or kind of test
SPECIAL_TOKENS = frozenset(
    {
        "amd",
        "npu",
        "xpu",
        "musa",
        "mlx",
        "mps",
        "mlu",
        "dcu",
        "ppu",
        "arm64",
        "intel",
        "tp",
        "nightly",
        "weekly",
        "stress",
        "full",
        "extra",
        "kernel",
        "benchmark",
        "diffusion",
        "deepep",
        "disaggregation",
        "nondeterministic",
        "perf",
        "eval",
        "acc",
        "accuracy",
        "bcg",
        "component",
        "py312",
        "mi35x",
        "h100",
        "h200",
        "h20",
        "b200",
        "b300",
        "gb200",
        "gb300",
        "5090",
        "dsv4",
        "large",
    }
)
_GPU_COUNT = re.compile(r"(?:^|-)(\d+)-?gpus?(?:-|$)")
_STAGE = re.compile(r"^[a-z]+-([a-z])-")


@dataclass(frozen=True)
class ForkSuites:
    """What a fork's run_suite.py says: its suites per backend, and whether it validates them."""

    path: Path
    per_commit: Mapping[str, tuple[str, ...]]  # backend name (CPU, CUDA, ...) -> suites
    known: Mapping[str, frozenset[str]]  # backend -> every suite of the three dicts
    validates: bool  # run_suite.py calls validate_all_suites
    checked: Optional[frozenset[str]]  # _SUITE_CHECKED_BACKENDS; None: every backend

    def rejects(self, backend: str, suite: str) -> bool:
        """Would the fork's own validate_all_suites reject a test of backend in suite?"""
        if not self.validates or (self.checked is not None and backend not in self.checked):
            return False
        return suite not in self.known.get(backend, frozenset())

    def accepts(self, backend: str, suite: str) -> bool:
        """Is suite one of the fork's for backend (in any of its suite dicts)?"""
        return suite in self.known.get(backend, frozenset())


def _backend(node: ast.AST) -> Optional[str]:
    """``HWBackend.CPU`` (or any ``Enum.NAME``) -> ``CPU``."""
    return node.attr if isinstance(node, ast.Attribute) else None


def _names(node: ast.AST) -> tuple[str, ...]:
    if not isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return ()
    return tuple(e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str))


def _assigned(tree: ast.Module, name: str) -> Optional[ast.AST]:
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in stmt.targets):
            return stmt.value
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.target.id == name:
            return stmt.value
    return None


def read_suites(root: Path) -> Optional[ForkSuites]:
    """The suites of the fork checkout at root; None when it has no test/run_suite.py."""
    path = root / RUN_SUITE
    if not path.is_file():
        return None
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    except SyntaxError as error:
        raise TargetError(
            f"{path}:{error.lineno}: not valid Python ({error.msg}), so the fork's CI suites are "
            "unknown (--no-tests leaves the tests out); nothing written"
        ) from None
    per_commit: dict[str, tuple[str, ...]] = {}
    known: dict[str, set[str]] = {}
    for dict_name in SUITE_DICTS:
        value = _assigned(tree, dict_name)
        if not isinstance(value, ast.Dict):
            continue
        for key, suites in zip(value.keys, value.values):
            backend = _backend(key) if key is not None else None
            if backend is None:
                continue
            known.setdefault(backend, set()).update(_names(suites))
            if dict_name == "PER_COMMIT_SUITES":
                per_commit[backend] = per_commit.get(backend, ()) + _names(suites)
    defined = {s.name for s in tree.body if isinstance(s, ast.FunctionDef)}
    called = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    checked_node = _assigned(tree, "_SUITE_CHECKED_BACKENDS")
    checked = None
    if isinstance(checked_node, (ast.Set, ast.List, ast.Tuple)):
        checked = frozenset(b for b in map(_backend, checked_node.elts) if b)
    return ForkSuites(
        path,
        per_commit,
        {b: frozenset(s) for b, s in known.items()},
        "validate_all_suites" in defined & called,
        checked,
    )


def _tokens(suite: str) -> list[str]:
    return suite.lower().split("-")


def _stage(suite: str) -> Optional[str]:
    found = _STAGE.match(suite.lower())
    return found.group(1) if found else None


def _cpu_key(index: int, suite: str) -> Optional[tuple]:
    if SPECIAL_TOKENS & set(_tokens(suite)) or _GPU_COUNT.search(suite.lower()):
        return None
    stage = _stage(suite)
    return (stage is None, stage or "", index)


def _cuda_key(index: int, suite: str) -> Optional[tuple]:
    tokens = _tokens(suite)
    count = _GPU_COUNT.search(suite.lower())
    if SPECIAL_TOKENS & set(tokens) or count is None or int(count.group(1)) != 1:
        return None
    stage = _stage(suite)
    return ("small" not in tokens, stage in (None, "a"), stage or "", index)


def choose_suite(suites: ForkSuites, backend: str) -> Optional[str]:
    """The per-commit suite of backend (``CPU`` or ``CUDA``) a written test goes to, by role; None if none fits."""
    key = {"CPU": _cpu_key, "CUDA": _cuda_key}[backend]
    ranked = sorted((k, s) for i, s in enumerate(suites.per_commit.get(backend, ())) if (k := key(i, s)) is not None)
    return ranked[0][1] if ranked else None

"""The test files ``apply`` writes into a fork checkout's own suite (``test/registered/``).

A fork checkout is a folder holding ``python/sglang`` and ``test/registered/``. Each file
is rendered from a template module in ``fork_templates`` (one source of its text), with
the package modules it names embedded verbatim, so the fork's CI needs nothing but the fork.
Each file is registered to a suite the fork's own ``test/run_suite.py`` runs per commit
(``fork_suites``); the CPU test is written by default, the GPU test (240 s of per-commit
GPU CI) only when asked for (``TestOptions.gpu_test``) or when the fork already has it. On a
tree with no site left to patch (upstream 0.5.13 or later, or a fork patched before) a test
not there yet is written only when asked for (``TestOptions.asks``); one there is kept up to date.
The CPU test imports the harness ``check`` runs from a module written and kept with it (``HARNESS``).
"""

from __future__ import annotations

import ast
import enum
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from .fork_suites import ForkSuites, choose_suite, read_suites
from .layout_patterns.ast_walk import parse
from .stored import StoredText
from .target import Target, TargetError

#: (path under the fork root, template module in fork_templates, what it checks)
FORK_TESTS = (
    ("test/registered/unit/speculative/test_draft_layout.py", "registered_cpu", "registered CPU test"),
    ("test/registered/spec/eagle/test_draft_layout_exact.py", "registered_gpu", "registered GPU test"),
)
#: (path under the fork root, template module, what it is) of the module the CPU test imports its harness from:
#: test support in the package, as SGLang keeps its own (``sglang.test.test_utils``), written with that test
HARNESS = ("python/sglang/test/draft_layout_harness.py", "draft_layout_harness", "the CPU test's harness")
#: template -> (the HWBackend its register call names, the CLI option naming its suite)
BACKENDS = {"registered_cpu": ("CPU", "--cpu-suite"), "registered_gpu": ("CUDA", "--cuda-suite")}
_EMBED = re.compile(r"^# sglang-draft-layout: embed ([\w.]+)\n\n*", re.MULTILINE)
#: a template's registration line: ``register_cpu_ci(est_time=25, suite="...")``
_REGISTER = re.compile(r'^(register_\w+_ci)\(est_time=(\d+), suite="([^"]*)"\)$', re.MULTILINE)


@dataclass(frozen=True)
class TestOptions:
    """What the user asked for: suite names of their own, the GPU test (naming a CUDA suite
    asks for it too), and the tests even on an up-to-date tree (``tests``: ``--tests``)."""

    cpu_suite: Optional[str] = None
    cuda_suite: Optional[str] = None
    gpu_test: bool = False
    tests: bool = False

    @property
    def asks(self) -> bool:
        """Any option naming the tests asks for them (``--tests``, a suite, the GPU test)."""
        return self.tests or self.gpu_test or self.cpu_suite is not None or self.cuda_suite is not None

    def suite_for(self, template: str) -> Optional[str]:
        return self.cpu_suite if template == "registered_cpu" else self.cuda_suite


class FileState(enum.Enum):
    TO_WRITE = "to write"
    PRESENT = "present"
    STALE = "stale"


@dataclass(frozen=True)
class GeneratedFile:
    path: Path
    what: str
    text: str
    stored: Optional[StoredText]  # the file as it is; None where it does not exist

    @property
    def old(self) -> Optional[str]:
        """The file's current text (as the rules read it); None where it does not exist."""
        return None if self.stored is None else self.stored.text

    @property
    def state(self) -> FileState:
        if self.old is None:
            return FileState.TO_WRITE
        return FileState.PRESENT if self.old == self.text else FileState.STALE


def _module_source(module: str) -> str:
    """A module's source, read from its file (not imported: a builder may need torch)."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(f"no source for {module}")
    return Path(spec.origin).read_text(encoding="utf-8")


def _split_imports(source: str) -> tuple[list[tuple[str, str, Optional[str]]], str, set[str]]:
    """((module, name or "", alias) of each top-level import, the rest of the body's text, the names
    its top-level statements define).

    A relative import's module keeps its leading dots (``..speculative``). The module's
    docstring and its top-level import statements are left out of the text.
    """
    tree = parse(source)
    lines = source.splitlines(keepends=True)
    imports: list[tuple[str, str, Optional[str]]] = []
    dropped: set[int] = set()
    for index, stmt in enumerate(tree.body):
        is_docstring = index == 0 and isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
        if isinstance(stmt, ast.Import):
            imports += [(alias.name, "", alias.asname) for alias in stmt.names]
        elif isinstance(stmt, ast.ImportFrom):
            module = "." * stmt.level + (stmt.module or "")
            imports += [(module, alias.name, alias.asname) for alias in stmt.names]
        elif not is_docstring:
            continue
        dropped.update(range(stmt.lineno - 1, stmt.end_lineno))
    body = "".join(line for number, line in enumerate(lines) if number not in dropped)
    return imports, body.strip("\n") + "\n", _defined(tree)


def _bound(tree: ast.Module, module: str, name: str, alias: Optional[str]) -> bool:
    """The template imports ``name`` from ``module`` (or ``module`` itself) under ``alias``; a
    relative ``module`` (``..speculative``) is met by any module ending so (``sglang.srt.speculative``)."""
    relative = module.lstrip(".") if module.startswith(".") else None
    for stmt in tree.body:
        if isinstance(stmt, ast.Import) and not name:
            if any((a.name, a.asname) == (module, alias) for a in stmt.names):
                return True
        if isinstance(stmt, ast.ImportFrom) and name and stmt.level == 0 and stmt.module is not None:
            same = (
                stmt.module == module
                if relative is None
                else (not relative or stmt.module == relative or stmt.module.endswith("." + relative))
            )
            if same and any((a.name, a.asname) == (name, alias) for a in stmt.names):
                return True
    return False


def _defined(tree: ast.Module) -> set[str]:
    """The names a module's top-level statements define (imports left out)."""
    names: set[str] = set()
    for stmt in tree.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(stmt.name)
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
    return names


def _absolute(module: str, package: str) -> str:
    """A relative import's module (``..speculative``) as imported from a module of ``package``."""
    level = len(module) - len(module.lstrip("."))
    if not level:
        return module
    base = package.split(".")[: len(package.split(".")) - level + 1]
    return ".".join([*base, module.lstrip(".")]).rstrip(".")


#: the line of a template that the draft paths the fork keeps replace (``with_kept``)
KEPT_MARKER = "KEPT = ()  # sglang-draft-layout: the paths the fork keeps\n"


def render(template: str, kept: Sequence[str] = ()) -> str:
    """The text of the file that template module ``fork_templates.<template>`` describes, with ``kept``
    (``module:Class`` of each draft path the fork keeps) in place of its ``KEPT_MARKER``."""
    return embed(with_kept(_module_source(f"{__package__}.fork_templates.{template}"), kept), template)


def with_kept(text: str, kept: Sequence[str]) -> str:
    listed = "".join(f'    "{entry}",\n' for entry in kept)
    return text.replace(KEPT_MARKER, f"KEPT = (\n{listed})\n" if kept else "KEPT = ()\n")


def embed(text: str, template: str) -> str:
    """``text`` with each embed marker (and the blank lines after it) replaced by the named
    module's body and two blank lines (black's spacing after a top-level definition).

    Markers are embedded in order, so one module may import another embedded above it. The
    template itself imports what the embedded modules import (the rendered file is the
    template's text, its imports untouched): an import the template lacks is an error, save a
    relative one that a module embedded above meets (dropped: the names are this file's; a
    module imported whole, ``from . import arrays``, is bound to this file, ``sys.modules``) or
    whose name the template binds itself (an assignment: what the modules call it by).
    A name that two embedded modules, or one and the template, define is an error too.
    """
    tree = parse(text)  # its imports: what embedding adds has none
    template_defined = _defined(tree)
    template_names = template_defined | {
        (a.asname or a.name).split(".")[0]
        for s in tree.body
        if isinstance(s, (ast.Import, ast.ImportFrom))
        for a in s.names
    }
    embedded: dict[str, set[str]] = {}  # module -> the names it binds (defined or imported)
    whole_modules: set[str] = set()  # the names bound to this file for `from . import NAME`
    for marker in list(_EMBED.finditer(text)):
        module = marker.group(1)
        imports, body, own = _split_imports(_module_source(module))
        package = module.rpartition(".")[0]
        bindings = []
        for imported, name, alias in imports:
            absolute = _absolute(imported, package)
            line = f"from {imported} import {name}" if name else f"import {imported}"
            line += f" as {alias}" if alias else ""
            if imported.startswith(".") and f"{absolute}.{name}" in embedded and alias is None:
                if not _bound(tree, "sys", "", None):
                    raise ValueError(
                        f"{template}: the embedded {module} needs `import sys` in the template " f"(for `{line}`)"
                    )
                if name in template_names:
                    raise ValueError(f"{template}: the embedded {module} imports {name}, which the template binds")
                if name not in whole_modules:  # a module embedded above, imported whole: this file
                    whole_modules.add(name)
                    bindings.append(f"{name} = sys.modules[__name__]  # {line}: embedded above\n")
            elif imported.startswith(".") and absolute in embedded and alias is None:
                if name not in embedded[absolute]:
                    raise ValueError(f"{template}: the embedded {module} needs `{line}`: not in {absolute}")
            elif not _bound(tree, imported, name, alias) and not (
                imported.startswith(".") and (alias or name) in template_defined  # the template assigns it itself
            ):
                raise ValueError(f"{template}: the embedded {module} needs `{line}` in the template")
        for other, names in [(template, template_names), *embedded.items()]:
            clash = sorted(own & names)
            if clash:
                raise ValueError(f"{template}: the embedded {module} and {other} both define {', '.join(clash)}")
        embedded[module] = (
            embedded.get(module, set())
            | own
            | {alias or name or imported.split(".")[0] for imported, name, alias in imports}
        )
        bound = "".join(bindings) + ("\n\n" if bindings else "")
        embedded_text = f"# {module} (sglang-draft-layout), verbatim\n{bound}{body}\n\n"
        text = text.replace(marker.group(0), embedded_text, 1)
    return text


def fork_root(target: Target) -> Optional[Path]:
    """The fork checkout holding the target package and a ``test/registered/`` suite, if any."""
    root = getattr(target, "root", None) or target.package.parent.parent
    if target.package.resolve() != (root / "python" / "sglang").resolve():
        return None
    return root if (root / "test" / "registered").is_dir() else None


def register_suite(text: str) -> Optional[str]:
    """The suite a written test file registers to (its top-level ``register_*_ci(suite=...)``)."""
    try:
        tree = parse(text)
    except SyntaxError:
        return None
    for stmt in tree.body:
        call = stmt.value if isinstance(stmt, ast.Expr) else None
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id.startswith("register_"):
            for keyword in call.keywords:
                if keyword.arg == "suite" and isinstance(keyword.value, ast.Constant):
                    return keyword.value.value
    return None


def with_suite(text: str, suite: str, line_length: int = 88) -> str:
    """``text`` with its registration line naming ``suite``, laid out as black would."""
    found = _REGISTER.search(text)
    if found is None:
        raise ValueError("a fork test template has no `register_*_ci(est_time=N, suite=...)` line")
    function, est_time, _suite = found.groups()
    arguments = f'est_time={est_time}, suite="{suite}"'
    line = f"{function}({arguments})"
    if len(line) > line_length:
        line = (
            f"{function}(\n    {arguments}\n)"
            if len(arguments) + 4 <= line_length
            else f'{function}(\n    est_time={est_time},\n    suite="{suite}",\n)'
        )
    return text[: found.start()] + line + text[found.end() :]


def _suite(
    template: str, options: TestOptions, suites: Optional[ForkSuites], kept: Optional[str], run_suite: Path
) -> tuple[Optional[str], Optional[str]]:
    """(the suite to register the test to, or None with why not) for one template; ``kept``:
    the suite the file already there registers to."""
    backend, option = BACKENDS[template]
    asked = options.suite_for(template)
    if asked is not None:
        if suites is not None and suites.rejects(backend, asked):
            known = ", ".join(sorted(suites.known.get(backend, ()))) or "none"
            raise TargetError(
                f"{run_suite}: {option} {asked}: not a {backend} suite of this fork, so its "
                f"validate_all_suites would fail every CI job (its {backend} suites: {known}); "
                "nothing written"
            )
        return asked, None
    if suites is None:
        if kept is not None:
            return kept, None  # written with a suite named by the maintainer: nothing to check it against
        return None, f"no {run_suite} to say which suites the fork runs (name one with {option} NAME)"
    if kept is not None and suites.accepts(backend, kept):
        return kept, None  # a suite the fork still has stays (an earlier choice, or the maintainer's)
    chosen = choose_suite(suites, backend)
    if chosen is None:
        per_commit = ", ".join(suites.per_commit.get(backend, ())) or "none"
        written = f"; the file there registers to {kept}, not one of them" if kept is not None else ""
        return None, (
            f"{run_suite} has no per-commit {backend} suite that fits (its per-commit {backend} "
            f"suites: {per_commit}{written}; name one with {option} NAME)"
        )
    return chosen, None


def generated_files(
    target: Target, options: TestOptions = TestOptions(), up_to_date: bool = False, kept_paths: Sequence[str] = ()
) -> tuple[list[GeneratedFile], list[str]]:
    """The test files a fork checkout gets, each with its current text, and one line for
    each test not written and why; ([], []) for trees that are not fork checkouts.
    ``up_to_date``: no site is left to patch, so a test not there yet is written only when
    ``options`` ask for the tests. ``kept_paths``: the draft paths the CPU test leaves out (``module:Class``).

    Raises TargetError for a suite name the fork's run_suite.py would reject."""
    root = fork_root(target)
    if root is None:
        return [], []
    tests = [
        (root / relative, template, what)
        for relative, template, what in FORK_TESTS
        if options.asks or not up_to_date or (root / relative).is_file()
    ]
    if not tests:
        return [], []  # an up-to-date fork without the tests: nothing to write, nothing to say
    register = target.package / "test" / "ci" / "ci_register.py"
    if not register.is_file():  # the files register through it (SGLang has it from 0.5.6 on)
        return [], [f"no tests written: the fork has no {register.relative_to(root)} to register them with"]
    suites = read_suites(root)
    run_suite = root / "test" / "run_suite.py"
    files, notes = [], []
    for path, template, what in tests:
        stored = StoredText.read(path) if path.is_file() else None
        if template == "registered_gpu" and not (options.gpu_test or options.cuda_suite) and stored is None:
            continue  # the GPU test costs per-commit GPU time: written only when asked for
        kept = register_suite(stored.text) if stored is not None else None
        suite, why_not = _suite(template, options, suites, kept, run_suite)
        if suite is None:
            notes.append(f"no {what} written: {why_not}")
            continue
        gone = kept is not None and suites is not None and not suites.accepts(BACKENDS[template][0], kept)
        label = f"{what} (suite {suite}" + (f"; was {kept}, not a suite of the fork)" if gone else ")")
        text = with_suite(render(template, kept_paths), suite, target.line_length)
        if template == "registered_cpu":
            harness = root / HARNESS[0]
            stored_harness = StoredText.read(harness) if harness.is_file() else None
            files.append(GeneratedFile(harness, HARNESS[2], render(HARNESS[1]), stored_harness))
        files.append(GeneratedFile(path, label, text, stored))
    return files, notes

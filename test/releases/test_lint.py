"""apply's output passes SGLang's lint on the real releases: black 24.10.0 and isort 5.13.2
(profile black, known first party sglang), the versions SGLang's pre-commit pins."""

from __future__ import annotations

import ast
import difflib
import hashlib
from collections import Counter
from pathlib import Path
from typing import Callable

import black
import isort
import pytest

from sglang_draft_layout.rules import RULES
from sglang_draft_layout.rules.base import EAGLE_UTILS, SPEC_UTILS

pytestmark = pytest.mark.releases

RELEASES = ("0.5.8", "0.5.9", "0.5.10", "0.5.11", "0.5.12")
LINTERS: dict[str, Callable[[str], str]] = {
    "black": lambda code: black.format_str(code, mode=black.Mode()),
    "isort": lambda code: isort.code(code, profile="black", known_first_party=["sglang"]),
}
#: originals isort 5.13.2 would change: they keep an exploded import that fits on one line
#: (black's magic trailing comma), which isort's black profile joins.
ISORT_DIRTY_ORIGINALS = {
    ("0.5.10", "srt/speculative/eagle_worker_v2.py"),
    ("0.5.11", "srt/speculative/eagle_worker_v2.py"),
    ("0.5.12", "srt/speculative/eagle_worker_v2.py"),
    ("0.5.12", "srt/layers/attention/deepseek_v4_backend.py"),
}
HELPERS = {
    (SPEC_UTILS, "draft_kv_indices_buffer_width"),
    (SPEC_UTILS, "draft_kv_indices_used_len"),
    (EAGLE_UTILS, "per_step_draft_out_cache_loc"),
}


def changed_files(pristine: Path, patched: Path) -> list[str]:
    """The files (relative to sglang/) that apply changed."""
    files = sorted({rule.file for rule in RULES})
    return [
        f
        for f in files
        if (pristine / "sglang" / f).is_file()
        and (pristine / "sglang" / f).read_bytes() != (patched / "sglang" / f).read_bytes()
    ]


_linted: dict[tuple[str, str], Counter] = {}  # (tool, sha256 of the code) -> its lint changes


def lint_changes(tool: str, code: str) -> Counter:
    """The lines ``tool`` would remove (-) and add (+): empty for a clean file. Each text once a
    process (the releases' own files are linted by many tests)."""
    key = (tool, hashlib.sha256(code.encode()).hexdigest())
    if key not in _linted:
        diff = difflib.unified_diff(code.splitlines(), LINTERS[tool](code).splitlines(), lineterm="", n=0)
        _linted[key] = Counter(line for line in diff if line[:1] in "+-" and not line.startswith(("+++", "---")))
    return _linted[key]


@pytest.mark.parametrize("version", RELEASES)
def test_every_changed_file_is_as_lint_clean_as_its_original(pristine, patched, version):
    """Clean originals stay clean; the few originals isort would change gain no new change."""
    changed = changed_files(pristine(version), patched(version))
    assert len(changed) >= 8
    for relative in changed:
        old = (pristine(version) / "sglang" / relative).read_text()
        new = (patched(version) / "sglang" / relative).read_text()
        for tool, lint in LINTERS.items():
            before = lint_changes(tool, old)
            original_clean = tool == "black" or (version, relative) not in ISORT_DIRTY_ORIGINALS
            assert (not before) == original_clean, f"{tool} on the original {relative}: {sorted(before)}"
            after = lint_changes(tool, new)
            assert after == before, f"{tool} would change the patched {relative}:\n" + "\n".join(
                difflib.unified_diff(new.splitlines(), lint(new).splitlines(), lineterm="")
            )


def describe(stmt: ast.stmt) -> str:
    if isinstance(stmt, ast.ImportFrom):
        return f"from {stmt.module}"
    if isinstance(stmt, ast.Import):
        return f"import {stmt.names[0].name}"
    return type(stmt).__name__


def helper_imports(path: Path, kept: set[str]) -> dict[str, tuple]:
    """Per module: the helpers a top-level from-import of it names, and the statements around it.

    Neighbours are counted among the top-level statements ``kept`` only (those in both
    files compared), so that an import upstream dropped or added elsewhere does not count.
    """
    body = [stmt for stmt in ast.parse(path.read_text()).body if describe(stmt) in kept]
    found = {}
    for index, stmt in enumerate(body):
        if isinstance(stmt, ast.ImportFrom):
            helpers = sorted(a.name for a in stmt.names if (stmt.module, a.name) in HELPERS)
            if helpers:
                before = describe(body[index - 1]) if index else None
                after = describe(body[index + 1]) if index + 1 < len(body) else None
                found[stmt.module] = (helpers, before, after)
    return found


def top_level(path: Path) -> set[str]:
    return {describe(stmt) for stmt in ast.parse(path.read_text()).body}


def test_0_5_12_imports_placed_as_upstream_0_5_13_places_them(pristine, patched):
    """Every file 0.5.13 imports the helpers in: the same module, between the same statements."""
    compared = []
    for relative in changed_files(pristine("0.5.12"), patched("0.5.12")):
        ours, upstream = patched("0.5.12") / "sglang" / relative, pristine("0.5.13") / "sglang" / relative
        if not upstream.is_file():
            continue
        in_both = top_level(ours) & top_level(upstream)
        if not helper_imports(upstream, in_both):
            continue
        assert helper_imports(ours, in_both) == helper_imports(upstream, in_both), relative
        compared.append(relative)
    assert sorted(compared) == [
        "srt/layers/attention/aiter_backend.py",
        "srt/layers/attention/deepseek_v4_backend.py",
        "srt/layers/attention/flashinfer_backend.py",
        "srt/layers/attention/flashinfer_mla_backend.py",
        "srt/layers/attention/triton_backend.py",
        "srt/speculative/eagle_worker_v2.py",
    ]

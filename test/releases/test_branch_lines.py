"""``branches.ordering_lines`` on real release files: every ``if`` and conditional expression ``comparisons`` finds
a number in holds a line it names (it only narrows where ``with_branches`` looks, never what it records)."""

from __future__ import annotations

import ast

import pytest

from sglang_draft_layout.harness.branches import comparisons, ordering_lines


@pytest.mark.parametrize("version", ["0.5.12", "0.5.23"])
def test_every_test_comparing_with_a_number_holds_an_ordering_line(pristine, version):
    files = sorted(
        path
        for folder in ("srt/layers/attention", "srt/speculative")
        for path in (pristine(version) / "sglang" / folder).rglob("*.py")
    )
    checked = 0
    for path in files:
        text = path.read_text(encoding="utf-8")
        lines = set(ordering_lines(text))
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.If, ast.IfExp)) and comparisons(node.test):
                checked += 1
                spanned = range(node.test.lineno, node.test.end_lineno + 1)
                assert lines.intersection(spanned), f"{path.name}:{node.test.lineno}: {ast.unparse(node.test)}"
    assert checked > 100  # the files hold such tests: the assertion above ran

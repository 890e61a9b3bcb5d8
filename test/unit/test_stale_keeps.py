"""``stale_keeps``: where a keep comment is found on a site and how ``apply`` takes a stale one out. Each
removal is held against black 24.10.0 (the fork's formatter): the snippet as black lays it out with the
comment, then the text ``apply`` writes, which black must leave as it is; where black would lay the lines
out anew, ``apply`` leaves the comment (``by_hand``). Hand-written snippets; the real 0.5.13 tree is
test/releases/test_stale_keep_comments.py's."""

from __future__ import annotations

import ast

import black
import pytest

from sglang_draft_layout.layout_patterns.keep import keep_comments
from sglang_draft_layout.stale_keeps import StaleKeep, removal, removed

KEEP = "# sglang-draft-layout: keep"
MODE = black.Mode(line_length=88)


def formatted(code: str) -> str:
    return black.format_str(code, mode=MODE)


def the_keep(code: str) -> StaleKeep:
    """The one keep comment honoured on ``f``'s def and on its statement holding ``foo(``."""
    tree = ast.parse(code)
    [method] = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "f"]
    line = next(
        (
            s.lineno
            for s in ast.walk(method)
            if isinstance(s, ast.stmt) and s is not method and "foo(" in ast.unparse(s)
        ),
        None,
    )
    [(at, span)] = keep_comments(code.splitlines(keepends=True), method, line, tree).items()
    return StaleKeep("m.py", at, span, None)  # type: ignore[arg-type]


#: (the code as black leaves it with the keep comment, what ``apply`` writes)
REMOVED = {
    "alone above the def": (
        f"class A:\n    x = 1\n\n    {KEEP}\n    def f(self, a):\n        return foo(a)\n",
        "class A:\n    x = 1\n\n    def f(self, a):\n        return foo(a)\n",
    ),
    "alone above a decorated def": (
        f"class A:\n    {KEEP}\n    @property\n    def f(self):\n        return foo(1)\n",
        "class A:\n    @property\n    def f(self):\n        return foo(1)\n",
    ),
    "alone above the statement": (
        f"class A:\n    def f(self, a):\n        b = a\n        {KEEP}\n        return foo(b)\n",
        "class A:\n    def f(self, a):\n        b = a\n        return foo(b)\n",
    ),
    "at the end of a one-line def": (
        f"class A:\n    def f(self, a):  {KEEP}\n        return foo(a)\n",
        "class A:\n    def f(self, a):\n        return foo(a)\n",
    ),
    "before another comment": (
        f"class A:\n    def f(self, a):\n        return foo(a)  {KEEP}  # noqa: E501\n",
        "class A:\n    def f(self, a):\n        return foo(a)  # noqa: E501\n",
    ),
    "after another comment": (
        f"class A:\n    def f(self, a):\n        return foo(a)  # noqa: E501  {KEEP}\n",
        "class A:\n    def f(self, a):\n        return foo(a)  # noqa: E501\n",
    ),
    "a def black split for it: joined": (
        f"class A:\n    def f(self, forward_batch: ForwardBatch, another_argument: int):  {KEEP}\n        return foo(1)\n",
        "class A:\n    def f(self, forward_batch: ForwardBatch, another_argument: int):\n        return foo(1)\n",
    ),
    "a statement black split for it: joined": (
        f"class A:\n    def f(self):\n        x = self.foo(max_seq_len, req_pool_indices, seq_lens_sum)  {KEEP}\n",
        "class A:\n    def f(self):\n        x = self.foo(max_seq_len, req_pool_indices, seq_lens_sum)\n",
    ),
    "a def too long without it: left split": (
        f"class A:\n    def f(self, forward_batch: ForwardBatch, another_argument: int, third_one: Tuple[int]):  {KEEP}\n"
        "        return foo(1)\n",
        "class A:\n    def f(\n        self, forward_batch: ForwardBatch, another_argument: int, third_one: Tuple[int]\n    ):\n"
        "        return foo(1)\n",
    ),
    "a magic trailing comma: left split": (
        f"class A:\n    def f(self):\n        x = foo(\n            a,\n            b,\n        )  {KEEP}\n",
        "class A:\n    def f(self):\n        x = foo(\n            a,\n            b,\n        )\n",
    ),
}


@pytest.mark.parametrize("case", sorted(REMOVED))
def test_apply_removes_it_as_black_leaves_the_lines(case):
    code, expected = REMOVED[case]
    code = formatted(code)  # the fork's code, as its black leaves it with the comment
    keep = the_keep(code)
    assert removed(code, [keep], 88) == expected
    assert formatted(expected) == expected and KEEP not in expected


BY_HAND = {
    "alone inside a def's header": f"class A:\n    def f(\n        self,\n        {KEEP}\n        a,\n    ):\n        return foo(a)\n",
    "in a statement black split twice": (
        "class A:\n    def f(self):\n        x = self.foo(\n            bar(aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa, bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb)"
        f"\n        )  {KEEP}\n"
    ),
}


@pytest.mark.parametrize("case", sorted(BY_HAND))
def test_it_is_left_where_black_would_lay_the_lines_out_anew(case):
    code = formatted(BY_HAND[case])
    keep = the_keep(code)
    assert removal(code.splitlines(keepends=True), keep.line, keep.span, 88) is None


def test_it_is_found_in_the_text_the_patch_writes_where_lines_moved():
    """The file's other sites rewritten (lines added above the comment): the comment is found where it went."""
    code, expected = REMOVED["alone above the statement"]
    keep = the_keep(code)
    written = code.replace("class A:\n", "class A:\n    y = draft_kv_indices_buffer_width(1, 2, 3)\n\n")
    assert removed(code, [keep], 88, written) == expected.replace(
        "class A:\n", "class A:\n    y = draft_kv_indices_buffer_width(1, 2, 3)\n\n"
    )
    changed = code.replace("        b = a\n", "        b = a + 1\n")
    assert removed(code, [keep], 88, changed.replace(f"        {KEEP}\n", f"        {KEEP} \n")) is None

"""Source (the file's ast) and rewrite.apply_edits (ast anchors applied with libcst)."""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest
from rule_test_support import FLASHINFER, backend_module
from sglang_draft_layout.rewrite import AnchorError, apply_edits
from sglang_draft_layout.rules.base import Edit, Source

SOURCE = '''"""A module."""

import os


class Backend:
    def first(self):
        return 1

    # about second
    @staticmethod
    def second(x):
        label = "é→"; y = (x + 1) * 2
        shape = (label, x)
        return y


# about helper
def helper():
    pass
'''


def node(source: Source, kind: type, text: str) -> ast.AST:
    """The only ``kind`` node of the file whose source is ``text``."""
    found = [n for n in ast.walk(source.tree) if isinstance(n, kind) and source.text(n) == text]
    assert len(found) == 1, found
    return found[0]


def test_text_reads_utf8_byte_columns():
    source = Source("mod.py", SOURCE)
    assert source.text(node(source, ast.BinOp, "x + 1")) == "x + 1"  # after non-ASCII text on its line
    assert source.text(node(source, ast.Tuple, "(label, x)")) == "(label, x)"


def test_expression_anchor_after_non_ascii_text_and_inside_parentheses():
    source = Source("mod.py", SOURCE)
    new = apply_edits(source, [Edit(node(source, ast.BinOp, "x + 1"), replace="x - 1")])
    assert new == SOURCE.replace("y = (x + 1) * 2", "y = (x - 1) * 2")


def test_parenthesised_tuple_anchor_and_statement_insert_in_a_decorated_method():
    source = Source("mod.py", SOURCE)
    tuple_node = node(source, ast.Tuple, "(label, x)")
    stmt = node(source, ast.Assign, "shape = (label, x)")
    new = apply_edits(source, [Edit(tuple_node, replace="(x, label)"), Edit(stmt, before=("z = [\n    1,\n]\n",))])
    assert new == SOURCE.replace(
        "        shape = (label, x)\n", "        z = [\n            1,\n        ]\n        shape = (x, label)\n"
    )


def test_an_expression_in_a_decorator_is_rewritten():
    """libcst's range of a definition, and of the block holding it, leaves out its decorators: the rewrite still enters
    them (``rewrite._RANGE_LEAVES_OUT``)."""
    for text in (
        "class A:\n    @deco(max_bs * ctx)\n    def f(self):\n        return 1\n",
        "@deco(max_bs * ctx)\ndef f():\n    return 1\n",
        "def g():\n    @deco(max_bs * ctx)\n    def f():\n        return 1\n",
    ):
        source = Source("mod.py", text)
        new = apply_edits(source, [Edit(node(source, ast.BinOp, "max_bs * ctx"), replace="width(max_bs, ctx)")])
        assert new == text.replace("max_bs * ctx", "width(max_bs, ctx)")


def test_insert_before_a_top_level_definition_keeps_its_comment():
    source = Source("mod.py", SOURCE)
    helper = next(s for s in source.tree.body if isinstance(s, ast.FunctionDef))
    new = apply_edits(source, [Edit(helper, before=("def added():\n    pass\n",), separate=2, keep_comments=True)])
    assert new == SOURCE.replace("# about helper\n", "def added():\n    pass\n\n\n# about helper\n")


def test_replace_absorbs_the_next_statement_and_takes_its_comment_above():
    text = "def f(x):\n    a = 1\n    # two\n    b = 2\n    return a + b\n"
    source = Source("mod.py", text)
    first, second = source.tree.body[0].body[:2]
    new = apply_edits(source, [Edit(first, replace="a = b = 3\n", absorb=(second,))])
    assert new == "def f(x):\n    # two\n    a = b = 3\n    return a + b\n"


def test_two_removed_statements_in_a_row_leave_the_blank_line_between_them():
    """A statement absorbed by a later one leaves its blank lines to the statement after it; the
    first of two in a row has none, the second's stay (above what follows the two)."""
    text = "def f(x):\n    a = 0\n    v = x\n\n    w = x\n    b = v\n    c = w\n    return b + c\n"
    source = Source("mod.py", text)
    _a, v, w, b, c, _return = source.tree.body[0].body
    new = apply_edits(source, [Edit(b, replace="b = x\n", absorb=(v,)), Edit(c, replace="c = x\n", absorb=(w,))])
    assert new == "def f(x):\n    a = 0\n\n    b = x\n    c = x\n    return b + c\n"


def test_a_removed_statement_leaves_the_comments_inside_and_at_the_end_of_it():
    text = (
        "def f(x):\n    v = x  # the view\n    b = v\n"
        "    c = w\n    # above\n    w = g(\n        x,  # inner\n    )  # end\n"
    )
    source = Source("mod.py", text)
    v, b, c, w = source.tree.body[0].body
    new = apply_edits(source, [Edit(b, replace="b = x\n", absorb=(v,)), Edit(c, replace="c = x\n", absorb=(w,))])
    assert new == "def f(x):\n    # the view\n    b = x\n    # above\n    # inner\n    # end\n    c = x\n"


def test_a_block_inserted_deep_in_a_method_takes_the_files_indent_unit():
    """The piece parsed is the statement, after a stand-in block line for each statement holding it: the inserted
    block's body is indented by the file's unit (two spaces here), not by the statement's depth."""
    text = "class A:\n  def f(self, b):\n    if b:\n      y = g(b)\n    return y\n"
    source = Source("mod.py", text)
    stmt = node(source, ast.Assign, "y = g(b)")
    new = apply_edits(source, [Edit(stmt, before=("if b > 1:\n    b = b - 1\n",)), Edit(stmt.value, replace="h(b)")])
    assert new == text.replace("      y = g(b)\n", "      if b > 1:\n        b = b - 1\n      y = h(b)\n")


def test_statements_in_an_except_handler_and_a_match_case_keep_their_indentation():
    text = (
        "def f(x):\n    try:\n        y = x + 1\n    except ValueError:\n        y = x + 2\n"
        "    match y:\n        case 3:\n            y = x + 3\n    return y\n"
    )
    source = Source("mod.py", text)
    edits = [Edit(node(source, ast.BinOp, f"x + {n}"), replace=f"x - {n}") for n in (2, 3)]
    new = apply_edits(source, edits)
    assert new == text.replace("x + 2", "x - 2").replace("x + 3", "x - 3")


def test_a_comment_past_a_blank_line_above_a_removed_statement_goes_with_it():
    """libcst makes a comment above a statement, blank lines between, a leading line of it: the piece parsed starts
    at the statement before, so that the removed statement's comment moves to the statement taking it over."""
    text = "def f(x):\n    a = 0\n    # about v\n\n    v = x\n    w = 1\n    b = v\n    return b\n"
    source = Source("mod.py", text)
    _a, v, _w, b, _return = source.tree.body[0].body
    new = apply_edits(source, [Edit(b, replace="b = x\n", absorb=(v,))])
    assert new == "def f(x):\n    a = 0\n    w = 1\n    # about v\n\n    b = x\n    return b\n"


def test_a_replaced_block_takes_the_comments_at_its_end_above_it():
    """libcst gives a block the comment lines after its last statement that are indented as deeply: the piece parsed
    takes them in, so that they go above the statement replacing the block, as its other comments do."""
    text = "def f(x):\n    if x:\n        a = 1  # one\n        # trailing\n\n    return a\n"
    source = Source("mod.py", text)
    new = apply_edits(source, [Edit(source.tree.body[0].body[0], replace="a = 1\n")])
    assert new == "def f(x):\n    # one\n    # trailing\n    a = 1\n\n    return a\n"


def test_an_anchor_libcst_cannot_match_is_an_error():
    text = "x = 1; y = 2\n"
    source = Source("mod.py", text)
    with pytest.raises(AnchorError):
        apply_edits(source, [Edit(source.tree.body[1], replace="y = 3\n")])


def test_check_does_not_import_libcst(sglang_tree):
    """check decides on the stdlib ast; libcst is for writing only. Nor does it import what only the demo (a
    download: subprocess, zipfile), a checkout asking git (subprocess) or --format json uses."""
    sglang_tree.write(FLASHINFER, backend_module("FlashInferMultiStepDraftBackend"))
    probe = (
        "import sys\n"
        "before = set(sys.modules)\n"
        "from sglang_draft_layout import cli, judgement\n"
        "judgement.path_findings = lambda *_args: []\n"  # the mimic is not a runnable program (rules_alone)
        f"code = cli.main(['check', {str(sglang_tree.root)!r}])\n"
        "print(code, sorted(m for m in set(sys.modules) - before\n"
        "                   if m.split('.')[0] in ('libcst', 'subprocess', 'zipfile', 'json')))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.splitlines()[-1] == "1 []"
    probe = probe.replace("'check'", "'apply'")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.splitlines()[-1].startswith("0 [") and "'libcst'" in out.splitlines()[-1]  # apply does import it

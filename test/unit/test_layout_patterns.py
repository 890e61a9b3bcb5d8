"""layout_patterns: the forms a method holds (the structural guard's view), one walk per
function, a row width bound to a local; Source.class_blocks; the guard's text filters."""

from __future__ import annotations

import ast
import textwrap

import pytest

from sglang_draft_layout.layout_patterns import (
    CAPACITY, LAUNCH, OUT_CACHE_LOC, ROWS, STEP_LENGTH, draft_layout_classes, draft_layout_forms,
    inline_draft_layout, nodes_of,
)
from sglang_draft_layout.rules.base import Source
from sglang_draft_layout.rules.structural_guard import may_hold_draft_layout


def method(body: str) -> ast.FunctionDef:
    return ast.parse("def f(self, max_bs, forward_batch):\n" + textwrap.indent(textwrap.dedent(body), "    ")).body[0]


FORMS = {
    "inline rows": ("x = torch.empty((self.speculative_num_steps, max_bs * self.max_context_len))", {ROWS}),
    "rows via a local": ("w = max_bs * self.max_context_len\nx = torch.zeros((self.speculative_num_steps, w))", {ROWS}),
    "helper rows": ("w = draft_kv_indices_buffer_width(max_bs, self.topk, self.max_context_len)\n"
                    "x = torch.zeros((self.speculative_num_steps, w))", {ROWS}),
    "other rows": ("x = torch.empty((self.speculative_num_steps, max_bs))", set()),
    "step length": ("y = row[i][: seq_lens_sum * self.topk + bs * (i + 1)]", {STEP_LENGTH}),
    "capacity length": ("n = seq_lens_sum * self.topk + bs * self.speculative_num_steps", {CAPACITY}),
    "helper capacity": ("n = draft_kv_indices_used_len(s, self.topk, bs, self.speculative_num_steps)", {CAPACITY}),
    "launch": ("generate_draft_decode_kv_indices[(1,)](a, b)", {LAUNCH}),
    "out_cache_loc": ("o = o.reshape(bs, self.topk, self.speculative_num_steps)\n"
                      "o = o.permute((2, 0, 1)).reshape(self.speculative_num_steps, -1)", {OUT_CACHE_LOC}),
    "delegates": ("for i in range(self.speculative_num_steps - 1):\n"
                  "    self.attn_backends[i].init_forward_metadata(forward_batch)", set()),
}


@pytest.mark.parametrize("body, forms", FORMS.values(), ids=FORMS.keys())
def test_draft_layout_forms(body, forms):
    assert draft_layout_forms(method(body)) == forms


@pytest.mark.parametrize("body", [body for body, forms in FORMS.values() if forms],
                         ids=[name for name, (_body, forms) in FORMS.items() if forms])
def test_text_filter_lets_every_form_through(body):
    assert may_hold_draft_layout(body)


def test_text_filter_ignores_an_unrelated_topk_sum():
    assert not may_hold_draft_layout("n = batch_size * self.topk + 1\nm = self.max_context_len")


def test_width_reverted_through_a_local_is_inline():
    tree = ast.parse("class B:\n" + textwrap.indent(
        "def init_cuda_graph_state(self, max_bs, max_num_tokens):\n"
        "    kv_indices_width = max_bs * self.max_context_len\n"
        "    self.rows = torch.zeros((self.speculative_num_steps, kv_indices_width))\n", "    "))
    assert inline_draft_layout(tree) == [("B", "init_cuda_graph_state", 4, "row width without draft_kv_indices_buffer_width")]
    assert draft_layout_classes(tree) == ["B"]


def test_nodes_of_walks_once_in_source_order():
    func = method("a = 1\nif a:\n    b = 2\nc = 3")
    assert [n.targets[0].id for n in nodes_of(func, ast.Assign)] == ["a", "b", "c"]
    assert [type(n).__name__ for n in nodes_of(func, ast.stmt)] == ["FunctionDef", "Assign", "If", "Assign", "Assign"]


def test_a_per_step_layout_is_reported_once():
    tree = ast.parse("class W:\n" + textwrap.indent("def draft_forward(self, o, bs):\n" + textwrap.indent(
        FORMS["out_cache_loc"][0] + "\n", "    "), "    "))
    assert [(c, m, line) for c, m, line, _what in inline_draft_layout(tree)] == [("W", "draft_forward", 3)]


CODE = '''"""m"""

import torch


def helper():
    return 1


@decorator
class Wanted:
    def f(self):
        return "marker"


class Other:
    pass
'''


def test_class_blocks_parse_only_wanted_classes_at_their_lines():
    source = Source.class_blocks("m.py", CODE, lambda text: "marker" in text)
    [cls] = source.tree.body
    assert (cls.name, cls.lineno, cls.decorator_list[0].lineno) == ("Wanted", 11, 10)
    assert source.text(cls.body[0].body[0].value) == '"marker"'


def test_class_blocks_fall_back_to_the_whole_file():
    code = CODE.replace('return "marker"', 'return """marker\nclass Other:\n"""')
    source = Source.class_blocks("m.py", code, lambda text: "marker" in text)
    assert [n.name for n in source.tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))] == \
        ["helper", "Wanted", "Other"]

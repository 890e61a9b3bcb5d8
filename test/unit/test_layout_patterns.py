"""layout_patterns: the forms a method holds (the structural guard's view), one walk per
function, a row width bound to a local; Source.class_blocks; the guard's text filters."""

from __future__ import annotations

import ast
import textwrap

import pytest

from sglang_draft_layout.layout_patterns.ast_walk import nodes_of
from sglang_draft_layout.layout_patterns.forms import (
    CAPACITY,
    LAUNCH,
    OUT_CACHE_LOC,
    ROWS,
    STEP_LENGTH,
    draft_layout_classes,
    draft_layout_forms,
    inline_draft_layout,
)
from sglang_draft_layout.layout_patterns.keep import has_keep_pragma, keeps_class
from sglang_draft_layout.layout_patterns.out_cache_loc import out_cache_loc_layouts, view_reads, view_rebinds
from sglang_draft_layout.rules.base import Source
from sglang_draft_layout.rules.structural_guard import may_hold_draft_layout


def method(body: str) -> ast.FunctionDef:
    return ast.parse(
        "def f(self, max_bs, forward_batch, o, n, i, order, f):\n" + textwrap.indent(textwrap.dedent(body), "    ")
    ).body[0]


FORMS = {
    "inline rows": ("x = torch.empty((self.speculative_num_steps, max_bs * self.max_context_len))", {ROWS}),
    "rows via a local": ("w = max_bs * self.max_context_len\nx = torch.zeros((self.speculative_num_steps, w))", {ROWS}),
    "helper rows": (
        "w = draft_kv_indices_buffer_width(max_bs, self.topk, self.max_context_len)\n"
        "x = torch.zeros((self.speculative_num_steps, w))",
        {ROWS},
    ),
    "other rows": ("x = torch.empty((self.speculative_num_steps, max_bs))", set()),
    "step length": ("y = row[i][: seq_lens_sum * self.topk + bs * (i + 1)]", {STEP_LENGTH}),
    "capacity length": ("n = seq_lens_sum * self.topk + bs * self.speculative_num_steps", {CAPACITY}),
    "helper capacity": ("n = draft_kv_indices_used_len(s, self.topk, bs, self.speculative_num_steps)", {CAPACITY}),
    "launch": ("generate_draft_decode_kv_indices[(1,)](a, b)", {LAUNCH}),
    "out_cache_loc": (
        "o = o.reshape(bs, self.topk, self.speculative_num_steps)\n"
        "o = o.permute((2, 0, 1)).reshape(self.speculative_num_steps, -1)",
        {OUT_CACHE_LOC},
    ),
    "delegates": (
        "for i in range(self.speculative_num_steps - 1):\n"
        "    self.attn_backends[i].init_forward_metadata(forward_batch)",
        set(),
    ),
}


@pytest.mark.parametrize("body, forms", FORMS.values(), ids=FORMS.keys())
def test_draft_layout_forms(body, forms):
    assert draft_layout_forms(method(body)) == forms


@pytest.mark.parametrize(
    "body",
    [body for body, forms in FORMS.values() if forms],
    ids=[name for name, (_body, forms) in FORMS.items() if forms],
)
def test_text_filter_lets_every_form_through(body):
    assert may_hold_draft_layout(body)


def test_text_filter_ignores_an_unrelated_topk_sum():
    assert not may_hold_draft_layout("n = batch_size * self.topk + 1\nm = self.max_context_len")


def test_width_reverted_through_a_local_is_inline():
    tree = ast.parse(
        "class B:\n"
        + textwrap.indent(
            "def init_cuda_graph_state(self, max_bs, max_num_tokens):\n"
            "    kv_indices_width = max_bs * self.max_context_len\n"
            "    self.rows = torch.zeros((self.speculative_num_steps, kv_indices_width))\n",
            "    ",
        )
    )
    assert inline_draft_layout(tree) == [
        ("B", "init_cuda_graph_state", 4, "row width without draft_kv_indices_buffer_width")
    ]
    assert draft_layout_classes(tree) == ["B"]


def test_nodes_of_walks_once_in_source_order():
    func = method("a = 1\nif a:\n    b = 2\nc = 3")
    assert [n.targets[0].id for n in nodes_of(func, ast.Assign)] == ["a", "b", "c"]
    assert [type(n).__name__ for n in nodes_of(func, ast.stmt)] == ["FunctionDef", "Assign", "If", "Assign", "Assign"]


def test_a_per_step_layout_is_reported_once():
    tree = ast.parse(
        "class W:\n"
        + textwrap.indent(
            "def draft_forward(self, o, bs):\n" + textwrap.indent(FORMS["out_cache_loc"][0] + "\n", "    "), "    "
        )
    )
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
    assert [n.name for n in source.tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))] == [
        "helper",
        "Wanted",
        "Other",
    ]


# ---- a fork's own spelling of the per-step out_cache_loc split -----------------------

SPLIT = "x = o.view(n, self.topk, self.speculative_num_steps)"
SPELLINGS = {
    "width -1": f"{SPLIT}.permute(2, 0, 1).reshape(self.speculative_num_steps, -1)",
    "permute as a tuple": f"{SPLIT}.permute((2, 0, 1)).reshape(self.speculative_num_steps, -1)",
    "width n * topk": f"{SPLIT}.permute(2, 0, 1).reshape(self.speculative_num_steps, n * self.topk)",
    "width topk * n, steps -1": f"{SPLIT}.permute(2, 0, 1).reshape(-1, self.topk * n)",
    "width a local": f"w = n * self.topk\n{SPLIT}.permute(2, 0, 1).reshape(self.speculative_num_steps, w)",
    "topk and steps locals": "topk = self.topk\nsteps = self.speculative_num_steps\nbs = n\nstep_width = bs * topk\n"
    "x = o.reshape(bs, topk, steps).permute(2, 0, 1).reshape(steps, step_width)[i]",
    "movedim(2, 0)": f"{SPLIT}.movedim(2, 0).reshape(self.speculative_num_steps, -1)",
    "movedim(-1, 0)": f"{SPLIT}.movedim(-1, 0).flatten(1)",
    "two transposes": f"{SPLIT}.transpose(1, 2).transpose(0, 1).flatten(start_dim=1)",
    "transpose then swapaxes": f"{SPLIT}.transpose(0, 2).swapaxes(1, 2).reshape(self.speculative_num_steps, -1)",
    "returned": f"return {SPLIT[4:]}.permute(2, 0, 1).reshape(self.speculative_num_steps, -1)",
    "a keyword argument": f"f(loc={SPLIT[4:]}.permute(2, 0, 1).reshape(self.speculative_num_steps, -1)[i])",
    "3-d view bound to a local": "r = o.view(n, self.topk, self.speculative_num_steps)\n"
    "x = r.permute(2, 0, 1).reshape(self.speculative_num_steps, -1)",
    "bound view, topk and steps locals, movedim": "topk = self.topk\nsteps = self.speculative_num_steps\n"
    "rows = o.reshape(n, topk, steps)\nx = rows.movedim(-1, 0).flatten(1)",
    "bound view, returned subscripted": "rows = o.view(n, self.topk, self.speculative_num_steps)\n"
    "return rows.transpose(1, 2).transpose(0, 1).flatten(1)[i]",
    "bound view, a statement between": "r = o.view(n, self.topk, self.speculative_num_steps)\ny = 1\n"
    "x = r.permute(2, 0, 1).reshape(self.speculative_num_steps, -1)",
    "bound view, a block between": "r = o.view(n, self.topk, self.speculative_num_steps)\nif n:\n    y = 1\n"
    "z = 2\nx = r.permute(2, 0, 1).reshape(self.speculative_num_steps, -1)",
    "two statements, a statement between": "o = o.view(n, self.topk, self.speculative_num_steps)\ny = 1\n"
    "o = o.permute(2, 0, 1).reshape(self.speculative_num_steps, -1)",
    "bound view, moved in a nested block": "r = o.view(n, self.topk, self.speculative_num_steps)\nif n:\n"
    "    x = r.permute(2, 0, 1).reshape(self.speculative_num_steps, -1)",
    "bound view, moved two blocks down": "r = o.view(n, self.topk, self.speculative_num_steps)\nwith f:\n"
    "    y = 1\n    if n:\n        return r.movedim(-1, 0).flatten(1)[i]",
    "bound view, moved in a loop below it": "r = o.view(n, self.topk, self.speculative_num_steps)\nfor i in f:\n"
    "    x = r.permute(2, 0, 1).reshape(self.speculative_num_steps, -1)[i]",
}
NOT_THE_LAYOUT = {
    "one transpose": f"{SPLIT}.transpose(0, 2).reshape(self.speculative_num_steps, -1)",
    "other permutation": f"{SPLIT}.permute(1, 0, 2).reshape(self.speculative_num_steps, -1)",
    "steps-first view without a move": f"{SPLIT}.reshape(self.speculative_num_steps, -1)",
    "width n alone": f"{SPLIT}.permute(2, 0, 1).reshape(self.speculative_num_steps, n)",
    "width topk * steps": f"{SPLIT}.permute(2, 0, 1).reshape(self.speculative_num_steps, self.topk * self.speculative_num_steps)",
    "steps and width both -1": f"{SPLIT}.permute(2, 0, 1).reshape(-1, -1)",
    "rows last": f"{SPLIT}.permute(2, 0, 1).reshape(-1, self.speculative_num_steps)",
    "steps a different number": f"{SPLIT}.permute(2, 0, 1).reshape(self.speculative_num_steps + 1, -1)",
    "topk local rebound": "topk = self.topk\ntopk = 1\n"
    "x = o.view(n, topk, self.speculative_num_steps).permute(2, 0, 1).reshape(self.speculative_num_steps, -1)",
    "topk a parameter": "x = o.view(n, max_bs, self.speculative_num_steps).permute(2, 0, 1).reshape(self.speculative_num_steps, -1)",
    "flatten(0)": f"{SPLIT}.permute(2, 0, 1).flatten(0)",
    "permute by a variable": f"{SPLIT}.permute(*order).reshape(self.speculative_num_steps, -1)",
    "bound view, moved in a nested def": "r = o.view(n, self.topk, self.speculative_num_steps)\nif n:\n"
    "    def g():\n"
    "        return r.permute(2, 0, 1).reshape(self.speculative_num_steps, -1)",
    "bound view, rebound in the block of its move": "r = o.view(n, self.topk, self.speculative_num_steps)\nif n:\n"
    "    r = f\n"
    "    x = r.permute(2, 0, 1).reshape(self.speculative_num_steps, -1)",
}


@pytest.mark.parametrize("body", SPELLINGS.values(), ids=SPELLINGS.keys())
def test_a_forks_spelling_is_the_per_step_split(body):
    func = method(body)
    [split] = out_cache_loc_layouts(func)
    assert (ast.unparse(split.buffer), ast.unparse(split.batch_size)) in {("o", "n"), ("o", "bs")}
    assert draft_layout_forms(func) == {OUT_CACHE_LOC}


@pytest.mark.parametrize("body", NOT_THE_LAYOUT.values(), ids=NOT_THE_LAYOUT.keys())
def test_another_layout_is_not_the_per_step_split(body):
    assert out_cache_loc_layouts(method(body)) == []


BOUND = "r = o.view(n, self.topk, self.speculative_num_steps)\n"
MOVED = "r.permute(2, 0, 1).reshape(self.speculative_num_steps, -1)"
VIEW_READS = {  # the body, the lines (the def is line 1) reading the bound 3-d view besides its split
    "read after its split": (f"{BOUND}x = {MOVED}\ny = r[:, 0]", [4]),
    "read beside its split": (f"{BOUND}x = f({MOVED}, r)", [3]),
    "deleted after its split": (f"{BOUND}x = {MOVED}\ndel r", [4]),
    "rebound by its split": (f"{BOUND}r = {MOVED}[i]\nreturn r", []),
    "its name read before it is bound": (f"r = o\nz = r.sum()\n{BOUND.replace('o.view', 'r.view')}x = {MOVED}", []),
    "read between it and its split": (f"{BOUND}z = r.sum()\nx = {MOVED}", [3]),
    "read between it and its split rebinding it": (f"{BOUND}z = r.sum()\nr = {MOVED}", [3]),
    # a function, lambda or generator written before it runs later: it may read the view
    "read before it by a def": (f"def show():\n    return r.shape\n{BOUND}x = {MOVED}\nshow()", [3]),
    "read before it by a lambda": (f"show = lambda: r.shape\n{BOUND}if n:\n    x = {MOVED}", [2]),
    "read before it by a generator": (f"g = (r[j] for j in n)\n{BOUND}x = {MOVED}", [2]),
    "read before it in a loop": ("for i in n:\n    z = r[0]\n" + textwrap.indent(f"{BOUND}x = {MOVED}", "    "), [3]),
    "read by the header of its move's block": (f"{BOUND}if r.numel():\n    x = {MOVED}", [3]),
    "read after its move's block": (f"{BOUND}if n:\n    x = {MOVED}\ny = r[:, 0]", [5]),
    "moved in two branches": (f"{BOUND}if n:\n    x = {MOVED}\nelse:\n    x = {MOVED}", [6]),
}


@pytest.mark.parametrize("body, lines", VIEW_READS.values(), ids=VIEW_READS.keys())
def test_the_other_reads_of_a_bound_view(body, lines):
    func = method(body)
    split = out_cache_loc_layouts(func)[0]
    assert split.view is not None and ast.unparse(split.view).startswith("r = ")
    assert (split.statements, ast.unparse(split.node)) == ([], MOVED)
    assert [name.lineno for name in view_reads(func, split)] == lines


@pytest.mark.parametrize(
    "between, moved",
    [
        ("y = 1\n", MOVED),
        ("if n:\n    y = r\n", MOVED),
        ("", f"f({MOVED})"),
    ],
    ids=["a statement", "a block reading the view", "none, moved inside a call"],
)
def test_the_statements_between_a_bound_view_and_its_move(between, moved):
    func = method(f"{BOUND}{between}x = {moved}")
    [split] = out_cache_loc_layouts(func)
    assert [ast.unparse(stmt) for stmt in split.between] == [ast.unparse(s) for s in func.body[1:-1]]
    assert (split.line, ast.unparse(split.node)) == (2, MOVED)


def test_a_view_bound_anew_owns_the_move_after_it():
    func = method(f"{BOUND}y = 1\n{BOUND.replace('o.view', 'f.view')}x = {MOVED}")
    [split] = out_cache_loc_layouts(func)
    assert (ast.unparse(split.buffer), split.line, split.between) == ("f", 4, ())


#: statements between the bound view (line 2) and its move -> (what they bind that the view reads, or the view's
#: local; its line)
REBINDS = {
    "nothing the view reads": ("y = n + 1\nself.other = o", []),
    "the batch size": ("n = 2", [("n", 3)]),
    "the buffer, augmented": ("o += 1", [("o", 3)]),
    "self.topk": ("self.topk = 1", [("self.topk", 3)]),
    "self itself": ("self = f", [("self", 3)]),
    "the view's local": ("y = 1\nr = o", [("r", 4)]),
    "a for target in a block": ("if i:\n    for n in f:\n        pass", [("n", 4)]),
    "with as": ("with f as o:\n    pass", [("o", 3)]),
    "a walrus": ("y = (n := 3)", [("n", 3)]),
    "a comprehension's own name": ("y = [n for n in f]\nz = {o: 1 for (o, r) in f}", []),
    "a walrus in a comprehension": ("y = [(n := v) for v in f]", [("n", 3)]),
    "del": ("del o", [("o", 3)]),
    "an import": ("import o.path", [("o", 3)]),
    "an import as": ("from os import path as n", [("n", 3)]),
    "a def": ("def n():\n    pass", [("n", 3)]),
    "a class": ("class o:\n    pass", [("o", 3)]),
    "global": ("global n", [("n", 3)]),
    "except as": ("try:\n    pass\nexcept ValueError as o:\n    pass", [("o", 5)]),
    "match captures": ("match f:\n    case [n, *o]:\n        pass", [("n", 4), ("o", 4)]),
}


@pytest.mark.parametrize("between, bound", REBINDS.values(), ids=REBINDS.keys())
def test_what_the_statements_between_rebind(between, bound):
    [split] = out_cache_loc_layouts(method(f"{BOUND}{between}\nx = {MOVED}"))
    assert split.between and view_rebinds(split) == bound


#: a block holding the move of the bound view (line 2) -> what it binds before the move that the view reads
NESTED_REBINDS = {
    "the move's own target": (f"if i:\n    o = {MOVED}", []),
    "after the move": (f"if i:\n    x = {MOVED}\n    n = 2", []),
    "in the block, before the move": (f"if i:\n    n = 2\n    x = {MOVED}", [("n", 4)]),
    "a with target": (f"with f as o:\n    x = {MOVED}", [("o", 3)]),
    "a walrus in the if test": (f"if (n := f):\n    x = {MOVED}", [("n", 3)]),
    "an earlier branch": (f"if i:\n    n = 2\nelse:\n    x = {MOVED}", [("n", 4)]),
    "an except name, two blocks down": (f"try:\n    y = 1\nexcept E as o:\n    if i:\n        x = {MOVED}", [("o", 5)]),
}


@pytest.mark.parametrize("block, bound", NESTED_REBINDS.values(), ids=NESTED_REBINDS.keys())
def test_what_the_block_of_a_nested_move_rebinds_before_it(block, bound):
    [split] = out_cache_loc_layouts(method(f"{BOUND}{block}"))
    assert (split.between, split.line, ast.unparse(split.node)) == ((), 2, MOVED)
    assert view_rebinds(split) == bound


def test_the_two_statement_form_has_no_bound_view():
    [split] = out_cache_loc_layouts(method(FORMS["out_cache_loc"][0]))
    assert split.view is None and len(split.statements) == 2


def test_split_inside_a_forks_method_is_reported_inline():
    tree = ast.parse(
        "class B:\n"
        + textwrap.indent(
            "def _rows(self, forward_batch):\n" + textwrap.indent(SPELLINGS["topk and steps locals"], "    ") + "\n",
            "    ",
        )
    )
    assert [(c, m, what) for c, m, _line, what in inline_draft_layout(tree)] == [
        ("B", "_rows", "per-step out_cache_loc without per_step_draft_out_cache_loc")
    ]


KEEP = "# sglang-draft-layout: keep"


@pytest.mark.parametrize("where", ["def line", "statement", "statement's last line"])
def test_keep_pragma_leaves_a_site_out_of_the_inline_report(where):
    body = (
        "o = o.reshape(bs, self.topk, self.speculative_num_steps)\n"
        "o = o.permute(2, 0, 1).reshape(\n    self.speculative_num_steps, -1\n)"
    )
    code = "class W:\n    def draft_forward(self, o, bs):\n" + textwrap.indent(body, "        ") + "\n"
    lines = code.splitlines()
    index = {"def line": 1, "statement": 2, "statement's last line": 2}[where]
    if where == "statement's last line":
        lines = [*lines[:2], lines[2] + "  " + KEEP, *lines[3:]]
    else:
        lines[index] += "  " + KEEP
    tree = ast.parse("\n".join(lines))
    assert len(inline_draft_layout(tree)) == 1
    assert inline_draft_layout(tree, lines) == []
    assert has_keep_pragma(lines, tree.body[0].body[0], 3)
    other = code.splitlines()
    assert inline_draft_layout(ast.parse(code), [*other[:4], other[4] + "  # noqa: E501"]) != []


@pytest.mark.parametrize("body", SPELLINGS.values(), ids=SPELLINGS.keys())
def test_text_filter_lets_every_spelling_through(body):
    assert may_hold_draft_layout(body)


def test_text_filter_ignores_a_transpose_of_a_name():
    assert not may_hold_draft_layout("q = q.transpose(1, 2)\nn = self.speculative_num_steps")


#: text -> whether a move other than permute is called on a name bound to a view or reshape
BOUND_VIEW_MOVES = {
    "rows = o.reshape(n, topk, steps)\nx = rows.movedim(-1, 0)": True,
    "ré = o.view(n, topk, steps)\nx = ré.swapdims(0, 2)": True,
    "x = rows.movedim(-1, 0)": False,
    "rows2 = o.view(n, topk, steps)\nx = rows.transpose(0, 2)": False,
    "rows = o.view(n, topk, steps)\nx = o.movedim(-1, 0)": False,
}


@pytest.mark.parametrize("text", BOUND_VIEW_MOVES)
def test_a_move_is_read_back_to_the_name_it_is_called_on(text):
    steps = "\nn = self.speculative_num_steps"
    assert may_hold_draft_layout(text + steps) == BOUND_VIEW_MOVES[text]


KEEP = "# sglang-draft-layout: keep"


@pytest.mark.parametrize(
    ("text", "kept"),
    [
        (f"class Own(Base):  {KEEP}\n    pass\n", True),
        (f"{KEEP}\nclass Own(Base):\n    pass\n", True),
        (f"class Own(\n    Base,\n):  {KEEP}\n    pass\n", True),  # black's header over lines
        ("class Own(Base):\n    pass\n", False),
        (f"class Own(Base):\n    x = 1  {KEEP}\n", False),  # in its body: a site's keep, not the class's
        (f"class Owner(Base):  {KEEP}\n    pass\n", False),  # another class
        (f"class Own(Base):  {KEEP}\n    pass\n\n\nclass Own(Base):\n    pass\n", False),  # Python keeps the last
    ],
)
def test_keeps_class(text, kept):
    assert keeps_class(text, "Own") is kept

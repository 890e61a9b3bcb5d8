"""layout_patterns: the forms a method holds (the structural guard's view), one walk per
function, a row width bound to a local; Source.class_blocks; the guard's text filters."""

from __future__ import annotations

import ast
import textwrap

import pytest

from sglang_draft_layout.layout_patterns import (
    CAPACITY, LAUNCH, OUT_CACHE_LOC, ROWS, STEP_LENGTH, draft_layout_classes, draft_layout_forms, handoff_methods,
    has_keep_pragma, inline_draft_layout, keeps_split_once, nodes_of, out_cache_loc_handoffs, out_cache_loc_layouts,
    split_path_problems, split_paths, view_reads, view_rebinds, worker_step_rows,
)
from sglang_draft_layout.rules.base import Source
from sglang_draft_layout.rules.structural_guard import may_hold_draft_layout


def method(body: str) -> ast.FunctionDef:
    return ast.parse("def f(self, max_bs, forward_batch, o, n, i, order, f):\n" + textwrap.indent(textwrap.dedent(body), "    ")).body[0]


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


@pytest.mark.parametrize("between, moved", [
    ("y = 1\n", MOVED), ("if n:\n    y = r\n", MOVED), ("", f"f({MOVED})"),
], ids=["a statement", "a block reading the view", "none, moved inside a call"])
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
    "an except name, two blocks down": (f"try:\n    y = 1\nexcept E as o:\n    if i:\n        x = {MOVED}",
                                        [("o", 5)]),
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
    tree = ast.parse("class B:\n" + textwrap.indent(
        "def _rows(self, forward_batch):\n" + textwrap.indent(SPELLINGS["topk and steps locals"], "    ") + "\n",
        "    "))
    assert [(c, m, what) for c, m, _line, what in inline_draft_layout(tree)] == [
        ("B", "_rows", "per-step out_cache_loc without per_step_draft_out_cache_loc")]


KEEP = "# sglang-draft-layout: keep"


@pytest.mark.parametrize("where", ["def line", "statement", "statement's last line"])
def test_keep_pragma_leaves_a_site_out_of_the_inline_report(where):
    body = "o = o.reshape(bs, self.topk, self.speculative_num_steps)\n" \
           "o = o.permute(2, 0, 1).reshape(\n    self.speculative_num_steps, -1\n)"
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


# ---- split once on a multi-step -> per-step path ------------------------------------

PER_STEP = '''
class StepBackend:
    def __init__(self, speculative_step_id=0):
        self.speculative_step_id = speculative_step_id

    def init_forward_metadata(self, forward_batch):
        if forward_batch.forward_mode.is_decode_or_idle():
{split}            self.metadata = self.build(out_cache_loc={loc})
'''
PER_STEP_SPLIT = (
    "            loc = per_step_draft_out_cache_loc(\n"
    "                forward_batch.out_cache_loc, forward_batch.batch_size, self.topk, self.speculative_num_steps\n"
    "            )[self.speculative_step_id]\n")
MULTI_STEP = '''
class MultiStepBackend(StepBackend):
    def __init__(self, steps):
        self.attn_backends = [StepBackend() for _ in range(steps)]

    def init_forward_metadata(self, forward_batch):
{rows}        for i in range(self.speculative_num_steps - 1):
{set_row}            self.attn_backends[i].init_forward_metadata(forward_batch)
'''
CALLER_ROWS = (
    "        rows = forward_batch.out_cache_loc.view(\n"
    "            forward_batch.batch_size, self.topk, self.speculative_num_steps\n"
    "        ).movedim(-1, 0).flatten(1)\n")
SET_ROW = "            forward_batch.out_cache_loc = rows[i]\n"


def path_module(per_step_splits: bool, caller_splits: bool) -> str:
    return (PER_STEP.format(split=PER_STEP_SPLIT if per_step_splits else "",
                            loc="loc" if per_step_splits else "forward_batch.out_cache_loc")
            + MULTI_STEP.format(rows=CALLER_ROWS if caller_splits else "", set_row=SET_ROW if caller_splits else ""))


@pytest.mark.parametrize("per_step_splits, caller_splits, problem", [
    (True, False, None),
    (False, True, None),
    (True, True, "splits per step, and so does StepBackend.init_forward_metadata: twice"),
    (False, False, "StepBackend.init_forward_metadata gets the whole buffer: never split per step"),
], ids=["per-step backend splits", "caller splits", "both split", "nobody splits"])
def test_split_paths_count_the_splits_on_the_path(per_step_splits, caller_splits, problem):
    code = path_module(per_step_splits, caller_splits)
    tree = ast.parse(code)
    [path] = split_paths(tree)
    assert (path.caller.name, path.per_step.name) == ("MultiStepBackend", "StepBackend")
    assert path.splits == per_step_splits + caller_splits
    found = split_path_problems(tree)
    assert [what for _scope, _line, what in found] == ([problem] if problem else [])
    if problem:  # kept on the per-step backend's def line: left out; on the caller's: still found
        per_step_def, caller_def = [i for i, line in enumerate(code.splitlines()) if "def init_forward_metadata" in line]
        assert split_path_problems(*kept_at(code, caller_def)) == found
        assert split_path_problems(*kept_at(code, per_step_def)) == []


def kept_at(code: str, index: int) -> tuple:
    """(tree, lines) of ``code`` with the keep comment on its line ``index`` (from 0)."""
    lines = code.splitlines()
    lines[index] += "  " + KEEP
    return ast.parse("\n".join(lines)), lines


def kept_where(code: str, where: dict) -> dict:
    """{name: whether keeps_split_once keeps the one path of ``code`` with the keep comment on line
    ``where[name]``}; the written test and the structural guard (what `check` reports) agree on each."""
    kept = {}
    for name, index in where.items():
        tree, kept_lines = kept_at(code, index)
        [path] = split_paths(tree)
        kept[name] = keeps_split_once(kept_lines, path.per_step)
        assert (split_path_problems(tree, kept_lines) == []) is kept[name], name
        assert (guard_split_once("\n".join(kept_lines))[0].value == "kept by the fork") is kept[name], name
    return kept


def test_only_a_keep_on_the_per_step_backends_def_or_handoff_keeps_the_path():
    """keeps_split_once: the per-step method's def line or its statement handing out_cache_loc= on;
    not its own split's statement, not the caller's def line or rows (they keep their own layouts)."""
    code = path_module(True, True)
    lines = code.splitlines()
    where = {
        "per-step def": next(i for i, line in enumerate(lines) if "def init_forward_metadata" in line),
        "handoff": next(i for i, line in enumerate(lines) if "out_cache_loc=loc" in line),
        "per-step split": next(i for i, line in enumerate(lines) if "loc = per_step_draft_out_cache_loc(" in line),
        "caller def": [i for i, line in enumerate(lines) if "def init_forward_metadata" in line][1],
        "caller rows": next(i for i, line in enumerate(lines) if "forward_batch.out_cache_loc = rows[i]" in line),
        "caller split": next(i for i, line in enumerate(lines) if "rows = forward_batch.out_cache_loc.view(" in line),
    }
    kept = kept_where(code, where)
    assert kept == {"per-step def": True, "handoff": True, "per-step split": False,
                    "caller def": False, "caller rows": False, "caller split": False}
    [path] = split_paths(ast.parse(code))
    assert keeps_split_once(lines, path.per_step) is False


def test_the_handoffs_are_the_simple_statements_handing_out_cache_loc_on():
    code = path_module(True, False).replace("            self.metadata = self.build(",
                                            "            with ctx:\n                self.metadata = self.build(")
    [path] = split_paths(ast.parse(code))
    [handoff] = out_cache_loc_handoffs(path.per_step_method)  # not the `if` nor the `with` holding it
    assert isinstance(handoff, ast.Assign)
    assert code.splitlines()[handoff.lineno - 1].strip() == "self.metadata = self.build(out_cache_loc=loc)"


def test_a_caller_that_sets_a_row_after_init_does_not_split_for_it():
    code = path_module(False, True).replace(SET_ROW, "").replace(
        "            self.attn_backends[i].init_forward_metadata(forward_batch)\n",
        "            self.attn_backends[i].init_forward_metadata(forward_batch)\n" + SET_ROW)
    [path] = split_paths(ast.parse(code))
    assert path.caller_rows == [] and path.splits == 0


def test_a_per_step_backend_that_does_not_bake_out_cache_loc_has_no_path():
    code = path_module(False, False).replace("out_cache_loc=forward_batch.out_cache_loc", "seq_lens=forward_batch.seq_lens")
    assert split_paths(ast.parse(code)) == []


def test_keep_pragma_on_the_per_step_backends_site_statement_keeps_the_path():
    code = path_module(False, False).replace(
        "self.metadata = self.build(out_cache_loc=forward_batch.out_cache_loc)",
        "self.metadata = self.build(out_cache_loc=forward_batch.out_cache_loc)  " + KEEP)
    lines = code.splitlines()
    assert split_path_problems(ast.parse(code)) != []
    assert split_path_problems(ast.parse(code), lines) == []


WORKER_V2 = "srt/speculative/eagle_worker_v2.py"
#: an EAGLE worker (its own module) that sets each step's row, then inits that step's backend
WORKER = """
class EagleDraftWorker:
    def draft_forward(self, forward_batch):
        rows = forward_batch.out_cache_loc.view(
            forward_batch.batch_size, self.topk, self.speculative_num_steps
        ).movedim(-1, 0).flatten(1)
        for i in range(self.speculative_num_steps - 1):
            forward_batch.out_cache_loc = rows[i]
            forward_batch.attn_backend = self.draft_attn_backend.attn_backends[i]
            forward_batch.attn_backend.init_forward_metadata(forward_batch)
"""


def worker_modules(worker: str = WORKER) -> dict:
    return {WORKER_V2: ast.parse(worker)}


@pytest.mark.parametrize("per_step_splits, problem", [
    (False, None),
    (True, f"splits per step, and so does its caller EagleDraftWorker.draft_forward ({WORKER_V2}:8): twice"),
], ids=["only the worker splits", "the per-step backend splits too"])
def test_a_workers_rows_in_another_module_split_on_the_path(per_step_splits, problem):
    code = path_module(per_step_splits, False)
    tree = ast.parse(code)
    [rows] = worker_step_rows(worker_modules())
    assert WORKER.splitlines()[8 - 1] == "            forward_batch.out_cache_loc = rows[i]"
    assert (rows.path, rows.scope, rows.where) == (WORKER_V2, "EagleDraftWorker.draft_forward", f"{WORKER_V2}:8")
    without_worker = [] if per_step_splits else ["StepBackend.init_forward_metadata gets the whole buffer: never split per step"]
    assert [what for *_, what in split_path_problems(tree)] == without_worker
    [path] = split_paths(tree, [rows])
    assert path.splits == 1 + per_step_splits
    found = split_path_problems(tree, code.splitlines(), [rows])
    split_line = next(i for i, line in enumerate(code.splitlines(), 1) if "per_step_draft_out_cache_loc(" in line) \
        if per_step_splits else None
    assert found == ([("StepBackend.init_forward_metadata", split_line, problem)] if problem else [])
    # a keep on the worker's draft_forward keeps the worker's own split, not the path: still found
    kept = WORKER.replace("draft_forward(self, forward_batch):", "draft_forward(self, forward_batch):  " + KEEP)
    assert kept != WORKER and split_path_problems(tree, code.splitlines(), worker_step_rows(worker_modules(kept))) == found
    if problem:  # kept on the per-step backend's def line: left out
        per_step_def = next(i for i, line in enumerate(code.splitlines()) if "def init_forward_metadata" in line)
        assert split_path_problems(*kept_at(code, per_step_def), [rows]) == []


def test_a_worker_that_inits_before_setting_the_row_or_another_class_is_no_caller():
    after = WORKER.replace("            forward_batch.out_cache_loc = rows[i]\n", "") + \
        "            forward_batch.out_cache_loc = rows[i]\n"
    assert worker_step_rows(worker_modules(after)) == []
    assert worker_step_rows(worker_modules(WORKER.replace("EagleDraftWorker", "OtherWorker"))) == []
    assert worker_step_rows({"srt/speculative/other.py": worker_modules()[WORKER_V2]}) == []


@pytest.mark.parametrize("body", SPELLINGS.values(), ids=SPELLINGS.keys())
def test_text_filter_lets_every_spelling_through(body):
    assert may_hold_draft_layout(body)


def test_text_filter_ignores_a_transpose_of_a_name():
    assert not may_hold_draft_layout("q = q.transpose(1, 2)\nn = self.speculative_num_steps")


# ---- the per-step handoff moved into a method init_forward_metadata calls ----------------

#: the per-step backend's init_forward_metadata calling a method of its own that holds its decode branch
MOVED_HANDOFF = (
    "    def init_forward_metadata(self, forward_batch):\n"
    "        self._build_metadata(forward_batch)\n"
    "\n"
    "    def _build_metadata(self, forward_batch):\n"
    "        if forward_batch")


def moved_path_module(per_step_splits: bool, caller_splits: bool, depth: int = 1) -> str:
    """``path_module`` with the per-step backend's decode branch ``depth`` ``self.`` calls below its
    init_forward_metadata (``_build_metadata``, then ``_build_metadata_2``, ...)."""
    code = path_module(per_step_splits, caller_splits)
    code = code.replace("    def init_forward_metadata(self, forward_batch):\n        if forward_batch", MOVED_HANDOFF, 1)
    for level in range(2, depth + 1):
        below = f"_build_metadata_{level}"
        code = code.replace("        if forward_batch", (
            f"        self.{below}(forward_batch)\n\n    def {below}(self, forward_batch):\n        if forward_batch"), 1)
    return code


def step_backend(tree: ast.Module) -> ast.ClassDef:
    """The per-step backend class of a ``path_module`` tree."""
    return next(c for c in tree.body if isinstance(c, ast.ClassDef) and c.name == "StepBackend")


def guard_split_once(code: str) -> tuple:
    """(state, line) of the structural guard's split-once row for StepBackend (what `check` reports)."""
    from sglang_draft_layout.rules.structural_guard import guard_rules

    source = Source("srt/layers/attention/fork_backend.py", code)
    [rule] = [r for r in guard_rules(source.path, source, ()) if r.id.startswith("guard:split-once:")]
    finding = rule.find(rule, source)
    return finding.state, finding.line


@pytest.mark.parametrize("depth", [1, 2, 3], ids=["one call deep", "two calls deep", "three calls deep"])
@pytest.mark.parametrize("per_step_splits, caller_splits", [(True, False), (False, True), (True, True), (False, False)],
                         ids=["per-step backend splits", "caller splits", "both split", "nobody splits"])
def test_a_moved_handoff_is_on_the_path_as_if_in_init_forward_metadata(per_step_splits, caller_splits, depth):
    """split_paths follows init_forward_metadata through the methods of its class it calls as ``self.<name>(...)``,
    at any depth, to the one that hands out_cache_loc= on (handoff_methods), as `check` does; the structural
    guard agrees."""
    from sglang_draft_layout.rules.base import State

    code = moved_path_module(per_step_splits, caller_splits, depth)
    assert code.count("    def _build_metadata") == depth
    tree = ast.parse(code)
    step = step_backend(tree)
    handoff = "_build_metadata" + (f"_{depth}" if depth > 1 else "")
    assert [m.name for m in handoff_methods(step)] == [handoff]
    if per_step_splits and caller_splits:  # a keep on the method handing out_cache_loc= on keeps the path,
        lines = code.splitlines()  # not one on a method between that only calls it
        handoff_def = next(i for i, line in enumerate(lines) if f"def {handoff}(" in line)
        assert split_path_problems(*kept_at(code, handoff_def)) == []
        between_def = next(i for i, line in enumerate(lines) if "def _build_metadata(" in line)
        assert (split_path_problems(*kept_at(code, between_def)) == []) is (depth == 1)
    [path] = split_paths(tree)
    assert path.per_step_method.name == "init_forward_metadata"
    assert path.splits == per_step_splits + caller_splits
    unmoved = path_module(per_step_splits, caller_splits)
    assert [what for *_, what in split_path_problems(ast.parse(code))] == \
        [what for *_, what in split_path_problems(ast.parse(unmoved))]
    state, line = guard_split_once(code)
    assert (state is State.PATCHED) is (per_step_splits + caller_splits == 1)
    assert code.splitlines()[line - 1].strip().startswith("self.metadata = self.build(out_cache_loc=")


def deep_split_module(depth: int, caller_splits: bool) -> str:
    """``path_module`` whose per-step backend hands on ``self._row_1(forward_batch)``, its split ``depth``
    ``self.`` calls below the handoff (``_row_1`` returning ``self._row_2(...)``, ...)."""
    code = path_module(False, caller_splits).replace(
        "out_cache_loc=forward_batch.out_cache_loc", "out_cache_loc=self._row_1(forward_batch)")
    rows = [f"\n    def _row_{level}(self, forward_batch):\n        return self._row_{level + 1}(forward_batch)\n"
            for level in range(1, depth)]
    rows.append(f"\n    def _row_{depth}(self, forward_batch):\n"
                "        return forward_batch.out_cache_loc.view(\n"
                "            forward_batch.batch_size, self.topk, self.speculative_num_steps\n"
                "        ).movedim(-1, 0).flatten(1)[self.speculative_step_id]\n")
    return code.replace("\nclass MultiStepBackend", "".join(rows) + "\nclass MultiStepBackend", 1)


@pytest.mark.parametrize("depth", [1, 2, 3])
@pytest.mark.parametrize("caller_splits", [False, True], ids=["per-step backend splits", "both split"])
def test_a_split_calls_below_the_handoff_is_on_the_path(depth, caller_splits):
    """The per-step backend's row split in a method ``depth`` self. calls below its handoff: counted once."""
    code = deep_split_module(depth, caller_splits)
    assert code.count("    def _row_") == depth
    [path] = split_paths(ast.parse(code))
    assert path.splits == 1 + caller_splits
    assert [what for *_, what in split_path_problems(ast.parse(code))] == \
        ["splits per step, and so does StepBackend.init_forward_metadata: twice"] * caller_splits


def test_methods_calling_each_other_are_followed_once():
    """Recursion and two methods calling each other end: each method of the class is read once."""
    code = moved_path_module(True, True, 2).replace(
        "    def _build_metadata_2(self, forward_batch):\n",
        "    def _build_metadata_2(self, forward_batch):\n"
        "        if forward_batch.again:\n"
        "            self._build_metadata(forward_batch)\n"
        "            self._build_metadata_2(forward_batch)\n")
    tree = ast.parse(code)
    step = step_backend(tree)
    assert [m.name for m in handoff_methods(step)] == ["_build_metadata_2"]
    [path] = split_paths(tree)
    assert path.splits == 2 and len(path.per_step_splits) == 1
    no_handoff = code.replace("out_cache_loc=loc", "seq_lens=loc")
    assert split_paths(ast.parse(no_handoff)) == [] and split_path_problems(ast.parse(no_handoff)) == []


def test_a_keep_on_the_moved_handoff_or_either_def_line_keeps_the_path():
    code = moved_path_module(True, True)
    lines = code.splitlines()
    defs = [i for i, line in enumerate(lines) if "    def " in line]
    where = {
        "init_forward_metadata def": next(i for i in defs if "def init_forward_metadata" in lines[i]),
        "moved method def": next(i for i in defs if "def _build_metadata" in lines[i]),
        "moved handoff": next(i for i, line in enumerate(lines) if "out_cache_loc=loc" in line),
        "moved split": next(i for i, line in enumerate(lines) if "loc = per_step_draft_out_cache_loc(" in line),
        "caller def": [i for i in defs if "def init_forward_metadata" in lines[i]][1],
    }
    kept = kept_where(code, where)
    assert kept == {"init_forward_metadata def": True, "moved method def": True, "moved handoff": True,
                    "moved split": False, "caller def": False}


def test_a_method_handing_on_its_own_parameter_is_no_handoff():
    """0.5.12's init_forward_metadata_decode hands its parameter on (``out_cache_loc=out_cache_loc``):
    init_forward_metadata handed it the buffer, so the path's handoff stays there."""
    code = path_module(False, True).replace(
        "            self.metadata = self.build(out_cache_loc=forward_batch.out_cache_loc)\n",
        "            self.metadata = self.decode(out_cache_loc=forward_batch.out_cache_loc)\n"
        "\n"
        "    def decode(self, out_cache_loc):\n"
        "        return self.build(out_cache_loc=out_cache_loc)\n")
    tree = ast.parse(code)
    step = step_backend(tree)
    [path] = split_paths(tree)
    assert [m.name for m in handoff_methods(step)] == ["init_forward_metadata"]
    assert out_cache_loc_handoffs(next(m for m in step.body if getattr(m, "name", "") == "decode")) == []
    decode_def = next(i for i, line in enumerate(code.splitlines()) if "def decode(" in line)
    assert keeps_split_once(kept_at(code, decode_def)[1], path.per_step) is False
    assert path.splits == 1 and split_path_problems(tree) == []


def test_a_per_step_backend_that_does_not_know_its_step_has_no_path():
    """0.5.23's QwenSparseAttnBackend: no speculative_step_id (its caller hands each step a batch of its
    own, through a method `split_paths` does not read): it cannot split for itself, so no path is judged,
    as `check` reads no such class; with the handoff in init_forward_metadata or moved out of it."""
    code = path_module(False, False).replace(
        "    def __init__(self, speculative_step_id=0):\n        self.speculative_step_id = speculative_step_id\n\n", "")
    assert "speculative_step_id" not in code
    for each in (code, code.replace("    def init_forward_metadata(self, forward_batch):\n        if forward_batch",
                                    MOVED_HANDOFF, 1)):
        assert split_paths(ast.parse(each)) == [] and split_path_problems(ast.parse(each)) == []
    assert [p.splits for p in split_paths(ast.parse(path_module(False, False)))] == [0]

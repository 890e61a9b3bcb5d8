"""rules/helper_definitions.py: the three layout helpers defined in SGLang's own modules.

``draft_kv_indices_buffer_width`` and ``draft_kv_indices_used_len`` go into
``speculative/spec_utils.py``, ``per_step_draft_out_cache_loc`` into
``speculative/eagle_utils.py``, each just before the module's first top-level
definition, as this package's own source.
"""

from __future__ import annotations

import ast
import inspect

import pytest

from rule_test_support import (
    EAGLE_UTILS,
    EAGLE_UTILS_MODULE,
    SPEC_UTILS,
    SPEC_UTILS_MODULE,
    line_of,
    rule,
    write_bystanders,
)
from sglang_draft_layout.rules.base import State
from sglang_draft_layout.speculative import eagle_utils, spec_utils

WIDTH = rule("helper:draft_kv_indices_buffer_width")
USED_LEN = rule("helper:draft_kv_indices_used_len")
PER_STEP = rule("helper:per_step_draft_out_cache_loc")
SPEC_RULES = [WIDTH, USED_LEN]

WIDTH_SOURCE = inspect.getsource(spec_utils.draft_kv_indices_buffer_width)
USED_LEN_SOURCE = inspect.getsource(spec_utils.draft_kv_indices_used_len)
PER_STEP_SOURCE = inspect.getsource(eagle_utils.per_step_draft_out_cache_loc)
FIRST_DEF = "@triton.jit\ndef generate_draft_decode_kv_indices("


def insert_before(text: str, anchor: str, *definitions: str) -> str:
    """``text`` with ``definitions`` put before ``anchor``, two blank lines after each."""
    head, tail = text.split(anchor, 1)
    return head + "".join(d + "\n\n" for d in definitions) + anchor + tail


def test_spec_utils_before_after_whole_file(sglang_tree):
    sglang_tree.write(SPEC_UTILS, SPEC_UTILS_MODULE)

    plan = sglang_tree.apply(SPEC_RULES)

    line = line_of(SPEC_UTILS_MODULE, "def generate_draft_decode_kv_indices(")
    assert [(f.state, f.line) for f in plan.findings] == [(State.TO_PATCH, line), (State.TO_PATCH, line)]
    after = sglang_tree.read(SPEC_UTILS)
    # No import: neither helper needs one. Every line of the module is kept as it was.
    assert after == insert_before(SPEC_UTILS_MODULE, FIRST_DEF, WIDTH_SOURCE, USED_LEN_SOURCE)
    sglang_tree.assert_idempotent(SPEC_RULES)
    assert sglang_tree.read(SPEC_UTILS) == after


def test_inserted_helpers_run(sglang_tree):
    sglang_tree.write(SPEC_UTILS, SPEC_UTILS_MODULE)
    sglang_tree.apply(SPEC_RULES)
    tree = ast.parse(sglang_tree.read(SPEC_UTILS))
    helpers = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("draft_kv_indices_")]
    namespace: dict = {}
    exec(compile(ast.Module(body=helpers, type_ignores=[]), "spec_utils", "exec"), namespace)
    assert namespace["draft_kv_indices_buffer_width"](3, 2, 10) == 60
    assert namespace["draft_kv_indices_used_len"](18, 2, 6, 3) == 54


def test_eagle_utils_before_after_whole_file(sglang_tree):
    sglang_tree.write(EAGLE_UTILS, EAGLE_UTILS_MODULE)
    plan = sglang_tree.apply([PER_STEP])
    assert [(f.state, f.line) for f in plan.findings] == [
        (State.TO_PATCH, line_of(EAGLE_UTILS_MODULE, "def organize_draft_results("))
    ]
    # torch is imported already: the import is not added twice.
    assert sglang_tree.read(EAGLE_UTILS) == insert_before(
        EAGLE_UTILS_MODULE, "def organize_draft_results(", PER_STEP_SOURCE
    )
    sglang_tree.assert_idempotent([PER_STEP])


def test_eagle_utils_without_torch_gets_the_import_once(sglang_tree):
    before = EAGLE_UTILS_MODULE.replace("import logging\n\nimport torch\n", "import logging\n")
    sglang_tree.write(EAGLE_UTILS, before)
    sglang_tree.apply([PER_STEP])
    expected = insert_before(before, "def organize_draft_results(", PER_STEP_SOURCE).replace(
        "import logging\n", "import logging\n\nimport torch\n"
    )
    assert sglang_tree.read(EAGLE_UTILS) == expected
    sglang_tree.assert_idempotent([PER_STEP])


def test_first_definition_a_class(sglang_tree):
    before = EAGLE_UTILS_MODULE.replace(
        "def organize_draft_results(", "class TreeMaskMode:\n    FULL = 0\n\n\ndef organize_draft_results("
    )
    sglang_tree.write(EAGLE_UTILS, before)
    sglang_tree.apply([PER_STEP])
    assert sglang_tree.read(EAGLE_UTILS) == insert_before(before, "class TreeMaskMode:", PER_STEP_SOURCE)


def test_one_helper_already_there(sglang_tree):
    before = insert_before(SPEC_UTILS_MODULE, FIRST_DEF, WIDTH_SOURCE)
    sglang_tree.write(SPEC_UTILS, before)
    plan = sglang_tree.apply(SPEC_RULES)
    assert [f.state for f in plan.findings] == [State.PATCHED, State.TO_PATCH]
    assert sglang_tree.read(SPEC_UTILS) == insert_before(before, "def draft_kv_indices_buffer_width(", USED_LEN_SOURCE)


# 0.5.13's forms, written here by hand: the width computes its product twice.
UPSTREAM_WIDTH = (
    "def draft_kv_indices_buffer_width(num_seqs: int, topk: int, max_context_len: int) -> int:\n"
    '    """Row width."""\n'
    "    assert (\n"
    "        num_seqs * topk * max_context_len < 2**31\n"
    '    ), "would overflow int32"\n'
    "    return num_seqs * topk * max_context_len\n"
)
UPSTREAM_USED_LEN = (
    "def draft_kv_indices_used_len(seq_lens_sum: int, topk: int, bs: int, num_steps: int) -> int:\n"
    "    return seq_lens_sum * topk + bs * num_steps\n"
)
UPSTREAM_PER_STEP = (
    "def per_step_draft_out_cache_loc(loc, bs, topk, steps):\n"
    "    assert loc.shape[0] == bs * topk * steps, 'wrong length'\n"
    "    return loc.view(bs, topk, steps).permute(2, 0, 1).reshape(steps, -1)\n"
)
#: upstream's earlier bodies: the width before its int32 guard (27475 before 27486), the layout without its assert
EARLIER_WIDTH = (
    "def draft_kv_indices_buffer_width(num_seqs: int, topk: int, max_context_len: int) -> int:\n"
    "    return num_seqs * topk * max_context_len\n"
)
EARLIER_PER_STEP = (
    "def per_step_draft_out_cache_loc(loc, bs, topk, steps):\n"
    "    return loc.view(bs, topk, steps).permute(2, 0, 1).reshape(steps, -1)\n"
)


def append(text: str, *definitions: str) -> str:
    return text + "".join("\n\n" + d for d in definitions)


@pytest.mark.parametrize(
    "spec_utils_defs, eagle_utils_defs",
    [
        ((WIDTH_SOURCE, USED_LEN_SOURCE), (PER_STEP_SOURCE,)),
        ((UPSTREAM_WIDTH, UPSTREAM_USED_LEN), (UPSTREAM_PER_STEP,)),
    ],
    ids=["ours", "0.5.13's form"],
)
def test_current_bodies_anywhere_are_patched_and_kept(sglang_tree, spec_utils_defs, eagle_utils_defs):
    spec = append(SPEC_UTILS_MODULE, *spec_utils_defs)
    sglang_tree.write(SPEC_UTILS, spec)
    sglang_tree.write(EAGLE_UTILS, append(EAGLE_UTILS_MODULE, *eagle_utils_defs))
    plan = sglang_tree.plan([*SPEC_RULES, PER_STEP])
    assert [f.state for f in plan.findings] == [State.PATCHED] * 3
    assert plan.findings[0].line == line_of(spec, "def draft_kv_indices_buffer_width(")
    assert plan.changes == ()


@pytest.mark.parametrize(
    "relative, module, earlier, current, rules",
    [
        (SPEC_UTILS, SPEC_UTILS_MODULE, EARLIER_WIDTH, WIDTH_SOURCE, [WIDTH]),
        (EAGLE_UTILS, EAGLE_UTILS_MODULE, EARLIER_PER_STEP, PER_STEP_SOURCE, [PER_STEP]),
    ],
    ids=["width without its int32 guard", "per-step layout without its assert"],
)
def test_earlier_body_is_replaced_by_ours(sglang_tree, relative, module, earlier, current, rules):
    # the earlier body's own comments go with it (they described that body)
    earlier = earlier.replace(":\n", ":  # the earlier body's note\n", 1)
    before = append(module, "# kept above the helper\n" + earlier)
    sglang_tree.write(relative, before)
    plan = sglang_tree.apply(rules)
    assert [(f.state, f.line) for f in plan.findings] == [(State.TO_PATCH, line_of(before, "def " + rules[0].site[4:]))]
    assert sglang_tree.read(relative) == append(module, "# kept above the helper\n" + current)
    sglang_tree.assert_idempotent(rules)


FOREIGN = {
    "width without topk": (
        "draft_kv_indices_buffer_width",
        SPEC_UTILS,
        SPEC_UTILS_MODULE,
        "def draft_kv_indices_buffer_width(num_seqs, topk, max_context_len):\n"
        "    return num_seqs * max_context_len\n",
    ),
    "width guarded at 2**32": (
        "draft_kv_indices_buffer_width",
        SPEC_UTILS,
        SPEC_UTILS_MODULE,
        EARLIER_WIDTH.replace("    return", "    assert num_seqs * topk * max_context_len < 2**32\n    return"),
    ),
    "used length off by one": (
        "draft_kv_indices_used_len",
        SPEC_UTILS,
        SPEC_UTILS_MODULE,
        UPSTREAM_USED_LEN.replace("bs * num_steps", "bs * (num_steps + 1)"),
    ),
    "per-step layout topk last": (
        "per_step_draft_out_cache_loc",
        EAGLE_UTILS,
        EAGLE_UTILS_MODULE,
        UPSTREAM_PER_STEP.replace("view(bs, topk, steps)", "view(bs, steps, topk)"),
    ),
    "per-step returning the buffer": (
        "per_step_draft_out_cache_loc",
        EAGLE_UTILS,
        EAGLE_UTILS_MODULE,
        "def per_step_draft_out_cache_loc(loc, bs, topk, steps):\n    return loc\n",
    ),
}


@pytest.mark.parametrize("name, relative, module, definition", FOREIGN.values(), ids=FOREIGN.keys())
def test_foreign_body_is_unrecognised_and_apply_refuses_naming_it(sglang_tree, name, relative, module, definition):
    before = append(module, definition)
    sglang_tree.write(relative, before)
    write_bystanders(sglang_tree, besides=relative)
    [finding] = sglang_tree.plan([rule(f"helper:{name}")]).findings
    assert (finding.state, finding.detail) == (State.UNRECOGNISED, f"def {name} has a body no rule knows")
    snapshot = sglang_tree.snapshot()
    code, out, err = sglang_tree.cli("apply")
    assert (code, out) == (2, "")
    assert err == (
        f"error: {sglang_tree.path(relative)}:{line_of(before, f'def {name}(')}: {name}: helper definition: "
        f"def {name} has a body no rule knows; rewrite it to a form docs/sites.md lists; nothing written\n"
    )
    assert sglang_tree.snapshot() == snapshot


def test_a_method_of_that_name_does_not_count(sglang_tree):
    before = SPEC_UTILS_MODULE.replace(
        "TREE_TRAVERSE_TIME_THRESHOLD = 1\n",
        "TREE_TRAVERSE_TIME_THRESHOLD = 1\n\n\nclass Sizes:\n    def draft_kv_indices_buffer_width(self):\n        return 0\n",
    )
    sglang_tree.write(SPEC_UTILS, before)
    plan = sglang_tree.plan([WIDTH])
    assert plan.findings[0].state is State.TO_PATCH


def test_no_definition_to_anchor_is_unrecognised_and_nothing_written(sglang_tree):
    sglang_tree.write(SPEC_UTILS, '"""Only constants."""\n\nTREE_TRAVERSE_TIME_THRESHOLD = 1\n')
    write_bystanders(sglang_tree, besides=SPEC_UTILS)
    plan = sglang_tree.plan(SPEC_RULES)
    assert [(f.state, f.detail) for f in plan.findings] == [
        (State.UNRECOGNISED, "no top-level function to insert the helper before")
    ] * 2
    assert plan.changes == ()
    before = sglang_tree.snapshot()
    code, out, err = sglang_tree.cli("apply")
    assert (code, out) == (2, "")
    assert err == "".join(
        f"error: {sglang_tree.path(SPEC_UTILS)}: {name}: helper definition: no top-level function to "
        "insert the helper before; rewrite it to a form docs/sites.md lists; nothing written\n"
        for name in ("draft_kv_indices_buffer_width", "draft_kv_indices_used_len")
    )
    assert sglang_tree.snapshot() == before


def test_module_absent(sglang_tree):
    for module in ("spec_utils.py", "eagle_utils.py"):
        sglang_tree.path(f"srt/speculative/{module}").unlink()
    plan = sglang_tree.plan([*SPEC_RULES, PER_STEP])
    assert [(f.state, f.detail) for f in plan.findings] == [
        (State.ABSENT, "no srt/speculative/spec_utils.py"),
        (State.ABSENT, "no srt/speculative/spec_utils.py"),
        (State.ABSENT, "no srt/speculative/eagle_utils.py"),
    ]


def test_module_starting_with_a_definition_gets_the_import_on_its_own_line(sglang_tree):
    before = "def organize_draft_results(score_list):\n    return score_list\n"
    sglang_tree.write(EAGLE_UTILS, before)
    plan = sglang_tree.plan([PER_STEP])
    assert plan.findings[0].state is State.TO_PATCH
    [change] = plan.changes
    assert change.new.startswith("import torch\n")
    compile(change.new, "eagle_utils.py", "exec")


def test_comment_directly_above_the_first_definition_stays_with_it(sglang_tree):
    before = SPEC_UTILS_MODULE.replace(FIRST_DEF, "# Draft kv_indices of every step, in one launch.\n" + FIRST_DEF)
    sglang_tree.write(SPEC_UTILS, before)
    sglang_tree.apply(SPEC_RULES)
    after = sglang_tree.read(SPEC_UTILS)
    assert "# Draft kv_indices of every step, in one launch.\n" + FIRST_DEF in after

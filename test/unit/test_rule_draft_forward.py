"""rules/draft_forward.py: the per-step out_cache_loc of the EAGLE workers' draft_forward.

``x = x.reshape(bs, self.topk, self.speculative_num_steps)`` then
``x = x.permute((2, 0, 1)).reshape(self.speculative_num_steps, -1)`` become
``x = per_step_draft_out_cache_loc(x, bs, self.topk, self.speculative_num_steps)``.
"""

from __future__ import annotations

import black
import pytest

from rule_test_support import (
    DRAFT_FORWARD,
    WORKER_HEADER,
    WORKER_V1,
    WORKER_V2,
    assert_refused,
    line_of,
    method_source,
    rule,
    worker_module,
    write_bystanders,
)
from sglang_draft_layout.rules.base import State
from support.fork_edits import WORKER_TWO_SPLITS

CLS = "EagleDraftWorker"
SCOPE = f"{CLS}.draft_forward"
RULE = rule("draft-forward:EagleDraftWorker")
RULE_V1 = rule("draft-forward:EAGLEWorker")
DETAIL = "no `reshape(bs, topk, steps)` + `permute((2, 0, 1)).reshape(steps, -1)` of out_cache_loc"
HEADER_AFTER = WORKER_HEADER.replace(
    "import organize_draft_results\n", "import (\n    organize_draft_results,\n    per_step_draft_out_cache_loc,\n)\n"
)

AFTER = """\
    def draft_forward(self, forward_batch):
        spec_info = forward_batch.spec_info
        out_cache_loc = forward_batch.out_cache_loc
        topk_p, topk_index = spec_info.topk_p, spec_info.topk_index

        out_cache_loc = per_step_draft_out_cache_loc(
            out_cache_loc,
            forward_batch.batch_size,
            self.topk,
            self.speculative_num_steps,
        )

        for i in range(self.speculative_num_steps):
            forward_batch.out_cache_loc = out_cache_loc[i]
            self.draft_runner.forward(forward_batch)
        return topk_p, topk_index
"""

OTHER = """\
    def forward_batch_generation(self, batch):
        return self.draft_forward(batch)
"""


def test_before_after_whole_file(sglang_tree):
    before = worker_module(CLS, OTHER, DRAFT_FORWARD)
    sglang_tree.write(WORKER_V2, before)

    plan = sglang_tree.apply([RULE])

    [finding] = plan.findings
    assert (finding.state, finding.line) == (State.TO_PATCH, line_of(before, "out_cache_loc = out_cache_loc.reshape("))
    after = sglang_tree.read(WORKER_V2)
    assert method_source(after, SCOPE) == AFTER
    assert after == worker_module(CLS, OTHER, AFTER, header=HEADER_AFTER)
    sglang_tree.assert_idempotent([RULE])
    assert sglang_tree.read(WORKER_V2) == after


def test_v1_worker_keeps_the_comment_above(sglang_tree):
    before = DRAFT_FORWARD.replace(
        "        out_cache_loc = out_cache_loc.reshape(\n",
        "        # TODO: only speculative_num_steps - 1 slots are needed\n        out_cache_loc = out_cache_loc.reshape(\n",
    )
    after = AFTER.replace(
        "        out_cache_loc = per_step_draft_out_cache_loc(\n",
        "        # TODO: only speculative_num_steps - 1 slots are needed\n        out_cache_loc = per_step_draft_out_cache_loc(\n",
    )
    sglang_tree.write(WORKER_V1, worker_module("EAGLEWorker", before))
    sglang_tree.apply([RULE_V1])
    assert sglang_tree.read(WORKER_V1) == worker_module("EAGLEWorker", after, header=HEADER_AFTER)
    sglang_tree.assert_idempotent([RULE_V1])


def test_both_workers_in_one_plan(sglang_tree):
    sglang_tree.write(WORKER_V2, worker_module(CLS))
    sglang_tree.write(WORKER_V1, worker_module("EAGLEWorker"))
    plan = sglang_tree.apply([RULE, RULE_V1])
    assert [f.state for f in plan.findings] == [State.TO_PATCH, State.TO_PATCH]
    assert sglang_tree.read(WORKER_V2) == worker_module(CLS, AFTER, header=HEADER_AFTER)
    assert sglang_tree.read(WORKER_V1) == worker_module("EAGLEWorker", AFTER, header=HEADER_AFTER)


def _draft_forward(layout: str, params: str = "self, forward_batch") -> str:
    return (
        f"    def draft_forward({params}):\n"
        "        out_cache_loc = forward_batch.out_cache_loc\n"
        f"{layout}"
        "        return out_cache_loc[0]\n"
    )


def helper_call(target="out_cache_loc", buffer="out_cache_loc", batch_size="forward_batch.batch_size", pad="        "):
    return (
        f"{pad}{target} = per_step_draft_out_cache_loc(\n"
        f"{pad}    {buffer},\n"
        f"{pad}    {batch_size},\n"
        f"{pad}    self.topk,\n"
        f"{pad}    self.speculative_num_steps,\n"
        f"{pad})\n"
    )


#: a split that is an argument of a call, rewritten in place (black's layout of the exploded helper call)
IN_A_CALL_AFTER = (
    "        self.use(\n"
    "            per_step_draft_out_cache_loc(\n"
    "                out_cache_loc,\n"
    "                forward_batch.batch_size,\n"
    "                self.topk,\n"
    "                self.speculative_num_steps,\n"
    "            ),\n"
    "            1,\n"
    "        )\n"
)


STRUCTURAL = {
    "one statement": (
        "        out_cache_loc = forward_batch.out_cache_loc.reshape(forward_batch.batch_size, self.topk, self.speculative_num_steps).permute((2, 0, 1)).reshape(self.speculative_num_steps, -1)\n",
        helper_call(buffer="forward_batch.out_cache_loc"),
    ),
    "view, permute(2, 0, 1), black chain": (
        "        out_cache_loc = (\n"
        "            out_cache_loc.view(forward_batch.batch_size, self.topk, self.speculative_num_steps)\n"
        "            .permute(2, 0, 1)\n"
        "            .reshape(self.speculative_num_steps, -1)\n"
        "        )\n",
        helper_call(),
    ),
    "two statements, view and permute(2, 0, 1)": (
        "        out_cache_loc = out_cache_loc.view(forward_batch.batch_size, self.topk, self.speculative_num_steps)\n"
        "        out_cache_loc = out_cache_loc.permute(2, 0, 1).reshape(self.speculative_num_steps, -1)\n",
        helper_call(),
    ),
    "renamed locals": (
        "        bs = forward_batch.batch_size\n"
        "        loc = out_cache_loc.reshape(bs, self.topk, self.speculative_num_steps)\n"
        "        loc = loc.permute((2, 0, 1)).reshape(self.speculative_num_steps, -1)\n",
        "        bs = forward_batch.batch_size\n" + helper_call(target="loc", batch_size="bs"),
    ),
    "in a nested block, comment above": (
        "        if self.topk > 0:\n"
        "            # steps first\n"
        "            out_cache_loc = out_cache_loc.reshape(\n"
        "                forward_batch.batch_size, self.topk, self.speculative_num_steps\n"
        "            )\n"
        "            out_cache_loc = out_cache_loc.permute((2, 0, 1)).reshape(\n"
        "                self.speculative_num_steps, -1\n"
        "            )\n",
        "        if self.topk > 0:\n" "            # steps first\n" + helper_call(pad="            "),
    ),
}


def test_batch_renamed_fb_and_method_moved_last(sglang_tree):
    before = DRAFT_FORWARD.replace("forward_batch", "fb")
    sglang_tree.write(WORKER_V2, worker_module(CLS, OTHER, OTHER.replace("forward_batch_generation", "other"), before))
    sglang_tree.apply([RULE])
    assert method_source(sglang_tree.read(WORKER_V2), SCOPE) == AFTER.replace("forward_batch", "fb")
    sglang_tree.assert_idempotent([RULE])


def test_import_added_when_the_file_has_no_eagle_utils_import(sglang_tree):
    header = '"""Worker (mimic)."""\n\nimport torch\n\n\n'
    sglang_tree.write(WORKER_V2, worker_module(CLS, header=header))
    sglang_tree.apply([RULE])
    assert sglang_tree.read(WORKER_V2) == worker_module(
        CLS,
        AFTER,
        header=header.replace(
            "import torch\n",
            "import torch\n\nfrom sglang.srt.speculative.eagle_utils import per_step_draft_out_cache_loc\n",
        ),
    )


@pytest.mark.parametrize(
    "layout",
    [
        helper_call(),
        "        out_cache_loc = per_step_draft_out_cache_loc(out_cache_loc, forward_batch.batch_size, self.topk, self.speculative_num_steps)\n",
    ],
    ids=["0.5.13-like", "one line"],
)
def test_already_upstream_is_patched_and_unchanged(sglang_tree, layout):
    text = worker_module(CLS, _draft_forward(layout), header=HEADER_AFTER)
    sglang_tree.write(WORKER_V2, text)
    plan = sglang_tree.plan([RULE])
    assert [(f.state, f.line) for f in plan.findings] == [
        (State.PATCHED, line_of(text, "out_cache_loc = per_step_draft_out_cache_loc("))
    ]
    assert plan.changes == ()


REFUSED = {
    "no reshape at all": "",
    "other permutation": (
        "        out_cache_loc = out_cache_loc.reshape(forward_batch.batch_size, self.topk, self.speculative_num_steps)\n"
        "        out_cache_loc = out_cache_loc.permute((1, 0, 2)).reshape(self.speculative_num_steps, -1)\n"
    ),
    "steps and topk swapped": (
        "        out_cache_loc = out_cache_loc.reshape(forward_batch.batch_size, self.speculative_num_steps, self.topk)\n"
        "        out_cache_loc = out_cache_loc.permute((2, 0, 1)).reshape(self.speculative_num_steps, -1)\n"
    ),
    "rows last": (
        "        out_cache_loc = out_cache_loc.reshape(forward_batch.batch_size, self.topk, self.speculative_num_steps)\n"
        "        out_cache_loc = out_cache_loc.permute((2, 0, 1)).reshape(-1, self.speculative_num_steps)\n"
    ),
}


@pytest.mark.parametrize("layout", REFUSED.values(), ids=REFUSED.keys())
def test_unknown_layout_is_unrecognised_at_the_def(sglang_tree, layout):
    text = worker_module(CLS, _draft_forward(layout))
    sglang_tree.write(WORKER_V2, text)
    plan = sglang_tree.plan([RULE])
    [finding] = plan.findings
    assert (finding.state, finding.line, finding.detail) == (
        State.UNRECOGNISED,
        line_of(text, "def draft_forward"),
        DETAIL,
    )
    assert plan.changes == ()


def test_apply_refuses_and_writes_nothing(sglang_tree):
    text = worker_module(CLS, OTHER, _draft_forward(""))
    sglang_tree.write(WORKER_V2, text)
    write_bystanders(sglang_tree, besides=WORKER_V2)
    assert_refused(sglang_tree, WORKER_V2, line_of(text, "def draft_forward"), SCOPE, "per-step out_cache_loc", DETAIL)


def test_apply_through_the_cli_then_nothing_to_do(sglang_tree):
    sglang_tree.write(WORKER_V2, worker_module(CLS))
    code, out, err = sglang_tree.cli("apply")
    assert (code, err) == (0, "")
    assert "\nwrote 1 file\n" in out
    assert sglang_tree.read(WORKER_V2) == worker_module(CLS, AFTER, header=HEADER_AFTER)
    code, out, _ = sglang_tree.cli("apply")
    assert code == 0
    assert out.endswith("nothing to do: every site already follows upstream\n")


def test_class_absent(sglang_tree):
    sglang_tree.write(WORKER_V2, worker_module("EAGLEWorkerV2"))
    [finding, *guarded] = sglang_tree.plan([RULE]).findings
    assert (finding.state, finding.detail) == (State.ABSENT, f"no class {CLS}")
    # the renamed class holds the draft layout: the structural guard reports it
    assert guarded and {f.rule.scope.split(".")[0] for f in guarded} == {"EAGLEWorkerV2"}


def test_v1_worker_file_absent_as_in_0_5_13(sglang_tree):
    sglang_tree.write(WORKER_V2, worker_module(CLS))
    plan = sglang_tree.plan([RULE, RULE_V1])
    assert [f.state for f in plan.findings] == [State.TO_PATCH, State.ABSENT]
    assert plan.findings[1].detail == "no srt/speculative/eagle_worker.py"


def test_comment_between_the_two_statements_is_kept(sglang_tree):
    layout = (
        "        out_cache_loc = out_cache_loc.reshape(\n"
        "            forward_batch.batch_size, self.topk, self.speculative_num_steps\n"
        "        )\n"
        "        # Steps first: row i holds the slots step i writes.\n"
        "        out_cache_loc = out_cache_loc.permute((2, 0, 1)).reshape(\n"
        "            self.speculative_num_steps, -1\n"
        "        )\n"
    )
    sglang_tree.write(WORKER_V2, worker_module(CLS, _draft_forward(layout)))
    sglang_tree.apply([RULE])
    after = method_source(sglang_tree.read(WORKER_V2), SCOPE)
    assert helper_call() in after
    assert ".permute(" not in after
    assert after.count("        # Steps first: row i holds the slots step i writes.\n") == 1


FORK_SPELLINGS = {
    "width bs * topk, locals": (
        "        bs = forward_batch.batch_size\n"
        "        topk, steps = self.topk, self.speculative_num_steps\n"
        "        out_cache_loc = out_cache_loc.reshape(bs, self.topk, self.speculative_num_steps)\n"
        "        out_cache_loc = out_cache_loc.permute(2, 0, 1).reshape(\n"
        "            self.speculative_num_steps, bs * self.topk\n"
        "        )\n",
        "        bs = forward_batch.batch_size\n"
        "        topk, steps = self.topk, self.speculative_num_steps\n" + helper_call(batch_size="bs"),
    ),
    "topk and steps locals, two transposes, flatten": (
        "        topk = self.topk\n"
        "        steps = self.speculative_num_steps\n"
        "        out_cache_loc = out_cache_loc.view(forward_batch.batch_size, topk, steps)\n"
        "        out_cache_loc = out_cache_loc.transpose(1, 2).transpose(0, 1).flatten(1)\n",
        "        topk = self.topk\n"
        "        steps = self.speculative_num_steps\n"
        + helper_call().replace("self.topk,", "topk,").replace("self.speculative_num_steps,", "steps,"),
    ),
    "3-d view bound to another name": (
        "        tmp = out_cache_loc.reshape(forward_batch.batch_size, self.topk, self.speculative_num_steps)\n"
        "        out_cache_loc = tmp.permute((2, 0, 1)).reshape(self.speculative_num_steps, -1)\n",
        helper_call(),
    ),
    "bound view, three names, topk and steps locals": (
        "        topk = self.topk\n"
        "        steps = self.speculative_num_steps\n"
        "        # [bs, topk, steps]\n"
        "        slots = out_cache_loc.view(forward_batch.batch_size, topk, steps)\n"
        "        # steps first\n"
        "        step_slots = slots.movedim(-1, 0).flatten(1)\n",
        "        topk = self.topk\n"
        "        steps = self.speculative_num_steps\n"
        "        # [bs, topk, steps]\n"
        "        # steps first\n"
        + helper_call(target="step_slots")
        .replace("self.topk,", "topk,")
        .replace("self.speculative_num_steps,", "steps,"),
    ),
    "bound view moved inside a call": (
        "        # [bs, topk, steps]\n"
        "        rows = out_cache_loc.view(\n"
        "            forward_batch.batch_size, self.topk, self.speculative_num_steps\n"
        "        )\n"
        "        self.use(\n"
        "            rows.permute(2, 0, 1).reshape(self.speculative_num_steps, -1),\n"
        "            1,\n"
        "        )\n",
        "        # [bs, topk, steps]\n" + IN_A_CALL_AFTER,
    ),
    "bound view, a statement between": (
        "        tmp = out_cache_loc.reshape(forward_batch.batch_size, self.topk, self.speculative_num_steps)\n"
        "        scores = None\n"
        "        out_cache_loc = tmp.permute((2, 0, 1)).reshape(self.speculative_num_steps, -1)\n",
        "        scores = None\n" + helper_call(),
    ),
    "two statements, a statement between": (
        "        out_cache_loc = out_cache_loc.reshape(forward_batch.batch_size, self.topk, self.speculative_num_steps)\n"
        "        scores = None\n"
        "        out_cache_loc = out_cache_loc.permute((2, 0, 1)).reshape(self.speculative_num_steps, -1)\n",
        "        scores = None\n" + helper_call(),
    ),
    # the view's comment goes with the split, its blank line stays above the statements between
    "bound view, blocks and comments between, width a local bound between": (
        "        topk_p = None\n"
        "\n"
        "        # [bs, topk, steps]: each request's draft slots\n"
        "        rows = out_cache_loc.reshape(\n"
        "            forward_batch.batch_size, self.topk, self.speculative_num_steps\n"
        "        )\n"
        "        if self.hot_token_id is not None:\n"
        "            # map to the target vocabulary\n"
        "            topk_p = self.hot_token_id[topk_p]\n"
        "\n"
        "        step_width = forward_batch.batch_size * self.topk\n"
        "        # steps first\n"
        "        out_cache_loc = rows.permute(2, 0, 1).reshape(\n"
        "            self.speculative_num_steps, step_width\n"
        "        )\n",
        "        topk_p = None\n"
        "\n"
        "        if self.hot_token_id is not None:\n"
        "            # map to the target vocabulary\n"
        "            topk_p = self.hot_token_id[topk_p]\n"
        "\n"
        "        step_width = forward_batch.batch_size * self.topk\n"
        "        # [bs, topk, steps]: each request's draft slots\n"
        "        # steps first\n" + helper_call(),
    ),
    # the comments written in the view's statement go above the split too, none lost
    "bound view, comments inside and at the end of it": (
        "        rows = out_cache_loc.view(  # [bs, topk, steps]\n"
        "            forward_batch.batch_size, self.topk, self.speculative_num_steps\n"
        "        )  # each request's draft slots\n"
        "        out_cache_loc = rows.permute(2, 0, 1).reshape(self.speculative_num_steps, -1)\n",
        "        # [bs, topk, steps]\n" "        # each request's draft slots\n" + helper_call(),
    ),
    # the comments written in a replaced statement go above the helper, none lost
    "annotated, black chain": (
        "        slots: torch.Tensor = (\n"
        "            out_cache_loc.view(forward_batch.batch_size, self.topk, self.speculative_num_steps)\n"
        "            .permute(2, 0, 1)\n"
        "            .reshape(self.speculative_num_steps, -1)\n"
        "        )\n",
        helper_call(target="slots: torch.Tensor"),
    ),
    "two statements, comments at the end of each": (
        "        out_cache_loc = out_cache_loc.reshape(  # [bs, topk, steps]\n"
        "            forward_batch.batch_size, self.topk, self.speculative_num_steps\n"
        "        )\n"
        "        out_cache_loc = out_cache_loc.permute((2, 0, 1)).reshape(  # steps first\n"
        "            self.speculative_num_steps, -1\n"
        "        )  # one row per step\n",
        "        # [bs, topk, steps]\n" "        # steps first\n" "        # one row per step\n" + helper_call(),
    ),
    "bound view, the move's comment at its end": (
        "        rows = out_cache_loc.view(forward_batch.batch_size, self.topk, self.speculative_num_steps)\n"
        "        out_cache_loc = rows.permute(2, 0, 1).reshape(self.speculative_num_steps, -1)  # steps first\n",
        "        # steps first\n" + helper_call(),
    ),
    "bound view, a blank line above it and above its move": (
        "        topk_p = None\n"
        "\n"
        "        rows = out_cache_loc.view(forward_batch.batch_size, self.topk, self.speculative_num_steps)\n"
        "\n"
        "        out_cache_loc = rows.permute(2, 0, 1).reshape(self.speculative_num_steps, -1)\n",
        "        topk_p = None\n" "\n" + helper_call(),
    ),
    "bound view, returned subscripted after a blank line": (
        "        rows = out_cache_loc.view(forward_batch.batch_size, self.topk, self.speculative_num_steps)\n"
        "        self.count += 1\n"
        "\n"
        "        return rows.movedim(-1, 0).flatten(1)[self.speculative_step_id]\n",
        "        self.count += 1\n"
        "\n"
        + helper_call()
        .replace("out_cache_loc = ", "return ")
        .replace("        )\n", "        )[self.speculative_step_id]\n"),
    ),
    # the view's statement goes, its comments (above it, at its end) onto the move in the block below
    "bound view moved into an if block, comments carried": (
        "        # [bs, topk, steps]\n"
        "        tmp = out_cache_loc.reshape(forward_batch.batch_size, self.topk, self.speculative_num_steps)  # slots\n"
        "        if self.topk > 0:\n"
        "            # steps first\n"
        "            out_cache_loc = tmp.permute((2, 0, 1)).reshape(self.speculative_num_steps, -1)\n",
        "        if self.topk > 0:\n"
        "            # [bs, topk, steps]\n"
        "            # slots\n"
        "            # steps first\n" + helper_call(pad="            "),
    ),
    # its blank line stays above the block; the statement before the move in the block stays
    "bound view moved two blocks down, after a statement": (
        "        topk_p = None\n"
        "\n"
        "        rows = out_cache_loc.view(forward_batch.batch_size, self.topk, self.speculative_num_steps)\n"
        "        with self.timer:\n"
        "            scores = None\n"
        "            if self.speculative_num_steps > 1:\n"
        "                out_cache_loc = rows.movedim(-1, 0).flatten(1)\n",
        "        topk_p = None\n"
        "\n"
        "        with self.timer:\n"
        "            scores = None\n"
        "            if self.speculative_num_steps > 1:\n" + helper_call(pad="                "),
    ),
    "bound view moved into an else branch, returned subscripted": (
        "        rows = out_cache_loc.view(forward_batch.batch_size, self.topk, self.speculative_num_steps)\n"
        "        if self.speculative_num_steps == 1:\n"
        "            return out_cache_loc\n"
        "        else:\n"
        "            return rows.permute(2, 0, 1).reshape(self.speculative_num_steps, -1)[0]\n",
        "        if self.speculative_num_steps == 1:\n"
        "            return out_cache_loc\n"
        "        else:\n"
        + helper_call(pad="            ")
        .replace("out_cache_loc = ", "return ")
        .replace("            )\n", "            )[0]\n"),
    ),
    "an attribute target, its value in parentheses (black's form of a long line)": (
        "        self.draft_step_out_cache_loc_rows_for_every_speculative_decoding_step = (\n"
        "            out_cache_loc.reshape(\n"
        "                forward_batch.batch_size, self.topk, self.speculative_num_steps\n"
        "            )\n"
        "            .permute(2, 0, 1)\n"
        "            .reshape(self.speculative_num_steps, -1)\n"
        "        )\n",
        "        self.draft_step_out_cache_loc_rows_for_every_speculative_decoding_step = (\n"
        + helper_call(target="", pad="            ").replace(" = per_step", "per_step")
        + "        )\n",
    ),
    "an attribute target too long for parentheses to help": (
        "        self.draft_step_out_cache_loc_rows_for_every_one_of_the_speculative_decoding_steps_here = (\n"
        "            out_cache_loc.reshape(bs, self.topk, self.speculative_num_steps)\n"
        "            .permute(2, 0, 1)\n"
        "            .reshape(self.speculative_num_steps, -1)\n"
        "        )\n",
        helper_call(
            target="self.draft_step_out_cache_loc_rows_for_every_one_of_the_speculative_decoding_steps_here",
            batch_size="bs",
        ),
    ),
    "bound view moved into a call on one line": (
        "        bs = forward_batch.batch_size\n"
        "        steps = self.speculative_num_steps\n"
        "        rows = out_cache_loc.reshape(bs, self.topk, steps)\n"
        "        y = self.f(rows.permute(2, 0, 1).reshape(steps, -1))\n",
        "        bs = forward_batch.batch_size\n"
        "        steps = self.speculative_num_steps\n"
        "        y = self.f(per_step_draft_out_cache_loc(out_cache_loc, bs, self.topk, steps))\n",
    ),
    "split inside a call on one line": (
        "        bs = forward_batch.batch_size\n"
        "        steps = self.speculative_num_steps\n"
        "        self.f(out_cache_loc.reshape(bs, self.topk, steps).permute(2, 0, 1).reshape(steps, -1))\n",
        "        bs = forward_batch.batch_size\n"
        "        steps = self.speculative_num_steps\n"
        "        self.f(per_step_draft_out_cache_loc(out_cache_loc, bs, self.topk, steps))\n",
    ),
    "a local name long enough for parentheses": (
        "        step_rows_of_the_draft_out_cache_loc_buffer_one_per_speculative_step = (\n"
        "            out_cache_loc.reshape(\n"
        "                forward_batch.batch_size, self.topk, self.speculative_num_steps\n"
        "            )\n"
        "        )\n"
        "        step_rows_of_the_draft_out_cache_loc_buffer_one_per_speculative_step = step_rows_of_the_draft_"
        "out_cache_loc_buffer_one_per_speculative_step.permute(\n"
        "            2, 0, 1\n"
        "        ).reshape(\n"
        "            self.speculative_num_steps, -1\n"
        "        )\n",
        "        step_rows_of_the_draft_out_cache_loc_buffer_one_per_speculative_step = (\n"
        + helper_call(target="", pad="            ").replace(" = per_step", "per_step")
        + "        )\n",
    ),
    "movedim in a subscripted chain, width a local": (
        "        step_width = self.topk * forward_batch.batch_size\n"
        "        first = (\n"
        "            out_cache_loc.view(forward_batch.batch_size, self.topk, self.speculative_num_steps)\n"
        "            .movedim(2, 0)\n"
        "            .reshape(-1, step_width)[0]\n"
        "        )\n",
        "        step_width = self.topk * forward_batch.batch_size\n"
        + helper_call(target="first").replace("        )\n", "        )[0]\n"),
    ),
}


#: the release's split reformatted or restructured, and a fork's own spellings (its names kept)
SPELLINGS = {**STRUCTURAL, **FORK_SPELLINGS}


@pytest.mark.parametrize("before, after", SPELLINGS.values(), ids=SPELLINGS.keys())
def test_each_spelling_is_rewritten_to_the_helper(sglang_tree, before, after):
    sglang_tree.write(WORKER_V2, worker_module(CLS, _draft_forward(before)))
    assert sglang_tree.apply([RULE]).findings[0].state is State.TO_PATCH
    assert sglang_tree.read(WORKER_V2) == worker_module(CLS, _draft_forward(after), header=HEADER_AFTER)
    sglang_tree.assert_idempotent([RULE])
    if black_clean(worker_module(CLS, _draft_forward(before))):  # black's input gives black's output
        assert black_clean(sglang_tree.read(WORKER_V2))


def black_clean(code: str) -> bool:
    return black.format_str(code, mode=black.Mode()) == code


def test_black_clean_spellings_are_among_those_above():
    """The black check above runs on most spellings, the long-target ones included."""
    clean = [name for name, (before, _) in SPELLINGS.items() if black_clean(worker_module(CLS, _draft_forward(before)))]
    assert len(clean) >= 13 and {name for name in clean if "long" in name} == {
        "an attribute target, its value in parentheses (black's form of a long line)",
        "an attribute target too long for parentheses to help",
        "a local name long enough for parentheses",
    }


def test_a_split_inside_a_call_is_rewritten_in_place(sglang_tree):
    before = (
        "        self.use(\n"
        "            out_cache_loc.view(\n"
        "                forward_batch.batch_size, self.topk, self.speculative_num_steps\n"
        "            ).permute(2, 0, 1).reshape(self.speculative_num_steps, -1),\n"
        "            1,\n"
        "        )\n"
    )
    sglang_tree.write(WORKER_V2, worker_module(CLS, _draft_forward(before)))
    sglang_tree.apply([RULE])
    assert sglang_tree.read(WORKER_V2) == worker_module(CLS, _draft_forward(IN_A_CALL_AFTER), header=HEADER_AFTER)


def test_a_bound_view_read_again_is_refused(sglang_tree):
    layout = (
        "        rows = out_cache_loc.view(forward_batch.batch_size, self.topk, self.speculative_num_steps)\n"
        "        out_cache_loc = rows.permute(2, 0, 1).reshape(self.speculative_num_steps, -1)\n"
        "        first = rows[:, 0]\n"
    )
    text = worker_module(CLS, OTHER, _draft_forward(layout))
    sglang_tree.write(WORKER_V2, text)
    write_bystanders(sglang_tree, besides=WORKER_V2)
    detail = (
        f"the 3-d view `rows` of its split is also read at line {line_of(text, 'first = rows[:, 0]')}: "
        "rewriting the split would remove it"
    )
    [finding] = sglang_tree.plan([RULE]).findings
    assert (finding.state, finding.detail) == (State.UNRECOGNISED, detail)
    assert_refused(
        sglang_tree, WORKER_V2, line_of(text, "rows = out_cache_loc.view("), SCOPE, "per-step out_cache_loc", detail
    )


GAP_VIEW = "        rows = out_cache_loc.view(forward_batch.batch_size, self.topk, self.speculative_num_steps)\n"
GAP_MOVE = "        out_cache_loc = rows.permute(2, 0, 1).reshape(self.speculative_num_steps, -1)\n"
#: a statement between a bound 3-d view and its move -> (the line that refuses the split, why)
GAP_REFUSED = {
    "the batch rebound": (
        "        forward_batch = self.next_batch\n",
        "`forward_batch` is rebound at line {gap} between the 3-d view `rows` (line {view}) "
        "and its move (line {move}): rewrite the split by hand",
    ),
    "the batch size set": (
        "        forward_batch.batch_size = 1\n",
        "`forward_batch.batch_size` is rebound at line {gap} between the 3-d view `rows` "
        "(line {view}) and its move (line {move}): rewrite the split by hand",
    ),
    "the buffer rebound in a loop": (
        "        for out_cache_loc in self.buffers:\n            pass\n",
        "`out_cache_loc` is rebound at line {gap} between the 3-d view `rows` "
        "(line {view}) and its move (line {move}): rewrite the split by hand",
    ),
    "topk set": (
        "        self.topk += 1\n",
        "`self.topk` is rebound at line {gap} between the 3-d view `rows` (line {view}) "
        "and its move (line {move}): rewrite the split by hand",
    ),
    "the view's local rebound": (
        "        rows = self.rows\n",
        "`rows` is rebound at line {gap} between the 3-d view `rows` (line {view}) "
        "and its move (line {move}): rewrite the split by hand",
    ),
    "the view read": (
        "        first = rows[:, 0]\n",
        "the 3-d view `rows` of its split is also read at line {gap}: rewriting the split would remove it",
    ),
    "the view captured": (
        "        pick = lambda i: rows[i]\n",
        "the 3-d view `rows` of its split is also read at line {gap}: rewriting the split would remove it",
    ),
}


@pytest.mark.parametrize("between, why", GAP_REFUSED.values(), ids=GAP_REFUSED.keys())
def test_a_bound_view_with_its_values_changed_before_its_move_is_refused(sglang_tree, between, why):
    text = worker_module(CLS, _draft_forward(GAP_VIEW + "        scores = None\n" + between + GAP_MOVE))
    sglang_tree.write(WORKER_V2, text)
    plan = sglang_tree.plan([RULE])
    [finding] = plan.findings
    view, move = line_of(text, GAP_VIEW.strip()), line_of(text, GAP_MOVE.strip())
    detail = why.format(gap=line_of(text, between.strip().splitlines()[0]), view=view, move=move)
    assert (finding.state, finding.line, finding.detail) == (State.UNRECOGNISED, view, detail)
    assert plan.changes == ()


NESTED_MOVE = "rows.permute(2, 0, 1).reshape(self.speculative_num_steps, -1)"
#: a bound 3-d view moved in a block below it that `apply` refuses -> (the block, why)
NESTED_REFUSED = {
    "moved in a loop below it": (
        "        for i in range(self.speculative_num_steps):\n"
        f"            forward_batch.out_cache_loc = {NESTED_MOVE}[i]\n",
        "the 3-d view `rows` (line {view}) is moved inside a loop (line {first}): rewrite the split by hand",
    ),
    # the test runs on every pass: the helper there would read the buffer the body rebinds
    "moved in a while loop's test": (
        f"        while {NESTED_MOVE}.numel() > forward_batch.batch_size:\n"
        "            out_cache_loc = self.next_buffer()\n",
        "the 3-d view `rows` (line {view}) is moved inside a loop (line {first}): rewrite the split by hand",
    ),
    # a lambda runs later, a comprehension on every item: the helper there would read the buffer
    # (and the names they bind) then
    "moved in a lambda": (
        "        if self.topk > 0:\n"
        f"            step_rows = lambda: {NESTED_MOVE}\n"
        "        out_cache_loc = self.next_buffer()\n",
        "the 3-d view `rows` (line {view}) is moved inside a lambda (line {second}): rewrite the split by hand",
    ),
    "moved in a comprehension binding the batch": (
        "        if self.topk > 0:\n"
        f"            out_cache_loc = [{NESTED_MOVE} for forward_batch in self.batches]\n",
        "the 3-d view `rows` (line {view}) is moved inside a comprehension (line {second}): "
        "rewrite the split by hand",
    ),
    # its errors (a buffer of another length) were raised by the view, before the `try`
    "moved into a try body with a handler": (
        "        try:\n"
        f"            out_cache_loc = {NESTED_MOVE}\n"
        "        except RuntimeError:\n"
        "            out_cache_loc = forward_batch.out_cache_loc\n",
        "the 3-d view `rows` (line {view}) is moved into the body of a `try` (line {first}), whose handlers "
        "would catch its errors: rewrite the split by hand",
    ),
    "moved in two branches": (
        "        if self.topk == 1:\n"
        "            out_cache_loc = rows.movedim(-1, 0).flatten(1)\n"
        "        else:\n"
        f"            out_cache_loc = {NESTED_MOVE}\n",
        "the 3-d view `rows` (line {view}) is moved in 2 places (lines {second}, {fourth}): rewrite the split by hand",
    ),
    "the batch rebound in the block before the move": (
        "        if self.topk > 0:\n"
        "            forward_batch = self.next_batch\n"
        f"            out_cache_loc = {NESTED_MOVE}\n",
        "`forward_batch` is rebound at line {second} between the 3-d view `rows` (line {view}) "
        "and its move (line {third}): rewrite the split by hand",
    ),
    "the buffer rebound by the block's header": (
        "        with self.buffers() as out_cache_loc:\n" f"            out_cache_loc = {NESTED_MOVE}\n",
        "`out_cache_loc` is rebound at line {first} between the 3-d view `rows` (line {view}) "
        "and its move (line {second}): rewrite the split by hand",
    ),
    # the move's own statement binds before the move what the view reads: a match capture, a walrus
    "the batch captured by the pattern of the move's guard": (
        "        match self.mode:\n"
        f"            case (forward_batch, _) if {NESTED_MOVE}.numel():\n"
        "                out_cache_loc = forward_batch.out_cache_loc\n",
        "`forward_batch` is rebound at line {second} between the 3-d view `rows` (line {view}) "
        "and its move (line {second}): rewrite the split by hand",
    ),
    "the batch bound by a walrus before the move in its statement": (
        f"        if (forward_batch := self.next_batch) is not None and {NESTED_MOVE}.numel():\n"
        "            out_cache_loc = forward_batch.out_cache_loc\n",
        "`forward_batch` is rebound at line {first} between the 3-d view `rows` (line {view}) "
        "and its move (line {first}): rewrite the split by hand",
    ),
    "the view read by the block's header": (
        "        if rows.numel():\n" f"            out_cache_loc = {NESTED_MOVE}\n",
        "the 3-d view `rows` of its split is also read at line {first}: rewriting the split would remove it",
    ),
}


@pytest.mark.parametrize("block, why", NESTED_REFUSED.values(), ids=NESTED_REFUSED.keys())
def test_a_bound_view_moved_in_a_block_below_it_is_refused_where_unsafe(sglang_tree, block, why):
    text = worker_module(CLS, OTHER, _draft_forward(GAP_VIEW + block))
    sglang_tree.write(WORKER_V2, text)
    write_bystanders(sglang_tree, besides=WORKER_V2)
    view = line_of(text, GAP_VIEW.strip())
    first, second, third, fourth = range(view + 1, view + 5)
    detail = why.format(view=view, first=first, second=second, third=third, fourth=fourth)
    [finding] = sglang_tree.plan([RULE]).findings
    assert (finding.state, finding.line, finding.detail) == (State.UNRECOGNISED, view, detail)
    assert_refused(sglang_tree, WORKER_V2, view, SCOPE, "per-step out_cache_loc", detail)


def test_apply_refuses_a_rebound_batch_size_and_writes_nothing(sglang_tree):
    between, why = GAP_REFUSED["the batch size set"]
    text = worker_module(CLS, OTHER, _draft_forward(GAP_VIEW + between + GAP_MOVE))
    sglang_tree.write(WORKER_V2, text)
    write_bystanders(sglang_tree, besides=WORKER_V2)
    view, move = line_of(text, GAP_VIEW.strip()), line_of(text, GAP_MOVE.strip())
    assert_refused(
        sglang_tree, WORKER_V2, view, SCOPE, "per-step out_cache_loc", why.format(gap=view + 1, view=view, move=move)
    )


TWO_SPLITS_AFTER = (
    "        if self.topk == 1:\n"
    + helper_call(pad="            ")
    + "        else:\n"
    + helper_call(pad="            ")
)


def test_every_split_of_the_method_is_rewritten_in_one_apply(sglang_tree):
    text = worker_module(CLS, _draft_forward(WORKER_TWO_SPLITS))
    sglang_tree.write(WORKER_V2, text)
    [finding] = sglang_tree.apply([RULE]).findings
    assert (finding.state, finding.line) == (State.TO_PATCH, line_of(text, "out_cache_loc.view("))
    assert sglang_tree.read(WORKER_V2) == worker_module(CLS, _draft_forward(TWO_SPLITS_AFTER), header=HEADER_AFTER)
    sglang_tree.assert_idempotent([RULE])


def test_a_split_left_beside_the_helper_is_still_to_patch(sglang_tree):
    """A method half patched (its first split only, as version 0.3.0 of this tool left it) is not patched."""
    topk1_branch = WORKER_TWO_SPLITS.split("        else:\n")[0]
    half = WORKER_TWO_SPLITS.replace(topk1_branch, "        if self.topk == 1:\n" + helper_call(pad="            "))
    text = worker_module(CLS, _draft_forward(half), header=HEADER_AFTER)
    sglang_tree.write(WORKER_V2, text)
    [finding] = sglang_tree.apply([RULE]).findings
    assert (finding.state, finding.line) == (State.TO_PATCH, line_of(text, "out_cache_loc = out_cache_loc.reshape("))
    assert sglang_tree.read(WORKER_V2) == worker_module(CLS, _draft_forward(TWO_SPLITS_AFTER), header=HEADER_AFTER)


def test_two_splits_in_one_statement_are_refused(sglang_tree):
    split = (
        "out_cache_loc.view(forward_batch.batch_size, self.topk, self.speculative_num_steps).movedim(-1, 0).flatten(1)"
    )
    layout = f"        out_cache_loc = self.pick({split}, {split.replace('view', 'reshape')})\n"
    text = worker_module(CLS, _draft_forward(layout))
    sglang_tree.write(WORKER_V2, text)
    plan = sglang_tree.plan([RULE])
    [finding] = plan.findings
    line = line_of(text, "out_cache_loc = self.pick(")
    assert (finding.state, finding.line, finding.detail) == (
        State.UNRECOGNISED,
        line,
        f"two per-step out_cache_loc splits in one statement (line {line}): rewrite them by hand",
    )
    assert plan.changes == ()


@pytest.mark.parametrize(
    "layout",
    [
        "        out_cache_loc = out_cache_loc.reshape(forward_batch.batch_size, self.topk, self.speculative_num_steps); "
        "out_cache_loc = out_cache_loc.permute((2, 0, 1)).reshape(self.speculative_num_steps, -1)\n",
        "        if self.speculative_num_steps > 1: out_cache_loc = out_cache_loc.reshape(\n"
        "            forward_batch.batch_size, self.topk, self.speculative_num_steps\n"
        "        ).permute((2, 0, 1)).reshape(self.speculative_num_steps, -1)\n",
    ],
)
def test_a_split_sharing_its_line_is_unrecognised_naming_the_line(sglang_tree, layout):
    """libcst keeps `;`-joined statements and a one-line block as one line: `check` and `apply` say
    so (a line black would split), and apply writes nothing."""
    text = worker_module(CLS, _draft_forward(layout))
    sglang_tree.write(WORKER_V2, text)
    write_bystanders(sglang_tree, besides=WORKER_V2)
    assert_refused(
        sglang_tree,
        WORKER_V2,
        line_of(text, "out_cache_loc = out_cache_loc.reshape("),
        SCOPE,
        "per-step out_cache_loc",
        "more than one statement on this line (`;` or a one-line block): "
        "put each on a line of its own, as black does",
    )


#: rows laid out another way for batches larger than check's probes run (test_spelling_properties found such a
#: fork patched, its step-major chunks for more than 4 sequences left: the probes never took that branch)
SPLIT = (
    "        out_cache_loc = out_cache_loc.reshape(\n"
    "            forward_batch.batch_size, self.topk, self.speculative_num_steps\n"
    "        )\n"
    "        out_cache_loc = out_cache_loc.permute((2, 0, 1)).reshape(self.speculative_num_steps, -1)\n"
)
CHUNKS = "out_cache_loc.reshape(self.speculative_num_steps, -1)"


@pytest.mark.parametrize(
    "layout",
    [
        "        if forward_batch.batch_size > 4:\n"
        f"            out_cache_loc = {CHUNKS}\n"
        "        else:\n" + "".join("    " + line for line in SPLIT.splitlines(True)),
        SPLIT + f"        if forward_batch.batch_size > 4:\n            out_cache_loc = {CHUNKS}\n",
    ],
    ids=["in a branch above", "after it"],
)
def test_the_splits_rows_bound_another_way_are_refused(sglang_tree, layout):
    text = worker_module(CLS, _draft_forward(layout))
    sglang_tree.write(WORKER_V2, text)
    plan = sglang_tree.plan([RULE])
    [finding] = plan.findings
    line = line_of(text, f"out_cache_loc = {CHUNKS}")
    assert (finding.state, finding.line) == (State.UNRECOGNISED, line)
    assert finding.detail == (
        f"`out_cache_loc`, which its split binds, is also bound at line {line} (`{CHUNKS}`), which the probes need"
        " not run: rewrite the split by hand"
    )
    assert plan.changes == ()


def test_a_contiguous_copy_of_the_rows_is_no_other_layout(sglang_tree):
    """0.5.12's v1 worker makes the rows contiguous for one draft model (GptOss), after its split."""
    layout = SPLIT + "        if self.gpt_oss:\n            out_cache_loc = out_cache_loc.contiguous()\n"
    sglang_tree.write(WORKER_V2, worker_module(CLS, _draft_forward(layout)))
    assert sglang_tree.apply([RULE]).findings[0].state is State.TO_PATCH
    assert "out_cache_loc = out_cache_loc.contiguous()" in sglang_tree.read(WORKER_V2)

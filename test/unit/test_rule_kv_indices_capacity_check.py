"""rules/kv_indices_capacity_check.py: the capacity assert of common_template (FlashInfer, FlashInfer-MLA).

Before the draft kernel fills the rows, bind ``required_kv_indices_len =
draft_kv_indices_used_len(seq_lens_sum, self.topk, bs, self.speculative_num_steps)`` and
assert it fits ``kv_indices_buffer.shape[1]``; the operands are read off the per-step slice.
"""

from __future__ import annotations

import pytest

from rule_test_support import (
    AFTER_STEP_SLICE_END,
    COMMON_TEMPLATE,
    EAGER,
    FLASHINFER,
    FLASHINFER_MLA,
    GRAPH,
    INIT,
    assert_refused,
    backend_header,
    backend_module,
    line_of,
    method_source,
    rule,
    write_bystanders,
)
from sglang_draft_layout.rules import RULES
from sglang_draft_layout.rules.base import State

CLS = "FlashInferMultiStepDraftBackend"
SCOPE = f"{CLS}.common_template"
RULE = rule("capacity-check:flashinfer")
DETAIL_NO_LAUNCH = "no kernel launch to anchor the capacity check"
DETAIL_NO_SLICE = "no per-step slice to anchor the capacity check"


def check(row="kv_indices_buffer", seq_lens_sum="seq_lens_sum", bs="bs", indent="        "):
    """The two statements the rule inserts, then the blank line it keeps before the launch."""
    lines = [
        "required_kv_indices_len = draft_kv_indices_used_len(",
        f"    {seq_lens_sum}, self.topk, {bs}, self.speculative_num_steps",
        ")",
        f"assert required_kv_indices_len <= {row}.shape[1], (",
        '    f"EAGLE draft kv_indices row too small: need {required_kv_indices_len} > "',
        f'    f"width {{{row}.shape[1]}} (topk={{self.topk}}, "',
        f'    f"num_seqs={{{bs} // self.topk}}, seq_lens_sum={{{seq_lens_sum}}}, "',
        '    f"num_steps={self.speculative_num_steps}); size rows with "',
        '    "draft_kv_indices_buffer_width(num_seqs, topk, max_context_len)"',
        ")",
    ]
    return "".join(f"{indent}{line}\n" for line in lines) + "\n"


LAUNCH = "        self.generate_draft_decode_kv_indices["
AFTER = COMMON_TEMPLATE.replace(LAUNCH, check() + LAUNCH)


def test_before_after_whole_file(sglang_tree):
    before = backend_module(CLS)
    sglang_tree.write(FLASHINFER, before)

    plan = sglang_tree.apply([RULE])

    [finding] = plan.findings
    assert (finding.state, finding.line) == (State.TO_PATCH, line_of(before, "self.generate_draft_decode_kv_indices["))
    after = sglang_tree.read(FLASHINFER)
    assert method_source(after, SCOPE) == AFTER
    assert after == backend_module(CLS, INIT, AFTER, EAGER, GRAPH, header=backend_header("draft_kv_indices_used_len"))
    sglang_tree.assert_idempotent([RULE])
    assert sglang_tree.read(FLASHINFER) == after


def test_flashinfer_mla(sglang_tree):
    cls = "FlashInferMLAMultiStepDraftBackend"
    sglang_tree.write(FLASHINFER_MLA, backend_module(cls))
    sglang_tree.apply([rule("capacity-check:flashinfer_mla")])
    assert sglang_tree.read(FLASHINFER_MLA) == backend_module(
        cls, INIT, AFTER, EAGER, GRAPH, header=backend_header("draft_kv_indices_used_len")
    )
    sglang_tree.assert_idempotent([rule("capacity-check:flashinfer_mla")])


def test_only_the_flashinfer_backends_get_the_check():
    assert sorted(r.id for r in RULES if r.id.startswith("capacity-check:")) == [
        "capacity-check:flashinfer",
        "capacity-check:flashinfer_mla",
    ]


def test_with_the_step_slice_rule_one_import_and_both_edits(sglang_tree):
    rules = [RULE, rule("step-slice:flashinfer")]
    sglang_tree.write(FLASHINFER, backend_module(CLS))
    sglang_tree.apply(rules)
    expected = AFTER.replace("seq_lens_sum * self.topk + bs * (i + 1)", AFTER_STEP_SLICE_END)
    assert sglang_tree.read(FLASHINFER) == backend_module(
        CLS, INIT, expected, EAGER, GRAPH, header=backend_header("draft_kv_indices_used_len")
    )
    sglang_tree.assert_idempotent(rules)


def test_slice_already_upstream_gives_the_operands(sglang_tree):
    template = COMMON_TEMPLATE.replace("seq_lens_sum * self.topk + bs * (i + 1)", AFTER_STEP_SLICE_END)
    header = backend_header("draft_kv_indices_used_len")
    sglang_tree.write(FLASHINFER, backend_module(CLS, INIT, template, header=header))
    sglang_tree.apply([RULE])
    expected = AFTER.replace("seq_lens_sum * self.topk + bs * (i + 1)", AFTER_STEP_SLICE_END)
    assert sglang_tree.read(FLASHINFER) == backend_module(CLS, INIT, expected, header=header)


RENAMED = """\
    def common_template(self, fb, kv_buf, call_fn):
        n = self.topk * fb.batch_size
        generate_draft_decode_kv_indices[(self.speculative_num_steps, fb.batch_size, self.topk)](kv_buf)  # fill
        for step in range(self.speculative_num_steps - 1):
            fb.spec_info.kv_indices = kv_buf[step][: (step + 1) * n + self.topk * fb.seq_lens_sum]
            call_fn(step, fb)
"""


def test_renamed_locals_module_level_kernel_and_method_moved(sglang_tree):
    sglang_tree.write(FLASHINFER, backend_module(CLS, INIT, EAGER, GRAPH, RENAMED))
    plan = sglang_tree.apply([RULE])
    assert plan.findings[0].state is State.TO_PATCH
    expected = RENAMED.replace(
        "        generate_draft",
        check(row="kv_buf", seq_lens_sum="fb.seq_lens_sum", bs="n") + "        generate_draft",
    )
    assert method_source(sglang_tree.read(FLASHINFER), SCOPE) == expected
    sglang_tree.assert_idempotent([RULE])


def test_launch_in_a_nested_block(sglang_tree):
    method = """\
    def common_template(self, forward_batch, kv_indices_buffer, call_fn):
        bs = self.topk * forward_batch.batch_size
        seq_lens_sum = forward_batch.seq_lens_sum
        if self.speculative_num_steps > 0:
            self.generate_draft_decode_kv_indices[(self.speculative_num_steps, bs, self.topk)](
                kv_indices_buffer
            )
        for i in range(self.speculative_num_steps - 1):
            forward_batch.spec_info.kv_indices = kv_indices_buffer[i][: seq_lens_sum * self.topk + bs * (i + 1)]
"""
    sglang_tree.write(FLASHINFER, backend_module(CLS, INIT, method))
    sglang_tree.apply([RULE])
    expected = method.replace(
        "            self.generate_draft",
        check(indent="            ") + "            self.generate_draft",
    )
    assert method_source(sglang_tree.read(FLASHINFER), SCOPE) == expected


UPSTREAM_ASSERT_BUFFER_FITS = """\
    def common_template(self, forward_batch, kv_indices_buffer, call_fn):
        num_seqs = forward_batch.batch_size
        bs = self.topk * num_seqs
        seq_lens_sum = forward_batch.seq_lens_sum

        required_kv_indices_len = draft_kv_indices_used_len(
            seq_lens_sum, self.topk, bs, self.speculative_num_steps
        )
        assert_buffer_fits(
            required_kv_indices_len,
            kv_indices_buffer.shape[1],
            "draft kv_indices row",
        )
        self.generate_draft_decode_kv_indices[
            (self.speculative_num_steps, num_seqs, self.topk)
        ](kv_indices_buffer)

        for i in range(self.speculative_num_steps - 1):
            forward_batch.spec_info.kv_indices = kv_indices_buffer[i][
                : draft_kv_indices_used_len(seq_lens_sum, self.topk, bs, i + 1)
            ]
"""


@pytest.mark.parametrize(
    "method",
    [
        UPSTREAM_ASSERT_BUFFER_FITS,
        UPSTREAM_ASSERT_BUFFER_FITS.replace("required_kv_indices_len = ", "need = ").replace(
            "            required_kv_indices_len,\n", "            need,\n"
        ),
        UPSTREAM_ASSERT_BUFFER_FITS.replace(
            "        required_kv_indices_len = draft_kv_indices_used_len(\n"
            "            seq_lens_sum, self.topk, bs, self.speculative_num_steps\n"
            "        )\n",
            "        required_kv_indices_len = self.required_len(seq_lens_sum, bs)\n",
        ),
        AFTER,
    ],
    ids=["0.5.13 assert_buffer_fits", "renamed local", "assert_buffer_fits alone", "this rule's own output"],
)
def test_already_upstream_is_patched_and_unchanged(sglang_tree, method):
    text = backend_module(CLS, INIT, method, header=backend_header("draft_kv_indices_used_len"))
    sglang_tree.write(FLASHINFER, text)
    plan = sglang_tree.plan([RULE])
    assert [(f.state, f.line) for f in plan.findings] == [(State.PATCHED, line_of(text, "def common_template"))]
    assert plan.changes == ()


def test_no_kernel_launch_is_unrecognised(sglang_tree):
    template = COMMON_TEMPLATE.replace("self.generate_draft_decode_kv_indices[", "self.fill_rows[")
    text = backend_module(CLS, INIT, template)
    sglang_tree.write(FLASHINFER, text)
    plan = sglang_tree.plan([RULE])
    [finding] = plan.findings
    assert (finding.state, finding.line, finding.detail) == (
        State.UNRECOGNISED,
        line_of(text, "def common_template"),
        DETAIL_NO_LAUNCH,
    )
    assert plan.changes == ()


def test_unknown_slice_leaves_no_operands_and_is_unrecognised(sglang_tree):
    template = COMMON_TEMPLATE.replace("seq_lens_sum * self.topk + bs * (i + 1)", "seq_lens_sum + bs")
    text = backend_module(CLS, INIT, template)
    sglang_tree.write(FLASHINFER, text)
    [finding] = sglang_tree.plan([RULE]).findings
    assert (finding.state, finding.line, finding.detail) == (
        State.UNRECOGNISED,
        line_of(text, "def common_template"),
        DETAIL_NO_SLICE,
    )


def test_apply_refuses_and_writes_nothing(sglang_tree):
    cls = "FlashInferMLAMultiStepDraftBackend"
    template = COMMON_TEMPLATE.replace("self.generate_draft_decode_kv_indices[", "self.fill_rows[")
    text = backend_module(cls, INIT, template, EAGER, GRAPH)
    sglang_tree.write(FLASHINFER_MLA, text)
    write_bystanders(sglang_tree, besides=FLASHINFER_MLA)
    assert_refused(
        sglang_tree,
        FLASHINFER_MLA,
        line_of(text, "def common_template"),
        f"{cls}.common_template",
        "kv_indices capacity check",
        DETAIL_NO_LAUNCH,
    )


def test_class_absent(sglang_tree):
    sglang_tree.write(FLASHINFER, backend_module("FlashInferAttnBackend"))
    [finding, *guarded] = sglang_tree.plan([RULE]).findings
    assert (finding.state, finding.detail) == (State.ABSENT, f"no class {CLS}")
    # the renamed class holds the draft layout: the structural guard reports it
    assert guarded and {f.rule.scope.split(".")[0] for f in guarded} == {"FlashInferAttnBackend"}


LATE_OPERAND = """\
    def common_template(self, forward_batch, kv_indices_buffer, call_fn):
        num_seqs = forward_batch.batch_size
        bs = self.topk * num_seqs
        self.generate_draft_decode_kv_indices[(self.speculative_num_steps, num_seqs, self.topk)](
            kv_indices_buffer
        )
        seq_lens_sum = forward_batch.seq_lens_sum
        for i in range(self.speculative_num_steps - 1):
            forward_batch.spec_info.kv_indices = kv_indices_buffer[i][: seq_lens_sum * self.topk + bs * (i + 1)]
"""


def test_operand_assigned_after_the_launch_is_not_read_before_its_assignment(sglang_tree):
    sglang_tree.write(FLASHINFER, backend_module(CLS, INIT, LATE_OPERAND))
    plan = sglang_tree.plan([RULE])
    [finding] = plan.findings
    if finding.state is not State.UNRECOGNISED:
        method = method_source(plan.changes[0].new, SCOPE)
        assert method.index("seq_lens_sum = forward_batch") < method.index("required_kv_indices_len = ")

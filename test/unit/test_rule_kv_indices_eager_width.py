"""rules/kv_indices_eager_width.py: the eager kv_indices row width of init_forward_metadata.

``torch.empty((self.speculative_num_steps, forward_batch.batch_size * self.topk * self.max_context_len), ...)``
becomes ``kv_indices_width = draft_kv_indices_buffer_width(forward_batch.batch_size, self.topk,
self.max_context_len)`` then ``torch.empty((self.speculative_num_steps, kv_indices_width), ...)``.
"""

from __future__ import annotations

import pytest

from rule_test_support import (
    AITER,
    COMMON_TEMPLATE,
    EAGER,
    FLASHINFER,
    FLASHINFER_MLA,
    GRAPH,
    INIT,
    TRITON,
    assert_refused,
    backend_header,
    backend_module,
    line_of,
    method_source,
    rule,
    write_bystanders,
)
from sglang_draft_layout.rules.base import State

CLS = "FlashInferMultiStepDraftBackend"
SCOPE = f"{CLS}.init_forward_metadata"
RULE = rule("eager-width:flashinfer")
HEADER_AFTER = backend_header("draft_kv_indices_buffer_width")

AFTER = """\
    def init_forward_metadata(self, forward_batch):
        # One kv_indices row per draft step.
        kv_indices_width = draft_kv_indices_buffer_width(
            forward_batch.batch_size, self.topk, self.max_context_len
        )
        kv_indices = torch.empty(
            (self.speculative_num_steps, kv_indices_width),
            dtype=torch.int32,
            device="cuda",
        )

        def call_fn(i, forward_batch):
            self.attn_backends[i].init_forward_metadata(forward_batch)

        self.common_template(forward_batch, kv_indices, call_fn)
"""


def test_before_after_whole_file(sglang_tree):
    before = backend_module(CLS)
    sglang_tree.write(FLASHINFER, before)

    plan = sglang_tree.apply([RULE])

    [finding] = plan.findings
    assert (finding.state, finding.line) == (State.TO_PATCH, line_of(before, "kv_indices = torch.empty("))
    after = sglang_tree.read(FLASHINFER)
    assert method_source(after, SCOPE) == AFTER
    assert after == backend_module(CLS, INIT, COMMON_TEMPLATE, AFTER, GRAPH, header=HEADER_AFTER)
    sglang_tree.assert_idempotent([RULE])
    assert sglang_tree.read(FLASHINFER) == after


@pytest.mark.parametrize(
    "rule_id, relative, cls, dtype, device",
    [
        ("eager-width:flashinfer", FLASHINFER, "FlashInferMultiStepDraftBackend", "torch.int32", '"cuda"'),
        ("eager-width:flashinfer_mla", FLASHINFER_MLA, "FlashInferMLAMultiStepDraftBackend", "torch.int32", '"cuda"'),
        ("eager-width:triton", TRITON, "TritonMultiStepDraftBackend", "torch.int64", "self.device"),
        ("eager-width:aiter", AITER, "AiterMultiStepDraftBackend", "torch.int32", "self.device"),
    ],
)
def test_every_backend_keeps_dtype_and_device(sglang_tree, rule_id, relative, cls, dtype, device):
    def site(text):
        return text.replace("dtype=torch.int32", f"dtype={dtype}").replace('device="cuda"', f"device={device}")

    sglang_tree.write(relative, backend_module(cls, INIT, site(EAGER)))
    sglang_tree.apply([rule(rule_id)])
    assert sglang_tree.read(relative) == backend_module(cls, INIT, site(AFTER), header=HEADER_AFTER)
    sglang_tree.assert_idempotent([rule(rule_id)])


WIDTH_CALL = "draft_kv_indices_buffer_width(\n{pad}    {num_seqs}, self.topk, self.max_context_len\n{pad})\n"


def width_stmt(num_seqs="forward_batch.batch_size", pad="        "):
    return f"{pad}kv_indices_width = " + WIDTH_CALL.format(pad=pad, num_seqs=num_seqs)


def _eager(allocation: str, params="self, forward_batch", before: str = "") -> str:
    return f"    def init_forward_metadata({params}):\n{before}{allocation}        self.common_template(None, None, None)\n"


ONE_LINE_AFTER = "        kv_indices = torch.empty((self.speculative_num_steps, kv_indices_width), dtype=torch.int32)\n"

STRUCTURAL = {
    "topk first": (
        "        kv_indices = torch.empty((self.speculative_num_steps, self.topk * forward_batch.batch_size * self.max_context_len), dtype=torch.int32)\n",
        width_stmt() + ONE_LINE_AFTER,
    ),
    "max_context_len first": (
        "        kv_indices = torch.empty((self.speculative_num_steps, self.max_context_len * forward_batch.batch_size * self.topk), dtype=torch.int32)\n",
        width_stmt() + ONE_LINE_AFTER,
    ),
    "parenthesised factors": (
        "        kv_indices = torch.empty(\n"
        "            (self.speculative_num_steps, ((forward_batch.batch_size * self.topk) * (self.max_context_len))),\n"
        "            dtype=torch.int32,\n"
        "        )\n",
        width_stmt() + "        kv_indices = torch.empty(\n"
        "            (self.speculative_num_steps, kv_indices_width),\n"
        "            dtype=torch.int32,\n"
        "        )\n",
    ),
    "topk missing": (
        "        kv_indices = torch.empty((self.speculative_num_steps, forward_batch.batch_size * self.max_context_len), dtype=torch.int32)\n",
        width_stmt() + ONE_LINE_AFTER,
    ),
    "comment above and statements before": (
        "        x = 1\n\n"
        "        # the rows\n"
        "        # (one per step)\n"
        "        kv_indices = torch.empty((self.speculative_num_steps, forward_batch.batch_size * self.topk * self.max_context_len), dtype=torch.int32)\n",
        "        x = 1\n\n" "        # the rows\n" "        # (one per step)\n" + width_stmt() + ONE_LINE_AFTER,
    ),
}


@pytest.mark.parametrize("before, after", STRUCTURAL.values(), ids=STRUCTURAL.keys())
def test_structural_variants(sglang_tree, before, after):
    sglang_tree.write(FLASHINFER, backend_module(CLS, INIT, _eager(before)))
    assert sglang_tree.apply([RULE]).findings[0].state is State.TO_PATCH
    assert sglang_tree.read(FLASHINFER) == backend_module(CLS, INIT, _eager(after), header=HEADER_AFTER)
    sglang_tree.assert_idempotent([RULE])


def test_renamed_batch_and_buffer_zeros_int64_method_moved(sglang_tree):
    method = """\
    def init_forward_metadata(self, fb):
        kv_buf = torch.zeros((self.speculative_num_steps, fb.batch_size * self.topk * self.max_context_len), dtype=torch.int64, device=self.device)
        self.common_template(fb, kv_buf, None)
"""
    sglang_tree.write(FLASHINFER, backend_module(CLS, INIT, COMMON_TEMPLATE, GRAPH, method))
    sglang_tree.apply([RULE])
    assert (
        method_source(sglang_tree.read(FLASHINFER), SCOPE)
        == """\
    def init_forward_metadata(self, fb):
        kv_indices_width = draft_kv_indices_buffer_width(
            fb.batch_size, self.topk, self.max_context_len
        )
        kv_buf = torch.zeros((self.speculative_num_steps, kv_indices_width), dtype=torch.int64, device=self.device)
        self.common_template(fb, kv_buf, None)
"""
    )
    sglang_tree.assert_idempotent([RULE])


@pytest.mark.parametrize(
    "allocation",
    [
        width_stmt() + ONE_LINE_AFTER,
        "        width = draft_kv_indices_buffer_width(forward_batch.batch_size, self.topk, self.max_context_len)\n"
        "        kv_indices = torch.empty((self.speculative_num_steps, width), dtype=torch.int32)\n",
        "        kv_indices = torch.empty(\n"
        "            (self.speculative_num_steps, draft_kv_indices_buffer_width(forward_batch.batch_size, self.topk, self.max_context_len)),\n"
        "            dtype=torch.int32,\n"
        "        )\n",
    ],
    ids=["0.5.13 kv_indices_width", "other local name", "inline call"],
)
def test_already_upstream_is_patched_and_unchanged(sglang_tree, allocation):
    text = backend_module(CLS, INIT, _eager(allocation), header=HEADER_AFTER)
    sglang_tree.write(FLASHINFER, text)
    plan = sglang_tree.plan([RULE])
    assert [(f.state, f.line) for f in plan.findings] == [(State.PATCHED, line_of(text, "kv_indices = torch.empty("))]
    assert plan.changes == ()


REFUSED = {
    "constant factor": "forward_batch.batch_size * 2 * self.max_context_len",
    "no max_context_len": "forward_batch.batch_size * self.topk * 4096",
    "a sum": "forward_batch.batch_size * self.topk * self.max_context_len + 1",
    "two unknown factors": "forward_batch.batch_size * self.num_heads * self.topk * self.max_context_len",
}


@pytest.mark.parametrize("width", REFUSED.values(), ids=REFUSED.keys())
def test_unknown_width_is_unrecognised(sglang_tree, width):
    text = backend_module(
        CLS, INIT, _eager(f"        kv_indices = torch.empty((self.speculative_num_steps, {width}))\n")
    )
    _assert_unrecognised_width(sglang_tree, text, width)


def test_width_in_a_local_gets_the_helper_as_its_value(sglang_tree):
    """The fork binds the inline product to a local (0.5.13's form, reverted): the local is rewritten."""
    allocation = "        kv_indices = torch.empty((self.speculative_num_steps, width))\n"
    text = backend_module(
        CLS, INIT, _eager("        width = forward_batch.batch_size * self.topk * self.max_context_len\n" + allocation)
    )
    sglang_tree.write(FLASHINFER, text)
    plan = sglang_tree.apply([RULE])
    [finding] = plan.findings
    assert (finding.state, finding.line) == (State.TO_PATCH, line_of(text, "width = forward_batch"))
    after = method_source(sglang_tree.read(FLASHINFER), SCOPE)
    assert (
        "        width = " + WIDTH_CALL.format(pad="        ", num_seqs="forward_batch.batch_size") + allocation
        in after
    )
    sglang_tree.assert_idempotent([RULE])


def test_width_in_a_local_of_unknown_form_is_unrecognised(sglang_tree):
    text = backend_module(
        CLS,
        INIT,
        _eager(
            "        width = forward_batch.batch_size * 2 * self.max_context_len\n"
            "        kv_indices = torch.empty((self.speculative_num_steps, width))\n"
        ),
    )
    _assert_unrecognised_width(sglang_tree, text, "forward_batch.batch_size * 2 * self.max_context_len")


def _assert_unrecognised_width(sglang_tree, text, width):
    sglang_tree.write(FLASHINFER, text)
    plan = sglang_tree.plan([RULE])
    [finding] = plan.findings
    assert (finding.state, finding.line, finding.detail) == (
        State.UNRECOGNISED,
        line_of(text, "kv_indices = torch.empty("),
        f"row width `{width}` is no known form",
    )
    assert plan.changes == ()


@pytest.mark.parametrize(
    "allocation",
    [
        "        kv_indices = torch.empty(self.speculative_num_steps * forward_batch.batch_size * self.topk * self.max_context_len)\n",
        "        kv_indices = torch.empty((forward_batch.batch_size * self.topk * self.max_context_len, self.speculative_num_steps))\n",
        "        kv_indices = self.pool.alloc((self.speculative_num_steps, forward_batch.batch_size * self.topk * self.max_context_len))\n",
    ],
    ids=["flat", "steps last", "not torch"],
)
def test_no_row_allocation_is_unrecognised_at_the_def(sglang_tree, allocation):
    text = backend_module(CLS, INIT, _eager(allocation))
    sglang_tree.write(FLASHINFER, text)
    [finding] = sglang_tree.plan([RULE]).findings
    assert (finding.state, finding.line, finding.detail) == (
        State.UNRECOGNISED,
        line_of(text, "def init_forward_metadata"),
        "no `torch.empty/zeros((self.speculative_num_steps, width), ...)` row allocation",
    )


def test_apply_refuses_and_writes_nothing(sglang_tree):
    cls = "AiterMultiStepDraftBackend"
    eager = EAGER.replace(
        "forward_batch.batch_size * self.topk * self.max_context_len",
        "forward_batch.batch_size * 2 * self.max_context_len",
    )
    text = backend_module(cls, INIT, COMMON_TEMPLATE, eager, GRAPH)
    sglang_tree.write(AITER, text)
    write_bystanders(sglang_tree, besides=AITER)
    assert_refused(
        sglang_tree,
        AITER,
        line_of(text, "kv_indices = torch.empty("),
        f"{cls}.init_forward_metadata",
        "eager kv_indices row width",
        "row width `forward_batch.batch_size * 2 * self.max_context_len` is no known form",
    )


def test_class_absent(sglang_tree):
    sglang_tree.write(FLASHINFER, backend_module("FlashInferAttnBackend"))
    [finding, *guarded] = sglang_tree.plan([RULE]).findings
    assert (finding.state, finding.detail) == (State.ABSENT, f"no class {CLS}")
    # the renamed class holds the draft layout: the structural guard reports it
    assert guarded and {f.rule.scope.split(".")[0] for f in guarded} == {"FlashInferAttnBackend"}


@pytest.mark.parametrize("width", ["self.max_context_len * 2", "forward_batch.seq_lens_sum * self.max_context_len"])
def test_width_whose_factor_is_not_the_batch_size_is_unrecognised(sglang_tree, width):
    text = backend_module(
        CLS, INIT, _eager(f"        kv_indices = torch.empty((self.speculative_num_steps, {width}))\n")
    )
    sglang_tree.write(FLASHINFER, text)
    [finding] = sglang_tree.plan([RULE]).findings
    assert (finding.state, finding.line) == (State.UNRECOGNISED, line_of(text, "kv_indices = torch.empty("))


def test_comments_inside_the_shape_tuple_are_kept(sglang_tree):
    allocation = (
        "        kv_indices = torch.empty(\n"
        "            (\n"
        "                # one row per draft step\n"
        "                self.speculative_num_steps,\n"
        "                forward_batch.batch_size * self.topk * self.max_context_len,  # every branch\n"
        "            ),\n"
        "            dtype=torch.int32,\n"
        "        )\n"
    )
    sglang_tree.write(FLASHINFER, backend_module(CLS, INIT, _eager(allocation)))
    plan = sglang_tree.apply([RULE])
    assert plan.findings[0].state is State.TO_PATCH
    after = method_source(sglang_tree.read(FLASHINFER), SCOPE)
    assert "kv_indices_width = draft_kv_indices_buffer_width(" in after
    assert after.count("# one row per draft step\n") == 1
    assert after.count("# every branch\n") == 1


WIDE = "forward_batch.batch_size * self.topk * self.max_context_len"
NARROW = "forward_batch.batch_size * self.max_context_len"
#: rows sized twice, the other way for batches larger than check's probes run (test_spelling_properties found
#: such a fork patched as if the other sizing were not there: the probes never took that branch)
SIZED_TWICE = {
    "another allocation": (
        f"        kv_indices = torch.empty((self.speculative_num_steps, {WIDE}))\n"
        "        if forward_batch.batch_size > 4:\n"
        f"            kv_indices = torch.empty((self.speculative_num_steps, {NARROW}))\n",
        "a second kv_indices row allocation at line {second}, which the probes need not run: one only",
    ),
    "another allocation of a width no rule knows": (
        f"        kv_indices = torch.empty((self.speculative_num_steps, {WIDE}))\n"
        "        if forward_batch.batch_size > 4:\n"
        f"            kv_indices = torch.empty((self.speculative_num_steps, {WIDE.replace('self.max_context_len', '(self.max_context_len + 1)')}))\n",
        "a second kv_indices row allocation at line {second}, which the probes need not run: one only",
    ),
    "the width's local bound twice": (
        "        if forward_batch.batch_size > 4:\n"
        f"            width = {NARROW}\n"
        "        else:\n"
        f"            width = {WIDE}\n"
        "        kv_indices = torch.empty((self.speculative_num_steps, width))\n",
        "the row width `width` is bound at lines {first}, {else_}, which the probes need not all run: once only",
    ),
}


@pytest.mark.parametrize("allocation, detail", SIZED_TWICE.values(), ids=SIZED_TWICE.keys())
def test_rows_sized_twice_refuse_the_site(sglang_tree, allocation, detail):
    text = backend_module(CLS, INIT, _eager(allocation))
    sglang_tree.write(FLASHINFER, text)
    [finding] = sglang_tree.plan([RULE]).findings
    branch = line_of(text, "batch_size > 4:")
    first_allocation = next(n for n, line in enumerate(text.splitlines(), 1) if "kv_indices = torch.empty(" in line)
    assert (finding.state, finding.line) == (State.UNRECOGNISED, first_allocation)
    assert finding.detail == detail.format(second=branch + 1, first=branch + 1, else_=branch + 3)


def test_rows_of_another_kind_beside_are_no_second_sizing(sglang_tree):
    """0.5.23's Triton allocates its sliding-window rows beside the kv_indices rows: sized by the window."""
    window = (
        "        window_kv_indices = torch.zeros(\n"
        "            (self.speculative_num_steps, forward_batch.batch_size * self.topk * self.sliding_window_size)\n"
        "        )\n"
    )
    before, after = STRUCTURAL["topk first"]
    sglang_tree.write(FLASHINFER, backend_module(CLS, INIT, _eager(before + window)))
    assert sglang_tree.apply([RULE]).findings[0].state is State.TO_PATCH
    assert sglang_tree.read(FLASHINFER) == backend_module(CLS, INIT, _eager(after + window), header=HEADER_AFTER)

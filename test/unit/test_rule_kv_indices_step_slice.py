"""rules/kv_indices_step_slice.py: the per-step kv_indices slice of common_template.

``kv_indices_buffer[i][: seq_lens_sum * self.topk + bs * (i + 1)]`` becomes
``kv_indices_buffer[i][: draft_kv_indices_used_len(seq_lens_sum, self.topk, bs, i + 1)]``.
"""

from __future__ import annotations

import pytest

from rule_test_support import (
    AFTER_STEP_SLICE_END,
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

SCOPE = "FlashInferMultiStepDraftBackend.common_template"
CLS = "FlashInferMultiStepDraftBackend"
RULE = rule("step-slice:flashinfer")

BEFORE_END = "seq_lens_sum * self.topk + bs * (i + 1)"
AFTER = COMMON_TEMPLATE.replace(BEFORE_END, AFTER_STEP_SLICE_END)


def test_before_after_whole_file(sglang_tree):
    before = backend_module(CLS)
    sglang_tree.write(FLASHINFER, before)

    plan = sglang_tree.apply([RULE])

    [finding] = plan.findings
    assert finding.state is State.TO_PATCH
    assert finding.line == line_of(before, "kv_indices_buffer[i][")
    after = sglang_tree.read(FLASHINFER)
    assert method_source(after, SCOPE) == AFTER
    # Only the slice end and the import changed: every other line is byte-identical.
    assert after == backend_module(CLS, INIT, AFTER, EAGER, GRAPH, header=backend_header("draft_kv_indices_used_len"))
    sglang_tree.assert_idempotent([RULE])
    assert sglang_tree.read(FLASHINFER) == after


@pytest.mark.parametrize(
    "rule_id, relative, cls",
    [
        ("step-slice:flashinfer", FLASHINFER, "FlashInferMultiStepDraftBackend"),
        ("step-slice:flashinfer_mla", FLASHINFER_MLA, "FlashInferMLAMultiStepDraftBackend"),
        ("step-slice:triton", TRITON, "TritonMultiStepDraftBackend"),
        ("step-slice:aiter", AITER, "AiterMultiStepDraftBackend"),
    ],
)
def test_every_backend(sglang_tree, rule_id, relative, cls):
    sglang_tree.write(relative, backend_module(cls))
    sglang_tree.apply([rule(rule_id)])
    assert sglang_tree.read(relative) == backend_module(
        cls, INIT, AFTER, EAGER, GRAPH, header=backend_header("draft_kv_indices_used_len")
    )
    sglang_tree.assert_idempotent([rule(rule_id)])


def test_import_merged_into_the_existing_spec_utils_import(sglang_tree):
    header = backend_header().replace(
        "import torch\n",
        "import torch\n\nfrom sglang.srt.speculative.spec_utils import generate_draft_decode_kv_indices\n",
    )
    sglang_tree.write(TRITON, backend_module("TritonMultiStepDraftBackend", header=header))
    sglang_tree.apply([rule("step-slice:triton")])
    after = sglang_tree.read(TRITON)
    assert after == backend_module(
        "TritonMultiStepDraftBackend",
        INIT,
        AFTER,
        EAGER,
        GRAPH,
        header=header.replace(
            "import generate_draft_decode_kv_indices",
            "import (\n    draft_kv_indices_used_len,\n    generate_draft_decode_kv_indices,\n)",
        ),
    )
    assert after.count("draft_kv_indices_used_len,") == 1


def test_import_added_once_when_the_capacity_check_needs_it_too(sglang_tree):
    rules = [rule("capacity-check:flashinfer"), RULE]
    sglang_tree.write(FLASHINFER, backend_module(CLS))
    sglang_tree.apply(rules)
    after = sglang_tree.read(FLASHINFER)
    assert after.count("from sglang.srt.speculative.spec_utils import draft_kv_indices_used_len\n") == 1
    assert after.count("import") == backend_module(CLS).count("import") + 1
    sglang_tree.assert_idempotent(rules)


def _common_template(slice_line: str, params: str = "self, forward_batch, kv_indices_buffer, call_fn") -> str:
    return (
        f"    def common_template({params}):\n"
        "        bs = self.topk * forward_batch.batch_size\n"
        "        seq_lens_sum = forward_batch.seq_lens_sum\n"
        "        for i in range(self.speculative_num_steps - 1):\n"
        f"{slice_line}"
        "            call_fn(i, forward_batch)\n"
    )


USED_LEN = "draft_kv_indices_used_len(seq_lens_sum, self.topk, bs, i + 1)"

STRUCTURAL = {
    "one line": (
        "            forward_batch.spec_info.kv_indices = kv_indices_buffer[i][: seq_lens_sum * self.topk + bs * (i + 1)]\n",
        f"            forward_batch.spec_info.kv_indices = kv_indices_buffer[i][: {USED_LEN}]\n",
    ),
    "terms swapped": (
        "            forward_batch.spec_info.kv_indices = kv_indices_buffer[i][: bs * (i + 1) + seq_lens_sum * self.topk]\n",
        f"            forward_batch.spec_info.kv_indices = kv_indices_buffer[i][: {USED_LEN}]\n",
    ),
    "factors swapped": (
        "            forward_batch.spec_info.kv_indices = kv_indices_buffer[i][: self.topk * seq_lens_sum + (i + 1) * bs]\n",
        f"            forward_batch.spec_info.kv_indices = kv_indices_buffer[i][: {USED_LEN}]\n",
    ),
    "extra parentheses": (
        "            forward_batch.spec_info.kv_indices = kv_indices_buffer[i][\n"
        "                : ((seq_lens_sum) * self.topk) + (bs * ((i + 1)))\n"
        "            ]\n",
        "            forward_batch.spec_info.kv_indices = kv_indices_buffer[i][\n"
        f"                : {USED_LEN}\n"
        "            ]\n",
    ),
    "parenthesised end": (
        "            forward_batch.spec_info.kv_indices = kv_indices_buffer[i][:(seq_lens_sum * self.topk + bs * (i + 1))]\n",
        f"            forward_batch.spec_info.kv_indices = kv_indices_buffer[i][:{USED_LEN}]\n",
    ),
    "comments between the lines": (
        "            # the row of step i\n"
        "            forward_batch.spec_info.kv_indices = kv_indices_buffer[i][  # cut it\n"
        "                # prefix of every branch, then i + 1 draft slots\n"
        "                : seq_lens_sum * self.topk\n"
        "                + bs * (i + 1)\n"
        "            ]  # done\n",
        "            # the row of step i\n"
        "            forward_batch.spec_info.kv_indices = kv_indices_buffer[i][  # cut it\n"
        "                # prefix of every branch, then i + 1 draft slots\n"
        f"                : {USED_LEN}\n"
        "            ]  # done\n",
    ),
    "inline batch attribute": (
        "            fb_indices = kv_indices_buffer[i][: forward_batch.seq_lens_sum * self.topk + bs * (i + 1)]\n",
        "            fb_indices = kv_indices_buffer[i][: draft_kv_indices_used_len(forward_batch.seq_lens_sum, self.topk, bs, i + 1)]\n",
    ),
}


@pytest.mark.parametrize("before_line, after_line", STRUCTURAL.values(), ids=STRUCTURAL.keys())
def test_structural_variants(sglang_tree, before_line, after_line):
    before = backend_module(CLS, INIT, _common_template(before_line))
    sglang_tree.write(FLASHINFER, before)
    plan = sglang_tree.apply([RULE])
    assert plan.findings[0].state is State.TO_PATCH
    after = sglang_tree.read(FLASHINFER)
    assert method_source(after, SCOPE) == _common_template(after_line)
    assert after == backend_module(
        CLS, INIT, _common_template(after_line), header=backend_header("draft_kv_indices_used_len")
    )
    sglang_tree.assert_idempotent([RULE])


def test_renamed_locals_and_method_moved_to_the_end(sglang_tree):
    method = """\
    def common_template(self, fb, kv_buf, call_fn):
        n = self.topk * fb.batch_size
        total = fb.seq_lens_sum
        for step in range(self.speculative_num_steps - 1):
            fb.spec_info.kv_indices = kv_buf[step][
                : total * self.topk + n * (step + 1)
            ]
            call_fn(step, fb)
"""
    sglang_tree.write(FLASHINFER, backend_module(CLS, INIT, EAGER, GRAPH, method))
    sglang_tree.apply([RULE])
    assert method_source(sglang_tree.read(FLASHINFER), SCOPE) == method.replace(
        "total * self.topk + n * (step + 1)", "draft_kv_indices_used_len(total, self.topk, n, step + 1)"
    )
    sglang_tree.assert_idempotent([RULE])


def test_already_upstream_is_patched_and_unchanged(sglang_tree):
    upstream = backend_module(CLS, INIT, AFTER, EAGER, GRAPH, header=backend_header("draft_kv_indices_used_len"))
    sglang_tree.write(FLASHINFER, upstream)
    plan = sglang_tree.plan([RULE])
    assert [(f.state, f.line) for f in plan.findings] == [(State.PATCHED, line_of(upstream, "kv_indices_buffer[i]["))]
    assert plan.changes == ()


REFUSED = {
    "no topk factor": "seq_lens_sum + bs",
    "steps not i + 1": "seq_lens_sum * self.topk + bs * i",
    "constant instead of topk": "seq_lens_sum * 2 + bs * (i + 1)",
    "extra term": "seq_lens_sum * self.topk + bs * (i + 1) + 1",
    "extra prefix factor": "seq_lens_sum * 2 * self.topk + bs * (i + 1)",
    "extra step factor": "seq_lens_sum * self.topk + bs * 2 * (i + 1)",
}


@pytest.mark.parametrize("end", REFUSED.values(), ids=REFUSED.keys())
def test_unknown_slice_end_is_unrecognised(sglang_tree, end):
    text = backend_module(CLS, INIT, _common_template(f"            rows = kv_indices_buffer[i][: {end}]\n"))
    sglang_tree.write(FLASHINFER, text)
    plan = sglang_tree.plan([RULE])
    [finding] = plan.findings
    assert finding.state is State.UNRECOGNISED
    assert finding.line == line_of(text, "rows = kv_indices_buffer[i]")
    assert finding.detail == "no per-step slice `row[i][: seq_lens_sum * topk + bs * (i + 1)]`"
    assert plan.changes == ()


def test_common_template_without_any_slice_is_unrecognised_at_the_def(sglang_tree):
    text = backend_module(
        CLS,
        INIT,
        "    def common_template(self, forward_batch, kv_indices_buffer, call_fn):\n"
        "        call_fn(0, forward_batch)\n",
    )
    sglang_tree.write(FLASHINFER, text)
    [finding] = sglang_tree.plan([RULE]).findings
    assert (finding.state, finding.line) == (State.UNRECOGNISED, line_of(text, "def common_template"))


def test_apply_refuses_and_writes_nothing(sglang_tree):
    cls = "TritonMultiStepDraftBackend"
    template = COMMON_TEMPLATE.replace(BEFORE_END, "seq_lens_sum + bs")
    text = backend_module(cls, INIT, template, EAGER, GRAPH)
    sglang_tree.write(TRITON, text)
    write_bystanders(sglang_tree, besides=TRITON)
    assert_refused(
        sglang_tree,
        TRITON,
        line_of(text, "kv_indices_buffer[i]["),
        f"{cls}.common_template",
        "per-step kv_indices slice",
        "no per-step slice `row[i][: seq_lens_sum * topk + bs * (i + 1)]`",
    )


def test_class_absent(sglang_tree):
    sglang_tree.write(FLASHINFER, backend_module("FlashInferAttnBackend"))
    [finding, *guarded] = sglang_tree.plan([RULE]).findings
    assert finding.state is State.ABSENT
    assert finding.detail == f"no class {CLS}"
    # the renamed class holds the draft layout: the structural guard reports it
    assert guarded and {f.rule.scope.split(".")[0] for f in guarded} == {"FlashInferAttnBackend"}


def test_file_absent(sglang_tree):
    [finding] = sglang_tree.plan([RULE]).findings
    assert finding.state is State.ABSENT


def test_a_fork_value_is_kept_and_said(sglang_tree):
    """A fork that slices `i + 2` entries keeps its value; check and apply say so."""
    line = "            rows = kv_indices_buffer[i][: seq_lens_sum * self.topk + bs * (i + 2)]\n"
    sglang_tree.write(FLASHINFER, backend_module(CLS, INIT, _common_template(line)))
    kept = "keeps the fork's value `i + 2` (upstream: `i + 1`)"
    [before] = sglang_tree.plan([RULE]).findings
    assert (before.state, before.detail) == (State.TO_PATCH, kept)
    sglang_tree.apply([RULE])
    assert "draft_kv_indices_used_len(seq_lens_sum, self.topk, bs, i + 2)" in sglang_tree.read(FLASHINFER)
    [after] = sglang_tree.plan([RULE]).findings
    assert (after.state, after.detail) == (State.PATCHED, kept)


def test_upstream_value_says_nothing_more(sglang_tree):
    sglang_tree.write(FLASHINFER, backend_module(CLS))
    assert [f.detail for f in sglang_tree.plan([RULE]).findings] == [""]
    sglang_tree.apply([RULE])
    assert [(f.state, f.detail) for f in sglang_tree.plan([RULE]).findings] == [(State.PATCHED, "")]


#: a fork's other slice for batches larger than check's probes run (test_spelling_properties found it patched
#: as if it were not there: the probes never took that branch)
LARGER_BATCHES = (
    "            if forward_batch.batch_size > 4:\n"
    "                forward_batch.spec_info.kv_indices = kv_indices_buffer[i][: {other}]\n"
    "            else:\n"
    "                forward_batch.spec_info.kv_indices = kv_indices_buffer[i][: {end}]\n"
)


@pytest.mark.parametrize(
    "other, end",
    [
        ("seq_lens_sum * self.topk + bs * i", BEFORE_END),
        ("seq_lens_sum * self.topk + bs * (i + 2)", BEFORE_END),
        (BEFORE_END, "seq_lens_sum * self.topk + bs * (i + 2)"),
        (USED_LEN, USED_LEN),
    ],
    ids=["unknown form", "recognised, another value", "first recognised", "both the helper"],
)
def test_a_second_slice_of_the_rows_refuses_the_site(sglang_tree, other, end):
    text = backend_module(CLS, INIT, _common_template(LARGER_BATCHES.format(other=other, end=end)))
    sglang_tree.write(FLASHINFER, text)
    [finding] = sglang_tree.plan([RULE]).findings
    first, second = line_of(text, "batch_size > 4:") + 1, line_of(text, "else:") + 1
    recognised = second if other == "seq_lens_sum * self.topk + bs * i" else first
    assert (finding.state, finding.line) == (State.UNRECOGNISED, recognised)
    assert finding.detail.startswith(
        f"a second slice of `kv_indices_buffer` rows at line {first + second - recognised} (`kv_indices_buffer[i][:"
    )
    assert finding.detail.endswith("), which the probes need not run: one per-step slice only")


def test_a_slice_of_other_rows_is_no_second_slice(sglang_tree):
    """0.5.23's Triton cuts its sliding-window rows beside the step's slice: another buffer, not a second slice."""
    window = "            forward_batch.spec_info.window_kv_indices = window_rows[i][: bs * self.window]\n"
    slice_line = STRUCTURAL["one line"][0]
    text = backend_module(CLS, INIT, _common_template(slice_line + window))
    sglang_tree.write(FLASHINFER, text)
    assert sglang_tree.apply([RULE]).findings[0].state is State.TO_PATCH
    assert method_source(sglang_tree.read(FLASHINFER), SCOPE) == _common_template(STRUCTURAL["one line"][1] + window)

"""rules/dsv4_out_cache_loc.py: the per-step out_cache_loc of DeepseekV4AttnBackend's decode branch.

``self.init_forward_metadata_decode(..., out_cache_loc=forward_batch.out_cache_loc)`` gets
``per_step_draft_out_cache_loc(...)[self.speculative_step_id]`` when
``self.topk > 0 and self.speculative_num_steps > 1``.
"""

from __future__ import annotations

import pytest

from rule_test_support import DSV4, assert_refused, keep_hint, line_of, method_source, rule, write_bystanders
from sglang_draft_layout.rules.base import State

CLS = "DeepseekV4AttnBackend"
SCOPE = f"{CLS}.init_forward_metadata"
RULE = rule("dsv4-out-cache-loc")
SITE = "per-step out_cache_loc (decode)"
DETAIL = "no decode branch passing `forward_batch.out_cache_loc` to init_forward_metadata_decode"

HEADER = '''\
"""DeepSeek-V4 attention backend (hand-made mimic of the site)."""

import torch

from sglang.srt.layers.attention.base_attn_backend import AttentionBackend


'''
HEADER_AFTER = HEADER.replace(
    "import AttentionBackend\n",
    "import AttentionBackend\nfrom sglang.srt.speculative.eagle_utils import per_step_draft_out_cache_loc\n")

INIT = """\
    def __init__(self, topk, speculative_num_steps, speculative_step_id=0):
        self.topk = topk
        self.speculative_num_steps = speculative_num_steps
        self.speculative_step_id = speculative_step_id
"""

BEFORE = """\
    def init_forward_metadata(self, forward_batch):
        max_seq_len = int(forward_batch.seq_lens_cpu.max().item())

        # Decode, and every step of a multi-step draft.
        if forward_batch.forward_mode.is_decode_or_idle():
            metadata = self.init_forward_metadata_decode(
                max_seq_len=max_seq_len,
                seq_lens=forward_batch.seq_lens,
                out_cache_loc=forward_batch.out_cache_loc,
            )
        elif forward_batch.forward_mode.is_target_verify():
            metadata = self.init_forward_metadata_target_verify(
                max_seq_len=max_seq_len,
                out_cache_loc=forward_batch.out_cache_loc,
            )
        else:
            metadata = None

        self.forward_metadata = metadata
"""

AFTER = """\
    def init_forward_metadata(self, forward_batch):
        max_seq_len = int(forward_batch.seq_lens_cpu.max().item())

        # Decode, and every step of a multi-step draft.
        if forward_batch.forward_mode.is_decode_or_idle():
            # DSv4 bakes this step's KV write target (c4/c128) into metadata,
            # so slice the shared multi-step out_cache_loc now, not at forward time.
            out_cache_loc = forward_batch.out_cache_loc
            if self.topk > 0 and self.speculative_num_steps > 1:
                out_cache_loc = per_step_draft_out_cache_loc(
                    out_cache_loc,
                    forward_batch.batch_size,
                    self.topk,
                    self.speculative_num_steps,
                )[self.speculative_step_id]
            metadata = self.init_forward_metadata_decode(
                max_seq_len=max_seq_len,
                seq_lens=forward_batch.seq_lens,
                out_cache_loc=out_cache_loc,
            )
        elif forward_batch.forward_mode.is_target_verify():
            metadata = self.init_forward_metadata_target_verify(
                max_seq_len=max_seq_len,
                out_cache_loc=forward_batch.out_cache_loc,
            )
        else:
            metadata = None

        self.forward_metadata = metadata
"""

DECODE = """\
    def init_forward_metadata_decode(self, max_seq_len, seq_lens, out_cache_loc):
        return max_seq_len, seq_lens, out_cache_loc
"""

#: a method that also branches on decode but passes a local: not the site
CAPTURE = """\
    def init_forward_metadata_capture_cuda_graph(self, bs, forward_mode, out_cache_loc):
        if forward_mode.is_decode_or_idle():
            self.decode_metadata = self.init_forward_metadata_decode(
                max_seq_len=1, seq_lens=None, out_cache_loc=out_cache_loc
            )
"""


def dsv4_module(*methods: str, header: str = HEADER, cls: str = CLS) -> str:
    return header + f"class {cls}(AttentionBackend):\n" + "\n".join(methods)


def test_before_after_whole_file(sglang_tree):
    before = dsv4_module(INIT, BEFORE, DECODE)
    sglang_tree.write(DSV4, before)

    plan = sglang_tree.apply([RULE])

    [finding] = plan.findings
    assert (finding.state, finding.line) == (State.TO_PATCH, line_of(before, "metadata = self.init_forward_metadata_decode("))
    after = sglang_tree.read(DSV4)
    assert method_source(after, SCOPE) == AFTER
    assert after == dsv4_module(INIT, AFTER, DECODE, header=HEADER_AFTER)
    sglang_tree.assert_idempotent([RULE])
    assert sglang_tree.read(DSV4) == after


def test_method_moved_after_another_decode_branch(sglang_tree):
    sglang_tree.write(DSV4, dsv4_module(INIT, CAPTURE, DECODE, BEFORE))
    sglang_tree.apply([RULE])
    assert sglang_tree.read(DSV4) == dsv4_module(INIT, CAPTURE, DECODE, AFTER, header=HEADER_AFTER)
    sglang_tree.assert_idempotent([RULE])


def _with_batch(text: str, name: str) -> str:
    return text.replace("forward_batch", name)


STRUCTURAL = {
    "batch renamed fb": (_with_batch(BEFORE, "fb"), _with_batch(AFTER, "fb")),
    "one-line call, keyword first": (
        BEFORE.replace(
            "            metadata = self.init_forward_metadata_decode(\n"
            "                max_seq_len=max_seq_len,\n"
            "                seq_lens=forward_batch.seq_lens,\n"
            "                out_cache_loc=forward_batch.out_cache_loc,\n"
            "            )\n",
            "            metadata = self.init_forward_metadata_decode(out_cache_loc=forward_batch.out_cache_loc, max_seq_len=max_seq_len)\n"),
        AFTER.replace(
            "            metadata = self.init_forward_metadata_decode(\n"
            "                max_seq_len=max_seq_len,\n"
            "                seq_lens=forward_batch.seq_lens,\n"
            "                out_cache_loc=out_cache_loc,\n"
            "            )\n",
            "            metadata = self.init_forward_metadata_decode(out_cache_loc=out_cache_loc, max_seq_len=max_seq_len)\n"),
    ),
    "statements and comments before the call": (
        BEFORE.replace(
            "            metadata = self.init_forward_metadata_decode(\n",
            "            seq_lens = forward_batch.seq_lens\n\n"
            "            # Build the decode metadata.\n"
            "            metadata = self.init_forward_metadata_decode(\n"),
        AFTER.replace(
            "            # DSv4 bakes",
            "            seq_lens = forward_batch.seq_lens\n\n"
            "            # Build the decode metadata.\n"
            "            # DSv4 bakes"),
    ),
    "returned directly": (
        BEFORE.replace("            metadata = self.init_forward_metadata_decode(", "            return self.init_forward_metadata_decode("),
        AFTER.replace("            metadata = self.init_forward_metadata_decode(", "            return self.init_forward_metadata_decode("),
    ),
}


@pytest.mark.parametrize("before, after", STRUCTURAL.values(), ids=STRUCTURAL.keys())
def test_structural_variants(sglang_tree, before, after):
    sglang_tree.write(DSV4, dsv4_module(INIT, before, DECODE))
    assert sglang_tree.apply([RULE]).findings[0].state is State.TO_PATCH
    assert sglang_tree.read(DSV4) == dsv4_module(INIT, after, DECODE, header=HEADER_AFTER)
    sglang_tree.assert_idempotent([RULE])


UPSTREAM = """\
    def init_forward_metadata(self, forward_batch):
        max_seq_len = int(forward_batch.seq_lens_cpu.max().item())
        if forward_batch.forward_mode.is_decode_or_idle():
            out_cache_loc = forward_batch.out_cache_loc
            if self.topk > 0 and self.speculative_num_steps > 1:
                out_cache_loc = per_step_draft_out_cache_loc(
                    out_cache_loc, forward_batch.batch_size, self.topk, self.speculative_num_steps
                )[self.speculative_step_id]
            metadata = self.init_forward_metadata_decode(
                max_seq_len=max_seq_len, seq_lens=forward_batch.seq_lens, out_cache_loc=out_cache_loc
            )
        else:
            metadata = None
        self.forward_metadata = metadata
"""


@pytest.mark.parametrize("method", [UPSTREAM, AFTER], ids=["0.5.13-like", "this rule's own output"])
def test_already_upstream_is_patched_and_unchanged(sglang_tree, method):
    text = dsv4_module(INIT, method, DECODE, header=HEADER_AFTER)
    sglang_tree.write(DSV4, text)
    plan = sglang_tree.plan([RULE])
    assert [(f.state, f.line) for f in plan.findings] == [(State.PATCHED, line_of(text, ".is_decode_or_idle():"))]
    assert plan.changes == ()


REFUSED = {
    "sliced buffer": BEFORE.replace("out_cache_loc=forward_batch.out_cache_loc,\n            )\n        elif",
                                    "out_cache_loc=forward_batch.out_cache_loc[: forward_batch.batch_size],\n            )\n        elif"),
    "local buffer": BEFORE.replace("out_cache_loc=forward_batch.out_cache_loc,\n            )\n        elif",
                                   "out_cache_loc=loc,\n            )\n        elif"),
    "no init_forward_metadata_decode call": BEFORE.replace("self.init_forward_metadata_decode(", "self.build_decode_metadata("),
    "no decode branch": BEFORE.replace("is_decode_or_idle()", "is_decode()"),
}


@pytest.mark.parametrize("method", REFUSED.values(), ids=REFUSED.keys())
def test_unknown_form_is_unrecognised(sglang_tree, method):
    sglang_tree.write(DSV4, dsv4_module(INIT, method, DECODE))
    plan = sglang_tree.plan([RULE])
    [finding] = plan.findings
    assert (finding.state, finding.detail) == (State.UNRECOGNISED, DETAIL)
    assert plan.changes == ()


def test_apply_refuses_and_writes_nothing(sglang_tree):
    sglang_tree.write(DSV4, dsv4_module(INIT, REFUSED["sliced buffer"], DECODE))
    write_bystanders(sglang_tree, besides=DSV4)
    before = sglang_tree.snapshot()
    code, out, err = sglang_tree.cli("apply")
    assert (code, out) == (2, "")
    assert err.startswith(f"error: {sglang_tree.path(DSV4)}")
    assert err.endswith(f": {SCOPE}: {SITE}: {DETAIL}{keep_hint(DSV4, SCOPE)}; nothing written\n")
    assert err.count("\n") == 1
    assert sglang_tree.snapshot() == before


def test_unrecognised_names_the_line(sglang_tree):
    text = dsv4_module(INIT, REFUSED["sliced buffer"], DECODE)
    sglang_tree.write(DSV4, text)
    write_bystanders(sglang_tree, besides=DSV4)
    [finding] = sglang_tree.plan([RULE]).findings
    assert finding.line == line_of(text, "metadata = self.init_forward_metadata_decode(")
    assert_refused(sglang_tree, DSV4, finding.line, SCOPE, SITE, DETAIL)


def test_class_absent_in_the_file(sglang_tree):
    sglang_tree.write(DSV4, dsv4_module(INIT, BEFORE, cls="DeepseekV3AttnBackend"))
    [finding] = sglang_tree.plan([RULE]).findings
    assert (finding.state, finding.detail) == (State.ABSENT, f"no class {CLS}")


def test_file_absent_before_0_5_12(sglang_tree):
    [finding] = sglang_tree.plan([RULE]).findings
    assert finding.state is State.ABSENT

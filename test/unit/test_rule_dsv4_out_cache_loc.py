"""rules/dsv4_out_cache_loc.py: the per-step out_cache_loc of DeepseekV4AttnBackend's decode branch.

``self.init_forward_metadata_decode(..., out_cache_loc=forward_batch.out_cache_loc)`` gets
``per_step_draft_out_cache_loc(...)[self.speculative_step_id]`` when
``self.topk > 0 and self.speculative_num_steps > 1``.
"""

from __future__ import annotations

import json

import black
import pytest
from rule_test_support import DSV4, assert_refused, keep_hint, line_of, method_source, rule, write_bystanders
from sglang_draft_layout.rules.base import State
from support import fork_edits

CLS = "DeepseekV4AttnBackend"
SCOPE = f"{CLS}.init_forward_metadata"
RULE = rule("dsv4-out-cache-loc")
SITE = "per-step out_cache_loc (decode)"
DETAIL = "no decode branch passing `forward_batch.out_cache_loc` to init_forward_metadata_decode"

HEADER = '''\
"""DeepSeek-V4 attention backend (hand-made mimic of the site)."""

from __future__ import annotations

import torch

from sglang.srt.layers.attention.base_attn_backend import AttentionBackend


'''
HEADER_AFTER = HEADER.replace(
    "import AttentionBackend\n",
    "import AttentionBackend\nfrom sglang.srt.speculative.eagle_utils import per_step_draft_out_cache_loc\n",
)

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
    def init_forward_metadata_decode(self, max_seq_len, seq_lens=None, out_cache_loc=None):
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
    assert (finding.state, finding.line) == (
        State.TO_PATCH,
        line_of(before, "metadata = self.init_forward_metadata_decode("),
    )
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
            "            metadata = self.init_forward_metadata_decode(out_cache_loc=forward_batch.out_cache_loc, max_seq_len=max_seq_len)\n",
        ),
        AFTER.replace(
            "            metadata = self.init_forward_metadata_decode(\n"
            "                max_seq_len=max_seq_len,\n"
            "                seq_lens=forward_batch.seq_lens,\n"
            "                out_cache_loc=out_cache_loc,\n"
            "            )\n",
            "            metadata = self.init_forward_metadata_decode(out_cache_loc=out_cache_loc, max_seq_len=max_seq_len)\n",
        ),
    ),
    "statements and comments before the call": (
        BEFORE.replace(
            "            metadata = self.init_forward_metadata_decode(\n",
            "            seq_lens = forward_batch.seq_lens\n\n"
            "            # Build the decode metadata.\n"
            "            metadata = self.init_forward_metadata_decode(\n",
        ),
        AFTER.replace(
            "            # DSv4 bakes",
            "            seq_lens = forward_batch.seq_lens\n\n"
            "            # Build the decode metadata.\n"
            "            # DSv4 bakes",
        ),
    ),
    "returned directly": (
        BEFORE.replace(
            "            metadata = self.init_forward_metadata_decode(",
            "            return self.init_forward_metadata_decode(",
        ),
        AFTER.replace(
            "            metadata = self.init_forward_metadata_decode(",
            "            return self.init_forward_metadata_decode(",
        ),
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
    "sliced buffer": BEFORE.replace(
        "out_cache_loc=forward_batch.out_cache_loc,\n            )\n        elif",
        "out_cache_loc=forward_batch.out_cache_loc[: forward_batch.batch_size],\n            )\n        elif",
    ),
    "local buffer": BEFORE.replace(
        "out_cache_loc=forward_batch.out_cache_loc,\n            )\n        elif",
        "out_cache_loc=loc,\n            )\n        elif",
    ),
    "no init_forward_metadata_decode call": BEFORE.replace(
        "self.init_forward_metadata_decode(", "self.build_decode_metadata("
    ),
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
    """The rule's class renamed (a port): absent for the rule; the class still bakes out_cache_loc at init in
    DeepSeek-V4's decode form, so the structural guard gives it DeepSeek-V4's rule: upstream's slice."""
    sglang_tree.write(DSV4, dsv4_module(INIT, BEFORE, DECODE, cls="DeepseekV3AttnBackend"))
    finding, guard = sglang_tree.plan([RULE]).findings
    assert (finding.state, finding.detail) == (State.ABSENT, f"no class {CLS}")
    assert (guard.rule.scope, guard.state) == ("DeepseekV3AttnBackend.init_forward_metadata", State.TO_PATCH)
    sglang_tree.apply([RULE])
    assert sglang_tree.read(DSV4) == dsv4_module(INIT, AFTER, DECODE, header=HEADER_AFTER, cls="DeepseekV3AttnBackend")


def test_file_absent_before_0_5_12(sglang_tree):
    [finding] = sglang_tree.plan([RULE]).findings
    assert finding.state is State.ABSENT


# ---- a fork's own fix: its spelling, its own method, its caller ------------------------

CALLS_OWN_METHOD = BEFORE.replace(
    "                out_cache_loc=forward_batch.out_cache_loc,\n            )\n        elif",
    "                out_cache_loc=self._get_mtp_decode_out_cache_loc(forward_batch),\n            )\n        elif",
)
OWN_METHOD = fork_edits.OWN_METHOD.lstrip("\n")
OWN_METHOD_AFTER = OWN_METHOD.replace(
    """\
        return (
            out_cache_loc.reshape(bs, topk, steps)
            .permute(2, 0, 1)
            .reshape(steps, step_width)[self.speculative_step_id]
        )
""",
    """\
        return per_step_draft_out_cache_loc(
            out_cache_loc,
            bs,
            topk,
            steps,
        )[self.speculative_step_id]
""",
)
#: the split written in the decode branch itself, through a local feeding out_cache_loc=
INLINE_LOCAL = BEFORE.replace(
    """\
            metadata = self.init_forward_metadata_decode(
                max_seq_len=max_seq_len,
                seq_lens=forward_batch.seq_lens,
                out_cache_loc=forward_batch.out_cache_loc,
            )
""",
    """\
            step_loc = forward_batch.out_cache_loc
            if self.speculative_num_steps > 1:
                step_loc = step_loc.view(
                    forward_batch.batch_size, self.topk, self.speculative_num_steps
                ).movedim(-1, 0)[self.speculative_step_id].flatten()
                step_loc = (
                    forward_batch.out_cache_loc.view(
                        forward_batch.batch_size, self.topk, self.speculative_num_steps
                    )
                    .transpose(0, 2)
                    .transpose(1, 2)
                    .reshape(self.speculative_num_steps, -1)[self.speculative_step_id]
                )
            metadata = self.init_forward_metadata_decode(
                max_seq_len=max_seq_len,
                seq_lens=forward_batch.seq_lens,
                out_cache_loc=step_loc,
            )
""",
)


def test_own_method_split_is_rewritten_there(sglang_tree):
    text = dsv4_module(INIT, CALLS_OWN_METHOD, DECODE, OWN_METHOD)
    sglang_tree.write(DSV4, text)
    plan = sglang_tree.apply([RULE])
    [finding] = plan.findings
    assert (finding.state, finding.line) == (State.TO_PATCH, line_of(text, "out_cache_loc.reshape(bs, topk, steps)"))
    assert finding.detail == "the fork's own split (in _get_mtp_decode_out_cache_loc): via per_step_draft_out_cache_loc"
    assert sglang_tree.read(DSV4) == dsv4_module(INIT, CALLS_OWN_METHOD, DECODE, OWN_METHOD_AFTER, header=HEADER_AFTER)
    sglang_tree.assert_idempotent([RULE])


def test_an_unproven_first_split_is_left_and_the_proven_one_rewritten(sglang_tree):
    """`view(...).movedim(-1, 0)[step].flatten()` is not the helper's expression: only the second is rewritten."""
    sglang_tree.write(DSV4, dsv4_module(INIT, INLINE_LOCAL, DECODE))
    [finding] = sglang_tree.apply([RULE]).findings
    assert finding.state is State.TO_PATCH and "(in init_forward_metadata)" in finding.detail
    after = sglang_tree.read(DSV4)
    assert ".movedim(-1, 0)[self.speculative_step_id].flatten()" in after
    assert "step_loc = per_step_draft_out_cache_loc(\n" in after and ".transpose(" not in after
    sglang_tree.assert_idempotent([RULE])


#: the decode branch splits in two branches, each in its own spelling
TWO_SPLITS = BEFORE.replace(
    """\
            metadata = self.init_forward_metadata_decode(
                max_seq_len=max_seq_len,
                seq_lens=forward_batch.seq_lens,
                out_cache_loc=forward_batch.out_cache_loc,
            )
""",
    """\
            out_cache_loc = forward_batch.out_cache_loc
            bs = forward_batch.batch_size
            if self.topk > 1 and self.speculative_num_steps > 1:
                out_cache_loc = (
                    out_cache_loc.reshape(bs, self.topk, self.speculative_num_steps)
                    .permute(2, 0, 1)
                    .reshape(self.speculative_num_steps, -1)[self.speculative_step_id]
                )
            elif self.speculative_num_steps > 1:
                rows = out_cache_loc.view(bs, self.topk, self.speculative_num_steps)
                out_cache_loc = rows.movedim(-1, 0).flatten(1)[self.speculative_step_id]
            metadata = self.init_forward_metadata_decode(
                max_seq_len=max_seq_len,
                seq_lens=forward_batch.seq_lens,
                out_cache_loc=out_cache_loc,
            )
""",
)
FIRST_SPLIT = """\
                out_cache_loc = (
                    out_cache_loc.reshape(bs, self.topk, self.speculative_num_steps)
                    .permute(2, 0, 1)
                    .reshape(self.speculative_num_steps, -1)[self.speculative_step_id]
                )
"""
SECOND_SPLIT = """\
                rows = out_cache_loc.view(bs, self.topk, self.speculative_num_steps)
                out_cache_loc = rows.movedim(-1, 0).flatten(1)[self.speculative_step_id]
"""
HELPER_SPLIT = """\
                out_cache_loc = per_step_draft_out_cache_loc(
                    out_cache_loc,
                    bs,
                    self.topk,
                    self.speculative_num_steps,
                )[self.speculative_step_id]
"""
TWO_SPLITS_AFTER = TWO_SPLITS.replace(FIRST_SPLIT, HELPER_SPLIT).replace(SECOND_SPLIT, HELPER_SPLIT)


def test_every_split_feeding_the_site_is_rewritten_in_one_apply(sglang_tree):
    """Two branches, the second through a bound 3-d view: both get the helper, the view's local goes."""
    text = dsv4_module(INIT, TWO_SPLITS, DECODE)
    sglang_tree.write(DSV4, text)
    [finding] = sglang_tree.apply([RULE]).findings
    assert (finding.state, finding.line) == (
        State.TO_PATCH,
        line_of(text, "out_cache_loc.reshape(bs, self.topk, self.speculative_num_steps)"),
    )
    assert sglang_tree.read(DSV4) == dsv4_module(INIT, TWO_SPLITS_AFTER, DECODE, header=HEADER_AFTER)
    assert [f.state for f in sglang_tree.plan([RULE]).findings] == [State.PATCHED]
    sglang_tree.assert_idempotent([RULE])


def test_a_split_left_beside_the_helper_is_still_to_patch(sglang_tree):
    """The first split rewritten, the second not (as version 0.3.0 of this tool left it): still to patch."""
    text = dsv4_module(INIT, TWO_SPLITS.replace(FIRST_SPLIT, HELPER_SPLIT), DECODE, header=HEADER_AFTER)
    sglang_tree.write(DSV4, text)
    [finding] = sglang_tree.apply([RULE]).findings
    assert (finding.state, finding.line) == (State.TO_PATCH, line_of(text, "rows = out_cache_loc.view("))
    assert sglang_tree.read(DSV4) == dsv4_module(INIT, TWO_SPLITS_AFTER, DECODE, header=HEADER_AFTER)


DECODE_CALL = """\
            metadata = self.init_forward_metadata_decode(
                max_seq_len=max_seq_len,
                seq_lens=forward_batch.seq_lens,
                out_cache_loc=forward_batch.out_cache_loc,
            )
"""


def _decode_from(lines: str, value: str) -> str:
    """BEFORE with ``lines`` ahead of the decode call, which passes ``out_cache_loc=value``."""
    return BEFORE.replace(DECODE_CALL, lines + DECODE_CALL.replace("=forward_batch.out_cache_loc,", f"={value},"))


ROWS_SPLIT = """\
            rows = (
                out_cache_loc.reshape(bs, self.topk, self.speculative_num_steps)
                .permute(2, 0, 1)
                .reshape(self.speculative_num_steps, -1)
            )
"""
ROWS_HELPER = """\
            rows = per_step_draft_out_cache_loc(
                out_cache_loc,
                bs,
                self.topk,
                self.speculative_num_steps,
            )
"""
STEP_ROW = "            step_loc = rows[self.speculative_step_id]\n"
BS = "            out_cache_loc = forward_batch.out_cache_loc\n            bs = forward_batch.batch_size\n"
#: the split reaches out_cache_loc= through a chain of locals, each bound once (before, after; black-clean)
ALIAS_CHAINS = {
    "rows, then the step's row": (
        _decode_from(BS + ROWS_SPLIT + STEP_ROW, "step_loc"),
        _decode_from(BS + ROWS_HELPER + STEP_ROW, "step_loc"),
    ),
    "three locals, the row taken first": (
        _decode_from(
            BS
            + ROWS_SPLIT.replace("-1)\n", "-1)[self.speculative_step_id]\n")
            + "            row = rows\n            step_loc = row\n",
            "step_loc",
        ),
        _decode_from(
            BS
            + ROWS_HELPER.replace("            )\n", "            )[self.speculative_step_id]\n")
            + "            row = rows\n            step_loc = row\n",
            "step_loc",
        ),
    ),
    "a local bound twice, each value an alias bound once": (
        _decode_from(
            BS + ROWS_SPLIT + "            step_loc = out_cache_loc\n"
            "            if self.speculative_num_steps > 1:\n    " + STEP_ROW,
            "step_loc",
        ),
        _decode_from(
            BS + ROWS_HELPER + "            step_loc = out_cache_loc\n"
            "            if self.speculative_num_steps > 1:\n    " + STEP_ROW,
            "step_loc",
        ),
    ),
    "rows annotated": (
        _decode_from(BS + ROWS_SPLIT.replace("rows = (", "rows: torch.Tensor = (") + STEP_ROW, "step_loc"),
        _decode_from(BS + ROWS_HELPER.replace("rows = ", "rows: torch.Tensor = ") + STEP_ROW, "step_loc"),
    ),
    "a comprehension's own name like the chain's (it binds nothing around it)": (
        _decode_from(
            BS + ROWS_SPLIT + "            widths = [len(rows) for rows in self.attn_backends]\n" + STEP_ROW, "step_loc"
        ),
        _decode_from(
            BS + ROWS_HELPER + "            widths = [len(rows) for rows in self.attn_backends]\n" + STEP_ROW,
            "step_loc",
        ),
    ),
    "a bound 3-d view, a statement between": (
        _decode_from(
            BS + "            slots = out_cache_loc.view(bs, self.topk, self.speculative_num_steps)\n"
            "            seq_lens = forward_batch.seq_lens\n"
            "            rows = slots.permute(2, 0, 1).reshape(self.speculative_num_steps, -1)\n" + STEP_ROW,
            "step_loc",
        ),
        _decode_from(BS + "            seq_lens = forward_batch.seq_lens\n" + ROWS_HELPER + STEP_ROW, "step_loc"),
    ),
}


@pytest.mark.parametrize("before, after", ALIAS_CHAINS.values(), ids=ALIAS_CHAINS.keys())
def test_a_split_through_a_chain_of_locals_is_rewritten_where_it_is(sglang_tree, before, after):
    for method in (before, after):
        assert black.format_str("class A:\n" + method, mode=black.Mode()) == "class A:\n" + method
    text = dsv4_module(INIT, before, DECODE)
    sglang_tree.write(DSV4, text)
    [finding] = sglang_tree.apply([RULE]).findings
    assert (finding.state, finding.detail) == (
        State.TO_PATCH,
        "the fork's own split (in init_forward_metadata): via per_step_draft_out_cache_loc",
    )
    assert sglang_tree.read(DSV4) == dsv4_module(INIT, after, DECODE, header=HEADER_AFTER)
    assert [f.state for f in sglang_tree.plan([RULE]).findings] == [State.PATCHED]
    sglang_tree.assert_idempotent([RULE])


#: a local of the chain bound more than once: which value reaches out_cache_loc= is not proven
CHAIN_BOUND_TWICE = _decode_from(
    BS + ROWS_SPLIT + "            if self.speculative_num_steps == 1:\n"
    "                rows = out_cache_loc[None]\n" + STEP_ROW,
    "step_loc",
)


def test_a_chain_of_locals_with_one_bound_twice_is_refused(sglang_tree):
    text = dsv4_module(INIT, CHAIN_BOUND_TWICE, DECODE)
    sglang_tree.write(DSV4, text)
    write_bystanders(sglang_tree, besides=DSV4)
    lines = f"{line_of(text, 'rows = (')}, {line_of(text, 'rows = out_cache_loc[None]')}"
    detail = (
        f"out_cache_loc= comes through `rows`, bound more than once in init_forward_metadata (lines {lines}): "
        "rewrite its split by hand"
    )
    [finding] = sglang_tree.plan([RULE]).findings
    assert (finding.state, finding.detail) == (State.UNRECOGNISED, detail)
    assert_refused(
        sglang_tree, DSV4, line_of(text, "metadata = self.init_forward_metadata_decode("), SCOPE, SITE, detail
    )


#: the bound view's move short enough for black to break inside the subscript instead
SUBSCRIPT_BROKEN = """\
            out_cache_loc = forward_batch.out_cache_loc
            if self.topk > 0 and self.speculative_num_steps > 1:
                steps = self.speculative_num_steps
                rows = out_cache_loc.view(forward_batch.batch_size, self.topk, steps)
                out_cache_loc = rows.permute(2, 0, 1).reshape(steps, -1)[
                    self.speculative_step_id
                ]
"""
SUBSCRIPT_JOINED = """\
            out_cache_loc = forward_batch.out_cache_loc
            if self.topk > 0 and self.speculative_num_steps > 1:
                steps = self.speculative_num_steps
                out_cache_loc = per_step_draft_out_cache_loc(
                    out_cache_loc,
                    forward_batch.batch_size,
                    self.topk,
                    steps,
                )[self.speculative_step_id]
"""


def test_a_subscript_black_broke_is_joined_after_the_helper_call(sglang_tree):
    before = TWO_SPLITS.replace(
        TWO_SPLITS[
            TWO_SPLITS.index("            out_cache_loc = forward_batch") : TWO_SPLITS.index("            metadata = ")
        ],
        SUBSCRIPT_BROKEN,
    )
    after = before.replace(SUBSCRIPT_BROKEN, SUBSCRIPT_JOINED)
    for method in (before, after):  # both as black writes them
        assert black.format_str("class A:\n" + method, mode=black.Mode()) == "class A:\n" + method
    sglang_tree.write(DSV4, dsv4_module(INIT, before, DECODE))
    assert sglang_tree.apply([RULE]).findings[0].state is State.TO_PATCH
    assert sglang_tree.read(DSV4) == dsv4_module(INIT, after, DECODE, header=HEADER_AFTER)
    sglang_tree.assert_idempotent([RULE])


#: the decode branch binding the 3-d view once and moving it in each of two branches below it
VIEW_MOVED_TWICE = BEFORE.replace(
    """\
            metadata = self.init_forward_metadata_decode(
                max_seq_len=max_seq_len,
                seq_lens=forward_batch.seq_lens,
                out_cache_loc=forward_batch.out_cache_loc,
            )
""",
    """\
            rows = forward_batch.out_cache_loc.view(
                forward_batch.batch_size, self.topk, self.speculative_num_steps
            )
            if self.topk == 1:
                step_loc = rows.movedim(-1, 0).flatten(1)[self.speculative_step_id]
            else:
                step_loc = rows.permute(2, 0, 1).reshape(self.speculative_num_steps, -1)[
                    self.speculative_step_id
                ]
            metadata = self.init_forward_metadata_decode(
                max_seq_len=max_seq_len,
                seq_lens=forward_batch.seq_lens,
                out_cache_loc=step_loc,
            )
""",
)


def test_a_bound_view_moved_in_two_branches_is_refused_in_one_line(sglang_tree):
    text = dsv4_module(INIT, VIEW_MOVED_TWICE, DECODE)
    sglang_tree.write(DSV4, text)
    write_bystanders(sglang_tree, besides=DSV4)
    view, first, second = (
        line_of(text, s) for s in ("rows = forward_batch", "step_loc = rows.movedim", "step_loc = rows.permute")
    )
    detail = (
        f"the 3-d view `rows` (line {view}) is moved in 2 places (lines {first}, {second}): rewrite the split by hand"
    )
    [finding] = sglang_tree.plan([RULE]).findings
    assert (finding.state, finding.line, finding.detail) == (State.UNRECOGNISED, view, detail)
    assert_refused(sglang_tree, DSV4, view, SCOPE, SITE, detail)


MULTI_STEP = """

class DeepseekV4MultiStepBackend(DeepseekV4AttnBackend):
    def __init__(self, topk, speculative_num_steps):
        self.topk = topk
        self.speculative_num_steps = speculative_num_steps
        self.attn_backends = [
            DeepseekV4AttnBackend(topk, speculative_num_steps, speculative_step_id=i)
            for i in range(speculative_num_steps)
        ]

    def init_forward_metadata(self, forward_batch):
        step_out_cache_loc = self._split_out_cache_loc_per_step(forward_batch)
        original_out_cache_loc = forward_batch.out_cache_loc
        try:
            for i in range(self.speculative_num_steps - 1):
                forward_batch.out_cache_loc = step_out_cache_loc[i]
                self.attn_backends[i].init_forward_metadata(forward_batch)
        finally:
            forward_batch.out_cache_loc = original_out_cache_loc

    def _split_out_cache_loc_per_step(self, forward_batch):
        num_reqs = forward_batch.batch_size
        return (
            forward_batch.out_cache_loc.reshape(num_reqs, self.topk, self.speculative_num_steps)
            .permute(2, 0, 1)
            .reshape(self.speculative_num_steps, -1)
        )
"""
MULTI_STEP_AFTER = MULTI_STEP.replace(
    """\
        return (
            forward_batch.out_cache_loc.reshape(num_reqs, self.topk, self.speculative_num_steps)
            .permute(2, 0, 1)
            .reshape(self.speculative_num_steps, -1)
        )
""",
    """\
        return per_step_draft_out_cache_loc(
            forward_batch.out_cache_loc,
            num_reqs,
            self.topk,
            self.speculative_num_steps,
        )
""",
)
PLAIN_MULTI_STEP = """

class DeepseekV4MultiStepBackend(DeepseekV4AttnBackend):
    def init_forward_metadata(self, forward_batch):
        for i in range(self.speculative_num_steps - 1):
            self.attn_backends[i].init_forward_metadata(forward_batch)
"""


def test_caller_split_is_handled_by_the_caller_and_not_split_again(sglang_tree):
    text = dsv4_module(INIT, BEFORE, DECODE) + MULTI_STEP
    sglang_tree.write(DSV4, text)
    plan = sglang_tree.apply([RULE])
    site, guard = plan.findings
    assert (site.state, site.line) == (State.BY_CALLER, line_of(text, "metadata = self.init_forward_metadata_decode("))
    caller_line = line_of(text, "forward_batch.out_cache_loc = step_out_cache_loc[i]")
    assert site.detail == f"DeepseekV4MultiStepBackend.init_forward_metadata at {DSV4}:{caller_line}"
    assert site.edits == ()
    assert (guard.state, guard.rule.scope) == (
        State.TO_PATCH,
        "DeepseekV4MultiStepBackend._split_out_cache_loc_per_step",
    )
    after = sglang_tree.read(DSV4)
    assert after == dsv4_module(INIT, BEFORE, DECODE, header=HEADER_AFTER) + MULTI_STEP_AFTER
    again = sglang_tree.plan([RULE])
    assert [f.state for f in again.findings] == [State.BY_CALLER, State.PATCHED] and again.changes == ()
    assert sglang_tree.cli("check")[0] == 0


def test_a_caller_that_does_not_split_leaves_the_split_to_upstreams_place(sglang_tree):
    sglang_tree.write(DSV4, dsv4_module(INIT, BEFORE, DECODE) + PLAIN_MULTI_STEP)
    [finding] = sglang_tree.apply([RULE]).findings
    assert finding.state is State.TO_PATCH
    assert sglang_tree.read(DSV4) == dsv4_module(INIT, AFTER, DECODE, header=HEADER_AFTER) + PLAIN_MULTI_STEP


def test_upstreams_split_under_a_caller_that_splits_takes_the_callers_split_out(sglang_tree):
    """Upstream's per-step split under a caller that splits (a fork that merged upstream, or what `apply`
    once added to such a fork): the caller's split is taken out, proven by the split-once verdict."""
    text = dsv4_module(INIT, AFTER, DECODE, OWN_METHOD, header=HEADER_AFTER) + MULTI_STEP_AFTER
    sglang_tree.write(DSV4, text)
    finding = sglang_tree.plan([RULE]).findings[0]
    assert finding.state is State.TO_PATCH and finding.judged  # by the split-once verdict on the result
    assert finding.detail.endswith("the fork's split taken out, upstream's kept")
    assert written_test_problems(sglang_tree) == [(CLS, "twice")]
    code, out, _err = sglang_tree.cli("apply", "--no-tests")
    assert code == 0 and "the fork's split taken out" in " ".join(out.split())
    after = sglang_tree.read(DSV4)
    assert "forward_batch.out_cache_loc = " not in after and "_split_out_cache_loc_per_step" not in after
    assert after.startswith(dsv4_module(INIT, AFTER, DECODE, OWN_METHOD, header=HEADER_AFTER))
    assert sglang_tree.cli("check", "--no-tests")[0] == 0 and written_test_problems(sglang_tree) == []


def test_a_path_that_splits_twice_is_refused(sglang_tree):
    """The fork's own per-step split (not upstream's) under a caller that splits: which to keep is the
    maintainer's call."""
    text = dsv4_module(INIT, CALLS_OWN_METHOD, DECODE, OWN_METHOD, header=HEADER_AFTER) + MULTI_STEP_AFTER
    sglang_tree.write(DSV4, text)
    [finding, _guard] = sglang_tree.plan([RULE]).findings
    assert (finding.state, finding.line) == (
        State.UNRECOGNISED,
        line_of(text, "metadata = self.init_forward_metadata_decode("),
    )
    assert finding.detail.startswith("splits the per-step out_cache_loc twice: here (in ")
    assert finding.detail.endswith(
        "and in its caller DeepseekV4MultiStepBackend.init_forward_metadata (line "
        f"{line_of(text, 'forward_batch.out_cache_loc = step_out_cache_loc[i]')}); keep one of them"
    )
    code, _out, err = sglang_tree.cli("check")
    assert code == 2 and "twice" in err


# ---- a double split kept: on the DSv4 site only, as `check` and the written test judge it ----

KEEP = "  # sglang-draft-layout: keep"
DSV4_DEF = "    def init_forward_metadata(self, forward_batch):\n        max_seq_len"
CALLER_DEF = "    def init_forward_metadata(self, forward_batch):\n        step_out_cache_loc"
#: where the keep comment goes in the in-module double split, and whether that keeps the path
KEEP_ON = {
    "DSv4 def line": (DSV4_DEF, True),
    "DSv4 statement": ("            metadata = self.init_forward_metadata_decode(\n", True),
    "DSv4 split statement": ("                out_cache_loc = per_step_draft_out_cache_loc(\n", None),
    "caller def line": (CALLER_DEF, False),
    "caller's row": ("                forward_batch.out_cache_loc = step_out_cache_loc[i]\n", False),
}
#: (True: kept; False: refused, the caller kept as written; None: the caller's split taken out)


def with_keep(text: str, line: str) -> str:
    """``text`` with the keep comment at the end of the first line of ``line`` (its only occurrence)."""
    assert text.count(line) == 1, line
    first, rest = line.split("\n", 1)
    return text.replace(line, first + KEEP + "\n" + rest)


def written_test_problems(sglang_tree) -> list:
    """What the written CPU test's split-once check finds in the tree."""
    from support.written_split_once import not_split_once

    return not_split_once(sglang_tree.package)


@pytest.mark.parametrize("where", KEEP_ON, ids=KEEP_ON.keys())
def test_a_double_split_is_kept_on_the_dsv4_site_not_on_its_caller(sglang_tree, where):
    line, kept = KEEP_ON[where]
    text = with_keep(dsv4_module(INIT, AFTER, DECODE, header=HEADER_AFTER) + MULTI_STEP_AFTER, line)
    sglang_tree.write(DSV4, text)
    finding = sglang_tree.plan([RULE]).findings[0]
    assert finding.state is {True: State.KEPT, False: State.UNRECOGNISED, None: State.TO_PATCH}[kept]
    code, out, err = sglang_tree.cli("check", "--no-tests")
    problems = written_test_problems(sglang_tree)
    if kept is None:  # a keep on upstream's split keeps nothing the removal touches
        assert code == 1 and problems == [(CLS, "twice")]
    elif kept:
        assert (code, err) == (0, "") and "kept by the fork" in out
        assert problems == []
    else:
        assert code == 2 and "splits the per-step out_cache_loc twice" in err
        assert "DeepseekV4MultiStepBackend.init_forward_metadata" in err and SCOPE in err
        assert problems == [(CLS, "twice")]


@pytest.mark.parametrize(
    "scope, code",
    [(SCOPE, 0), ("DeepseekV4MultiStepBackend.init_forward_metadata", 2)],
    ids=["--keep the DSv4 site", "--keep the caller"],
)
def test_keep_flag_on_a_double_split_judges_as_the_comment_does(sglang_tree, scope, code):
    sglang_tree.write(DSV4, dsv4_module(INIT, AFTER, DECODE, header=HEADER_AFTER) + MULTI_STEP_AFTER)
    found, out, err = sglang_tree.cli("check", "--no-tests", "--keep", f"{DSV4}:{scope}")
    assert found == code
    if code:  # the caller is no site: --keep names none
        assert err.startswith(f"error: --keep {DSV4}:{scope}: no site of ") and out == ""
    else:
        assert "kept by the fork" in out and err == ""


# ---- the decode branch moved out of init_forward_metadata: check and the written test agree ----

#: 0.5.12's multi-step backend (builds the per-step backends, hands each the whole batch): the path the written test walks
BUILDING_MULTI_STEP = (
    MULTI_STEP[: MULTI_STEP.index("    def init_forward_metadata")] + PLAIN_MULTI_STEP.split("\n", 3)[3]
)
#: the per-step backend's init_forward_metadata, its whole body moved into a method of its own
MOVED_INIT = """\
    def init_forward_metadata(self, forward_batch):
        self.forward_metadata = self._init_metadata(forward_batch)
"""


def moved(method: str) -> str:
    """``method`` (a form of init_forward_metadata) as ``_init_metadata``, returning its metadata."""
    return method.replace("def init_forward_metadata(", "def _init_metadata(").replace(
        "        self.forward_metadata = metadata\n", "        return metadata\n"
    )


#: the decode branch alone moved into a method of its own; the verify branch stays in init_forward_metadata
PARTIAL_INIT = """\
    def init_forward_metadata(self, forward_batch):
        max_seq_len = int(forward_batch.seq_lens_cpu.max().item())
        if forward_batch.forward_mode.is_target_verify():
            metadata = self.init_forward_metadata_target_verify(
                max_seq_len=max_seq_len,
                out_cache_loc=forward_batch.out_cache_loc,
            )
        else:
            metadata = self._init_decode_metadata(forward_batch, max_seq_len)
        self.forward_metadata = metadata
"""
PARTIAL_DECODE = """\
    def _init_decode_metadata(self, forward_batch, max_seq_len):
        if forward_batch.forward_mode.is_decode_or_idle():
            return self.init_forward_metadata_decode(
                max_seq_len=max_seq_len,
                seq_lens=forward_batch.seq_lens,
                out_cache_loc={loc},
            )
        return None
"""
#: the moved body one ``self.`` call further down: ``_init_metadata`` calls ``_init_metadata_body`` holding it
DEEPER = """\
    def _init_metadata(self, forward_batch):
        return self._init_metadata_body(forward_batch)
"""
#: DEEPER with recursion and two methods calling each other (each read once)
DEEPER_CYCLE = """\
    def _init_metadata(self, forward_batch):
        if forward_batch.again:
            return self._init_metadata(forward_batch)
        return self._init_metadata_body(forward_batch)
"""
#: the fork's own method with its split one ``self.`` call further down (in ``_mtp_step_rows``)
OWN_METHOD_DEEP = fork_edits.OWN_METHOD_DEEP.lstrip("\n")


def deeper(method: str, calls_back: bool = False) -> str:
    """``moved(method)`` as ``_init_metadata_body``, under DEEPER; with ``calls_back``, calling ``_init_metadata``."""
    body = moved(method).replace("def _init_metadata(", "def _init_metadata_body(")
    if calls_back:
        body = body.replace(
            "        max_seq_len =",
            "        if forward_batch.again:\n"
            "            return self._init_metadata(forward_batch)\n        max_seq_len =",
            1,
        )
    return body


#: the written test's verdicts (proof.split_once)
TWICE, NEVER = "twice", "never"
#: per-step methods, caller -> check's state of the DSv4 site, what the written test finds (None: nothing)
MOVED = {
    "moved, no split": ((moved(BEFORE),), BUILDING_MULTI_STEP, State.TO_PATCH, NEVER),
    "moved, upstream's split": ((moved(AFTER),), BUILDING_MULTI_STEP, State.PATCHED, None),
    "moved, own method": ((moved(CALLS_OWN_METHOD), OWN_METHOD), BUILDING_MULTI_STEP, State.TO_PATCH, None),
    "moved, caller splits": ((moved(BEFORE),), MULTI_STEP_AFTER, State.BY_CALLER, None),
    "moved, caller and upstream's split": ((moved(AFTER),), MULTI_STEP_AFTER, State.TO_PATCH, TWICE),
    "moved, caller and own method": (
        (moved(CALLS_OWN_METHOD), OWN_METHOD),
        MULTI_STEP_AFTER,
        State.UNRECOGNISED,
        TWICE,
    ),
    "two deep, no split": ((DEEPER, deeper(BEFORE)), BUILDING_MULTI_STEP, State.TO_PATCH, NEVER),
    "two deep, upstream's split": ((DEEPER, deeper(AFTER)), BUILDING_MULTI_STEP, State.PATCHED, None),
    "two deep, caller splits": ((DEEPER, deeper(BEFORE)), MULTI_STEP_AFTER, State.BY_CALLER, None),
    "two deep, caller and upstream's split": ((DEEPER, deeper(AFTER)), MULTI_STEP_AFTER, State.TO_PATCH, TWICE),
    "two deep, own method two deep": (
        (DEEPER, deeper(CALLS_OWN_METHOD), OWN_METHOD_DEEP),
        BUILDING_MULTI_STEP,
        State.TO_PATCH,
        None,
    ),
    "two deep, caller and own method two deep": (
        (DEEPER, deeper(CALLS_OWN_METHOD), OWN_METHOD_DEEP),
        MULTI_STEP_AFTER,
        State.UNRECOGNISED,
        TWICE,
    ),
    "calling each other, no split": (
        (DEEPER_CYCLE, deeper(BEFORE, calls_back=True)),
        BUILDING_MULTI_STEP,
        State.TO_PATCH,
        NEVER,
    ),
    "calling each other, caller and upstream's split": (
        (DEEPER_CYCLE, deeper(AFTER, calls_back=True)),
        MULTI_STEP_AFTER,
        State.TO_PATCH,  # the caller's split taken out: upstream's kept
        TWICE,
    ),
    "own method two deep": (
        (
            CALLS_OWN_METHOD.replace("def init_forward_metadata(", "def _init_metadata(").replace(
                "        self.forward_metadata = metadata\n", "        return metadata\n"
            ),
            OWN_METHOD_DEEP,
        ),
        BUILDING_MULTI_STEP,
        State.TO_PATCH,
        None,
    ),
    "decode moved, no split": (
        (PARTIAL_DECODE.format(loc="forward_batch.out_cache_loc"),),
        BUILDING_MULTI_STEP,
        State.TO_PATCH,
        NEVER,
    ),
    "decode moved, own method": (
        (PARTIAL_DECODE.format(loc="self._get_mtp_decode_out_cache_loc(forward_batch)"), OWN_METHOD),
        BUILDING_MULTI_STEP,
        State.TO_PATCH,
        None,
    ),
    "decode moved, caller and own method": (
        (PARTIAL_DECODE.format(loc="self._get_mtp_decode_out_cache_loc(forward_batch)"), OWN_METHOD),
        MULTI_STEP_AFTER,
        State.UNRECOGNISED,
        TWICE,
    ),
}


@pytest.mark.parametrize("shape", MOVED, ids=MOVED.keys())
def test_a_decode_branch_moved_into_a_method_is_judged_alike_by_check_and_the_written_test(sglang_tree, shape):
    """The per-step backend's init_forward_metadata calls a method of its own holding the decode branch
    (the handoff, the split): `check` follows it, and so does the written test's split-once check."""
    methods, caller, state, problem = MOVED[shape]
    init = PARTIAL_INIT if shape.startswith("decode moved") else MOVED_INIT
    header = HEADER_AFTER if any("per_step_draft" in m for m in (*methods, caller)) else HEADER
    text = dsv4_module(INIT, init, *methods, DECODE, header=header) + caller
    sglang_tree.write(DSV4, text)
    assert sglang_tree.plan([RULE]).findings[0].state is state
    assert [who for _cls, who in written_test_problems(sglang_tree)] == ([problem] if problem else [])
    if state is not State.UNRECOGNISED:  # after apply: check at rest, the written test passes
        assert sglang_tree.cli("apply", "--no-tests")[0] == 0
        assert sglang_tree.cli("check", "--no-tests")[0] == 0
        assert written_test_problems(sglang_tree) == []


def test_a_decode_call_moved_without_its_branch_is_no_site_check_knows(sglang_tree):
    """The `if ...is_decode_or_idle():` left in init_forward_metadata, its init_forward_metadata_decode
    call (the handoff) moved into the method it calls: `check` refuses it (nothing to guess); the written
    test counts that method like any handoff method (here: never split)."""
    init = """\
    def init_forward_metadata(self, forward_batch):
        max_seq_len = int(forward_batch.seq_lens_cpu.max().item())
        if forward_batch.forward_mode.is_decode_or_idle():
            metadata = self._init_decode_metadata(forward_batch, max_seq_len)
        else:
            metadata = None
        self.forward_metadata = metadata
"""
    decode = """\
    def _init_decode_metadata(self, forward_batch, max_seq_len):
        return self.init_forward_metadata_decode(
            max_seq_len=max_seq_len,
            seq_lens=forward_batch.seq_lens,
            out_cache_loc=forward_batch.out_cache_loc,
        )
"""
    sglang_tree.write(DSV4, dsv4_module(INIT, init, decode, DECODE) + BUILDING_MULTI_STEP)
    finding = sglang_tree.plan([RULE]).findings[0]
    assert (finding.state, finding.detail) == (State.UNRECOGNISED, DETAIL)
    assert [who for _cls, who in written_test_problems(sglang_tree)] == [NEVER]


#: where the keep comment goes in the moved double split, and whether that keeps the path
MOVED_KEEP_ON = {
    "init_forward_metadata's def line": (MOVED_INIT, True),
    "the moved method's def line": ("    def _init_metadata(self, forward_batch):\n", True),
    "the moved handoff": ("            metadata = self.init_forward_metadata_decode(\n", True),
    "the moved split statement": ("                out_cache_loc = per_step_draft_out_cache_loc(\n", None),
    "the caller's def line": (CALLER_DEF, False),
}


@pytest.mark.parametrize("where", MOVED_KEEP_ON, ids=MOVED_KEEP_ON.keys())
def test_a_moved_double_split_is_kept_alike_by_check_and_the_written_test(sglang_tree, where):
    line, kept = MOVED_KEEP_ON[where]
    text = with_keep(dsv4_module(INIT, MOVED_INIT, moved(AFTER), DECODE, header=HEADER_AFTER) + MULTI_STEP_AFTER, line)
    sglang_tree.write(DSV4, text)
    expected = {True: State.KEPT, False: State.UNRECOGNISED, None: State.TO_PATCH}[kept]  # None: taken out
    assert sglang_tree.plan([RULE]).findings[0].state is expected
    assert [who for _cls, who in written_test_problems(sglang_tree)] == ([] if kept else [TWICE])


# ---- kept by the fork: pragma or --keep --------------------------------------------

KEPT_FORM = REFUSED["sliced buffer"]


@pytest.mark.parametrize("where", ["def line", "site's statement", "site's last line"])
def test_pragma_keeps_an_unrecognised_site_and_the_rest_is_patched(sglang_tree, where):
    if where == "def line":
        method = KEPT_FORM.replace("forward_batch):\n", "forward_batch):  # sglang-draft-layout: keep\n", 1)
    elif where == "site's statement":
        method = KEPT_FORM.replace(
            "metadata = self.init_forward_metadata_decode(\n",
            "metadata = self.init_forward_metadata_decode(  # sglang-draft-layout: keep\n",
            1,
        )
    else:
        method = KEPT_FORM.replace(
            "[: forward_batch.batch_size],\n", "[: forward_batch.batch_size],  # sglang-draft-layout: keep\n"
        )
    text = dsv4_module(INIT, method, DECODE)
    sglang_tree.write(DSV4, text)
    write_bystanders(sglang_tree, besides=DSV4)
    [finding] = sglang_tree.plan([RULE]).findings
    assert (finding.state, finding.detail) == (State.KEPT, "# sglang-draft-layout: keep")
    code, out, err = sglang_tree.cli("check", "--no-tests")
    assert code == 1 and err == ""  # the bystanders are still to patch
    assert "kept by the fork" in out
    code, _out, err = sglang_tree.cli("apply")
    assert (code, err) == (0, "")
    assert sglang_tree.read(DSV4) == text
    assert sglang_tree.cli("check")[0] == 0


def test_pragma_on_another_statement_keeps_nothing(sglang_tree):
    method = KEPT_FORM.replace("max_seq_len = int(", "max_seq_len = int(  # sglang-draft-layout: keep\n            ", 1)
    sglang_tree.write(DSV4, dsv4_module(INIT, method, DECODE))
    [finding] = sglang_tree.plan([RULE]).findings
    assert finding.state is State.UNRECOGNISED


@pytest.mark.parametrize(
    "spec",
    [
        f"srt/layers/attention/deepseek_v4_backend.py:{SCOPE}",
        f"sglang/srt/layers/attention/deepseek_v4_backend.py:{SCOPE}",
        f"deepseek_v4_backend.py:{SCOPE}",
    ],
    ids=["under the package", "with sglang/", "file name"],
)
def test_keep_flag_keeps_the_site(sglang_tree, spec):
    text = dsv4_module(INIT, KEPT_FORM, DECODE)
    sglang_tree.write(DSV4, text)
    write_bystanders(sglang_tree, besides=DSV4)
    assert sglang_tree.cli("apply")[0] == 2
    code, out, err = sglang_tree.cli("apply", "--keep", spec, "--format", "json")
    assert (code, err) == (0, "")
    report = json.loads(out)
    assert [site["state"] for site in report["sites"] if site["class_method"] == SCOPE] == ["kept by the fork"]
    assert len(report["files"]) == 4  # the bystanders
    assert sglang_tree.read(DSV4) == text
    assert sglang_tree.cli("check", "--keep", spec)[0] == 0
    assert sglang_tree.cli("check")[0] == 2


def test_keep_flag_also_keeps_a_site_to_patch(sglang_tree):
    text = dsv4_module(INIT, BEFORE, DECODE)
    sglang_tree.write(DSV4, text)
    code, out, _err = sglang_tree.cli("apply", "--keep", f"srt/layers/attention/deepseek_v4_backend.py:{SCOPE}")
    assert code == 0 and "nothing to do" in out
    assert sglang_tree.read(DSV4) == text


def test_keep_flag_naming_no_site_is_refused(sglang_tree):
    sglang_tree.write(DSV4, dsv4_module(INIT, BEFORE, DECODE))
    before = sglang_tree.snapshot()
    code, out, err = sglang_tree.cli("apply", "--keep", "srt/layers/attention/deepseek_v4_backend.py:Nope.init")
    assert (code, out) == (2, "")
    assert err.startswith("error: --keep srt/layers/attention/deepseek_v4_backend.py:Nope.init: no site of ")
    assert err.count("\n") == 1
    assert sglang_tree.snapshot() == before


WORKER_INITS_PER_STEP = """\
    def draft_forward(self, forward_batch):
        out_cache_loc = forward_batch.out_cache_loc
        out_cache_loc = out_cache_loc.reshape(
            forward_batch.batch_size, self.topk, self.speculative_num_steps
        )
        out_cache_loc = out_cache_loc.permute((2, 0, 1)).reshape(
            self.speculative_num_steps, -1
        )
        for i in range(self.speculative_num_steps - 1):
            forward_batch.out_cache_loc = out_cache_loc[i]
            backend = self.draft_attn_backend.attn_backends[i]
            backend.init_forward_metadata(forward_batch)
            self.draft_runner.forward(forward_batch, skip_attn_backend_init=True)
"""


@pytest.mark.parametrize("columns", [80, 200])
def test_check_lists_the_site_the_caller_handles_on_one_line_with_the_callers_file_and_line(
    sglang_tree, monkeypatch, columns
):
    text = dsv4_module(INIT, BEFORE, DECODE) + MULTI_STEP
    sglang_tree.write(DSV4, text)
    monkeypatch.setenv("COLUMNS", str(columns))
    code, out, _ = sglang_tree.cli("check")
    site_line = line_of(text, "metadata = self.init_forward_metadata_decode(")
    where = f"{DSV4}:{line_of(text, 'forward_batch.out_cache_loc = step_out_cache_loc[i]')}"
    [row] = [line for line in out.splitlines() if "handled by the fork's caller" in line and line.startswith("  ")]
    assert code == 1 and len(row) <= columns
    assert row.strip().startswith(f"{site_line}  handled by the fork's caller  ")
    caller = f"DeepseekV4MultiStepBackend.init_forward_metadata at {where}"
    assert row.endswith(caller if columns == 200 else where.rpartition("/")[2])  # cut from the left: file:line stay
    assert out.splitlines()[out.splitlines().index(row) + 1].startswith("  ")  # the next row: no detail line


def test_a_worker_that_only_forwards_each_row_is_no_caller(sglang_tree):
    from rule_test_support import WORKER_V2, worker_module

    sglang_tree.write(DSV4, dsv4_module(INIT, BEFORE, DECODE))
    sglang_tree.write(
        WORKER_V2,
        worker_module(
            "EagleDraftWorker",
            WORKER_INITS_PER_STEP.replace("            backend.init_forward_metadata(forward_batch)\n", ""),
        ),
    )
    [finding] = sglang_tree.plan([RULE]).findings
    assert finding.state is State.TO_PATCH


CHUNKS = "forward_batch.out_cache_loc.reshape(self.speculative_num_steps, -1)[self.speculative_step_id]"
STEP_SPLIT = (
    "forward_batch.out_cache_loc.reshape(forward_batch.batch_size, self.topk, self.speculative_num_steps)"
    ".permute(2, 0, 1).reshape(self.speculative_num_steps, -1)[self.speculative_step_id]"
)


def chunks_for_larger_batches(sglang_tree, larger: int) -> tuple[str, object]:
    """The step's row laid out another way (step-major chunks) for more than ``larger`` sequences: (text, finding)."""
    lines = (
        "            out_cache_loc = forward_batch.out_cache_loc\n"
        f"            if forward_batch.batch_size > {larger}:\n                out_cache_loc = {CHUNKS}\n"
        f"            else:\n                out_cache_loc = {STEP_SPLIT}\n"
    )
    text = dsv4_module(INIT, _decode_from(lines, "out_cache_loc"), DECODE)
    sglang_tree.write(DSV4, text)
    [finding] = sglang_tree.plan([RULE]).findings
    return text, finding


def test_the_splits_rows_bound_another_way_are_refused(sglang_tree):
    """For batches larger than any probe runs (those past an ``if``'s number too: at most harness.paths.PAST_AT_MOST)
    the split's rewrite would be judged on the probes' branch only (test_spelling_properties found the like patched)."""
    text, finding = chunks_for_larger_batches(sglang_tree, 1024)
    line = line_of(text, f"out_cache_loc = {CHUNKS}")
    assert (finding.state, finding.line) == (State.UNRECOGNISED, line)
    assert finding.detail == (
        f"`out_cache_loc`, which its split binds, is also bound at line {line} (`{CHUNKS[:60]}`), which the probes"
        " need not run: rewrite the split by hand"
    )


@pytest.mark.parametrize("larger", [4, 64])
def test_a_layout_for_more_sequences_than_the_base_probes_is_run_past_the_ifs_number(sglang_tree, larger):
    """For more than 4 (or 64) sequences (the base probes run 3 at most) the harness runs a probe one past the
    ``if``'s number, and the step baking a chunk there refuses the site, naming the branch."""
    text, finding = chunks_for_larger_batches(sglang_tree, larger)
    decode = line_of(text, "metadata = self.init_forward_metadata_decode(")
    condition = f"if forward_batch.batch_size > {larger}:"
    assert (finding.state, finding.line) == (State.UNRECOGNISED, decode)
    assert finding.detail.startswith(
        f"the per-step out_cache_loc path: bs {larger + 1}, topk 1, 3 steps (for `{condition}` at"
        f" srt/layers/attention/deepseek_v4_backend.py:{line_of(text, condition)}): eager:"
        " step 0 bakes slots [1000000, 1000001, 1000002"
    )

"""rules/dsv4_hip_out_cache_loc.py and rules/dsv4_in_graph_out_cache_loc.py: the ROCm DeepSeek-V4
backend's decode branch (the DSv4 rule's judgement on another (file, per-step class)), and both
DeepSeek-V4 backends' ``init_forward_metadata_in_graph``; a guard class's correct hand layout left
"correct, by hand" (engine ``_by_hand``). Hand-written mimics of the sites, no SGLang code."""

from __future__ import annotations

import pytest
from rule_test_support import DSV4, SPEC_UTILS, line_of, method_source, rule
from sglang_draft_layout import engine
from sglang_draft_layout.rules import RULES
from sglang_draft_layout.rules.base import State
from sglang_draft_layout.rules.dsv4_in_graph_out_cache_loc import step_slice

HIP = "srt/layers/attention/deepseek_v4_backend_hip_radix.py"
CLS = "DeepseekV4HipRadixBackend"
DECODE_RULE = rule("dsv4-hip-out-cache-loc")
IN_GRAPH_HIP = rule(f"dsv4-in-graph-out-cache-loc:{CLS}")
IN_GRAPH_CUDA = rule("dsv4-in-graph-out-cache-loc:DeepseekV4AttnBackend")

HEADER = '''\
"""ROCm DeepSeek-V4 attention backend (hand-made mimic of the sites)."""

import torch

from sglang.srt.layers.attention.base_attn_backend import AttentionBackend
'''
IMPORT = "from sglang.srt.speculative.eagle_utils import per_step_draft_out_cache_loc\n"

PER_STEP_BEFORE = """

class {cls}(AttentionBackend):
    def __init__(self, topk=0, speculative_num_steps=0, speculative_step_id=0):
        assert topk in (0, 1), "MTP topk > 1 not supported for DeepSeek V4"
        self.topk = topk
        self.speculative_num_steps = speculative_num_steps
        self.speculative_step_id = speculative_step_id

    def init_forward_metadata_decode(self, seq_lens, out_cache_loc):
        assert seq_lens.shape[0] == out_cache_loc.shape[0]
        return out_cache_loc

    def init_forward_metadata(self, forward_batch):
        if forward_batch.forward_mode.is_decode_or_idle():
            metadata = self.init_forward_metadata_decode(
                seq_lens=forward_batch.seq_lens,
                out_cache_loc=forward_batch.out_cache_loc,
            )
        else:
            metadata = None
        self.forward_metadata = metadata
{in_graph}"""
DECODE_AFTER = """\
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
                seq_lens=forward_batch.seq_lens,
                out_cache_loc=out_cache_loc,
            )
"""
IN_GRAPH_LOCAL = """
    def init_forward_metadata_in_graph(self, forward_batch):
        metadata = self.forward_metadata
        if forward_batch.out_cache_loc is not None:
            out_cache_loc = forward_batch.out_cache_loc
            metadata.swa_out_cache_loc = self.token_to_kv_pool.translate_loc_from_full_to_swa(
                out_cache_loc
            )
"""
IN_GRAPH_INLINE = """
    def init_forward_metadata_in_graph(self, forward_batch):
        metadata = self.forward_metadata
        if forward_batch.out_cache_loc is not None:
            metadata.swa_out_cache_loc = self.token_to_kv_pool.translate_loc_from_full_to_swa(
                forward_batch.out_cache_loc
            )
"""
IN_GRAPH_AFTER = """
    def init_forward_metadata_in_graph(self, forward_batch):
        metadata = self.forward_metadata
        if forward_batch.out_cache_loc is not None:
            out_cache_loc = forward_batch.out_cache_loc
            if (
                forward_batch.forward_mode.is_decode_or_idle()
                and self.topk > 0
                and self.speculative_num_steps > 1
            ):
                # Multi-step draft decode shares one out_cache_loc buffer across
                # steps; mirror the eager init's per-step slice.
                out_cache_loc = per_step_draft_out_cache_loc(
                    out_cache_loc,
                    forward_batch.batch_size,
                    self.topk,
                    self.speculative_num_steps,
                )[self.speculative_step_id]
            metadata.swa_out_cache_loc = self.token_to_kv_pool.translate_loc_from_full_to_swa(
                out_cache_loc
            )
"""
MULTI_STEP = """

class DeepseekV4MultiStepBackend({cls}):
    def __init__(self, topk, speculative_num_steps):
        self.topk = topk
        self.speculative_num_steps = speculative_num_steps
        self.attn_backends = []
        for i in range(self.speculative_num_steps):
            self.attn_backends.append(
                {cls}(topk=topk, speculative_num_steps=speculative_num_steps, speculative_step_id=i)
            )

    def init_forward_metadata(self, forward_batch):
        for i in range(self.speculative_num_steps - 1):
            self.attn_backends[i].init_forward_metadata(forward_batch)
{in_graph}"""
MULTI_IN_GRAPH = """
    def init_forward_metadata_in_graph(self, forward_batch):
        for attn_backend in self.attn_backends:
            attn_backend.init_forward_metadata_in_graph(forward_batch)
"""
#: a caller that hands each step its own row before the per-step init
MULTI_SPLITS = MULTI_STEP.replace(
    "        for i in range(self.speculative_num_steps - 1):\n"
    "            self.attn_backends[i].init_forward_metadata(forward_batch)\n",
    "        rows = forward_batch.out_cache_loc.reshape(\n"
    "            forward_batch.batch_size, self.topk, self.speculative_num_steps\n"
    "        ).permute(2, 0, 1).reshape(self.speculative_num_steps, -1)\n"
    "        whole = forward_batch.out_cache_loc\n"
    "        for i in range(self.speculative_num_steps - 1):\n"
    "            forward_batch.out_cache_loc = rows[i]\n"
    "            self.attn_backends[i].init_forward_metadata(forward_batch)\n"
    "        forward_batch.out_cache_loc = whole\n",
)


def had_the_bug(finding) -> bool:
    """The site's path, run on the probes before the rewrite, did not give upstream's values."""
    return bool(finding.judged) and not finding.judged.startswith("upstream's values")


def of(plan: engine.Plan, site) -> "engine.Finding":
    """The plan's one finding of ``site`` (the structural guard may add others, for the caller)."""
    [finding] = [f for f in plan.findings if f.rule.id == site.id]
    return finding


def module(
    cls: str = CLS,
    in_graph: str = "",
    multi: str = MULTI_STEP,
    multi_in_graph: str = MULTI_IN_GRAPH,
    imported: bool = False,
) -> str:
    return (
        HEADER
        + (IMPORT if imported else "")
        + PER_STEP_BEFORE.format(cls=cls, in_graph=in_graph)
        + multi.format(cls=cls, in_graph=multi_in_graph if in_graph else "")
    )


def test_hip_decode_branch_before_after(sglang_tree):
    before = module()
    sglang_tree.write(HIP, before)
    finding = of(sglang_tree.apply([DECODE_RULE]), DECODE_RULE)
    assert (finding.state, finding.line) == (
        State.TO_PATCH,
        line_of(before, "metadata = self.init_forward_metadata_decode("),
    )
    assert had_the_bug(finding)
    after = sglang_tree.read(HIP)
    assert DECODE_AFTER in method_source(after, f"{CLS}.init_forward_metadata")
    assert after == module(imported=True).replace(
        DECODE_AFTER.split("            # DSv4")[0] + "            metadata = self.init_forward_metadata_decode(\n"
        "                seq_lens=forward_batch.seq_lens,\n"
        "                out_cache_loc=forward_batch.out_cache_loc,\n            )\n",
        DECODE_AFTER,
    )
    sglang_tree.assert_idempotent([DECODE_RULE])


def test_hip_decode_branch_split_by_the_caller(sglang_tree):
    sglang_tree.write(HIP, module(multi=MULTI_SPLITS))
    finding = of(sglang_tree.plan([DECODE_RULE]), DECODE_RULE)
    assert finding.state is State.BY_CALLER
    assert "DeepseekV4MultiStepBackend.init_forward_metadata" in finding.detail


def test_hip_decode_branch_split_twice_takes_the_callers_split_out(sglang_tree):
    text = (
        module(multi=MULTI_SPLITS, imported=True)
        .replace(
            "            metadata = self.init_forward_metadata_decode(\n",
            DECODE_AFTER.split("            metadata =")[0].split("is_decode_or_idle():\n")[1]
            + "            metadata = self.init_forward_metadata_decode(\n",
        )
        .replace(
            "out_cache_loc=forward_batch.out_cache_loc,\n            )\n        else",
            "out_cache_loc=out_cache_loc,\n            )\n        else",
        )
    )
    sglang_tree.write(HIP, text)
    finding = of(sglang_tree.plan([DECODE_RULE]), DECODE_RULE)
    assert finding.state is State.TO_PATCH and "the fork's split taken out, upstream's kept" in finding.detail
    assert finding.judged
    sglang_tree.apply([DECODE_RULE])
    assert sglang_tree.read(HIP) == text.replace(
        MULTI_SPLITS.format(cls=CLS, in_graph=""), MULTI_STEP.format(cls=CLS, in_graph="")
    )
    sglang_tree.assert_idempotent([DECODE_RULE])


@pytest.mark.parametrize("in_graph", [IN_GRAPH_LOCAL, IN_GRAPH_INLINE], ids=["through a local", "inline"])
@pytest.mark.parametrize(
    "relative, cls, site",
    [(HIP, CLS, IN_GRAPH_HIP), (DSV4, "DeepseekV4AttnBackend", IN_GRAPH_CUDA)],
    ids=["hip", "cuda"],
)
def test_in_graph_before_after(sglang_tree, in_graph, relative, cls, site):
    sglang_tree.write(relative, module(cls, in_graph))
    finding = of(sglang_tree.apply([site]), site)
    assert finding.state is State.TO_PATCH
    assert had_the_bug(finding)
    after = sglang_tree.read(relative)
    assert method_source(after, f"{cls}.init_forward_metadata_in_graph") == IN_GRAPH_AFTER.lstrip("\n")
    assert after == module(cls, IN_GRAPH_AFTER, imported=True)
    sglang_tree.assert_idempotent([site])


def test_in_graph_absent_where_the_tree_has_no_such_method(sglang_tree):
    sglang_tree.write(HIP, module())
    finding = of(sglang_tree.plan([IN_GRAPH_HIP]), IN_GRAPH_HIP)
    assert finding.state is State.ABSENT and "0.5.13 added it" in finding.detail


#: the multi-step in-graph method computing each step's row: ``{hand}`` is what it does with them
CALLER_ROWS = MULTI_IN_GRAPH.replace(
    "        for attn_backend in self.attn_backends:\n"
    "            attn_backend.init_forward_metadata_in_graph(forward_batch)\n",
    "        rows = per_step_draft_out_cache_loc(\n"
    "            forward_batch.out_cache_loc, forward_batch.batch_size, self.topk, self.speculative_num_steps\n"
    "        )\n"
    "        whole = forward_batch.out_cache_loc\n"
    "        for i, attn_backend in enumerate(self.attn_backends):\n"
    "{hand}"
    "            attn_backend.init_forward_metadata_in_graph(forward_batch)\n"
    "        forward_batch.out_cache_loc = whole\n",
)
HANDS_ROW = "            forward_batch.out_cache_loc = rows[i]\n"


def test_in_graph_caller_that_computes_rows_but_hands_none_is_patched(sglang_tree):
    """Rows computed, never set on the batch: each step still translates the whole buffer (not "handled by
    the caller", as a syntactic reading of the caller had it)."""
    sglang_tree.write(HIP, module(in_graph=IN_GRAPH_LOCAL, multi_in_graph=CALLER_ROWS.format(hand=""), imported=True))
    finding = of(sglang_tree.apply([IN_GRAPH_HIP]), IN_GRAPH_HIP)
    assert finding.state is State.TO_PATCH
    assert had_the_bug(finding)
    assert method_source(sglang_tree.read(HIP), f"{CLS}.init_forward_metadata_in_graph") == IN_GRAPH_AFTER.lstrip("\n")


def test_in_graph_caller_that_hands_each_step_its_row(sglang_tree):
    text = module(in_graph=IN_GRAPH_LOCAL, multi_in_graph=CALLER_ROWS.format(hand=HANDS_ROW), imported=True)
    sglang_tree.write(HIP, text)
    finding = of(sglang_tree.plan([IN_GRAPH_HIP]), IN_GRAPH_HIP)
    line = text.splitlines().index(HANDS_ROW.rstrip("\n")) + 1
    assert finding.state is State.BY_CALLER
    assert finding.detail.endswith(f"DeepseekV4MultiStepBackend.init_forward_metadata_in_graph at {HIP}:{line}")
    sglang_tree.write(HIP, text.replace(IN_GRAPH_LOCAL, IN_GRAPH_AFTER))
    finding = of(sglang_tree.plan([IN_GRAPH_HIP]), IN_GRAPH_HIP)
    assert finding.state is State.UNRECOGNISED and "AssertionError" in finding.detail


@pytest.mark.parametrize(
    "hand, why",
    [
        (
            "            forward_batch.out_cache_loc = rows[0]\n",
            "in graph: step 1 bakes slots [1000000]; upstream's row 1",
        ),
        ("            forward_batch.out_cache_loc = rows[i + 1] if i + 1 < len(rows) else rows[i]\n", "bakes slots"),
        (
            "            forward_batch.out_cache_loc = torch.chunk(whole, self.speculative_num_steps)[i]\n",
            "bakes slots",
        ),
    ],
    ids=["row 0 for every step", "the next step's row", "torch.chunk"],
)
def test_in_graph_caller_handing_other_rows_is_refused(sglang_tree, hand, why):
    sglang_tree.write(HIP, module(in_graph=IN_GRAPH_LOCAL, multi_in_graph=CALLER_ROWS.format(hand=hand), imported=True))
    plan = sglang_tree.plan([IN_GRAPH_HIP])
    finding = of(plan, IN_GRAPH_HIP)
    assert finding.state is State.UNRECOGNISED and why in finding.detail, finding.detail
    assert not plan.changes


#: the per-step eager init calling the in-graph method after its decode metadata, as 0.5.13's does
CALLS_IN_GRAPH = (
    "        self.forward_metadata = metadata\n        self.init_forward_metadata_in_graph(forward_batch)\n"
)


def test_in_graph_caller_handing_rows_for_topk_above_1_only_is_patched(sglang_tree):
    """The caller hands rows only when topk > 1, which this DeepSeek-V4 backend's own __init__ refuses: at
    topk 1 each step translates the whole buffer, so upstream's slice is added."""
    hand = "            if self.topk > 1:\n    " + HANDS_ROW
    sglang_tree.write(HIP, module(in_graph=IN_GRAPH_LOCAL, multi_in_graph=CALLER_ROWS.format(hand=hand), imported=True))
    assert of(sglang_tree.plan([IN_GRAPH_HIP]), IN_GRAPH_HIP).state is State.TO_PATCH


@pytest.mark.judged
def test_in_graph_judged_on_the_eager_path_too(sglang_tree):
    """The eager init calls the in-graph method: a multi-step eager caller handing each step its row and an
    in-graph caller handing the whole buffer leave no one place to split: refused, nothing written."""
    text = module(in_graph=IN_GRAPH_LOCAL, multi=MULTI_SPLITS).replace(
        "        self.forward_metadata = metadata\n", CALLS_IN_GRAPH
    )
    sglang_tree.write(HIP, text)
    plan = sglang_tree.plan([IN_GRAPH_HIP])
    assert plan.unrecognised and not plan.changes


def test_in_graph_and_decode_patched_together_on_the_eager_path(sglang_tree):
    """Both unsplit, the in-graph method called from the eager init (0.5.13's shape before its fix): both
    sites patched in one apply, the in-graph one proven by the verdict on the whole result."""
    text = module(in_graph=IN_GRAPH_LOCAL).replace("        self.forward_metadata = metadata\n", CALLS_IN_GRAPH)
    sglang_tree.write(HIP, text)
    plan = sglang_tree.apply([DECODE_RULE, IN_GRAPH_HIP])
    assert {of(plan, r).state for r in (DECODE_RULE, IN_GRAPH_HIP)} == {State.TO_PATCH}
    after = sglang_tree.read(HIP)
    assert method_source(after, f"{CLS}.init_forward_metadata_in_graph") == IN_GRAPH_AFTER.lstrip("\n")
    assert {of(sglang_tree.plan([DECODE_RULE, IN_GRAPH_HIP]), r).state for r in (DECODE_RULE, IN_GRAPH_HIP)} == {
        State.PATCHED
    }


@pytest.mark.parametrize(
    "in_graph, state, problems",
    [
        (IN_GRAPH_LOCAL, State.UNRECOGNISED, [("OwnDsv4Backend", "never")]),
        (IN_GRAPH_AFTER, State.PATCHED, []),
    ],
    ids=["whole buffer", "split as upstream"],
)
def test_in_graph_of_a_class_no_rule_names_is_guarded(sglang_tree, in_graph, state, problems):
    """A fork's own DeepSeek-V4-like backend: its in-graph path judged by the structural guard and the
    written CPU test with the same verdict (never split: refused, nothing written)."""
    from support.written_split_once import not_split_once

    own = "srt/layers/attention/own_dsv4_backend.py"
    decode_unsplit = PER_STEP_BEFORE[
        PER_STEP_BEFORE.index("        if forward_batch") : PER_STEP_BEFORE.index("        else:")
    ]
    text = module("OwnDsv4Backend", in_graph, imported=True).replace(decode_unsplit, DECODE_AFTER)
    sglang_tree.write(own, text)
    plan = engine.plan(sglang_tree.target(), rules=list(RULES))
    [finding] = [
        f for f in plan.findings if f.rule.id.startswith(f"guard:split-once:{own}") and "_in_graph" in f.rule.id
    ]
    assert finding.rule.id.startswith("guard:split-once:") and finding.state is state
    assert line_of(sglang_tree.read(own), "translate_loc_from_full_to_swa") == finding.line
    assert not_split_once(sglang_tree.package) == problems
    assert not plan.changes or state is State.PATCHED


def test_in_graph_other_target_is_unrecognised(sglang_tree):
    sglang_tree.write(
        HIP,
        module(
            in_graph=IN_GRAPH_LOCAL.replace(
                "out_cache_loc = forward_batch.out_cache_loc\n", "out_cache_loc = forward_batch.out_cache_loc[:4]\n"
            )
        ),
    )
    finding = of(sglang_tree.plan([IN_GRAPH_HIP]), IN_GRAPH_HIP)
    assert finding.state is State.UNRECOGNISED


def test_step_slice_joins_its_condition_where_black_would():
    assert step_slice("fb", 12, 88).startswith("if (\n    fb.forward_mode.is_decode_or_idle()\n    and self.topk > 0\n")
    assert step_slice("fb", 12, 120).startswith(
        "if fb.forward_mode.is_decode_or_idle() and self.topk > 0 and self.speculative_num_steps > 1:\n"
    )


# ---- a class no rule names: a correct hand layout is left, a wrong one patched ----------------

OWN = "srt/layers/attention/own_dsv4_backend.py"
OWN_BACKEND = '''\
"""A fork's own multi-step backend (hand-made)."""

import torch


class OwnDraftBackend:
    def __init__(self, topk, speculative_num_steps):
        self.topk = topk
        self.speculative_num_steps = speculative_num_steps

    def step_rows(self, forward_batch):
        return forward_batch.out_cache_loc.reshape(
            forward_batch.batch_size, self.topk, self.speculative_num_steps
        ).permute({order}).reshape(self.speculative_num_steps, -1)
'''


def test_guard_class_no_draft_path_runs_is_left(sglang_tree):
    """A split of the fork's own in a class no draft path runs: a rewrite there could not be judged, so it is
    left as written (not affected), neither rewritten nor refused."""
    sglang_tree.write(OWN, OWN_BACKEND.format(order="2, 0, 1"))
    plan = engine.plan(sglang_tree.target(), rules=list(RULES))
    [finding] = [f for f in plan.findings if f.rule.file == OWN]
    assert finding.rule.id.startswith("guard:")
    assert finding.state is State.NOT_AFFECTED and finding.edits == ()
    assert "no draft path runs its class" in finding.detail
    assert not any(c.path.name == "own_dsv4_backend.py" for c in plan.changes)


def test_rule_class_correct_by_hand_is_brought_to_upstream(sglang_tree):
    """The same hand layout in a class a rule names is rewritten to the helper (upstream's form)."""
    text = module(multi=MULTI_SPLITS)
    sglang_tree.write(HIP, text)
    plan = engine.plan(sglang_tree.target(), rules=list(RULES))
    [finding] = [f for f in plan.findings if f.rule.scope == "DeepseekV4MultiStepBackend.init_forward_metadata"]
    assert finding.state is State.TO_PATCH


#: the draft kernel's signature, launched as ``kernel[grid](...)`` (a mimic: its body is the real kernel's)
KERNEL_MIMIC = """

import triton


@triton.jit
def generate_draft_decode_kv_indices(req_pool_indices=None, req_to_token=None, paged_kernel_lens=None,
                                     kv_indices=None, kv_indptr=None, positions=None, pool_len=None,
                                     kv_indices_stride=None, kv_indptr_stride=None, bs_upper=None,
                                     iter_upper=None, num_tokens_upper=None, page_size=None):
    pass
"""
NARROW = '''\
"""A fork's own multi-step backend (hand-made)."""

import torch


class OwnDraftBackend:
    def __init__(self, topk, speculative_num_steps, max_context_len):
        self.topk = topk
        self.speculative_num_steps = speculative_num_steps
        self.max_context_len = max_context_len

    def init_cuda_graph_state(self, max_bs, max_num_tokens):
        self.cuda_graph_kv_indices = torch.zeros(
            (self.speculative_num_steps, max_bs * {width}),
        )
'''


NARROW_LAUNCHING = (
    NARROW.replace(
        "class OwnDraftBackend:",
        "from sglang.srt.speculative.spec_utils import generate_draft_decode_kv_indices\n\n\nclass OwnDraftBackend:",
    ).replace(
        "        self.max_context_len = max_context_len\n",
        "        self.max_context_len = max_context_len\n        self.attn_backends = [None] * speculative_num_steps\n",
    )
    + """
    def init_forward_metadata_capture_cuda_graph(self, forward_batch):
        generate_draft_decode_kv_indices[(self.speculative_num_steps, forward_batch.batch_size, self.topk)](
            kv_indices=self.cuda_graph_kv_indices,
            kv_indices_stride=self.cuda_graph_kv_indices.shape[1],
        )
        bs, seq_lens_sum = forward_batch.batch_size * self.topk, forward_batch.seq_lens_sum
        for i in range(self.speculative_num_steps - 1):
            forward_batch.spec_info.kv_indices = self.cuda_graph_kv_indices[i][
                : seq_lens_sum * self.topk + bs * (i + 1)
            ]
"""
)


@pytest.mark.parametrize(
    "width, state",
    [("self.max_context_len", State.TO_PATCH), ("self.topk * self.max_context_len", State.BY_HAND)],
    ids=["narrow row: patched", "upstream's width by hand: left"],
)
@pytest.mark.judged
def test_guard_class_row_width(sglang_tree, width, state):
    """A fork's own draft backend launching the kernel on its own rows: run on the probes, a narrow row is
    patched; upstream's width written by hand is left."""
    sglang_tree.write(SPEC_UTILS, sglang_tree.read(SPEC_UTILS) + KERNEL_MIMIC)
    sglang_tree.write(OWN, NARROW_LAUNCHING.format(width=width))
    plan = engine.plan(sglang_tree.target(), rules=list(RULES))
    [finding] = [f for f in plan.findings if f.rule.id.startswith(f"guard:row-width:{OWN}")]
    assert finding.state is state
    assert bool(plan.changes) == (state is State.TO_PATCH)


# ---- what the written CPU test calls: layout_patterns.forms.wrong_draft_layout ---------------


def test_rule_classes_are_the_classes_the_rules_name_or_read():
    from sglang_draft_layout.layout_patterns.forms import RULE_CLASSES
    from sglang_draft_layout.rules.base import MODULE_SCOPE

    named = {r.scope.split(".")[0] for r in RULES if r.scope != MODULE_SCOPE} | {c for r in RULES for c in r.reads}
    assert RULE_CLASSES == named


@pytest.mark.parametrize(
    "cls, width, wrong",
    [
        ("OwnDraftBackend", "self.topk * self.max_context_len", False),
        ("OwnDraftBackend", "self.max_context_len", True),
        ("TritonMultiStepDraftBackend", "self.topk * self.max_context_len", True),
    ],
    ids=["own class, upstream's width by hand", "own class, narrow row", "a rule's class, by hand"],
)
def test_wrong_draft_layout(cls, width, wrong):
    import ast

    from sglang_draft_layout.layout_patterns.forms import inline_draft_layout, wrong_draft_layout

    text = NARROW.format(width=width).replace("class OwnDraftBackend:", f"class {cls}:")
    tree = ast.parse(text)
    assert len(inline_draft_layout(tree, text.splitlines())) == 1
    assert bool(wrong_draft_layout(tree, text.splitlines())) == wrong


def test_wrong_draft_layout_leaves_a_correct_hand_split():
    import ast

    from sglang_draft_layout.layout_patterns.forms import inline_draft_layout, wrong_draft_layout

    text = OWN_BACKEND.format(order="2, 0, 1")
    tree = ast.parse(text)
    assert inline_draft_layout(tree) and wrong_draft_layout(tree) == []

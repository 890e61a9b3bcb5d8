"""Forms of SGLang before 0.5.8: created helper modules, the one-parameter CUDA-graph frame,
the step-major out_cache_loc split (hand-made snippets; the real releases: test/releases/).
"""

from __future__ import annotations

import json

from rule_test_support import (
    COMMON_TEMPLATE,
    EAGER,
    EAGLE_UTILS,
    EAGLE_UTILS_MODULE,
    FLASHINFER,
    GRAPH,
    INIT,
    SPEC_UTILS,
    TRITON,
    WORKER_V1,
    backend_module,
    line_of,
    rule,
    worker_module,
)
from sglang_draft_layout import engine
from sglang_draft_layout.rules import helper_definitions
from sglang_draft_layout.rules.base import State
from sglang_draft_layout.rules.kv_indices_graph_width import PER_BRANCH, TREE_PER_BRANCH

CLS = "FlashInferMultiStepDraftBackend"
#: the one-parameter frame (0.4.6.post5 to 0.4.7.post1): called with max_bs * topk
GRAPH_PER_BRANCH = GRAPH.replace("max_bs: int, max_num_tokens: int", "max_bs: int").replace(
    "max_bs, max_num_tokens, kv_indices_buf", "max_bs, kv_indices_buf"
)
STEP_MAJOR = """\
    def draft_forward(self, forward_batch):
        out_cache_loc = forward_batch.out_cache_loc
        for i in range(self.speculative_num_steps):
            out_cache_loc = out_cache_loc.view(forward_batch.batch_size, -1)
            forward_batch.out_cache_loc = out_cache_loc[
                :, self.topk * i : self.topk * (i + 1)
            ].flatten()
            self.draft_runner.forward(forward_batch)
"""


def test_one_parameter_graph_rows_are_not_affected(sglang_tree):
    text = backend_module(CLS, INIT, GRAPH_PER_BRANCH)
    sglang_tree.write(FLASHINFER, text)
    [finding] = sglang_tree.plan([rule("graph-width:flashinfer")]).findings
    assert (finding.state, finding.line, finding.detail) == (
        State.NOT_AFFECTED,
        line_of(text, "self.cuda_graph_kv_indices = torch.zeros("),
        PER_BRANCH,
    )


def test_one_parameter_tree_is_not_affected_and_nothing_is_written(sglang_tree):
    sglang_tree.path(SPEC_UTILS).unlink()  # as before 0.5.3
    sglang_tree.write(FLASHINFER, backend_module(CLS, INIT, COMMON_TEMPLATE, EAGER, GRAPH_PER_BRANCH))
    sglang_tree.write(WORKER_V1, worker_module("EAGLEWorker", STEP_MAJOR))
    plan = engine.plan(sglang_tree.target())
    sites = {f.rule.id: f for f in plan.findings if f.rule.counts_as_site and f.state is not State.ABSENT}
    assert set(sites) == {
        "capacity-check:flashinfer",
        "step-slice:flashinfer",
        "eager-width:flashinfer",
        "graph-width:flashinfer",
        "draft-forward:EAGLEWorker",
    }
    assert {f.state for f in sites.values()} == {State.NOT_AFFECTED}
    assert sites["step-slice:flashinfer"].detail == TREE_PER_BRANCH
    assert sites["draft-forward:EAGLEWorker"].detail.startswith("its own step-major split")
    assert plan.changes == ()
    before = sglang_tree.snapshot()
    assert sglang_tree.cli("check")[0] == 0
    assert sglang_tree.cli("apply")[0] == 0
    assert sglang_tree.snapshot() == before


def test_one_parameter_beside_two_parameter_backends_is_refused(sglang_tree):
    sglang_tree.write(FLASHINFER, backend_module(CLS, INIT, COMMON_TEMPLATE, EAGER, GRAPH_PER_BRANCH))
    triton = GRAPH.replace("max_bs * self.max_context_len", "max_num_tokens * self.max_context_len")
    sglang_tree.write(TRITON, backend_module("TritonMultiStepDraftBackend", INIT, COMMON_TEMPLATE, EAGER, triton))
    before = sglang_tree.snapshot()
    plan = engine.plan(sglang_tree.target())
    [refused] = plan.unrecognised
    assert refused.rule.id == "graph-width:flashinfer"
    assert refused.detail.startswith("one-parameter init_cuda_graph_state beside the two-parameter form")
    code, _out, err = sglang_tree.cli("apply")
    assert code == 2 and "nothing written" in err
    assert sglang_tree.snapshot() == before


def test_step_major_split_is_not_affected_in_any_tree(sglang_tree):
    text = worker_module("EAGLEWorker", STEP_MAJOR)
    sglang_tree.write(WORKER_V1, text)
    [finding] = sglang_tree.plan([rule("draft-forward:EAGLEWorker")]).findings
    assert (finding.state, finding.line) == (
        State.NOT_AFFECTED,
        line_of(text, "forward_batch.out_cache_loc = out_cache_loc["),
    )


def test_absent_helper_module_is_created_holding_just_the_helpers(sglang_tree):
    sglang_tree.path(SPEC_UTILS).unlink()  # as before 0.5.3: the kernel lives in eagle_utils.py
    sglang_tree.write(EAGLE_UTILS, EAGLE_UTILS_MODULE)
    sglang_tree.write(FLASHINFER, backend_module(CLS))
    plan = engine.plan(sglang_tree.target())
    created = [f for f in plan.findings if f.rule.file == SPEC_UTILS]
    assert [f.rule.site for f in created] == ["def draft_kv_indices_buffer_width", "def draft_kv_indices_used_len"]
    assert {(f.state, f.detail) for f in created} == {
        (State.TO_PATCH, f"to create: the tree has no {SPEC_UTILS}; apply creates it holding just the helpers")
    }
    [change] = [c for c in plan.changes if c.path == sglang_tree.path(SPEC_UTILS)]
    assert change.old is None and change.new == helper_definitions.new_module(SPEC_UTILS)
    assert "new file mode 100644" in plan.diff()

    code, out, _err = sglang_tree.cli("apply", "--format", "json")
    assert code == 0
    report = json.loads(out)
    assert {"path": f"sglang/{SPEC_UTILS}", "new": True} in report["files"]
    assert {s["state"] for s in report["sites"] if s["file"] == f"sglang/{SPEC_UTILS}"} == {"patched now"}
    text = sglang_tree.read(SPEC_UTILS)
    assert text.startswith('"""Multi-step EAGLE draft layout helpers') and "Created by sglang-draft-layout" in text
    assert "from sglang.srt.speculative.spec_utils import" in sglang_tree.read(FLASHINFER)
    after = sglang_tree.snapshot()
    assert sglang_tree.cli("check")[0] == 0
    assert sglang_tree.cli("apply")[0] == 0
    assert sglang_tree.snapshot() == after


def test_created_eagle_utils_imports_torch(sglang_tree):
    sglang_tree.path(EAGLE_UTILS).unlink()  # as in 0.5.3
    sglang_tree.write(WORKER_V1, worker_module("EAGLEWorker", header='"""Worker."""\n\nimport torch\n\n\n'))
    assert sglang_tree.cli("apply")[0] == 0
    text = sglang_tree.read(EAGLE_UTILS)
    assert text == helper_definitions.new_module(EAGLE_UTILS)
    assert "\nimport torch\n" in text and "def per_step_draft_out_cache_loc(" in text


def test_no_site_no_module_created(sglang_tree):
    sglang_tree.path(SPEC_UTILS).unlink()
    plan = engine.plan(sglang_tree.target())
    assert {f.state for f in plan.findings if f.rule.file == SPEC_UTILS} == {State.ABSENT}
    assert not any(c.path == sglang_tree.path(SPEC_UTILS) for c in plan.changes)


def test_helper_module_that_is_a_package_is_refused(sglang_tree):
    sglang_tree.path(SPEC_UTILS).unlink()
    sglang_tree.write("srt/speculative/spec_utils/__init__.py", '"""A fork\'s package."""\n')
    sglang_tree.write(FLASHINFER, backend_module(CLS))
    before = sglang_tree.snapshot()
    plan = engine.plan(sglang_tree.target())
    assert {f.detail for f in plan.unrecognised} == {
        f"its helper's module is the package {sglang_tree.path('srt/speculative/spec_utils')}, which no rule edits"
    }
    assert sglang_tree.cli("apply")[0] == 2
    assert sglang_tree.snapshot() == before

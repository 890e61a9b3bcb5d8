"""Rows a fork sizes in a frame of its own, right as they are: ``apply`` never writes them topk times too wide.

Two fork edits of the real 0.5.12 tree, each giving upstream's rows before the rewrite (a review round of fork
edits, 2026-12-07): the draft CUDA-graph runner hands branches as ``max_bs`` (upstream 27338 fixed at the call,
``init_cuda_graph_state(self.max_num_token, self.max_num_token)``), and FlashInfer's multi-step backend folds topk
into its own ``max_context_len``. Upstream's helper on either counts topk twice. The draft paths run after the
rewrite show it: the runner's own ``__init__`` hands the CUDA-graph sizes, an outside backend's ``max_context_len``
is the model's context length. ``check`` and ``apply`` refuse (exit 2), naming each path; nothing is written.

Three more from a second round, each a CUDA-graph value of FlashInfer's own that the rewrite leaves (``apply`` wrote
them with exit 0 until the graph was sized for a batch larger than the one it replays): the kernel handed a row
stride ``bs * self.max_context_len`` (right only where the graph's batch is the largest), every per-step backend
handed row 0 of the graph's rows, and the replay handing ``common_template`` the rows cut to the batch's width.
And three from a third: row 0 handed by position, the replay filling a copy of the rows the graph captured, and the
runner handing branches as ``max_bs`` by keyword.
"""

from __future__ import annotations

import pytest
from sglang_draft_layout import cli
from test_regressed_trees import error_lines
from test_releases import tree_digest

pytestmark = pytest.mark.releases

RUNNER = "sglang/srt/speculative/eagle_draft_cuda_graph_runner.py"
UPSTREAMS_CALL = "self.draft_attn_backend.init_cuda_graph_state(self.max_bs, self.max_num_token)"
BRANCHES_CALL = "self.draft_attn_backend.init_cuda_graph_state(self.max_num_token, self.max_num_token)"
FLASHINFER = "sglang/srt/layers/attention/flashinfer_backend.py"
#: what check says of each multi-step backend where the runner hands branches as max_bs (upstream's rows: 768 wide)
BRANCHES_ROWS = (
    "after the rewrite, bs 2, topk 4, 3 steps: capture (max bs 3, sized by EAGLEDraftCudaGraphRunner): "
    "kv_indices rows (3, 3072)"
)
#: 0.5.12's FlashInferMultiStepDraftBackend: its context length, its eager width (fork: topk in the first)
CONTEXT_LEN = "self.max_context_len = self.attn_backends[0].max_context_len\n"
EAGER_WIDTH = "forward_batch.batch_size * self.topk * self.max_context_len,"


def edit(root, relative: str, old: str, new: str) -> None:
    path = root / relative
    text = path.read_text()
    assert text.count(old) == 1, (relative, old)
    path.write_text(text.replace(old, new))


def refused(root, capsys, said: dict[str, str]) -> None:
    """check and apply exit 2, an error for each class of ``said`` holding its text, and write nothing."""
    before = tree_digest(root)
    for command in ("check", "apply"):
        capsys.readouterr()
        assert cli.main([command, str(root)]) == 2
        errors = error_lines(capsys)
        for cls, text in said.items():
            assert any(f"{cls}.<kv_indices rows>: draft path" in e and text in e for e in errors), (cls, errors)
    assert tree_digest(root) == before


def test_a_runner_handing_branches_as_max_bs_is_refused(scratch, capsys):
    root = scratch("0.5.12")
    edit(root, RUNNER, UPSTREAMS_CALL, BRANCHES_CALL)
    after = BRANCHES_ROWS
    classes = ("FlashInferMultiStepDraftBackend", "TritonMultiStepDraftBackend", "AiterMultiStepDraftBackend")
    refused(root, capsys, {cls: after for cls in classes})


def test_a_context_len_counting_topk_is_refused(scratch, capsys):
    root = scratch("0.5.12")
    edit(root, FLASHINFER, CONTEXT_LEN, CONTEXT_LEN.replace("\n", " * self.topk\n"))
    edit(root, FLASHINFER, EAGER_WIDTH, EAGER_WIDTH.replace(" * self.topk", ""))
    after = "after the rewrite, bs 2, topk 4, 3 steps: eager: kv_indices rows (3, 2048)"
    refused(root, capsys, {"FlashInferMultiStepDraftBackend": after})


#: a FlashInfer multi-step backend's graph rows: its kernel launch's row stride, what it hands step i, its capture's and
#: replay's call (the replay's the second)
ROW_STRIDE = "            self.pool_len,\n            kv_indices_buffer.shape[1],\n"
HANDED = "max_bs, max_num_tokens, kv_indices_buf=self.cuda_graph_kv_indices[i]"
FILLED = "        self.common_template(forward_batch, self.cuda_graph_kv_indices, call_fn)\n"
GRAPH_VALUES = {  # the fork's value, and what check says of it after the rewrite
    "kernel row stride of the batch": (
        ROW_STRIDE,
        ROW_STRIDE.replace("kv_indices_buffer.shape[1]", "bs * self.max_context_len"),
        "after the rewrite, bs 1, topk 1, 2 steps: capture (max bs 2): kv_indices rows (2, 128) (row stride 64)",
    ),
    "row 0 for every step": (
        HANDED,
        HANDED.replace("[i]", "[0]"),
        "capture (max bs 4): the per-step backends' CUDA-graph kv_indices are rows [0, 0, 0]; upstream's [0, 1, 2]",
    ),
    "row 0 for every step, by position": (
        HANDED,
        HANDED.replace("kv_indices_buf=", "").replace("[i]", "[0]"),
        "capture (max bs 4): the per-step backends' CUDA-graph kv_indices are rows [0, 0, 0]; upstream's [0, 1, 2]",
    ),
    "rows cut to the batch at replay": (
        FILLED,
        "        used = forward_batch.batch_size * self.topk * self.max_context_len\n"
        + FILLED.replace("self.cuda_graph_kv_indices,", "self.cuda_graph_kv_indices[:, :used],"),
        "after the rewrite, bs 1, topk 1, 2 steps: replay (max bs 2): kv_indices rows (2, 64) (row stride 64)",
    ),
    "a copy filled at replay": (
        FILLED,
        FILLED.replace("self.cuda_graph_kv_indices,", "self.cuda_graph_kv_indices.clone(),"),
        "replay (max bs 2): the kernel fills other rows than those the per-step backends were handed",
    ),
}


@pytest.mark.parametrize("name", GRAPH_VALUES)
def test_a_cuda_graph_value_of_the_forks_own_is_refused(scratch, capsys, name):
    root = scratch("0.5.12")
    old, new, after = GRAPH_VALUES[name]
    path = root / FLASHINFER
    head, found, tail = path.read_text().rpartition(old)  # the last: FILLED's is the replay's
    assert found and (old == FILLED or old not in head), name
    path.write_text(head + new + tail)
    refused(root, capsys, {"FlashInferMultiStepDraftBackend": after})


def test_a_runner_handing_branches_as_max_bs_by_keyword_is_refused(scratch, capsys):
    root = scratch("0.5.12")
    edit(root, RUNNER, UPSTREAMS_CALL, BRANCHES_CALL.replace("(self.max_num_token, self.max_num_token)",
         "(max_bs=self.max_num_token, max_num_tokens=self.max_num_token)"))  # fmt: skip
    after = BRANCHES_ROWS
    classes = ("FlashInferMultiStepDraftBackend", "TritonMultiStepDraftBackend", "AiterMultiStepDraftBackend")
    refused(root, capsys, {cls: after for cls in classes})

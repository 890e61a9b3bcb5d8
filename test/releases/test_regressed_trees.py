"""A tree with no site left to patch is judged as it is: a draft path that regressed is refused.

A fork past the fix (upstream's own code, 0.5.13 on) or a tree an earlier ``apply`` patched may put a narrow
row back. Its sites read as patched, so nothing is rewritten; ``check`` and ``apply`` still run its draft paths
and refuse (exit 2, nothing written), naming the path, the probe and the phase. From 0.5.13 the draft CUDA-graph
runner plans the rows with ``init_forward_metadata_out_graph`` (``in_capture=True`` at capture, then at replay:
``srt/speculative/eagle_draft_cuda_graph_runner.py`` of 0.5.23), so that is where the narrow row shows.
"""

from __future__ import annotations

import pytest
from sglang_draft_layout import cli
from test_releases import tree_digest

pytestmark = pytest.mark.releases

#: 0.5.23's multi-step draft backends that take topk > 1, by file under srt/layers/attention (FlashInfer-MLA's
#: ``__init__`` refuses it: its rows have no topk factor to lose)
MULTI_STEP = {
    "flashinfer_backend.py": "FlashInferMultiStepDraftBackend",
    "triton_backend.py": "TritonMultiStepDraftBackend",
    "aiter_backend.py": "AiterMultiStepDraftBackend",
}
#: the CUDA-graph row width each of them asks for (the eager one names ``forward_batch.batch_size``)
GRAPH_WIDTH = "max_bs, self.topk, self.max_context_len"


def test_unedited_0_5_23_runs_every_multi_step_backend_in_the_graph_phases(pristine, capsys):
    assert cli.main(["check", str(pristine("0.5.23"))]) == 0, capsys.readouterr().err


def test_a_narrow_cuda_graph_row_put_back_is_refused_by_check_and_apply(scratch, capsys):
    root = scratch("0.5.23")
    for name in MULTI_STEP:
        path = root / "sglang/srt/layers/attention" / name
        text = path.read_text()
        assert text.count(GRAPH_WIDTH) == 1, name
        path.write_text(text.replace(GRAPH_WIDTH, "max_bs, 1, self.max_context_len"))
    before = tree_digest(root)
    for command in ("check", "apply"):
        capsys.readouterr()
        assert cli.main([command, str(root)]) == 2
        errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
        assert len(errors) == len(MULTI_STEP), errors
        for name, cls in MULTI_STEP.items():
            said = f"{name}: {cls}.<kv_indices rows>: draft path, run on the probes: as the tree is, bs 2, topk 4"
            assert any(said in line and ": capture: kv_indices rows (3, " in line for line in errors), (cls, errors)
    assert tree_digest(root) == before

"""A draft path that gives other values than upstream's is refused, whether or not a rule names its class.

A fork past the fix (upstream's own code, 0.5.13 on) or a tree an earlier ``apply`` patched may put a narrow
row back. Its sites read as patched, so nothing is rewritten; ``check`` and ``apply`` still run its draft paths
and refuse (exit 2, nothing written), naming the path, the probe and the phase. From 0.5.13 the draft CUDA-graph
runner plans the rows with ``init_forward_metadata_out_graph`` (``in_capture=True`` at capture, then at replay:
``srt/speculative/eagle_draft_cuda_graph_runner.py`` of 0.5.23), so that is where the narrow row shows. A fork's
own multi-step subclass that sizes its CUDA-graph rows in a form no rule rewrites keeps its narrow row after the
rewrite: refused too, where it was left unmentioned; so is a fork's own subclass of an EAGLE worker whose
``draft_forward`` splits otherwise (it was no draft path).
"""

from __future__ import annotations

import re

import pytest
from sglang_draft_layout import cli, engine
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
#: the multi-step backends 0.5.23 draft with (FlashInfer-MLA's topk 1 too), by file under srt/layers/attention
BACKENDS = {**MULTI_STEP, "flashinfer_mla_backend.py": "FlashInferMLAMultiStepDraftBackend"}


def error_lines(capsys) -> list[str]:
    """The ``error:`` lines the command printed since the last read."""
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]


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
        errors = error_lines(capsys)
        assert len(errors) == len(MULTI_STEP), errors
        for name, cls in MULTI_STEP.items():
            said = f"{name}: {cls}.<kv_indices rows>: draft path, run on the probes: as the tree is, bs 2, topk 4"
            assert any(said in line and ": capture (max bs 3): kv_indices rows (3, " in line for line in errors), (
                cls,
                errors,
            )
    assert tree_digest(root) == before


def test_upstreams_worker_reading_every_step_with_step_0s_backend_is_refused(scratch, capsys):
    """0.5.23's ``EagleDraftWorker`` hands each step's backend through ``ForwardContext(attn_backend=...)``, not the
    batch: every step handed ``attn_backends[0]`` (step 0's kv_indices row and slice end) is refused."""
    root = scratch("0.5.23")
    path = root / "sglang/srt/speculative/eagle_worker_v2.py"
    text = path.read_text()
    site = "attn_backend=self.draft_attn_backend.attn_backends[i]"
    assert text.count(site) == 2  # draft_forward's, then _draft_forward_idle's
    path.write_text(text.replace(site, site.replace("[i]", "[0]"), 1))
    assert cli.main(["check", str(root)]) == 2
    assert any(
        "EagleDraftWorker.<draft_forward>" in line and "forwards read with 1 attention backend for 3 steps" in line
        for line in error_lines(capsys)
    )


#: the draft CUDA-graph runner's largest batch put otherwise, and where the rows it sizes show it: its smallest batch
#: (SGLang sorts them), or the largest capped by ``min`` (an ``if`` in disguise, ``branches.bounds``: the probes go
#: past the cap, a batch of 257 in a graph of 258)
RUNNER_MAX_BS = {
    "self.capture_bs[0]": "bs 1, topk 1, 2 steps: capture (max bs 2, sized by EAGLEDraftCudaGraphRunner): kv_indices "
    "rows (2, 64) (row stride 64)",
    "min(max(self.capture_bs), 256)": "bs 257, topk 1, 3 steps (for `min(max(self.capture_bs), 256)` at "
    "srt/speculative/eagle_draft_cuda_graph_runner.py:160): capture (max bs 258, sized by EAGLEDraftCudaGraphRunner): "
    "kv_indices rows (3, 16384)",
}


@pytest.mark.parametrize("max_bs", RUNNER_MAX_BS)
def test_a_runner_sizing_the_rows_for_less_than_its_largest_batch_is_refused(scratch, capsys, max_bs):
    """The draft CUDA-graph runner hands ``init_cuda_graph_state`` the numbers its ``__init__`` computes from the batch
    sizes it captures: rows sized for less than the largest are too narrow for the batches the graph replays, and every
    multi-step backend it sizes is refused."""
    root = scratch("0.5.23")
    path = root / "sglang/srt/speculative/eagle_draft_cuda_graph_runner.py"
    text = path.read_text()
    assert text.count("self.max_bs = max(self.capture_bs)") == 1
    path.write_text(text.replace("self.max_bs = max(self.capture_bs)", f"self.max_bs = {max_bs}"))
    assert cli.main(["check", str(root)]) == 2
    errors = error_lines(capsys)
    assert len(errors) == len(MULTI_STEP) + 1, errors
    for name, cls in {**MULTI_STEP, "flashinfer_mla_backend.py": "FlashInferMLAMultiStepDraftBackend"}.items():
        said = (
            f"{name}: {cls}.<kv_indices rows>: draft path, run on the probes: as the tree is, {RUNNER_MAX_BS[max_bs]}"
        )
        assert any(said in line for line in errors), (cls, errors)


#: kv_indptr row 0 where step i (or per-step backend i) has row i: (files, upstream's text, what it says then)
KV_INDPTR_ROW_0 = {
    "every step reads it": (  # the first bs + 1 of row i: the kernel fills one row per step
        BACKENDS,
        "forward_batch.spec_info.kv_indptr = self.kv_indptr[i, : bs + 1]",
        "bs 3, topk 1, 4 steps: eager: steps read kv_indptr (row, start, length) [(0, 0, 4), (0, 0, 4), (0, 0, 4)]",
    ),
    "FlashInfer plans every step with its host copy": (  # 0.5.23 may build the copy from the lengths: not judged then
        {"flashinfer_backend.py": "FlashInferMultiStepDraftBackend"},
        "global_override_indptr_cpu = indptr_cpu_whole[i]",
        "bs 3, topk 1, 4 steps: eager: steps read kv_indptr on the host (row, start, length) [(0, 0, 4), (0, 0, 4), "
        "(0, 0, 4)]",
    ),
    "every per-step backend is built on it": (  # the buffer its CUDA graph plans into
        BACKENDS,
        "kv_indptr_buf=self.kv_indptr[i],",
        "bs 3, topk 1, 4 steps: the per-step backends are built on kv_indptr rows [0, 0, 0]; upstream's [0, 1, 2]",
    ),
}


@pytest.mark.parametrize(
    "how, name", [(how, name) for how, (files, _site, _said) in KV_INDPTR_ROW_0.items() for name in files]
)
def test_kv_indptr_row_0_where_a_step_has_row_i_is_refused(scratch, capsys, how, name):
    files, site, said = KV_INDPTR_ROW_0[how]
    root = scratch("0.5.23")
    path = root / "sglang/srt/layers/attention" / name
    text = path.read_text()
    assert text.count(site) == 1
    path.write_text(text.replace(site, site.replace("[i", "[0")))
    assert cli.main(["check", str(root)]) == 2
    [error] = error_lines(capsys)
    assert f"{name}: {files[name]}.<kv_indices rows>: draft path, run on the probes: as the tree is, {said}" in error


#: a FlashInfer module padding the draft kv_indptr rows, by a function of its own, to the batch alignment its CUDA
#: graphs capture (the attention TP size: one GPU on the probes), as Ascend/sglang@bf186cf8fc reads that size and as
#: seedleap/sglang@1f5eeb6c57 does (0.5.2x's ``get_parallel()``)
PADDING = (
    "\nfrom sglang.srt.utils import require_gathered_buffer\n"
    "\n\ndef _cuda_graph_capture_max_bs(server_args, max_bs: int) -> int:\n"
    "    mul_base = 1\n"
    "    if server_args.enable_two_batch_overlap:\n"
    "        mul_base *= 2\n"
    "    if require_gathered_buffer(server_args):\n"
    "        mul_base *= {tp_size}\n"
    "    return (max_bs + mul_base - 1) // mul_base * mul_base\n"
)
TP_SIZE = {
    "Ascend/sglang@bf186cf8fc": "get_attention_tp_size()",
    "seedleap/sglang@1f5eeb6c57": "get_parallel().attn_tp_size",
}


@pytest.mark.parametrize("fork", TP_SIZE)
def test_kv_indptr_rows_padded_as_a_forks_own_function_pads_them_are_judged(scratch, capsys, fork):
    root = scratch("0.5.12")
    assert cli.main(["apply", "--no-tests", str(root)]) == 0
    path = root / "sglang/srt/layers/attention/flashinfer_backend.py"
    text = path.read_text()
    sized = "max_bs = model_runner.req_to_token_pool.size * self.topk"
    padded = "max_bs = _cuda_graph_capture_max_bs(\n            model_runner.server_args, model_runner.req_to_token_pool.size * self.topk\n        )"
    site = "forward_batch.spec_info.kv_indptr = self.kv_indptr[i, : bs + 1]"
    assert text.count(sized) == 1 and text.count(site) == 1
    padding = PADDING.format(tp_size=TP_SIZE[fork])
    if "get_parallel" in padding:
        padding = "\nfrom sglang.srt.runtime_context import get_parallel" + padding
    text = text.replace(
        "\n\nclass FlashInferMultiStepDraftBackend", padding + "\n\nclass FlashInferMultiStepDraftBackend"
    )
    path.write_text(text.replace(sized, padded).replace(site, site.replace("[i,", "[0,")))
    capsys.readouterr()
    assert cli.main(["check", str(root)]) == 2
    [error] = error_lines(capsys)
    assert "FlashInferMultiStepDraftBackend.<kv_indices rows>" in error
    assert "steps read kv_indptr (row, start, length) [(0, 0, 4), (0, 0, 4), (0, 0, 4)]" in error


#: a fork's own multi-step backend: its CUDA-graph rows sized by a method of its own, one branch wide
OWN_SUBCLASS = """

class ForkTritonMultiStepDraftBackend(TritonMultiStepDraftBackend):
    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int):
        self.cuda_graph_kv_indices = torch.zeros(
            (self.speculative_num_steps, self._row_width(max_bs)),
            dtype=torch.int32,
            device=self.device,
        )
        for i in range(self.speculative_num_steps - 1):
            self.attn_backends[i].init_cuda_graph_state(
                max_bs, max_num_tokens, kv_indices_buf=self.cuda_graph_kv_indices[i]
            )

    def _row_width(self, num_seqs: int) -> int:
        return num_seqs * self.max_context_len
"""


def test_a_forks_own_subclass_left_narrow_by_the_rewrite_is_refused(scratch, capsys):
    root = scratch("0.5.12")
    path = root / "sglang/srt/layers/attention/triton_backend.py"
    path.write_text(path.read_text() + OWN_SUBCLASS)
    before = tree_digest(root)
    capsys.readouterr()
    assert cli.main(["apply", str(root)]) == 2
    errors = error_lines(capsys)
    said = (
        "triton_backend.py: ForkTritonMultiStepDraftBackend.<kv_indices rows>: draft path, run on the probes: "
        "after the rewrite, bs 2, topk 4, 3 steps: capture (max bs 3): kv_indices rows (3, 192)"
    )
    assert len(errors) == 1 and said in errors[0], errors
    assert f"; {engine.PATH_HINT}" in errors[0]  # no site to keep: the keep comment on its class line
    assert tree_digest(root) == before


def test_the_keep_comment_on_its_class_line_keeps_the_forks_own_path(scratch, capsys):
    root = scratch("0.5.12")
    path = root / "sglang/srt/layers/attention/triton_backend.py"
    header = "class ForkTritonMultiStepDraftBackend(TritonMultiStepDraftBackend):"
    path.write_text(path.read_text() + OWN_SUBCLASS.replace(header, f"{header}  # sglang-draft-layout: keep"))
    capsys.readouterr()
    assert cli.main(["apply", str(root)]) == 0, capsys.readouterr().err
    assert "1 draft path kept by the fork" in capsys.readouterr().out.replace("\n  ", " ")
    assert f"{header}  # sglang-draft-layout: keep\n" in path.read_text()  # the rest patched, its class as written
    assert cli.main(["check", str(root)]) == 0
    out = capsys.readouterr().out
    assert "kept by the fork  ForkTritonMultiStepDraftBackend.<kv_indices rows>" in out, out
    assert "as the tree is, bs 2, topk 4, 3 steps: capture (max bs 3): kv_indices rows (3, 192)" in out.replace(
        "\n      ", " "
    )


#: the split ``apply`` writes in the V2 worker's ``draft_forward``, and a fork's own in its place: the steps
#: transposed with the sequences (upstream's rows are sequence-major: ``permute(2, 0, 1)``)
HELPER_SPLIT = """        out_cache_loc = per_step_draft_out_cache_loc(
            out_cache_loc,
            forward_batch.batch_size,
            self.topk,
            self.speculative_num_steps,
        )
"""
TRANSPOSED_SPLIT = """        rows = out_cache_loc.reshape(
            forward_batch.batch_size, self.topk, self.speculative_num_steps
        )
        out_cache_loc = rows.transpose(0, 2).reshape(self.speculative_num_steps, -1)
"""


def with_worker_subclass(root, split: str) -> None:
    """A fork's own subclass of the patched V2 draft worker: its ``draft_forward``, the base's with ``split``."""
    path = root / "sglang/srt/speculative/eagle_worker_v2.py"
    text = path.read_text()
    start = text.index("    def draft_forward(self, forward_batch: ForwardBatch):")
    end = re.compile(r"\n    (def |@)").search(text, start + 1).start() + 1
    method = text[start:end]
    assert method.count(HELPER_SPLIT) == 1
    path.write_text(text + "\n\nclass ForkDraftWorker(EagleDraftWorker):\n" + method.replace(HELPER_SPLIT, split))


@pytest.mark.parametrize("split", ["helper", "transposed"])
def test_a_forks_own_worker_subclass_is_judged(scratch, capsys, split):
    root = scratch("0.5.12")
    assert cli.main(["apply", str(root)]) == 0
    with_worker_subclass(root, HELPER_SPLIT if split == "helper" else TRANSPOSED_SPLIT)
    capsys.readouterr()
    code = cli.main(["check", str(root)])
    errors = error_lines(capsys)
    if split == "helper":  # upstream's values: nothing to say
        assert (code, errors) == (0, [])
        return
    said = "eagle_worker_v2.py: ForkDraftWorker.<draft_forward>: draft path, run on the probes: as the tree is, "
    assert code == 2 and len(errors) == 1 and said in errors[0], errors
    assert "the draft steps write to ['other slots', 'other slots']; upstream's rows 0..1" in errors[0]


#: a fork's own multi-step backend whose CUDA-graph rows are a width of its own: no name the rows read
#: (``max_context_len``, a helper) in its text
FIXED_WIDTH_SUBCLASS = """

class ForkTritonMultiStepDraftBackend(TritonMultiStepDraftBackend):
    ROW = 4096

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int):
        self.cuda_graph_kv_indices = torch.zeros(
            (self.speculative_num_steps, max_bs * self.ROW),
            dtype=torch.int32,
            device=self.device,
        )
        for i in range(self.speculative_num_steps - 1):
            self.attn_backends[i].init_cuda_graph_state(
                max_bs, max_num_tokens, kv_indices_buf=self.cuda_graph_kv_indices[i]
            )
"""


def test_a_forks_own_subclass_with_a_width_of_its_own_is_judged(scratch, capsys):
    root = scratch("0.5.12")
    assert cli.main(["apply", str(root)]) == 0
    path = root / "sglang/srt/layers/attention/triton_backend.py"
    path.write_text(path.read_text() + FIXED_WIDTH_SUBCLASS)
    capsys.readouterr()
    assert cli.main(["check", str(root)]) == 2
    errors = error_lines(capsys)
    said = "ForkTritonMultiStepDraftBackend.<kv_indices rows>: draft path, run on the probes: as the tree is, bs 1, "
    assert (
        len(errors) == 1 and said in errors[0] and "capture (max bs 2): kv_indices rows (2, 8192)" in errors[0]
    ), errors

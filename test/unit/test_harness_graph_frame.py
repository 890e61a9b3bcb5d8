"""The sizes a draft CUDA-graph runner hands the multi-step backend's ``init_cuda_graph_state``: the numbers its own
``__init__`` hands at a probe, its captured batch sizes the world's (``paths.handed_sizes``); and, for a size it takes
from outside the path, whether it counts branches: run at two topks (``paths.graph_frame``), changing with topk."""

import textwrap

import pytest
from sglang_draft_layout.harness import paths, tensors, world

RUNNER = textwrap.dedent(
    """\
    from sglang.srt.model_executor.cuda_graph_runner import get_batch_sizes_to_capture


    class Runner:
        def __init__(self, eagle_worker):
            self.model_runner = model_runner = eagle_worker.model_runner
            self.topk = model_runner.server_args.speculative_eagle_topk
            self.draft_attn_backend = model_runner.draft_attn_backend
            self.capture_bs, self.compile_bs = get_batch_sizes_to_capture(model_runner)
            self.max_bs = {max_bs}
            self.max_num_token = self.max_bs * self.topk
            {before}self.draft_attn_backend.init_cuda_graph_state({sizes})
    """
)


def runner_tree(sizes: str, before: str = "", max_bs: str = "max(self.capture_bs)") -> world.Tree:
    tree = world.Tree(None, tensors.FACADE)
    tree.texts["srt/speculative/runner.py"] = RUNNER.format(sizes=sizes, before=before, max_bs=max_bs)
    return tree


def frame(sizes: str, before: str = ""):
    return paths.graph_frame(runner_tree(sizes, before), ("srt/speculative/runner.py", "Runner"))


@pytest.mark.parametrize(
    "max_bs, handed",
    [
        ("max(self.capture_bs)", (3, 12)),  # upstream's: the largest batch the graph captures
        ("self.capture_bs[-1]", (3, 12)),  # SGLang's capture sizes come sorted
        ("self.capture_bs[0]", (1, 4)),  # the smallest: rows too narrow for the batches replayed in them
        ("len(self.capture_bs)", (3, 12)),  # the world's sizes at bs 2 (largest 3): 1, 2, 3
    ],
)
def test_the_sizes_handed_are_the_numbers_the_runner_computes_at_the_probe(max_bs, handed):
    tree = runner_tree("self.max_bs, self.max_num_token", max_bs=max_bs)
    probe = paths.Probe(2, 4, 3)
    args, kwargs = paths.handed_sizes(tree, ("srt/speculative/runner.py", "Runner"), probe)
    assert [type(size) for size in args] == [int, int] and args == handed and kwargs == {}


@pytest.mark.parametrize(
    "sizes, expected",
    [
        ("self.max_bs, self.max_num_token", ((False, True), {})),  # upstream's (0.4.8 on)
        ("self.max_num_token, self.max_num_token", ((True, True), {})),  # a fork handing branches as max_bs
        ("self.max_num_token", ((True,), {})),  # 0.4.6.post5 to 0.4.7.post1
        ("self.max_bs", ((False,), {})),
        (
            "max_bs=self.max_num_token, max_num_tokens=self.max_num_token",
            ((), {"max_bs": True, "max_num_tokens": True}),
        ),
        ("self.max_bs, max_num_tokens=self.max_num_token", ((False,), {"max_num_tokens": True})),
    ],
)
def test_each_size_counts_branches_where_it_changes_with_topk(sizes, expected):
    assert frame(sizes) == expected


def test_a_runner_stopping_before_the_call_hands_no_sizes():
    assert frame("self.max_bs, self.max_num_token", before="raise RuntimeError('no graphs')\n        ") is None


def test_a_runner_is_found_by_its_call_and_named_on_each_rows_path():
    text = runner_tree("self.max_bs, self.max_num_token").texts["srt/speculative/runner.py"]
    assert paths.sizes_rows(text)
    assert not paths.sizes_rows(text.replace("draft_attn_backend.init", "draft_extend_attn_backend.init"))


BACKEND = textwrap.dedent(
    """\
    import torch
    from somewhere import decorate
    from sglang.srt.speculative.eagle_utils import generate_draft_decode_kv_indices


    class FlashInferMultiStepDraftBackend:
        def __init__(self, model_runner, topk, speculative_num_steps):
            self.kernel = generate_draft_decode_kv_indices
            self.topk, self.speculative_num_steps = topk, speculative_num_steps
            self.max_context_len = model_runner.model_config.context_len

        @decorate
        def init_cuda_graph_state(self, max_bs, max_num_tokens):
            self.rows = torch.zeros((self.speculative_num_steps, max_bs * self.max_context_len))
    """
)


def test_a_graph_state_a_decorator_outside_the_path_made_unknown_runs_on_sglangs_sizes():
    tree = world.Tree(None, tensors.FACADE)
    tree.texts["srt/layers/attention/backend.py"] = BACKEND
    [path] = paths.draft_paths(tree, ["srt/layers/attention/backend.py"])
    how, outcomes = paths.run_path(tree, path, paths.PROBES[2])
    assert how == "__init__" and [outcome.end for outcome in outcomes] == ["ok"]

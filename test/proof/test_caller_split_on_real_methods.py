"""A fork whose DeepSeek-V4 multi-step backend splits per step itself, on 0.5.12's own methods.

The fork (test/support/fork_edits.py ``dsv4_caller_split``, built from the real 0.5.12 tree)
sets each step's row on the batch before calling the per-step backend. After ``apply``, its
``DeepseekV4MultiStepBackend.init_forward_metadata`` and the real per-step
``DeepseekV4AttnBackend.init_forward_metadata`` run on CPU (see test/support/real_methods.py)
with a recorder in place of ``init_forward_metadata_decode``: each step's backend gets one row
of ``bs * topk`` slots, the slots the worker writes at that step (not 1, not bs * topk * steps).
Upstream's split added in the per-step backend on top (what an older ``apply`` wrote there)
fails at the first draft decode, as the server did on the H200.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from support import fork_edits  # noqa: E402
from support.real_methods import load_methods, top_level_function  # noqa: E402
from support.sglang_release import pristine_tree, scratch_tree  # noqa: E402

from sglang_draft_layout import engine  # noqa: E402
from sglang_draft_layout.target import resolve  # noqa: E402

DSV4 = Path("sglang") / fork_edits.DSV4
EAGLE_UTILS = Path("sglang/srt/speculative/eagle_utils.py")


@pytest.fixture(scope="module")
def forks(tmp_path_factory) -> dict[str, Path]:
    """The caller-split fork as the fork wrote it, patched by apply, and with the per-step split added first."""
    built = {}
    for name in ("fork", "patched", "split twice"):
        root = scratch_tree("0.5.12", tmp_path_factory.mktemp(name.replace(" ", "-")))
        if name == "split twice":  # plain 0.5.12 patched, then the fork's caller split merged in
            engine.apply(resolve(str(root)))
        fork_edits.dsv4_caller_split(root)
        if name == "patched":
            engine.apply(resolve(str(root)))
        built[name] = root
    return built


class Recorder:
    """Stands in for ``init_forward_metadata_decode``: records the out_cache_loc each step bakes."""

    def __init__(self) -> None:
        self.seen: list[list[int]] = []

    def __call__(self, *, max_seq_len, req_pool_indices, seq_lens, out_cache_loc):
        assert (
            req_pool_indices.shape[0] == seq_lens.shape[0] == out_cache_loc.shape[0]
        ), f"{req_pool_indices.shape=} {seq_lens.shape=} {out_cache_loc.shape=}"  # 0.5.12's own check
        self.seen.append(out_cache_loc.tolist())
        return SimpleNamespace(out_cache_loc=out_cache_loc)


def multi_step_backend(root: Path, *, topk: int, steps: int, recorder: Recorder):
    """The tree's DeepseekV4MultiStepBackend around its real per-step DeepseekV4AttnBackend."""
    namespace = {"torch": torch, "SWA_WINDOW": 128, "ForwardBatch": object}
    if "per_step_draft_out_cache_loc" in (root / DSV4).read_text():  # the patched trees import the helper
        top_level_function(root / EAGLE_UTILS, "per_step_draft_out_cache_loc", namespace)
    per_step_cls = load_methods(root / DSV4, "DeepseekV4AttnBackend", ("init_forward_metadata",), namespace)
    multi_cls = load_methods(
        root / DSV4,
        "DeepseekV4MultiStepBackend",
        ("init_forward_metadata", "_split_out_cache_loc_per_step"),
        dict(namespace),
    )
    req_to_token = object()
    backends = []
    for step_id in range(steps):
        backend = per_step_cls()
        backend.mtp_enabled, backend.topk, backend.speculative_num_steps = True, topk, steps
        backend.speculative_step_id, backend.swa_page_size, backend.page_size = step_id, 128, 256
        backend.req_to_token, backend.init_forward_metadata_decode = req_to_token, recorder
        backends.append(backend)
    multi = multi_cls()
    multi.topk, multi.speculative_num_steps, multi.attn_backends = topk, steps, backends
    return multi, req_to_token


def draft_batch(req_to_token, *, bs: int, out_cache_loc):
    """A multi-step draft decode batch: bs sequences, the flat buffer of bs * topk * steps slots."""
    return SimpleNamespace(
        forward_mode=SimpleNamespace(is_idle=lambda: False, is_decode_or_idle=lambda: True),
        req_pool_indices=torch.arange(bs),
        seq_lens=torch.full((bs,), 9),
        seq_lens_cpu=torch.full((bs,), 9),
        req_to_token_pool=SimpleNamespace(req_to_token=req_to_token),
        batch_size=bs,
        out_cache_loc=out_cache_loc,
    )


def worker_rows(out_cache_loc, bs: int, topk: int, steps: int) -> list[list[int]]:
    """Row i: the slots the draft worker writes at step i ([bs, topk, steps] with steps first)."""
    return out_cache_loc.view(bs, topk, steps).permute(2, 0, 1).reshape(steps, -1).tolist()


def test_the_fork_is_patched_with_one_split_on_the_path(forks):
    text = (forks["patched"] / DSV4).read_text()
    assert text.count("per_step_draft_out_cache_loc(") == 1
    assert "forward_batch.out_cache_loc = step_out_cache_loc[i]" in text
    assert (pristine_tree("0.5.12") / DSV4).read_text() != text


@pytest.mark.parametrize("bs, topk, steps", [(1, 1, 4), (3, 1, 4), (2, 1, 2), (4, 1, 5)])  # DSv4: topk 0 or 1
@pytest.mark.parametrize("tree", ["fork", "patched"])
def test_each_step_bakes_its_own_row_of_bs_times_topk_slots(forks, tree, bs, topk, steps):
    recorder = Recorder()
    multi, req_to_token = multi_step_backend(forks[tree], topk=topk, steps=steps, recorder=recorder)
    out_cache_loc = torch.randperm(bs * topk * steps) + 1000
    batch = draft_batch(req_to_token, bs=bs, out_cache_loc=out_cache_loc)

    multi.init_forward_metadata(batch)

    assert [len(row) for row in recorder.seen] == [bs * topk] * (steps - 1)
    assert recorder.seen == worker_rows(out_cache_loc, bs, topk, steps)[: steps - 1]
    assert batch.out_cache_loc is out_cache_loc  # the fork's finally restores the whole buffer
    assert [b.forward_metadata.out_cache_loc.tolist() for b in multi.attn_backends[: steps - 1]] == recorder.seen


def test_splitting_again_per_step_fails_as_the_server_did(forks):
    """bs 1, topk 1, 4 steps: the per-step helper gets the caller's row of 1 slot and asserts 4."""
    recorder = Recorder()
    multi, req_to_token = multi_step_backend(forks["split twice"], topk=1, steps=4, recorder=recorder)
    batch = draft_batch(req_to_token, bs=1, out_cache_loc=torch.arange(500, 504))
    with pytest.raises(
        AssertionError, match=r"out_cache_loc.shape\[0\]=1 != batch_size \* topk \* num_steps = 1\*1\*4=4"
    ):
        multi.init_forward_metadata(batch)
    assert recorder.seen == []


def test_fork_edit_cli_builds_the_same_fork(forks, tmp_path):
    """``python test/support/fork_edits.py dsv4-caller-split DEST`` (stdlib only) on a copy of the release."""
    import subprocess
    import sys

    shutil.copytree(pristine_tree("0.5.12") / "sglang", tmp_path / "sglang")
    script = Path(fork_edits.__file__)
    run = subprocess.run(
        [sys.executable, "-I", str(script), "dsv4-caller-split", str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert run.stdout.startswith(f"{tmp_path / 'sglang'}: dsv4-caller-split")
    assert (tmp_path / DSV4).read_text() == (forks["fork"] / DSV4).read_text()

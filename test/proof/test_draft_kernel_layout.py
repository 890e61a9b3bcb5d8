"""SGLang 0.5.12's own draft kv_indices kernel, run on CPU, against the helpers' layout.

The kernel ``generate_draft_decode_kv_indices`` is cut out of the real sglang==0.5.12 wheel
(see test/support/draft_kernel.py) and run under ``TRITON_INTERPRET=1`` with the arguments
the ``*MultiStepDraftBackend.common_template`` methods pass. Each run's rows are views into
one flat buffer filled with a sentinel, with a guard band after the last row, so that a
write past a row is visible.

What is shown:
* step i's row slice ``[: draft_kv_indices_used_len(seq_lens_sum, topk, bs, i + 1)]`` is
  exactly what a plain-Python reference built from the kernel's definition says, and
  kv_indptr row i is the matching prefix sum;
* nothing is written past that slice, in the row, the next row or the guard band;
* both widths the patched backends allocate (eager: ``draft_kv_indices_buffer_width(
  num_seqs, ...)``, CUDA graph: ``draft_kv_indices_buffer_width(max_bs, ...)``) hold it,
  for page size 1 and 16, int32 (FlashInfer) and int64 (Triton) rows;
* 0.5.12's FlashInfer / FlashInfer-MLA graph width ``max_bs * max_context_len`` overflows
  for topk > 1 and long sequences (upstream 27338 / 27460).
"""

from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch", reason="torch not installed (pip install torch==2.13.0)")
pytest.importorskip(
    "triton", reason="triton not installed (pip install triton==3.9.0; runs on CPU under TRITON_INTERPRET=1)"
)

from sglang_draft_layout.speculative.spec_utils import (  # noqa: E402
    draft_kv_indices_buffer_width,
    draft_kv_indices_used_len,
)
from support.draft_kernel import (  # noqa: E402
    ALLOWED_GLOBALS,
    SENTINEL,
    DraftLaunch,
    kernel_source,
    kernel_source_in_wheel,
    load_kernel,
)
from support.sglang_release import pristine_tree, require_release  # noqa: E402

pytestmark = pytest.mark.releases

VERSION = "0.5.12"


@pytest.fixture(scope="module")
def kernel():
    require_release(VERSION)
    return load_kernel(VERSION)


def check_launch(launch: DraftLaunch) -> None:
    """The launch wrote exactly the helpers' layout, and nothing anywhere else."""
    L = launch
    rows = L.rows.tolist()
    for i in range(L.num_steps):
        used = draft_kv_indices_used_len(L.seq_lens_sum, L.topk, L.bs, i + 1)
        expected = L.expected_row(i)
        assert len(expected) == used  # the reference and the helper agree on the length
        assert used <= L.row_width
        assert rows[i][:used] == expected, f"step {i}: row slice differs"
        assert set(rows[i][used:]) <= {SENTINEL}, f"step {i}: written past used_len {used}"
        indptr = L.kv_indptr[i].tolist()
        assert indptr[0] == SENTINEL  # never written; SGLang zero-initialises kv_indptr
        assert indptr[1 : L.bs + 1] == L.expected_indptr(i)[1:], f"step {i}: kv_indptr"
        assert set(indptr[L.bs + 1 :]) <= {SENTINEL}
    assert set(L.flat[L.num_steps * L.row_width :].tolist()) == {SENTINEL}, "guard band written"


def random_configs(page_size: int, count: int, seed: int):
    rng = random.Random(seed)
    configs = []
    for n in range(count):
        num_seqs = rng.randint(1, 5)
        topk = rng.choice([1, 2, 3, 4, 8]) if n else 8
        num_steps = rng.randint(2, 5)
        # over 128 sometimes: the kernel copies prefixes in blocks of 128
        max_context_len = rng.choice([16, 24, 40, 150, 300])
        top = max_context_len - num_steps  # seq_len + num_steps <= max_context_len
        tight = n % 3 == 0  # every sequence at the limit: the eager row is filled exactly
        seq_lens = [top if tight else rng.randint(1, top) for _ in range(num_seqs)]
        max_bs = num_seqs + rng.randint(0, 3)
        configs.append(
            dict(
                seq_lens=seq_lens,
                topk=topk,
                num_steps=num_steps,
                page_size=page_size,
                max_context_len=max_context_len,
                max_bs=max_bs,
                kv_dtype=torch.int32 if n % 2 else torch.int64,
                seed=seed * 1000 + n,
            )
        )
    return configs


def config_id(c):
    return (
        f"p{c['page_size']}-seqs{len(c['seq_lens'])}-topk{c['topk']}-steps{c['num_steps']}"
        f"-ctx{c['max_context_len']}-maxbs{c['max_bs']}-{str(c['kv_dtype'])[6:]}"
    )


CONFIGS = random_configs(1, 10, seed=1) + random_configs(16, 10, seed=16)


def test_kernel_comes_from_the_release_and_needs_only_triton():
    require_release(VERSION)
    source, free = kernel_source(pristine_tree(VERSION) / "sglang/srt/speculative/spec_utils.py")
    assert source.lstrip().startswith("@triton.jit")
    assert free == ALLOWED_GLOBALS  # it uses triton and tl, nothing else of SGLang


@pytest.mark.parametrize("version", ["0.5.8", "0.5.9", "0.5.10", "0.5.11", "0.5.13"])
def test_kernel_is_the_same_in_every_supported_release_and_upstream(version):
    """So the proof on 0.5.12's kernel covers 0.5.8-0.5.12, and the helpers upstream
    0.5.13 introduced size rows for this very kernel (moved to triton_ops/cache_locs.py)."""
    require_release(version), require_release(VERSION)
    assert kernel_source_in_wheel(version) == kernel_source_in_wheel(VERSION)


@pytest.mark.parametrize("config", CONFIGS, ids=config_id)
@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_rows_hold_exactly_the_helpers_layout(kernel, config, mode):
    c = dict(config)
    max_bs = c.pop("max_bs")
    num_seqs, topk = len(c["seq_lens"]), c["topk"]
    if mode == "eager":  # init_forward_metadata: rows for this batch
        width = draft_kv_indices_buffer_width(num_seqs, topk, c["max_context_len"])
        cols = (num_seqs + 2) * topk + 1
    else:  # init_cuda_graph_state: rows for the largest captured batch
        width = draft_kv_indices_buffer_width(max_bs, topk, c["max_context_len"])
        cols = max_bs * topk + 1
    launch = DraftLaunch(row_width=width, kv_indptr_cols=cols, **c).run(kernel)
    check_launch(launch)


def test_page_size_16_uses_per_branch_pages(kernel):
    """The page_size > 1, topk > 1 branch of the kernel is really taken: each branch's
    draft slots start on its own new page, at the prefix's in-page offset."""
    c = dict(seq_lens=[21, 7], topk=3, num_steps=4, max_context_len=40, kv_dtype=torch.int32)
    launch = DraftLaunch(page_size=16, row_width=draft_kv_indices_buffer_width(2, 3, 40), **c)
    check_launch(launch.run(kernel))
    pool_row = launch.req_to_token[int(launch.req_pool_indices[0])].tolist()
    last = launch.num_steps - 1
    # sequence 0: 21 tokens = one full page + 5; 4 draft tokens need 1 new page per branch
    # (5 + 4 <= 16): branch t drafts at 16 + t * 16 + 5, not at 21 + t * 4 as with page 1
    for t, start in enumerate([21, 37, 53]):
        assert launch.branch_slots(0, t, last) == pool_row[:21] + pool_row[start : start + 4]
    assert pool_row[37:41] != pool_row[25:29]


def test_spec_case_unpatched_flashinfer_graph_row_overflows(kernel):
    """SPEC's case: 3 sequences of lengths 5, 9, 4, topk 2, 3 steps, max_bs 3 and
    max_context_len 15. 0.5.12's FlashInfer graph rows are max_bs * max_context_len = 45
    wide; the steps need 42, 48 and 54 entries."""
    seq_lens, topk, steps, max_bs, ctx = [5, 9, 4], 2, 3, 3, 15
    unpatched_width = max_bs * ctx
    used = [draft_kv_indices_used_len(18, topk, 6, i + 1) for i in range(steps)]
    assert (unpatched_width, used) == (45, [42, 48, 54])

    bug = DraftLaunch(
        seq_lens=seq_lens,
        topk=topk,
        num_steps=steps,
        page_size=1,
        row_width=unpatched_width,
        max_context_len=ctx,
        kv_dtype=torch.int32,
        guard=64,
    ).run(kernel)
    guard = bug.flat[steps * unpatched_width :]
    # the last step's row ran 54 - 45 = 9 entries into the guard band: its own tail
    assert int((guard != SENTINEL).sum()) == 9
    assert guard[:9].tolist() == bug.expected_row(2)[45:54]
    # step 1 wrote entries 45..47 of its row over the front of step 2's row, and the
    # slice the backend hands the attention kernel cannot even be taken from the row
    assert bug.rows[1][: used[1]].numel() == 45 < used[1]
    assert any(bug.rows[i][: used[i]].tolist() != bug.expected_row(i) for i in range(steps))

    # the patched capacity check refuses this buffer; the patched width holds the layout
    assert used[-1] > unpatched_width
    fixed = DraftLaunch(
        seq_lens=seq_lens,
        topk=topk,
        num_steps=steps,
        page_size=1,
        row_width=draft_kv_indices_buffer_width(max_bs, topk, ctx),
        max_context_len=ctx,
        kv_dtype=torch.int32,
        guard=64,
    ).run(kernel)
    check_launch(fixed)


@pytest.mark.parametrize("topk,page_size", [(2, 1), (4, 1), (8, 1), (4, 16)])
def test_unpatched_graph_width_overflows_for_long_sequences(kernel, topk, page_size):
    """Full batch at the longest sequences: 0.5.12's graph row (no topk) is overrun, by
    exactly used_len(num_steps) - max_bs * max_context_len entries past the last row."""
    max_bs, ctx, steps = 3, 40, 3
    seq_lens = [ctx - steps] * max_bs
    width = max_bs * ctx
    need = draft_kv_indices_used_len(sum(seq_lens), topk, topk * max_bs, steps)
    guard = need  # large enough to catch all of it
    bug = DraftLaunch(
        seq_lens=seq_lens,
        topk=topk,
        num_steps=steps,
        page_size=page_size,
        row_width=width,
        max_context_len=ctx,
        kv_dtype=torch.int32,
        guard=guard,
    ).run(kernel)
    written = int((bug.flat[steps * width :] != SENTINEL).sum())
    assert need == topk * width  # the patched width, filled exactly
    assert written == need - width == (topk - 1) * width


def test_unpatched_graph_width_is_enough_for_topk_1(kernel):
    """Without topk > 1 the missing factor is 1: the bug needs topk > 1."""
    max_bs, ctx, steps = 4, 40, 5
    seq_lens = [ctx - steps] * max_bs
    launch = DraftLaunch(
        seq_lens=seq_lens,
        topk=1,
        num_steps=steps,
        page_size=1,
        row_width=max_bs * ctx,
        max_context_len=ctx,
        kv_dtype=torch.int32,
    )
    check_launch(launch.run(kernel))

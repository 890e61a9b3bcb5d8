"""The DeepSeek-V4 strided-row hazard, on SGLang 0.5.12's own kernel on CPU.

Upstream's ``per_step_draft_out_cache_loc(...)[i]`` (the layout the patch brings) is a view
with stride num_steps into the draft's flat out_cache_loc buffer. The DSv4 decode path hands
that row to ``init_compression_metadata`` as ``raw_out_loc``, and its Triton kernel
``_init_compressed_attn_metadata_kernel`` reads ``raw_out_loc_ptr + batch_id``: the element
``batch_id`` places after the row's first one in memory, whatever the row's stride. For a
batch of two or more and two or more draft steps, request b >= 1 then gets c4 / c128 out locs
computed from slot ``flat[i + b]`` (another request's or another step's slot) instead of
``flat[b * num_steps + i]``.

It is harmless in 0.5.12 and 0.5.13: the NextN (MTP) draft layer is built with
``compress_ratio_override=COMPRESS_RATIO_NEXTN_LAYER``, which is 0, and a layer of ratio 0 has
no compressor, so no c4 / c128 KV is written through those locs in the draft. A fork that
gives the NextN layer a compressor must pass a contiguous row (docs/layout.md, "Known hazard").
The patch keeps upstream's layout, a view.
"""

from __future__ import annotations

import ast

import pytest

torch = pytest.importorskip("torch", reason="torch not installed (pip install torch==2.13.0)")
pytest.importorskip(
    "triton", reason="triton not installed (pip install triton==3.9.0; runs on CPU under TRITON_INTERPRET=1)"
)

from sglang_draft_layout.speculative.eagle_utils import per_step_draft_out_cache_loc  # noqa: E402
from support.dsv4_metadata import (  # noqa: E402
    DSV4_BACKEND,
    DSV4_MODEL,
    NEXTN_MODEL,
    call_keywords,
    guards_of_assignment,
    load_metadata_module,
    module_constant,
)
from support.sglang_release import require_release  # noqa: E402
from support.wheel_source import wheel_source  # noqa: E402

pytestmark = pytest.mark.releases

VERSION = "0.5.12"
TOPK = 1  # 0.5.12 and 0.5.13 allow topk 0 or 1 for DeepSeek-V4 drafts
PAGE_SIZE = 256  # what 0.5.12 forces for DeepSeek-V4
MAX_PAGES = 4
OUT_LOCS = ("c4_out_loc", "c128_out_loc")
# init_compression_metadata's results, in order
RESULTS = (
    "c4_out_loc",
    "c4_positions",
    "c4_seq_lens_raw",
    "c4_seq_lens_clamp1",
    "c128_out_loc",
    "c128_positions",
    "c128_seq_lens_clamp1",
    "c128_page_indices",
)


@pytest.fixture(scope="module")
def metadata_kernel():
    require_release(VERSION)
    return load_metadata_module(VERSION)


class DraftBatch:
    """A multi-step draft decode batch: the flat out_cache_loc buffer of batch_size * topk *
    num_steps distinct KV slots, and one sequence length per request, every one a multiple of
    128 so that both the c4 and the c128 compression fire and every out loc shows its slot."""

    def __init__(self, batch_size: int, num_steps: int, seed: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.batch_size, self.num_steps = batch_size, num_steps
        count = batch_size * TOPK * num_steps
        # distinct slots with distinct slot // 128 (and so distinct slot // 4)
        self.flat = torch.randperm(4 * count, generator=gen)[:count] * 128 + torch.randint(
            0, 128, (count,), generator=gen
        )
        self.seq_lens = (torch.randint(1, MAX_PAGES * PAGE_SIZE // 128, (batch_size,), generator=gen) * 128).to(
            torch.int32
        )
        self.page_table = torch.randint(0, 1000, (batch_size, MAX_PAGES), generator=gen, dtype=torch.int32)

    def step_row(self, step: int) -> torch.Tensor:
        """Step ``step``'s write slots as upstream's DSv4 backend takes them: a strided view."""
        return per_step_draft_out_cache_loc(self.flat, self.batch_size, TOPK, self.num_steps)[step]

    def stride_blind_row(self, step: int) -> torch.Tensor:
        """What a read of ``row_ptr + batch_id`` sees: the batch_size slots after the row's start."""
        start = self.step_row(step).storage_offset()
        return self.flat[start : start + self.batch_size]

    def compression_metadata(self, module, raw_out_loc: torch.Tensor) -> dict[str, torch.Tensor]:
        """init_compression_metadata as DSV4AttnMetadata.init_compression_metadata calls it
        (positions = seq_lens - 1, as make_core_attn_metadata sets them)."""
        results = module.init_compression_metadata(
            self.seq_lens,
            self.seq_lens - 1,
            raw_out_loc,
            self.page_table,
            PAGE_SIZE,
            compute_page_indices=True,
        )
        return dict(zip(RESULTS, results))


def expected_out_locs(slots: torch.Tensor) -> dict[str, torch.Tensor]:
    """The kernel's definition for sequence lengths that are multiples of 128: slot // ratio."""
    return {"c4_out_loc": slots // 4, "c128_out_loc": slots // 128}


@pytest.mark.parametrize("batch_size, num_steps", [(2, 2), (4, 3), (3, 5)])
def test_strided_row_gives_other_slots_out_locs(metadata_kernel, batch_size, num_steps):
    batch = DraftBatch(batch_size, num_steps)
    for step in range(num_steps):
        row = batch.step_row(step)
        assert row.stride() == (num_steps,) and not row.is_contiguous()
        from_view = batch.compression_metadata(metadata_kernel, row)
        from_copy = batch.compression_metadata(metadata_kernel, row.contiguous())

        # the copy gives every request its own slot's out locs, the view the stride-blind slots
        blind = batch.stride_blind_row(step)
        for name in OUT_LOCS:
            assert from_copy[name].tolist() == expected_out_locs(row)[name].tolist(), name
            assert from_view[name].tolist() == expected_out_locs(blind)[name].tolist(), name
            # they differ exactly where the stride-blind slot is not the request's own:
            # every request but the first (distinct slots)
            differ = [b for b in range(batch_size) if from_view[name][b] != from_copy[name][b]]
            assert differ == [b for b in range(batch_size) if blind[b] != row[b]] == list(range(1, batch_size))
        # nothing else the kernel computes depends on out_cache_loc
        for name in set(RESULTS) - set(OUT_LOCS):
            assert torch.equal(from_view[name], from_copy[name]), name


@pytest.mark.parametrize("batch_size, num_steps", [(1, 3), (4, 1)])
def test_no_hazard_with_one_request_or_one_step(metadata_kernel, batch_size, num_steps):
    """One request reads only its own slot; one step's row is contiguous."""
    batch = DraftBatch(batch_size, num_steps)
    for step in range(num_steps):
        row = batch.step_row(step)
        assert torch.equal(batch.stride_blind_row(step), row)
        from_view = batch.compression_metadata(metadata_kernel, row)
        for name in OUT_LOCS:
            assert from_view[name].tolist() == expected_out_locs(row)[name].tolist(), name


@pytest.mark.parametrize("version", ["0.5.12", "0.5.13"])
def test_nextn_draft_layer_has_no_compressor(version):
    """The DSv4 NextN layer's compress ratio is 0, and only a non-zero ratio builds a compressor
    (the only writer through c4_out_loc / c128_out_loc)."""
    require_release(version)
    nextn = wheel_source(version, NEXTN_MODEL)
    assert module_constant(nextn, "COMPRESS_RATIO_NEXTN_LAYER") == 0
    layers = call_keywords(nextn, "DeepseekV4DecoderLayer")
    assert layers and all(kw.get("compress_ratio_override") == "COMPRESS_RATIO_NEXTN_LAYER" for kw in layers)
    assert guards_of_assignment(wheel_source(version, DSV4_MODEL), "self.compressor") == [["self.compress_ratio"]]


def test_upstream_passes_the_strided_row_to_the_dsv4_metadata():
    """0.5.13 (upstream) takes ``per_step_draft_out_cache_loc(...)[step]`` as it is, never a copy,
    in both places it slices the draft buffer: init_forward_metadata's decode branch, whose row
    init_forward_metadata_decode hands to the metadata kernel, and init_forward_metadata_in_graph
    (the SWA store target)."""
    require_release("0.5.13")
    backend = wheel_source("0.5.13", DSV4_BACKEND)
    values = [
        ast.unparse(node.value)
        for node in ast.walk(ast.parse(backend))
        if isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == ["out_cache_loc"]
    ]
    per_step = [v for v in values if "per_step_draft_out_cache_loc" in v]
    assert len(per_step) == 2, values
    for value in per_step:
        assert value.startswith("per_step_draft_out_cache_loc(") and value.endswith(")[self.speculative_step_id]")
    assert not [v for v in values if "contiguous" in v], values
    passed = [kw["out_cache_loc"] for kw in call_keywords(backend, "self.init_forward_metadata_decode")]
    assert "out_cache_loc" in passed

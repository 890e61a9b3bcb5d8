"""Layout of the multi-step EAGLE draft ``out_cache_loc`` buffer (upstream PR 26239)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def per_step_draft_out_cache_loc(
    out_cache_loc: torch.Tensor,
    batch_size: int,
    topk: int,
    num_steps: int,
) -> torch.Tensor:
    """Per-step KV write slots of the multi-step EAGLE draft out_cache_loc buffer.

    The draft allocates batch_size * topk * num_steps slots laid out as
    [batch_size, topk, num_steps]; row i of the result ([num_steps, batch_size * topk])
    holds the slots that draft step i writes. Single source of truth for the V2 worker's
    draft_forward and DeepseekV4AttnBackend, which bakes each step's write targets into
    its metadata: passing it the whole flat buffer failed a shape assertion with
    --disable-cuda-graph (upstream 26239). The result is a strided view, not a copy.
    """
    expected = batch_size * topk * num_steps
    assert out_cache_loc.shape[0] == expected, (
        f"out_cache_loc.shape[0]={out_cache_loc.shape[0]} != "
        f"batch_size * topk * num_steps = {batch_size}*{topk}*{num_steps}={expected}"
    )
    return (
        out_cache_loc.view(batch_size, topk, num_steps)
        .permute(2, 0, 1)
        .reshape(num_steps, -1)
    )

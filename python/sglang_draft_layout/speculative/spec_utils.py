"""Sizing of the multi-step EAGLE draft ``kv_indices`` rows (upstream PR 27475)."""

from __future__ import annotations


def draft_kv_indices_buffer_width(
    num_seqs: int, topk: int, max_context_len: int
) -> int:
    """Per-step row width of the EAGLE draft-decode kv_indices buffer.

    num_seqs * topk branches each attend up to max_context_len KV slots, so the row
    needs the topk factor: without it the row is under-allocated and the draft kernel
    writes past it (upstream 27338 FlashInfer, 27460 FlashInfer-MLA). The kernel uses
    int32 flat offsets, so the width must stay below 2**31.
    """
    width = num_seqs * topk * max_context_len
    assert width < 2**31, (
        f"draft kv_indices row width {num_seqs}*{topk}*{max_context_len}={width} "
        "would overflow int32 flat offsets; reduce batch size, topk or context length"
    )
    return width


def draft_kv_indices_used_len(
    seq_lens_sum: int, topk: int, bs: int, num_steps: int
) -> int:
    """Length of a kv_indices row used through num_steps draft-decode steps.

    Each of the bs = topk * num_seqs branches reads its sequence's prefix
    (seq_lens_sum * topk in all) plus one slot per step so far. Called with i + 1 for
    step i's slice and with speculative_num_steps for the capacity check; never more
    than draft_kv_indices_buffer_width while each seq_len + num_steps <= max_context_len.
    """
    return seq_lens_sum * topk + bs * num_steps

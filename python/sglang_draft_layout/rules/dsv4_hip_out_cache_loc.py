"""Per-step out_cache_loc in ``DeepseekV4HipRadixBackend.init_forward_metadata`` (decode branch).

Site: the ROCm DeepSeek-V4 backend (``srt/layers/attention/deepseek_v4_backend_hip_radix.py``),
which appeared in main after 0.5.12. Its ``DeepseekV4MultiStepBackend`` calls each step's
``DeepseekV4HipRadixBackend.init_forward_metadata`` with the whole draft ``forward_batch``, and
the per-step backend bakes each step's KV write targets into its metadata at init, as the CUDA
backend does: before upstream's fix (forks copied from May-2026 main) it passes the whole
``[bs * topk * num_steps]`` buffer to ``init_forward_metadata_decode``, which asserts one row of
``bs * topk`` slots. Upstream 0.5.13 slices with
``per_step_draft_out_cache_loc(...)[self.speculative_step_id]`` when
``self.topk > 0 and self.speculative_num_steps > 1``, as in ``deepseek_v4_backend.py``.
Invariant: as for ``dsv4_out_cache_loc`` (whose judgement this rule is, the split-once verdict of
``proof.split_once`` included): each step's metadata bakes the slots the draft worker writes at
that step, split from the flat buffer exactly once on the path multi-step backend -> per-step backend.
"""

from __future__ import annotations

from .dsv4_out_cache_loc import decode_rule

FILE = "srt/layers/attention/deepseek_v4_backend_hip_radix.py"
CLASS = "DeepseekV4HipRadixBackend"
#: the multi-step backend of that file (the same name as the CUDA file's)
MULTI_STEP = "DeepseekV4MultiStepBackend"

RULES = [decode_rule("dsv4-hip-out-cache-loc", FILE, CLASS, MULTI_STEP)]

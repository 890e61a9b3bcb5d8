"""The names of upstream's draft layout helpers and of the draft kv_indices kernel, as the forms spell them."""

WIDTH_HELPER = "draft_kv_indices_buffer_width"
USED_LEN_HELPER = "draft_kv_indices_used_len"
PER_STEP_HELPER = "per_step_draft_out_cache_loc"
KERNEL = "generate_draft_decode_kv_indices"
HELPERS = (WIDTH_HELPER, USED_LEN_HELPER, PER_STEP_HELPER)

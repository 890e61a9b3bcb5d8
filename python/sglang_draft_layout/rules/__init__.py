"""Every rule, in the order the report lists them: helper definitions, then call sites."""

from . import (
    draft_forward,
    dsv4_hip_out_cache_loc,
    dsv4_in_graph_out_cache_loc,
    dsv4_out_cache_loc,
    helper_definitions,
    kv_indices_capacity_check,
    kv_indices_eager_width,
    kv_indices_graph_width,
    kv_indices_step_slice,
)
from .base import Rule

RULES: list[Rule] = [
    *helper_definitions.RULES,
    *kv_indices_capacity_check.RULES,
    *kv_indices_step_slice.RULES,
    *kv_indices_eager_width.RULES,
    *kv_indices_graph_width.RULES,
    *dsv4_out_cache_loc.RULES,
    *dsv4_hip_out_cache_loc.RULES,
    *dsv4_in_graph_out_cache_loc.RULES,
    *draft_forward.RULES,
]

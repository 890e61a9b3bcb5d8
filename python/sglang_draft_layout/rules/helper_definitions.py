"""Define the three layout helpers in SGLang's own modules where they are absent.

Mirrors upstream PR 27475 (``draft_kv_indices_buffer_width`` and
``draft_kv_indices_used_len`` in ``speculative/spec_utils.py``) and PR 26239
(``per_step_draft_out_cache_loc`` in ``speculative/eagle_utils.py``). The inserted
source is read from this package's own functions, so the code SGLang runs is the code
this package tests. Invariant: every call site the other rules write has its helper
defined in the module it imports from. A tree that already defines a helper (0.5.13
and later, or an earlier apply) keeps its definition.
"""

from __future__ import annotations

import inspect
from typing import Callable

import libcst as cst

from ..speculative import eagle_utils, spec_utils
from .base import Edit, Finding, Rule, Source, State

UPSTREAM = {"spec_utils": "PR 27475", "eagle_utils": "PR 26239"}


def helper_definition(helper: Callable) -> cst.FunctionDef:
    """The libcst node of one of this package's helper functions."""
    return cst.parse_module(inspect.getsource(helper)).body[0]


def _find(helper: Callable, rule: Rule, source: Source) -> Finding:
    if helper.__name__ in source.function_names():
        return rule.report(State.PATCHED)
    first = source.first_definition()
    if first is None:
        return rule.report(State.UNRECOGNISED, detail="no top-level function to insert the helper before")
    anchor, line = first
    edit = Edit(anchor, before=(helper_definition(helper),), separate=2, keep_comments=True)
    imports = (("torch", ""),) if "torch." in inspect.getsource(helper) else ()
    return rule.report(State.TO_PATCH, line, edits=[edit], imports=imports)


def _rule(helper: Callable, module_name: str) -> Rule:
    return Rule(
        id=f"helper:{helper.__name__}",
        file=f"srt/speculative/{module_name}.py",
        scope="<module>",
        site=f"def {helper.__name__}",
        upstream=UPSTREAM[module_name],
        find=lambda rule, source: _find(helper, rule, source),
        counts_as_site=False,
    )


RULES = [
    _rule(spec_utils.draft_kv_indices_buffer_width, "spec_utils"),
    _rule(spec_utils.draft_kv_indices_used_len, "spec_utils"),
    _rule(eagle_utils.per_step_draft_out_cache_loc, "eagle_utils"),
]

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

from ..speculative import eagle_utils, spec_utils
from .base import Edit, Finding, Rule, Source, State

UPSTREAM = {"spec_utils": "PR 27475", "eagle_utils": "PR 26239"}


def _find(helper: Callable, rule: Rule, source: Source) -> Finding:
    if source.function(helper.__name__) is not None:
        return rule.report(State.PATCHED)
    definitions = source.definitions()
    if not definitions:
        return rule.report(State.UNRECOGNISED, detail="no top-level function to insert the helper before")
    anchor = definitions[0]
    helper_source = inspect.getsource(helper)
    edit = Edit(anchor, before=(helper_source,), separate=2, keep_comments=True)
    imports = (("torch", ""),) if "torch." in helper_source else ()
    return rule.report(State.TO_PATCH, anchor.lineno, edits=[edit], imports=imports)


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

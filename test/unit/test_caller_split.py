"""layout_patterns/caller_split.py: the edits that take a fork's own per-step split out of a multi-step
caller or a per-step callee (upstream's side of a merge), on hand-written mimics of a fork's code (no
SGLang code)."""

from __future__ import annotations

from sglang_draft_layout.rules.caller_split import callee_split_removal, caller_split_removal
from sglang_draft_layout.rewrite import apply_edits
from sglang_draft_layout.rules.base import Source
from sglang_draft_layout.rules.splice import spliced
from support.fork_edits import CALLER_SPLIT

HEAD = "class MultiStep(Base):\n    def __init__(self):\n        self.attn_backends = []\n\n"
TAIL = "\n    def other(self):\n        pass\n\n\nx = 1\n"
#: upstream's caller: each step's backend inits from the whole batch
UPSTREAM_CALLER = """    def init_forward_metadata(self, forward_batch: ForwardBatch):
        for i in range(self.speculative_num_steps - 1):
            self.attn_backends[i].init_forward_metadata(forward_batch)
"""


def removal(code: str) -> tuple[Source, list, str]:
    source = Source("f.py", code)
    edits, why = caller_split_removal(source, "MultiStep", "init_forward_metadata")
    return source, edits, why


def test_the_forks_caller_split_and_its_method_are_taken_out():
    source, edits, why = removal(HEAD + CALLER_SPLIT + TAIL)
    assert why == ""
    expected = HEAD + UPSTREAM_CALLER + TAIL
    assert apply_edits(source, edits) == expected  # as libcst writes it: the lines kept as written
    assert spliced(source, edits) == expected  # as check proves it


def test_a_split_method_that_something_else_calls_stays():
    used_elsewhere = TAIL.replace("pass", "return self._split_out_cache_loc_per_step(None)")
    source, edits, _why = removal(HEAD + CALLER_SPLIT + used_elsewhere)
    assert not any(e.remove for e in edits)
    assert "def _split_out_cache_loc_per_step" in apply_edits(source, edits)
    assert "forward_batch.out_cache_loc =" not in apply_edits(source, edits)


def test_a_try_with_a_handler_is_not_opened():
    handled = CALLER_SPLIT.replace(
        "        finally:\n", "        except RuntimeError:\n            raise\n        finally:\n"
    )
    _source, edits, why = removal(HEAD + handled + TAIL)
    assert edits == []
    assert why == "cannot take the fork's split out of MultiStep.init_forward_metadata (line 8) as written"


def test_a_caller_that_sets_nothing_has_nothing_to_take_out():
    _source, edits, why = removal(HEAD + UPSTREAM_CALLER + TAIL)
    assert (edits, why) == ([], "MultiStep.init_forward_metadata sets no `forward_batch.out_cache_loc`")


def test_a_local_read_by_code_that_stays_is_kept():
    logged = CALLER_SPLIT.replace("        try:\n", "        print(step_out_cache_loc)\n        try:\n")
    source, edits, _why = removal(HEAD + logged + TAIL)
    written = apply_edits(source, edits)
    assert "step_out_cache_loc = self._split_out_cache_loc_per_step(forward_batch)" in written
    assert "def _split_out_cache_loc_per_step" in written
    assert "forward_batch.out_cache_loc =" not in written


CALLEE = """class Backend:
    def init_forward_metadata_decode(self, seq_lens, out_cache_loc):
        # the step's row
        if self.topk > 0 and self.speculative_num_steps > 1:
            out_cache_loc = out_cache_loc.reshape(
                -1, self.topk, self.speculative_num_steps
            ).permute(2, 0, 1)[self.speculative_step_id].reshape(-1)
        assert seq_lens.shape[0] == out_cache_loc.shape[0]
        return out_cache_loc
"""


def test_a_callees_rebinding_of_its_parameter_is_taken_out():
    source = Source("f.py", CALLEE)
    edits, why = callee_split_removal(source, "Backend", "init_forward_metadata_decode")
    assert why == ""
    expected = CALLEE.replace(CALLEE[CALLEE.index("        if self.topk") : CALLEE.index("        assert")], "")
    assert "# the step's row\n        assert" in expected  # the comment above the split stays, above what follows
    assert apply_edits(source, edits) == spliced(source, edits) == expected


def test_a_callee_that_computes_with_its_row_is_left():
    """Rebinding by something other than a layout (a call of another object) is no split to take out."""
    other = CALLEE.replace("out_cache_loc.reshape(", "self.allocator.remap(out_cache_loc).reshape(")
    edits, why = callee_split_removal(Source("f.py", other), "Backend", "init_forward_metadata_decode")
    assert (edits, why) == ([], "Backend.init_forward_metadata_decode sets no parameter to a layout of itself")

"""The structural guard's split-once rule (rules/structural_guard.py) on small hand-written paths;
the real trees and forks built from them are test/releases/test_structural_guard.py's."""

from __future__ import annotations

from sglang_draft_layout.rules.base import Source, State
from sglang_draft_layout.rules.structural_guard import guard_rules

RELATIVE = "srt/layers/attention/fork_backend.py"
#: a per-step backend (it knows its step) handing ``out_cache_loc=`` on only in an ``if`` header, never split per step
HEADER_HANDOFF = """
from sglang.srt.layers.attention.base_attn_backend import Metadata

class StepBackend:
    def __init__(self, speculative_step_id=0):
        self.speculative_step_id = speculative_step_id

    def init_forward_metadata(self, forward_batch):{keep}
        if self.build(out_cache_loc=forward_batch.out_cache_loc) is None:
            return

    def build(self, out_cache_loc):
        self.forward_metadata = Metadata(out_cache_loc=out_cache_loc)
        return self.forward_metadata


class MultiStepBackend(StepBackend):
    def __init__(self, model_runner, topk, speculative_num_steps):
        self.speculative_num_steps = speculative_num_steps
        self.attn_backends = [StepBackend(i) for i in range(speculative_num_steps)]

    def init_forward_metadata(self, forward_batch):
        for i in range(self.speculative_num_steps - 1):
            self.attn_backends[i].init_forward_metadata(forward_batch)
"""


def split_once_finding(code: str):
    source = Source(RELATIVE, code)
    [rule] = [rule for rule in guard_rules(RELATIVE, source, set()) if ":split-once:" in rule.id]
    assert rule.scope == "StepBackend.init_forward_metadata"
    return rule.find(rule, source)


def test_a_handoff_only_in_a_compound_header_is_found_there_and_kept_there():
    code = HEADER_HANDOFF.format(keep="")
    finding = split_once_finding(code)
    header_line = (
        code.splitlines().index("        if self.build(out_cache_loc=forward_batch.out_cache_loc) is None:") + 1
    )
    assert (finding.state, finding.line) == (State.UNRECOGNISED, header_line)
    assert finding.detail.endswith("eager: step 0 bakes the whole buffer; upstream's row 0 is [1000000]")
    kept_on_def = split_once_finding(HEADER_HANDOFF.format(keep="  # sglang-draft-layout: keep"))
    assert (kept_on_def.state, kept_on_def.line) == (State.KEPT, header_line)
    on_header = code.replace("is None:\n", "is None:  # sglang-draft-layout: keep\n", 1)
    assert split_once_finding(on_header).state == State.KEPT

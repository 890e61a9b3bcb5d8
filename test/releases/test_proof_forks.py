"""Issue 26's forks on the real 0.5.12 tree: every rewrite judged by running the patched tree, or refused.

Each fork is a plausible edit a maintainer could make (test/support/fork_edits.py, PROOF_FORKS) where
recognising the split by its syntax alone rewrote it and left code that computes other rows than
upstream's. Now ``apply`` either refuses in one line (exit 2, nothing written) or patches, and then
the patched tree's own DeepSeek-V4 path, run by the harness from the multi-step caller, hands every
step upstream's row: split exactly once.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from sglang_draft_layout import cli
from sglang_draft_layout.rules.base import State
from support import fork_edits
from support.written_split_once import not_split_once
from test_fork_spellings import findings
from test_releases import tree_digest

pytestmark = pytest.mark.releases

DSV4 = fork_edits.DSV4
SITE = "dsv4-out-cache-loc"

#: fork -> ("refused", what the one line says) or ("patched", the DSv4 site's state before apply)
VERDICTS = {
    "worker-minus-one": ("refused", "after the rewrite, bs 1, topk 1, 2 steps: raises AssertionError"),
    "worker-2d-buffer": ("refused", "after the rewrite, bs 1, topk 1, 2 steps: raises AssertionError"),
    "dsv4-inline-minus-one": ("refused", "after the rewrite, bs 1, topk 1, 2 steps: eager: raises AssertionError"),
    "dsv4-caller-minus-one": ("refused", "after the rewrite, bs 1, topk 1, 2 steps: eager: raises AssertionError"),
    "dsv4-callee-split": ("patched", State.BY_HAND),
    "dsv4-caller-split-mixin": ("patched", State.BY_CALLER),
    "dsv4-caller-split-super": ("patched", State.BY_CALLER),
    "dsv4-caller-split-base-call": ("patched", State.BY_CALLER),
    "dsv4-step-subclass-split": ("patched", State.BY_HAND),
    "graph-width-defined-twice": ("patched", State.TO_PATCH),
    "dsv4-caller-chunk": ("refused", "eager: step 0 bakes slots [1000000, 1000001, 1000002]; upstream's row 0 is"),
    "dsv4-caller-first-row": ("refused", "eager: step 1 bakes slots [1000000, 1000004, 1000008]; upstream's row 1 is"),
    "dsv4-caller-topk-only": ("refused", "a per-step split that no probe runs"),
    "dsv4-caller-next-row": ("refused", "eager: step 0 bakes slots [1000001]; upstream's row 0 is [1000000]"),
    # the helper's assert is no RuntimeError: under the fork's suppress the patched split gives upstream's rows
    "worker-view-suppress": ("patched", State.TO_PATCH),
    "worker-view-nonlocal": ("refused", "rows"),
    # found by a red-team round of 65 fork edits (2026-12-07): apply wrote all three and check said clean
    "dsv4-subclass-own-module": (
        "refused",
        "deepseek_v4_fork_backend.py: DeepseekV4MultiStepForkBackend.<per-step out_cache_loc>: draft path, run on the "
        "probes: after the rewrite, bs 1, topk 1, 2 steps: eager: raises AssertionError",
    ),
    "worker-subclass-own-module": (
        "refused",
        "eagle_worker_v2_fork.py: EagleDraftForkWorker.<draft_forward>: draft path, run on the probes: after the "
        "rewrite, bs 3, topk 1, 4 steps: the draft steps write to ['other slots'",
    ),
    "flashinfer-strict-capacity-check": (
        "refused",
        "after the rewrite, bs 1, topk 1, 2 steps: common_template stops rows 7 wide, as wide as it fills: "
        "AssertionError at srt/layers/attention/flashinfer_backend.py:",
    ),
}


def test_every_proof_fork_has_a_verdict():
    assert set(VERDICTS) == set(fork_edits.PROOF_FORKS)


@pytest.mark.parametrize("fork", VERDICTS)
def test_apply_patches_and_proves_or_refuses_in_one_line(scratch, capsys, fork):
    root = scratch("0.5.12")
    fork_edits.PROOF_FORKS[fork](root)
    outcome, expected = VERDICTS[fork]
    before = tree_digest(root)
    before_site = findings(root)[SITE if fork != "graph-width-defined-twice" else "graph-width:flashinfer"]
    before_state = before_site.state
    capsys.readouterr()
    code = cli.main(["apply", str(root)])
    _out, err = capsys.readouterr()
    if outcome == "refused":
        assert code == 2 and tree_digest(root) == before
        errors = [line for line in err.splitlines() if line.startswith("error:")]
        assert errors and all("nothing written" in line for line in errors)
        assert any(expected in line for line in errors), errors
        return
    assert code == 0, err
    assert before_state is expected, before_site.detail
    states = findings(root)
    assert states[SITE].state in (State.PATCHED, State.BY_CALLER, State.BY_HAND)
    assert all(f.state is not State.TO_PATCH and f.state is not State.UNRECOGNISED for f in states.values())
    assert not_split_once(root / "sglang") == []  # split exactly once, every step upstream's row


def test_a_method_defined_twice_is_patched_where_python_runs_it(scratch):
    root = scratch("0.5.12")
    fork_edits.graph_width_defined_twice(root)
    assert cli.main(["apply", str(root)]) == 0
    text = (Path(root) / "sglang" / fork_edits.FLASHINFER).read_text()
    first, second = text.split("    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int):\n")[1:3]
    assert "max_bs * self.max_context_len" in first.split("\n    def ")[0]  # the dead definition, as it was
    assert "draft_kv_indices_buffer_width(\n            max_bs, self.topk, self.max_context_len\n" in second

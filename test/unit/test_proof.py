"""proof: a rewrite is written only when the fork's code and the rewritten code give the same rows.

Hypothesis draws spellings of the EAGLE worker's per-step split (the view's dimension order, ``-1``
placements, moves, the final reshape or flatten, a guard around it): whenever ``apply`` would rewrite
one, the spelling, run with real torch, must give upstream's rows on every probe shape. Hand-written
mimics pin the verdicts the issue names: what is refused, what is proven, and the proof's report.
"""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rule_test_support import DRAFT_FORWARD, WORKER_V2, backend_module, rule, worker_module
from sglang_draft_layout.proof.world import PROBES
from sglang_draft_layout.rules.base import State

RULE = rule("draft-forward:EagleDraftWorker")
SPLIT = (
    "        out_cache_loc = out_cache_loc.reshape(\n"
    "            forward_batch.batch_size, self.topk, self.speculative_num_steps\n"
    "        )\n"
    "        out_cache_loc = out_cache_loc.permute((2, 0, 1)).reshape(\n"
    "            self.speculative_num_steps, -1\n"
    "        )\n"
)
NAMES = {"bs": "forward_batch.batch_size", "topk": "self.topk", "steps": "self.speculative_num_steps"}


def _worker(split: str) -> str:
    return worker_module("EagleDraftWorker", DRAFT_FORWARD.replace(SPLIT, split))


def _upstream_rows(n: int, k: int, s: int) -> list:
    return torch.arange(n * k * s).view(n, k, s).permute(2, 0, 1).reshape(s, -1).tolist()


def _torch_rows(expression: str, n: int, k: int, s: int):
    """The spelling's rows with real torch (None when torch raises)."""
    values = {"bs": n, "topk": k, "steps": s}
    text = expression.format(**{key: str(v) for key, v in values.items()})
    try:
        return eval(text, {"x": torch.arange(n * k * s)}).tolist()  # noqa: S307 (the test's own spelling)
    except RuntimeError:
        return None


DIMS = st.permutations(["bs", "topk", "steps"]).map(tuple)
MOVES = st.one_of(
    st.permutations([0, 1, 2]).map(lambda p: f".permute({p[0]}, {p[1]}, {p[2]})"),
    st.tuples(st.integers(0, 2), st.integers(0, 2))
    .filter(lambda d: d[0] != d[1])
    .map(lambda d: f".transpose({d[0]}, {d[1]})"),
    st.tuples(st.integers(-1, 2), st.integers(0, 2)).map(lambda d: f".movedim({d[0]}, {d[1]})"),
)
ENDS = st.sampled_from(
    [
        ".reshape({steps}, -1)",
        ".reshape(-1, {bs} * {topk})",
        ".flatten(1)",
        ".reshape({steps}, {bs} * {topk})",
        ".reshape(-1, {topk})",
    ]
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(DIMS, st.sampled_from([None, "bs", "topk", "steps"]), st.lists(MOVES, min_size=1, max_size=2), ENDS)
def test_apply_never_writes_a_rewrite_whose_rows_differ(sglang_tree, dims, minus_one, moves, end):
    view = ", ".join("-1" if d == minus_one else "{" + d + "}" for d in dims)
    expression = f"x.reshape({view}){''.join(moves)}{end}"
    code = expression.replace("x.", "out_cache_loc.", 1).format(**NAMES)
    sglang_tree.write(WORKER_V2, _worker(f"        out_cache_loc = {code}\n"))
    [finding] = sglang_tree.plan([RULE]).findings
    if finding.state is State.TO_PATCH:
        for probe in PROBES:
            n, k, s = probe.num_seqs, probe.topk, probe.steps
            assert _torch_rows(expression, n, k, s) == _upstream_rows(n, k, s), (code, str(probe))
        assert finding.proof is not None and finding.proof.proven


@pytest.mark.parametrize(
    "split, why",
    [
        (SPLIT.replace("forward_batch.batch_size,", "-1,"), "the rewritten code raises AssertionError"),
        (
            "        out_cache_loc = out_cache_loc.view(-1, self.speculative_num_steps)\n" + SPLIT,
            "the rewritten code raises AssertionError",
        ),
        (
            "        rows = out_cache_loc.reshape(forward_batch.batch_size, self.topk, self.speculative_num_steps)\n"
            "        with contextlib.suppress(RuntimeError):\n"
            "            out_cache_loc = rows.permute(2, 0, 1).reshape(self.speculative_num_steps, -1)\n",
            "may swallow the layout's errors",
        ),
        (
            "        rows = out_cache_loc.reshape(forward_batch.batch_size, self.topk, self.speculative_num_steps)\n"
            "        try:\n"
            "            out_cache_loc = rows.permute(2, 0, 1).reshape(self.speculative_num_steps, -1)\n"
            "        finally:\n"
            "            return None\n",
            "a `finally` that returns",
        ),
    ],
    ids=["-1 batch", "2-d buffer first", "suppress", "finally returns"],
)
def test_unprovable_rewrites_are_refused_in_one_line(sglang_tree, split, why):
    sglang_tree.write(WORKER_V2, _worker(split))
    [finding] = sglang_tree.plan([RULE]).findings
    assert finding.state is State.UNRECOGNISED and finding.edits == ()
    assert why in finding.detail and "\n" not in finding.detail
    assert finding.detail.startswith("cannot prove the rewrite from EagleDraftWorker.draft_forward")


def test_a_proven_rewrite_says_how_in_json_and_verbose(sglang_tree):
    sglang_tree.write(WORKER_V2, _worker(SPLIT))
    code, out, _err = sglang_tree.cli("check", "--format", "json")
    site = next(s for s in json.loads(out)["sites"] if s["class_method"] == "EagleDraftWorker.draft_forward")
    assert site["proof"]["proven"] is True
    runs = site["proof"]["runs"]
    assert all(any(str(probe) in run["run"] for run in runs) for probe in PROBES)
    assert {run["verdict"] for run in runs} == {"equal"}
    code, out, _err = sglang_tree.cli("check", "-v")
    assert code == 1 and f"proven on {len(PROBES)} probes" in out


def test_a_narrow_row_is_widened_to_upstreams_and_said_so(sglang_tree):
    sglang_tree.write("srt/layers/attention/flashinfer_backend.py", backend_module("FlashInferMultiStepDraftBackend"))
    plan = sglang_tree.plan([rule("graph-width:flashinfer")])
    [finding] = plan.findings
    assert finding.state is State.TO_PATCH and finding.proof.proven
    verdicts = dict(finding.proof.probes)
    fixed = [probe for probe, verdict in verdicts.items() if verdict == "fixes the fork's bug"]
    assert fixed and all("topk=1," not in probe for probe in fixed)  # topk 1: the narrow row was wide enough


def test_a_wider_row_than_upstreams_is_not_narrowed(sglang_tree):
    """Branches times topk (a fork counting branches twice): the helper's row would be topk times narrower."""
    text = backend_module("FlashInferMultiStepDraftBackend").replace(
        "max_bs * self.max_context_len", "max_num_tokens * self.topk * self.max_context_len"
    )
    sglang_tree.write("srt/layers/attention/flashinfer_backend.py", text)
    [finding] = sglang_tree.plan([rule("graph-width:flashinfer")]).findings
    assert finding.state is State.UNRECOGNISED
    assert "allocates" in finding.detail and "upstream's rows" in finding.detail

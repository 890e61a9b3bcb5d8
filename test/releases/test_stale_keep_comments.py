"""Issue 40: a keep comment left on upstream's own code (real 0.5.13, where every site is patched) keeps
nothing. `check` names it (file, line, site) as stale, with `apply` as the command that removes it; `apply`
takes it out, leaving 0.5.13's file byte for byte, and `check` exits 0. A keep comment that keeps something
elsewhere (a per-step path through the method it is on) is not stale."""

from __future__ import annotations

import re

import black
import pytest

from sglang_draft_layout import api, cli
from support import fork_edits
from test_releases import tree_digest

pytestmark = pytest.mark.releases

UPSTREAM = "0.5.13"
KEEP = "# sglang-draft-layout: keep"
GRAPH_STATE = "    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int):\n"
FLASHINFER_CLASS = "class FlashInferMultiStepDraftBackend"
WORKER_DEF = "    def draft_forward(self, forward_batch: ForwardBatch):\n"


def above(text: str) -> str:
    """The keep comment alone above FlashInfer's multi-step init_cuda_graph_state (the form the tool advises)."""
    at = text.index(GRAPH_STATE, text.index(FLASHINFER_CLASS))
    return text[:at] + f"    {KEEP}\n" + text[at:]


def on_the_def_line(text: str) -> str:
    """The keep comment at the end of that def line, laid out as black 24.10.0 lays it out (it splits the line)."""
    at = text.index(GRAPH_STATE, text.index(FLASHINFER_CLASS))
    kept = text[:at] + GRAPH_STATE.replace(":\n", f":  {KEEP}\n") + text[at + len(GRAPH_STATE) :]
    return black.format_str(kept, mode=black.Mode())


#: where the comment goes: (file, how it is put there, the site check names)
CASES = {
    "alone above the def": (fork_edits.FLASHINFER, above, "CUDA-graph kv_indices row width"),
    "at the end of the def line, black split": (
        fork_edits.FLASHINFER,
        on_the_def_line,
        "CUDA-graph kv_indices row width",
    ),
    "at the end of a one-line def": (
        fork_edits.WORKER_V2,
        lambda text: text.replace(WORKER_DEF, WORKER_DEF.replace(":\n", f":  {KEEP}\n"), 1),
        "per-step out_cache_loc",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_keep_comment_on_upstreams_code_is_stale_and_apply_removes_it(scratch, pristine, capsys, case):
    file, put, site = CASES[case]
    tree = scratch(UPSTREAM)
    path = tree / "sglang" / file
    text = path.read_text()
    path.write_text(put(text))
    assert path.read_text() != text
    line = next(n for n, each in enumerate(path.read_text().splitlines(), 1) if KEEP in each)

    report = api.check(tree)
    [stale] = [item for item in report.items if item.kind == api.KEEP_COMMENT]
    assert (stale.file, stale.line, stale.site, stale.state) == (f"sglang/{file}", line, site, "stale")
    assert report.to_do == [stale] and report.exit_code == 1
    assert report.counts()[api.KEEP_COMMENT] == {"stale": 1}
    assert cli.main(["check", str(tree)]) == 1
    out = capsys.readouterr().out
    assert re.search(
        rf"^  {line}  stale  \S+  {site} \(its site follows upstream: it keeps nothing; `apply` removes it\)$",
        out,
        re.M,
    ), out
    assert "1 keep comment stale" in out and "next: run\n  sglang-draft-layout apply " in out
    assert cli.main(["check", "--format", "github", str(tree)]) == 1
    assert f"::error file=sglang/{file},line={line}," in capsys.readouterr().out

    assert cli.main(["apply", str(tree)]) == 0
    assert "1 keep comment removed now" in capsys.readouterr().out
    assert tree_digest(tree) == tree_digest(pristine(UPSTREAM))  # 0.5.13's own file, byte for byte
    assert cli.main(["check", str(tree)]) == 0


def test_a_keep_comment_that_keeps_a_per_step_path_is_not_stale(scratch):
    """On a fork with its own DeepSeek-V4 split in the callee (``fork_edits.dsv4_callee_split``), a keep above
    ``init_forward_metadata_in_graph`` (patched: upstream's code) keeps the per-step path through it: the
    decode site is kept by it, and without it `apply` would take the fork's split out. Not stale."""
    tree = scratch(UPSTREAM)
    fork_edits.dsv4_callee_split(tree)
    path = tree / "sglang" / fork_edits.DSV4
    text = path.read_text()
    at = text.index("    def init_forward_metadata_in_graph(")
    path.write_text(text[:at] + f"    {KEEP}\n" + text[at:])
    states = {
        item.scope: item.state for item in api.check(tree, tests=False).items if item.file.endswith(fork_edits.DSV4)
    }
    assert states["DeepseekV4AttnBackend.init_forward_metadata_in_graph"] == "patched"
    assert states["DeepseekV4AttnBackend.init_forward_metadata"] == "kept by the fork"
    assert not any(item.kind == api.KEEP_COMMENT for item in api.check(tree, tests=False).items)
    path.write_text(text)  # without it, the decode site is the fork's split to take out
    assert states != {i.scope: i.state for i in api.check(tree, tests=False).items if i.file.endswith(fork_edits.DSV4)}


def test_a_keep_comment_that_keeps_a_site_is_not_stale(scratch):
    """On 0.5.12, the keep above the narrow row FlashInfer's init_cuda_graph_state has keeps it: not stale."""
    tree = scratch("0.5.12")
    path = tree / "sglang" / fork_edits.FLASHINFER
    path.write_text(above(path.read_text()))
    items = api.check(tree).items
    assert [i.state for i in items if i.scope == "FlashInferMultiStepDraftBackend.init_cuda_graph_state"] == [
        "kept by the fork"
    ]
    assert not any(item.kind == api.KEEP_COMMENT for item in items)

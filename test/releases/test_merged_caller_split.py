"""A fork's own DeepSeek-V4 split, in its multi-step caller or in the per-step backend's callee, on
upstream 0.5.13's tree (a fork that merged upstream, or cherry-picked its per-step split): `apply` takes
the fork's split out, upstream's stays, proven by the split-once verdict; a split it cannot take apart
or that the fork keeps is refused with nothing written."""

from __future__ import annotations

import pytest
from sglang_draft_layout import cli
from sglang_draft_layout.rules.base import Source
from sglang_draft_layout.rules.who_splits import split_of as split_once_of
from support import fork_edits
from test_releases import tree_digest

pytestmark = pytest.mark.releases

UPSTREAM = "0.5.13"
DSV4 = fork_edits.DSV4


def test_the_forks_caller_split_is_taken_out_and_the_tree_is_upstreams(scratch, pristine, capsys):
    tree = scratch(UPSTREAM)
    fork_edits.dsv4_caller_split(tree)
    assert cli.main(["check", "--no-tests", str(tree)]) == 1
    out = capsys.readouterr().out
    assert "DeepseekV4MultiStepBackend.init_forward_metadata splits it again after" in " ".join(out.split())
    assert cli.main(["apply", "--no-tests", str(tree)]) == 0
    assert "the fork's split taken out, upstream's kept" in " ".join(capsys.readouterr().out.split())
    assert tree_digest(tree) == tree_digest(pristine(UPSTREAM))  # 0.5.13's file, byte for byte
    assert cli.main(["check", "--no-tests", str(tree)]) == 0


def test_a_caller_split_in_a_mixin_is_taken_out_there(scratch, capsys):
    tree = scratch(UPSTREAM)
    fork_edits.dsv4_caller_split_mixin(tree)
    assert cli.main(["apply", "--no-tests", str(tree)]) == 0
    path = tree / "sglang" / DSV4
    written = path.read_text()
    assert "_split_out_cache_loc_per_step" not in written and "forward_batch.out_cache_loc =" not in written
    source = Source(DSV4, written)
    source.package = tree / "sglang"
    assert split_once_of(source, "DeepseekV4AttnBackend").who == "per-step backend"
    assert cli.main(["check", "--no-tests", str(tree)]) == 0


def test_a_caller_split_it_cannot_take_apart_is_refused(scratch, capsys):
    tree = scratch(UPSTREAM)
    fork_edits.dsv4_caller_split(tree)
    path = tree / "sglang" / DSV4
    two_statements = (
        "        try:\n            self.steps_seen = 0\n            for i in range("  # the try opens to two
    )
    path.write_text(path.read_text().replace("        try:\n            for i in range(", two_statements, 1))
    before = tree_digest(tree)
    assert cli.main(["apply", "--no-tests", str(tree)]) == 2
    assert "splits the per-step out_cache_loc twice" in " ".join(capsys.readouterr().err.split())
    assert tree_digest(tree) == before  # nothing written


def test_the_forks_callee_split_is_taken_out_and_the_tree_is_upstreams(scratch, pristine, capsys):
    """The fork fixed the eager bug in ``init_forward_metadata_decode`` (``fork_edits.dsv4_callee_split``,
    with ``-1`` for the batch: no spelling this tool recognises) and merged 0.5.13: the proof decides."""
    tree = scratch(UPSTREAM)
    fork_edits.dsv4_callee_split(tree)
    assert cli.main(["check", "--no-tests", str(tree)]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "DeepseekV4AttnBackend.init_forward_metadata_decode splits it again after upstream's split" in out
    assert cli.main(["apply", "--no-tests", str(tree)]) == 0
    assert tree_digest(tree) == tree_digest(pristine(UPSTREAM))
    assert cli.main(["check", "--no-tests", str(tree)]) == 0


def test_a_callee_split_the_fork_keeps_is_refused(scratch, capsys):
    tree = scratch(UPSTREAM)
    fork_edits.dsv4_callee_split(tree)
    path = tree / "sglang" / DSV4
    kept = "            out_cache_loc = out_cache_loc.reshape(  # sglang-draft-layout: keep\n"
    path.write_text(path.read_text().replace("            out_cache_loc = out_cache_loc.reshape(\n", kept, 1))
    before = tree_digest(tree)
    assert cli.main(["apply", "--no-tests", str(tree)]) == 2
    error = " ".join(capsys.readouterr().err.split())  # the kept callee splits upstream's row again: it raises
    assert "eager: raises RuntimeError at srt/layers/attention/deepseek_v4_backend.py:" in error
    assert "is invalid for input of size 1" in error
    assert tree_digest(tree) == before


def test_an_in_graph_split_twice_is_refused_naming_the_phase_once(scratch, capsys):
    """Upstream's in-graph split, then the fork's strided one on the row it gave (issue 40: the error said
    "(in graph)" twice, the site's and the detail's): one error line, "(in graph)" once, the probe's phase."""
    tree = scratch(UPSTREAM)
    path = tree / "sglang" / DSV4
    text = path.read_text()
    upstreams = (
        "                )[self.speculative_step_id]\n            metadata.core_attn_metadata.swa_out_cache_loc = ("
    )
    assert text.count(upstreams) == 1
    again = "                out_cache_loc = out_cache_loc[self.speculative_step_id :: self.speculative_num_steps]\n"
    path.write_text(text.replace(upstreams, upstreams.replace("]\n", "]\n" + again, 1)))
    assert cli.main(["check", "--no-tests", str(tree)]) == 2
    [error] = [line for line in capsys.readouterr().err.splitlines() if "init_forward_metadata_in_graph:" in line]
    assert (
        error.count("(in graph)") == 1
        and "per-step out_cache_loc (in graph): the per-step out_cache_loc path: " in error
    )
    assert "in graph: step 0 bakes slots" in error


def test_a_caller_split_beside_a_decode_raising_at_topk_above_one_names_the_raise(scratch, capsys):
    """A fork that lets DeepSeek-V4 draft at topk > 1 (its topk assert relaxed) and splits in the caller: the tree's
    own decode raises there (its shape assert), which is what the refusal says: not a split in the per-step code."""
    tree = scratch("0.5.12")
    fork_edits.edit(
        tree,
        DSV4,
        'assert self.topk in [0, 1], "MTP Topk > 1 not supported for DeepSeek V4"',
        'assert self.topk >= 0, "negative speculative topk"',
    )
    fork_edits.dsv4_caller_split(tree)
    before = tree_digest(tree)
    for command in ("check", "apply"):
        assert cli.main([command, "--no-tests", str(tree)]) == 2
        err = " ".join(capsys.readouterr().err.split())
        assert "splits the per-step out_cache_loc twice" not in err, err
        assert "DeepseekV4AttnBackend.init_forward_metadata: per-step out_cache_loc (decode): the per-step" in err, err
        assert "topk 4, 3 steps: eager: raises AssertionError at srt/layers/attention/deepseek_v4_backend.py:" in err
    assert tree_digest(tree) == before  # nothing written

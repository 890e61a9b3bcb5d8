"""check/apply on every PyPI release from 0.4.6.post5 to 0.5.12.post1 (0.5.8 to 0.5.12: test_releases.py).

Per release, on a fresh unpack of its wheel: the sites found and their states, the helper
module the tree lacks created (0.4.8 to 0.5.3.post1), every site patched after ``apply``,
a second ``apply`` byte-identical, every changed or created file as lint-clean (black
24.10.0, isort 5.13.2 profile black) as its original. 0.4.6.post5 to 0.4.7.post1 (the
one-parameter ``init_cuda_graph_state``) are reported not affected, exit 0, nothing written.

The releases are grouped into families by what their code holds (read off the wheels): the
expectations say per family which sites are absent and which module is created.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple, Optional

import pytest

from sglang_draft_layout import cli, engine
from sglang_draft_layout.releases import unpack_release
from sglang_draft_layout.rules import RULES, helper_definitions
from sglang_draft_layout.rules.base import State
from sglang_draft_layout.target import resolve
from test_lint import LINTERS, lint_changes
from test_releases import tree_digest

pytestmark = pytest.mark.releases

AITER = {f"{kind}:aiter" for kind in ("step-slice", "eager-width", "graph-width")}
DSV4 = {"dsv4-out-cache-loc"}
#: the sites 0.5.13 added (the ROCm DeepSeek-V4 decode branch, the DeepSeek-V4 in-graph methods): in no release before
SINCE_0_5_13 = {
    "dsv4-hip-out-cache-loc",
    "dsv4-in-graph-out-cache-loc:DeepseekV4AttnBackend",
    "dsv4-in-graph-out-cache-loc:DeepseekV4HipRadixBackend",
}
V2_WORKER = {"draft-forward:EagleDraftWorker"}
SPEC_UTILS = "srt/speculative/spec_utils.py"
EAGLE_UTILS = "srt/speculative/eagle_utils.py"


class Family(NamedTuple):
    releases: tuple[str, ...]
    sites: int  # the sites check reports (present ones)
    absent: set[str]  # rule ids whose class or file the release lacks
    created: Optional[str] = None  # the helper module apply creates
    guarded: int = 0  # sites only the structural guard finds
    affected: bool = True


#: every release on PyPI from 0.4.6.post5 to 0.5.12.post1 (`pip index versions --pre sglang`, 2026-12-01)
PYPI_RELEASES = (
    "0.4.6.post5",
    "0.4.7",
    "0.4.7.post1",
    "0.4.8",
    "0.4.8.post1",
    "0.4.9",
    "0.4.9.post1",
    "0.4.9.post2",
    "0.4.9.post3",
    "0.4.9.post4",
    "0.4.9.post5",
    "0.4.9.post6",
    "0.4.10",
    "0.4.10.post1",
    "0.4.10.post2",
    "0.5.0rc0",
    "0.5.0rc1",
    "0.5.0rc2",
    "0.5.1",
    "0.5.1.post1",
    "0.5.1.post2",
    "0.5.1.post3",
    "0.5.2",
    "0.5.3",
    "0.5.3.post1",
    "0.5.3.post2",
    "0.5.3.post3",
    "0.5.4",
    "0.5.4.post1",
    "0.5.4.post2",
    "0.5.4.post3",
    "0.5.5",
    "0.5.5.post1",
    "0.5.5.post2",
    "0.5.5.post3",
    "0.5.6",
    "0.5.6.post1",
    "0.5.6.post2",
    "0.5.7",
    "0.5.8",
    "0.5.8.post1",
    "0.5.9",
    "0.5.10",
    "0.5.10.post1",
    "0.5.11",
    "0.5.12",
    "0.5.12.post1",
)
#: covered release by release by test_releases.py and test_lint.py
TESTED_ELSEWHERE = ("0.5.8", "0.5.9", "0.5.10", "0.5.11", "0.5.12")
FAMILIES = (
    # one-parameter init_cuda_graph_state(self, max_bs), called with max_bs * topk: rows per branch
    Family(("0.4.6.post5", "0.4.7", "0.4.7.post1"), 12, AITER | DSV4 | V2_WORKER, affected=False),
    # the narrow FlashInfer / FlashInfer-MLA graph row; no spec_utils.py (kernel in eagle_utils.py)
    Family(
        (
            "0.4.8",
            "0.4.8.post1",
            "0.4.9",
            "0.4.9.post1",
            "0.4.9.post2",
            "0.4.9.post3",
            "0.4.9.post4",
            "0.4.9.post5",
            "0.4.9.post6",
            "0.4.10",
            "0.4.10.post1",
            "0.4.10.post2",
            "0.5.0rc0",
        ),
        12,
        AITER | DSV4 | V2_WORKER,
        created=SPEC_UTILS,
    ),
    # the Aiter draft backend appears
    Family(
        ("0.5.0rc1", "0.5.0rc2", "0.5.1", "0.5.1.post1", "0.5.1.post2", "0.5.1.post3", "0.5.2"),
        15,
        DSV4 | V2_WORKER,
        created=SPEC_UTILS,
    ),
    # spec_utils.py holds the kernel; eagle_utils.py split into eagle_info.py and spec_utils.py
    Family(("0.5.3", "0.5.3.post1"), 15, DSV4 | V2_WORKER, created=EAGLE_UTILS),
    # the V2 worker's first form: class EAGLEWorkerV2 (found by the structural guard)
    Family(("0.5.3.post2", "0.5.3.post3"), 16, DSV4 | V2_WORKER, guarded=1),
    # 0.5.8's forms
    Family(
        (
            "0.5.4",
            "0.5.4.post1",
            "0.5.4.post2",
            "0.5.4.post3",
            "0.5.5",
            "0.5.5.post1",
            "0.5.5.post2",
            "0.5.5.post3",
            "0.5.6",
            "0.5.6.post1",
            "0.5.6.post2",
            "0.5.7",
            "0.5.8.post1",
            "0.5.10.post1",
        ),
        16,
        DSV4,
    ),
    Family(("0.5.12.post1",), 17, set()),  # 0.5.12's forms, DeepSeek-V4 included
)
FAMILY_OF = {version: family for family in FAMILIES for version in family.releases}


def run_cli(*args: str) -> int:
    return cli.main(list(args))


def test_families_list_each_release_once():
    releases = [version for family in FAMILIES for version in family.releases]
    assert len(releases) == len(set(releases))
    assert sorted(releases + list(TESTED_ELSEWHERE)) == sorted(PYPI_RELEASES)


@pytest.mark.parametrize("version", list(FAMILY_OF))
def test_release(version, tmp_path, capsys):
    family = FAMILY_OF[version]
    unpack_release(version, tmp_path)
    target = resolve(str(tmp_path))
    findings = engine.plan(target, render_changes=False).findings
    sites = {f.rule.id: f for f in findings if f.rule.counts_as_site}
    named = {rule.id for rule in RULES if rule.counts_as_site}
    guarded = set(sites) - named
    assert len(guarded) == family.guarded, sorted(guarded)
    absent = family.absent | SINCE_0_5_13
    assert {rule for rule, f in sites.items() if f.state is State.ABSENT} == absent
    present = set(sites) - absent
    assert len(present) == family.sites
    before = tree_digest(tmp_path)

    if not family.affected:
        assert {sites[rule].state for rule in present} == {State.NOT_AFFECTED}
        assert sites["graph-width:flashinfer"].detail.startswith(
            "init_cuda_graph_state(self, max_bs) gets max_bs * topk"
        )
        assert run_cli("check", str(tmp_path)) == 0
        assert run_cli("apply", str(tmp_path)) == 0
        assert tree_digest(tmp_path) == before  # nothing written
        return

    assert {sites[rule].state for rule in present} == {State.TO_PATCH}
    helpers = [f for f in findings if not f.rule.counts_as_site]
    to_create = {f.rule.file for f in helpers if f.detail.startswith("to create")}
    assert to_create == ({family.created} if family.created else set())
    assert run_cli("check", str(tmp_path)) == 1
    assert run_cli("apply", str(tmp_path)) == 0
    applied = tree_digest(tmp_path)
    changed = {name for name in applied if applied[name] != before.get(name)}
    expected = {f"sglang/{sites[rule].rule.file}" for rule in present} | {f"sglang/{f.rule.file}" for f in helpers}
    assert changed == expected
    if family.created:
        created = (tmp_path / "sglang" / family.created).read_text()
        assert created == helper_definitions.new_module(family.created)
        assert "Created by sglang-draft-layout" in created
    after = {f.rule.id: f.state for f in engine.plan(resolve(str(tmp_path)), render_changes=False).findings}
    assert {after[rule] for rule in present} == {State.PATCHED}
    assert run_cli("check", str(tmp_path)) == 0
    assert run_cli("apply", str(tmp_path)) == 0
    assert "nothing to do" in capsys.readouterr().out
    assert tree_digest(tmp_path) == applied  # the second apply is byte-identical

    for name in sorted(changed):
        new = (tmp_path / name).read_text()
        for tool in LINTERS:
            found = lint_changes(tool, new)
            if found:  # allowed only as the original's own finding, unchanged
                assert name in before, f"{tool} would change the created {name}: {sorted(found)}"
                original = unpack_original(version, name, tmp_path.parent / f"{tmp_path.name}-original")
                assert found == lint_changes(tool, original), f"{tool} on the patched {name}: {sorted(found)}"


def unpack_original(version: str, name: str, folder: Path) -> str:
    """The release's own text of ``name`` (``sglang/...``), unpacked beside the patched tree."""
    if not folder.exists():
        unpack_release(version, folder)
    return (folder / name).read_text()

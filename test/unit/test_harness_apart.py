"""harness.apart: a tree's draft paths judged in two processes give one process's verdicts; a child that dies or
raises; claims taken once each."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from sglang_draft_layout.harness import apart
from sglang_draft_layout.harness.invariant import GUARDED, judge, judge_paths
from sglang_draft_layout.harness.paths import STEPS, DraftPath
from sglang_draft_layout.harness.tensors import FACADE
from sglang_draft_layout.harness.world import Tree
from support.sglang_release import pristine_tree

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


@pytest.fixture(scope="module")
def release() -> tuple[Path, list[str]]:
    package = pristine_tree("0.5.12") / "sglang"
    modules = sorted(p.relative_to(package).as_posix() for f in GUARDED for p in (package / f).rglob("*.py"))
    return package, modules


@pytest.fixture
def two_cpus(monkeypatch):
    monkeypatch.setattr(apart, "_two_processes", lambda: True)


def test_two_processes_give_one_process_verdicts(release, two_cpus, monkeypatch):
    package, modules = release
    forked = []
    fork = os.fork
    monkeypatch.setattr(os, "fork", lambda: forked.append(1) or fork())
    found, read = apart.judge_apart(Tree(package, FACADE), modules, judge)
    assert forked == [1]
    alone = judge_paths(Tree(package, FACADE), modules)
    assert list(found) == list(alone) and len(found) == 7
    assert found == alone
    assert {"srt/speculative/eagle_worker.py", "srt/layers/attention/deepseek_v4_backend.py"} <= read


def test_one_job_judges_in_this_process(release, monkeypatch):
    package, modules = release
    monkeypatch.setenv(apart.JOBS, "1")
    monkeypatch.setattr(os, "fork", lambda: pytest.fail("forked with SGLANG_DRAFT_LAYOUT_JOBS=1"))
    found, _read = apart.judge_apart(Tree(package, FACADE), modules, judge)
    assert found == judge_paths(Tree(package, FACADE), modules)


def test_a_child_that_dies_leaves_its_paths_here(release, two_cpus, monkeypatch):
    package, modules = release
    monkeypatch.setattr(apart, "_judge_share", lambda *args: os._exit(1))
    found, _read = apart.judge_apart(Tree(package, FACADE), modules, judge)
    assert found == judge_paths(Tree(package, FACADE), modules)


def test_what_the_child_raises_is_raised_here(release, two_cpus):
    package, modules = release
    parent = os.getpid()

    def judged(tree, path, *by_worker):
        if os.getpid() != parent:  # the workers, which both processes judge
            raise SyntaxError("in the child")
        return judge(tree, path, *by_worker)

    with pytest.raises(SyntaxError, match="in the child"):
        apart.judge_apart(Tree(package, FACADE), modules, judged)


def test_each_path_is_claimed_once():
    """Two processes' claims, taken in turn: each path goes to the one that asks for it first."""
    others = [DraftPath(STEPS, f"m{n}.py", "C") for n in range(5)]
    reader, writer = os.pipe()
    os.write(writer, bytes(range(5)))
    os.close(writer)
    first, second = apart._Claims(reader, others), apart._Claims(reader, others)
    asked = []
    for path in others:
        asked += [first(path), second(path)]
    os.close(reader)
    assert asked == [True, False, False, True, True, False, False, True, True, False]
    assert first.taken == {others[0], others[2], others[4]} and second.taken == {others[1], others[3]}

"""harness.apart: a tree's draft paths judged in two processes give one process's verdicts; a child that dies or
raises; claims taken once each; a judging begun early (``judged.begin_tree``) finished once, or ended."""

from __future__ import annotations

import functools
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from sglang_draft_layout import engine
from sglang_draft_layout.harness import apart, judged
from sglang_draft_layout.harness.invariant import Verdict, guarded_modules, inits_steps, judge, judge_paths
from sglang_draft_layout.harness.paths import ROWS, STEPS, WORKER, draft_paths
from sglang_draft_layout.harness.tensors import FACADE
from sglang_draft_layout.harness.world import Tree
from sglang_draft_layout.target import TargetError, resolve
from support.sglang_release import pristine_tree

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


@pytest.fixture(scope="module")
def release() -> tuple[Path, list[str]]:
    package = pristine_tree("0.5.12") / "sglang"
    modules = guarded_modules(package)
    return package, modules


@pytest.fixture
def two_cpus(monkeypatch):
    monkeypatch.setattr(apart, "_two_processes", lambda pieces: 2 <= pieces < 256)


def test_two_processes_give_one_process_verdicts(release, two_cpus, monkeypatch):
    package, modules = release
    forked = []
    fork = os.fork
    monkeypatch.setattr(os, "fork", lambda: forked.append(1) or fork())
    found, read = apart.Judging(Tree(package, FACADE), modules, judge).finish()
    assert forked == [1]
    alone = judge_paths(Tree(package, FACADE), modules)
    assert list(found) == list(alone) and len(found) == 7
    assert found == alone
    assert read["srt/speculative/eagle_worker.py"] and read["srt/layers/attention/deepseek_v4_backend.py"]  # texts
    # a module the DeepSeek-V4 backend imports, looked for and not read (whether it is there is what counts)
    assert read["jit_kernel/dsv4/__init__.py"] is False


def test_the_child_judges_the_workers_and_hands_who_inits_each_step(release, two_cpus):
    """This process judges no worker: a per-step path it claims runs as the child found the workers init each step
    (on 0.5.12, none does: DeepSeek-V4's multi-step backend inits them)."""
    package, modules = release
    parent, here = os.getpid(), []

    def judged(tree, path, *by_worker):
        if os.getpid() == parent:
            here.append((path, by_worker))
        return judge(tree, path, *by_worker)

    found, _read = apart.Judging(Tree(package, FACADE), modules, judged).finish()
    assert found == judge_paths(Tree(package, FACADE), modules)
    assert here and not [path for path, _by in here if path.kind == WORKER]
    stepping = inits_steps({path: verdict for path, verdict in found.items() if path.kind == WORKER})
    assert {by for path, by in here if path.kind == STEPS} <= {(stepping,)}  # where this process judged it
    assert [verdict.driven_by for path, verdict in found.items() if path.kind == STEPS] == [stepping]


@pytest.mark.parametrize("guess", ["none", "right", "wrong"])
def test_a_per_step_path_claimed_before_the_child_hands_its_answer(release, monkeypatch, guess):
    """0.5.12's DeepSeek-V4 path is per-step, ordered last: claimed first by this process (which goes from the last
    back), before the child has said who inits each step (no worker does), it runs on the guess the tree before its
    rewrite gave, again where that was wrong, and with no guess after the other paths: its verdict always runs as
    the child says."""
    package, modules = release
    monkeypatch.setenv(apart.JOBS, "1")
    tree = Tree(package, FACADE)
    worker = next(path for path in draft_paths(tree, modules) if path.kind == WORKER)
    guessed = {"none": (), "right": (None,), "wrong": (worker,)}[guess]
    judging = apart.Judging(tree, modules, judge, guessed)
    assert [path.kind for path in judging.others] == [ROWS, ROWS, ROWS, ROWS, STEPS]
    judging.handed, writer = os.pipe()
    order, handed, lock = [], [], threading.Lock()

    def hand():  # the child's answer, once
        with lock:
            if not handed:
                handed.append(writer)
                os.write(writer, pickle.dumps(None))
                os.close(writer)

    def judged(tree, path, *by_worker):
        order.append((path.cls, by_worker))
        if len(order) == 4:  # the answer comes once four are judged (or in 2 s: a path that waits for it)
            hand()
        return Verdict(path, judged=len(order), driven_by=by_worker[0] if by_worker else None)

    timer = threading.Timer(2, hand)
    judging.judge_path = judged
    timer.start()
    try:
        found, _read = judging._judged_by(range(len(judging.others) - 1, -1, -1))
    finally:
        timer.cancel()
    rows = [(path.cls, ()) for path in reversed(judging.others) if path.kind == ROWS]
    steps = "DeepseekV4MultiStepBackend"
    expected = {
        "none": [*rows, (steps, (None,))],
        "right": [(steps, (None,)), *rows],
        "wrong": [(steps, (worker,)), *rows, (steps, (None,))],
    }[guess]
    assert order == expected and set(found) == set(judging.others) and judging.workers_here == {}
    assert [v.driven_by for p, v in found.items() if p.kind == STEPS] == [None]  # the answer's, not the guess's


def test_a_threaded_program_works_in_one_process(monkeypatch):
    monkeypatch.delenv(apart.JOBS, raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    with monkeypatch.context() as alone:
        alone.setattr(threading, "active_count", lambda: 1)
        assert apart._two_processes(3)
    started, stop = threading.Event(), threading.Event()
    thread = threading.Thread(target=lambda: (started.set(), stop.wait()))
    thread.start()
    started.wait()
    try:
        assert not apart._two_processes(3)
    finally:
        stop.set()
        thread.join()


def test_one_job_judges_in_this_process(release, monkeypatch):
    package, modules = release
    monkeypatch.setenv(apart.JOBS, "1")
    monkeypatch.setattr(os, "fork", lambda: pytest.fail("forked with SGLANG_DRAFT_LAYOUT_JOBS=1"))
    found, _read = apart.Judging(Tree(package, FACADE), modules, judge).finish()
    assert found == judge_paths(Tree(package, FACADE), modules)


def test_a_child_that_dies_leaves_its_paths_here(release, two_cpus, monkeypatch):
    package, modules = release
    monkeypatch.setattr(apart, "_hand_back", lambda *args: os._exit(1))
    found, _read = apart.Judging(Tree(package, FACADE), modules, judge).finish()
    assert found == judge_paths(Tree(package, FACADE), modules)


def test_what_the_child_raises_is_raised_here(release, two_cpus):
    package, modules = release
    parent = os.getpid()

    def judged(tree, path, *by_worker):
        if os.getpid() != parent:  # the workers, which both processes judge
            raise SyntaxError("in the child")
        return judge(tree, path, *by_worker)

    with pytest.raises(SyntaxError, match="in the child"):
        apart.Judging(Tree(package, FACADE), modules, judged).finish()


def test_each_piece_is_claimed_once_from_either_end():
    """Two processes' claims, taken in turn from one pipe: one goes from the first piece up, the other from the last
    down, and they stop where the claims run out, so that no piece is taken twice."""
    reader, writer = os.pipe()
    os.write(writer, bytes(5))
    os.close(writer)
    up, down = iter(apart._Claims(reader, range(5))), iter(apart._Claims(reader, range(4, -1, -1)))
    taken = [next(up), next(down), next(down), next(up), next(down)]
    assert next(up, None) is None and next(down, None) is None
    os.close(reader)
    assert taken == [0, 4, 3, 1, 2]


def test_each_call_is_made_once_in_either_process_in_order(two_cpus):
    def square(n):
        time.sleep(0.05)  # long enough for the child to claim some
        return n * n, os.getpid()

    made_by = apart.each_apart([functools.partial(square, n) for n in range(6)])
    assert [square for square, _pid in made_by] == [0, 1, 4, 9, 16, 25]
    assert len({pid for _square, pid in made_by}) == 2 and os.getpid() in {pid for _square, pid in made_by}


def test_what_a_call_in_the_child_raises_is_raised_here(two_cpus):
    parent = os.getpid()

    def call():
        if os.getpid() != parent:
            raise ValueError("rendered there")
        time.sleep(0.2)  # the child claims one meanwhile

    with pytest.raises(ValueError, match="rendered there"):
        apart.each_apart([call, call, call])


def test_a_judging_begun_is_finished_by_judge_tree_once(release, two_cpus, monkeypatch):
    package, modules = release
    texts = {m: (package / m).read_text() for m in modules}
    judged._JUDGED.clear()
    begun = []
    real = apart.Judging.__init__
    monkeypatch.setattr(apart.Judging, "__init__", lambda self, *a: begun.append(1) or real(self, *a))
    judged.begin_tree(package, FACADE, texts, modules)
    judged.begin_tree(package, FACADE, texts, modules)  # begun already: nothing more
    assert len(begun) == 1 and len(judged._BEGUN) == 1 and next(iter(judged._BEGUN.values())).forked.pid
    found = judged.judge_tree(package, FACADE, texts, modules)
    assert not judged._BEGUN and len(begun) == 1
    assert found == judge_paths(judged.Rewritten(package, FACADE, texts), modules, judged.judge_traced)


def test_a_judging_no_one_asks_for_is_ended(release, two_cpus):
    package, modules = release
    judged._JUDGED.clear()
    judged.begin_tree(package, FACADE, {m: (package / m).read_text() for m in modules}, modules)
    child = next(iter(judged._BEGUN.values())).forked.pid
    judged.cancel_begun()
    assert not judged._BEGUN
    with pytest.raises(ChildProcessError):  # killed and reaped
        os.waitpid(child, os.WNOHANG)


def test_a_plan_refused_while_judging_leaves_no_child(tmp_path, two_cpus, monkeypatch):
    scratch = tmp_path / "tree"
    shutil.copytree(pristine_tree("0.5.12") / "sglang", scratch / "sglang")
    worker = scratch / "sglang/srt/speculative/eagle_worker.py"
    text = worker.read_text()  # a class the rules parse, after the judging began (``engine._sources``)
    head = text.index(":\n", text.index("\nclass EAGLEWorker(")) + 2
    worker.write_text(text[:head] + "    def broken(:\n" + text[head:])
    cancelled = []
    real = apart._Forked.cancel
    monkeypatch.setattr(apart._Forked, "cancel", lambda self: cancelled.append(self.pid) or real(self))
    judged._JUDGED.clear()
    with pytest.raises(TargetError, match="eagle_worker.py:.*not valid Python"):
        engine.plan(resolve(str(scratch)), render_changes=False)
    assert not judged._BEGUN and len(cancelled) == 1 and cancelled[0]
    with pytest.raises(ChildProcessError):
        os.waitpid(cancelled[0], os.WNOHANG)


def test_what_this_process_raises_ends_the_child(release, two_cpus, monkeypatch):
    package, modules = release
    parent, cancelled = os.getpid(), []
    real = apart._Forked.cancel
    monkeypatch.setattr(apart._Forked, "cancel", lambda self: cancelled.append(self.pid) or real(self))

    def judged(tree, path, *by_worker):
        if os.getpid() == parent:
            raise KeyError("here")
        return judge(tree, path, *by_worker)

    with pytest.raises(KeyError, match="here"):
        apart.Judging(Tree(package, FACADE), modules, judged).finish()
    assert len(cancelled) == 1 and cancelled[0]
    with pytest.raises(ChildProcessError):
        os.waitpid(cancelled[0], os.WNOHANG)


def test_check_in_two_processes_says_what_one_process_says(release):
    """The CLI as a user runs it (two processes where it may) against one process, on 0.5.12: the same JSON."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU: the tool judges in one process")
    package, _modules = release
    said = {}
    for jobs in ("1", "2"):
        env = {k: v for k, v in os.environ.items() if k != apart.JOBS} | ({apart.JOBS: "1"} if jobs == "1" else {})
        env["SGLANG_DRAFT_LAYOUT_CACHE"] = tempfile.mkdtemp()  # judged, not read back
        run = subprocess.run(
            [sys.executable, "-m", "sglang_draft_layout", "check", "--format", "json", "-v", str(package.parent)],
            env=env, capture_output=True, text=True,
        )  # fmt: skip
        assert run.returncode == 1, run.stderr  # sites to patch
        said[jobs] = run.stdout
    assert said["1"] == said["2"] and '"judged"' in said["1"]


APPLY_WATCHING_FORKS = """
import sys
from sglang_draft_layout import cli
from sglang_draft_layout.harness import apart
real = apart._Forked.__init__
def forked(self, *args):
    print("fork", "libcst" in sys.modules)
    real(self, *args)
apart._Forked.__init__ = forked
apart._two_processes = lambda pieces: 2 <= pieces < 256
print("exit", cli.main(["apply", sys.argv[1]]))
"""


@pytest.mark.parametrize("version", ["0.5.12", "0.5.23"])
def test_apply_imports_libcst_once_before_the_rendering_forks_where_a_helper_is_missing(version, tmp_path):
    """0.5.12 lacks the helpers: libcst is imported after the tree is read, while the child judges it, and the
    processes rendering inherit it; 0.5.23 has them and nothing to render: never imported."""
    tree = tmp_path / "tree"
    shutil.copytree(pristine_tree(version) / "sglang", tree / "sglang")
    env = {**os.environ, "SGLANG_DRAFT_LAYOUT_CACHE": str(tmp_path / "cache")}
    env.pop(apart.JOBS, None)
    run = subprocess.run(
        [sys.executable, "-c", APPLY_WATCHING_FORKS, str(tree)], env=env, capture_output=True, text=True
    )
    said = [line for line in run.stdout.splitlines() if line.startswith(("fork", "exit"))]
    if version == "0.5.12":  # the tree as it is judged, the files rendered, the rewritten tree judged
        assert said == ["fork False", "fork True", "fork True", "exit 0"], run.stderr
    else:
        assert said == ["fork False", "exit 0"], run.stderr

"""A patched 0.5.12 fork merging upstream 0.5.13 with `git merge`, resolved as README's "Upgrading
to upstream 0.5.13 or later" says (docs/sites.md, "Upgrading a patched fork", gives this merge in full).

The repository is built from the release wheels: 0.5.12's files committed as upstream (tag
v0.5.12), upstream's next commit holding 0.5.13's files (tag v0.5.13), and a fork branch from
v0.5.12 with the fork's own edits, patched by `apply` and committed. After `git merge v0.5.13`
the conflicts are docs/sites.md's list; resolved to upstream's side (whole files where the fork changed
nothing else, else hunk by hunk), the fork's own DeepSeek-V4 split (in the multi-step caller, or in
the per-step backend's callee), which now splits a second time, taken out by `apply` (and its split
method with it), and the written test moved by `apply` to
the suite the merge renamed, and a keep comment the merge left on upstream's code reported stale and removed
by `apply`, `check` exits 0 and every file of the package is 0.5.13's; the written test passes there.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from sglang_draft_layout import api
from sglang_draft_layout.fork_tests import HARNESS

from scratch_fork import CPU_TEST, RUN_SUITES, git, make_fork
from support import fork_edits
from support.git_objects import borrow_objects
from support.sglang_release import pristine_tree, require_release

pytestmark = pytest.mark.releases
UPSTREAM = "0.5.13"
PACKAGE = "python/sglang/"
DSV4 = PACKAGE + fork_edits.DSV4
WORKER_V2 = PACKAGE + fork_edits.WORKER_V2
KEEP = "  # sglang-draft-layout: keep"
RUNNER = Path(__file__).with_name("run_on_cpu.py")
#: docs/sites.md's conflicts of a patched fork (one fork's merge): (git status code, path), the same in the real merge
CONFLICTS = {
    ("UU", PACKAGE + "srt/layers/attention/flashinfer_backend.py"),
    ("UU", PACKAGE + "srt/layers/attention/flashinfer_mla_backend.py"),
    ("UU", PACKAGE + "srt/layers/attention/aiter_backend.py"),
    ("UU", DSV4),
    ("UU", PACKAGE + "srt/speculative/eagle_utils.py"),
    ("UU", PACKAGE + "srt/speculative/spec_utils.py"),
    ("UU", WORKER_V2),
    ("UD", PACKAGE + "srt/speculative/eagle_worker.py"),
}


@pytest.fixture(scope="module")
def upstream(tmp_path_factory) -> Path:
    """A repository of upstream: v0.5.12 (a scratch fork's one commit) and v0.5.13 after it, 0.5.13's
    package and test/run_suite.py (upstream main's fixture: its per-commit CPU suite base-a-test-cpu
    is 0.5.13's, which renamed 0.5.12's stage-a-test-cpu)."""
    require_release(UPSTREAM)
    root = make_fork(tmp_path_factory.mktemp("upstream") / "sglang")
    git(root, "tag", "v0.5.12")
    shutil.rmtree(root / "python" / "sglang")
    shutil.copytree(pristine_tree(UPSTREAM) / "sglang", root / "python" / "sglang")
    (root / "python" / "sglang" / "_version.py").unlink(missing_ok=True)
    shutil.copy(RUN_SUITES / "main.py", root / "test" / "run_suite.py")
    borrow_objects(root, UPSTREAM)
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "Release v0.5.13")
    git(root, "tag", "v0.5.13")
    return root


def keep_dsv4_and_worker(python: Path) -> None:
    """The fork keeps two sites by the comment: DSv4's decode (its own strided slice) and the V2
    worker's draft_forward."""
    fork_edits.edit(
        python,
        fork_edits.DSV4,
        fork_edits.DSV4_DECODE,
        (
            "        if forward_batch.forward_mode.is_decode_or_idle():\n"
            "            step, steps = self.speculative_step_id, self.speculative_num_steps\n"
            f"            metadata = self.init_forward_metadata_decode({KEEP}\n"
            "                max_seq_len=max_seq_len,\n"
            "                req_pool_indices=req_pool_indices,\n"
            "                seq_lens=seq_lens,\n"
            "                out_cache_loc=forward_batch.out_cache_loc[step::steps],\n"
            "            )\n"
        ),
    )
    fork_edits.edit(python, fork_edits.WORKER_V2, WORKER_DEF, WORKER_DEF.replace(":\n", f":{KEEP}\n"))


WORKER_DEF = "    def draft_forward(self, forward_batch: ForwardBatch):\n"
#: the fork's own edits before it is patched, by case
FORKS = {
    "plain": None,
    "caller-split": fork_edits.dsv4_caller_split,
    "callee-split": fork_edits.dsv4_callee_split,
    "kept": keep_dsv4_and_worker,
}
#: the forks whose own DSv4 split merges in beside upstream's: `apply` takes it out
SPLITS_AGAIN = {"caller-split", "callee-split"}


def run_git(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["git", "-c", "user.name=fork", "-c", "user.email=fork@example.com", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
    )


def unmerged(fork: Path) -> set[tuple[str, str]]:
    """(status code, path) of each path left unmerged (``git status --porcelain``)."""
    codes = {"DD", "AU", "UD", "UA", "DU", "AA", "UU"}
    return {(line[:2], line[3:]) for line in git(fork, "status", "--porcelain").splitlines() if line[:2] in codes}


def take_upstream_hunks(fork: Path, path: str) -> None:
    """Every conflicting hunk of ``path`` resolved to upstream's side, the fork's other changes kept."""
    for stage, name in ((2, "ours"), (1, "base"), (3, "theirs")):
        (fork / f".merge-{name}").write_text(git(fork, "show", f":{stage}:{path}"))
    merged = run_git(fork, "merge-file", "-p", "--theirs", ".merge-ours", ".merge-base", ".merge-theirs")
    assert merged.returncode == 0, merged.stderr
    (fork / path).write_text(merged.stdout)
    for name in ("ours", "base", "theirs"):
        (fork / f".merge-{name}").unlink()


@pytest.mark.parametrize("case", sorted(FORKS))
def test_git_merge_of_0_5_13_into_a_patched_fork(upstream, tmp_path, case):
    fork = tmp_path / "fork"
    git(tmp_path, "clone", "-q", str(upstream), str(fork))
    git(fork, "checkout", "-q", "-b", "fork", "v0.5.12")
    if FORKS[case] is not None:
        FORKS[case](fork / "python")
        git(fork, "commit", "-q", "-am", "the fork's own change")
    forked = set(git(fork, "diff", "--name-only", "v0.5.12", "HEAD").split())
    assert api.apply(fork).exit_code == 0
    git(fork, "add", "-A")
    git(fork, "commit", "-q", "-m", "Use upstream's multi-step EAGLE draft layout helpers")

    merge = run_git(fork, "merge", "-m", "Merge v0.5.13", "v0.5.13")
    assert merge.returncode == 1 and "Automatic merge failed" in merge.stdout, merge.stdout + merge.stderr
    expected = {
        "kept": CONFLICTS - {("UU", WORKER_V2)},  # its split kept, unpatched
        "callee-split": CONFLICTS - {("UU", DSV4)},  # its own split left by hand: DSv4 merges cleanly
    }.get(case, CONFLICTS)
    assert unmerged(fork) == expected
    if case == "kept":  # the keep comment's own conflict: on DSv4's decode, which upstream restructured
        assert f"init_forward_metadata_decode({KEEP}\n" in (fork / DSV4).read_text().split("=======")[0]
    for _status, path in sorted(expected):
        if path.endswith("/eagle_worker.py"):
            git(fork, "rm", "-q", path)  # upstream deleted it
            continue
        if path in forked:
            take_upstream_hunks(fork, path)
        else:
            git(fork, "checkout", "--theirs", "--", path)
        git(fork, "add", "--", path)

    stale = [(CPU_TEST, "stale")]  # the merge renamed the suites: the written test is stale
    if case in SPLITS_AGAIN:  # merged in silently beside upstream's split: apply takes the fork's out
        report = api.check(fork)
        assert [(i.file, i.state) for i in report.to_do] == [(DSV4, "to patch"), *stale]
        assert "the fork's split taken out, upstream's kept" in report.to_do[0].detail
    if case == "kept":  # merged in silently on upstream's def line, where it keeps nothing: stale, `apply` removes it
        kept_def = WORKER_DEF.replace(":\n", f":{KEEP}\n")
        assert (fork / WORKER_V2).read_text().count(kept_def) == 1
        stale = [(WORKER_V2, "stale"), *stale]
    if case not in SPLITS_AGAIN:
        assert [(i.file, i.state) for i in api.check(fork).to_do] == stale
    assert api.apply(fork).exit_code == 0
    assert api.check(fork).exit_code == 0
    git(fork, "add", "-A")
    git(fork, "commit", "-q", "-m", "Merge v0.5.13")
    assert (
        git(fork, "diff", "--name-only", "v0.5.13", "HEAD", "--", "python") == f"{HARNESS[0]}\n"
    )  # and the test's harness
    assert 'suite="base-a-test-cpu"' in (fork / CPU_TEST).read_text()


def test_the_written_test_passes_on_the_merged_fork(upstream, tmp_path, proof_python):
    """The CPU test a 0.5.12 fork got from `apply`, on 0.5.13's package, as the fork's CI runs it."""
    fork = tmp_path / "fork"
    git(tmp_path, "clone", "-q", str(upstream), str(fork))
    git(fork, "checkout", "-q", "-b", "fork", "v0.5.12")
    assert api.apply(fork).exit_code == 0
    git(fork, "checkout", "-q", "v0.5.13", "--", "python")
    (fork / PACKAGE / "srt/speculative/eagle_worker.py").unlink()  # 0.5.13 has none
    assert api.check(fork).exit_code == 0  # 0.5.13's package, the written test as 0.5.12's suites have it
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONPATH"] = str(fork / "python")
    run = subprocess.run(
        [str(proof_python), str(RUNNER), str(fork / CPU_TEST)],
        cwd=fork,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Ran 5 tests" in run.stderr and "\nOK" in run.stderr

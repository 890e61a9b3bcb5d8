"""The harness's verdicts kept on disk (``verdict_cache``): read back only while every file they came from
hashes the same, on the real 0.5.12 tree."""

from __future__ import annotations

import hashlib
import pickle
import shutil

import pytest

from sglang_draft_layout import engine, verdict_cache
from sglang_draft_layout.harness import apart, judged, paths
from sglang_draft_layout.target import resolve

pytestmark = pytest.mark.releases


@pytest.fixture
def runs(monkeypatch, tmp_path):
    """runs(tree) -> (the plan's findings, how many times the harness has looked for draft paths), the
    process's own memo cleared before each plan; the tool's cache in a folder of this test's. ``runs.given``:
    the files each look had a text in place of."""
    monkeypatch.setenv("SGLANG_DRAFT_LAYOUT_CACHE", str(tmp_path / "cache"))
    counted = []
    real = apart.draft_paths
    monkeypatch.setattr(apart, "draft_paths", lambda tree, modules: counted.append(tree.given) or real(tree, modules))

    def plan(tree):
        judged._JUDGED.clear()
        found = engine.plan(resolve(str(tree)), render_changes=False)
        return [(f.rule.file, f.rule.scope, f.state, f.detail) for f in found.findings], len(counted)

    plan.given = counted
    return plan


def test_a_second_check_reads_the_verdicts_and_a_copy_of_the_tree_shares_them(scratch, runs, tmp_path):
    tree = scratch("0.5.12")
    first, judged = runs(tree)
    assert judged == 2  # the tree as it is, and rewritten in memory
    assert runs(tree) == (first, judged)  # nothing run again
    copy = tmp_path / "elsewhere"
    shutil.copytree(tree, copy)
    assert runs(copy) == (first, judged)


def test_a_file_the_paths_read_from_disk_changed_is_judged_again(scratch, runs, tmp_path):
    tree = scratch("0.5.12")
    base = "srt/layers/attention/base_attn_backend.py"
    _first, judged = runs(tree)
    entries = [pickle.loads(p.read_bytes())[0] for p in (tmp_path / "cache" / "verdicts").iterdir()]
    assert all(base in read for read in entries) and not any(base in given for given in runs.given)
    (tree / "sglang" / base).write_text((tree / "sglang" / base).read_text() + "\n# a fork's comment\n")
    assert runs(tree)[1] == judged + 2


def test_a_module_the_paths_only_looked_for_counts_by_being_there(scratch, runs, tmp_path):
    """A module the tree's imports looked for and did not read (``Tree.has``): its text changing keeps the verdicts;
    its going away does not."""
    tree = scratch("0.5.12")
    looked_for = "jit_kernel/dsv4/__init__.py"  # imported by the DeepSeek-V4 backend, never run
    _first, judged = runs(tree)
    entries = [pickle.loads(p.read_bytes())[0] for p in (tmp_path / "cache" / "verdicts").iterdir()]
    assert all(read[looked_for] is True for read in entries)  # it is there; not hashed
    (tree / "sglang" / looked_for).write_text((tree / "sglang" / looked_for).read_text() + "\n# a fork's comment\n")
    assert runs(tree)[1] == judged
    (tree / "sglang" / looked_for).unlink()
    assert runs(tree)[1] == judged + 2


def test_a_guarded_module_whose_bytes_were_only_searched_counts_by_its_bytes(scratch, runs, tmp_path):
    """A module of the guarded folders that names no draft step (its bytes searched, never decoded: ``Tree.mentions``)
    is judged by its hash: a path may be found in it once it does."""
    tree = scratch("0.5.12")
    scanned = "srt/layers/attention/torch_native_backend.py"
    assert b"speculative_num_steps" not in (tree / "sglang" / scanned).read_bytes()
    _first, judged = runs(tree)
    entries = [pickle.loads(p.read_bytes())[0] for p in (tmp_path / "cache" / "verdicts").iterdir()]
    assert all(isinstance(read[scanned], str) for read in entries)  # hashed
    (tree / "sglang" / scanned).write_text((tree / "sglang" / scanned).read_text() + "\n# a fork's comment\n")
    assert runs(tree)[1] == judged + 2


def test_an_unwritable_cache_is_no_cache(scratch, runs, tmp_path, monkeypatch):
    tree = scratch("0.5.12")  # first: the release's wheel is read from the cache
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("SGLANG_DRAFT_LAYOUT_CACHE", str(blocker))  # its "verdicts" folder cannot be made
    first, judged = runs(tree)
    assert runs(tree) == (first, judged + 2)


def test_the_store_is_the_tools_only_while_a_plan_runs(tmp_path):
    with verdict_cache.in_use(tmp_path):
        assert isinstance(judged.store, verdict_cache.DiskStore)
    assert judged.store is None and paths.draft_paths is apart.draft_paths


def test_a_files_hash_is_none_where_pathlib_sees_no_regular_file(tmp_path):
    """The store hashes what it asks about with ``os`` (most are modules looked for and not found); its answer is
    ``Path.is_file``'s: a hash for a file or a link to one, None for a folder, a missing file, a path through a file,
    a dangling link."""
    (tmp_path / "file.py").write_bytes(b"x = 1\n")
    (tmp_path / "folder").mkdir()
    (tmp_path / "link.py").symlink_to(tmp_path / "file.py")
    (tmp_path / "dangling.py").symlink_to(tmp_path / "gone.py")
    digest = verdict_cache._file_digest
    for relative in ("file.py", "link.py", "folder", "missing.py", "file.py/below.py", "dangling.py"):
        expected = (tmp_path / relative).is_file()
        assert (digest(tmp_path, relative) is not None) is expected, relative
    assert digest(tmp_path, "file.py") == digest(tmp_path, "link.py") == hashlib.sha1(b"x = 1\n").hexdigest()

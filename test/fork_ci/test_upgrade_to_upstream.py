"""A patched 0.5.12 fork merging upstream 0.5.13, resolved as README's "Upgrading to upstream
0.5.13 or later" says: every file the patch touched is merged three-way (`git merge-file`:
the fork's patched file, 0.5.12's, 0.5.13's), conflicts are resolved to upstream's side
(`--theirs`), a file upstream deleted is deleted; then check finds nothing to do."""

from __future__ import annotations

import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from sglang_draft_layout import api, cli
from sglang_draft_layout.releases import release_wheel, unpack_release

from scratch_fork import VERSION
from support.sglang_release import require_release

pytestmark = pytest.mark.releases
UPSTREAM = "0.5.13"


def release_files(version: str) -> dict[str, str]:
    """Every .py file of the sglang==version wheel by its path (``sglang/...``)."""
    with zipfile.ZipFile(release_wheel(version)) as wheel:
        return {name: wheel.read(name).decode() for name in wheel.namelist()
                if name.startswith("sglang/") and name.endswith(".py")}


def merge_file(tmp: Path, ours: str, base: str, theirs: str, *flags: str) -> tuple[int, str]:
    """``git merge-file -p [flags] ours base theirs``: (conflicts, merged text)."""
    for name, text in (("ours", ours), ("base", base), ("theirs", theirs)):
        (tmp / name).write_text(text)
    result = subprocess.run(["git", "merge-file", "-p", *flags, "ours", "base", "theirs"], cwd=tmp,
                            capture_output=True, text=True)
    assert result.returncode >= 0, result.stderr
    return result.returncode, result.stdout


def test_merging_0_5_13_onto_a_patched_fork(fork, tmp_path):
    require_release(UPSTREAM)
    patched = [f.path for f in api.apply(fork).files if not f.new]
    base, upstream = release_files(VERSION), release_files(UPSTREAM)
    conflicts, deleted = {}, []
    for path in patched:
        wheel_path = path.removeprefix("python/")
        if wheel_path not in upstream:  # upstream deleted it: the merge takes the deletion
            deleted.append(wheel_path)
            continue
        ours = (fork / path).read_text()
        conflicts[wheel_path], _ = merge_file(tmp_path, ours, base[wheel_path], upstream[wheel_path])
        _, resolved = merge_file(tmp_path, ours, base[wheel_path], upstream[wheel_path], "--theirs")
        assert resolved == upstream[wheel_path], wheel_path  # upstream's side is upstream's file
    # the hunks README names: the helpers' docstrings, the capacity check (assert_buffer_fits), imports
    assert {path for path, count in conflicts.items() if count} >= {
        "sglang/srt/speculative/eagle_utils.py", "sglang/srt/layers/attention/flashinfer_backend.py",
        "sglang/srt/layers/attention/flashinfer_mla_backend.py"}
    assert deleted == ["sglang/srt/speculative/eagle_worker.py"]

    # the fork after the merge: 0.5.13's package (the resolved files are 0.5.13's), the fork's tests kept
    shutil.rmtree(fork / "python" / "sglang")
    unpack_release(UPSTREAM, fork / "python")
    report = api.check(fork)
    assert report.exit_code == 0, [(i.file, i.scope, i.state) for i in report.to_do]
    assert {i.state for i in report.items if i.kind == api.TEST} == {"present"}
    assert cli.main(["apply", str(fork)]) == 0 and api.diff(fork).patch == ""

"""Faults while `apply` writes a real 0.5.12 tree: signals, a killed process, a full disk, unusual files.

Each case ends with the tree as it was, or exactly the clean patched result (``patched_parts``:
apply on the release as published, UTF-8 with LF line ends) put into the case's form, byte for
byte; with one line saying what happened, and no temp file left. The trees hold the part of the
release the patch reads (``PARTS``), which keeps these tests fast.
"""

from __future__ import annotations

import codecs
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path
from typing import Callable

import pytest

from sglang_draft_layout import cli, engine, transaction
from sglang_draft_layout.rules import RULES
from sglang_draft_layout.target import resolve

pytestmark = pytest.mark.releases

RELEASE = "0.5.12"
SPEC_UTILS = "sglang/srt/speculative/spec_utils.py"
FLASHINFER = "sglang/srt/layers/attention/flashinfer_backend.py"
TEMP = re.compile(r"\.sglang-draft-layout-\w{8}\.tmp$")


#: the part of the release a tree here holds: every file the rules and the structural guard read
PARTS = ("sglang/_version.py", "sglang/srt/speculative", "sglang/srt/layers/attention")


def copy_parts(source: Path, dest: Path) -> Path:
    for part in PARTS:
        (dest / part).parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if (source / part).is_dir() else shutil.copy2)(source / part, dest / part)
    return dest


@pytest.fixture
def tree(pristine, tmp_path) -> Path:
    """A fresh copy of the 0.5.12 files the patch reads (``PARTS``)."""
    return copy_parts(pristine(RELEASE), tmp_path / "tree")


@pytest.fixture(scope="session")
def patched_parts(pristine, tmp_path_factory) -> tuple[Path, list[str]]:
    """Those files of the release patched as published (UTF-8, LF line ends), and the files
    apply writes (relative to the tree, in the order it writes them)."""
    root = copy_parts(pristine(RELEASE), tmp_path_factory.mktemp("clean"))
    changes = engine.apply(resolve(str(root))).changes
    return root, [change.path.relative_to(root).as_posix() for change in changes]


@pytest.fixture
def clean(patched_parts) -> Path:
    """The clean result (``patched_parts``)."""
    return patched_parts[0]


@pytest.fixture
def written(patched_parts) -> list[str]:
    """The files apply writes, in its order."""
    return patched_parts[1]


def snapshot(root: Path) -> dict[str, object]:
    """Every file under ``root`` (hidden ones too): its bytes, or where it links."""
    found: dict[str, object] = {}
    for folder, folders, files in os.walk(root):
        for name in folders + files:
            path = Path(folder) / name
            if path.is_symlink():
                found[str(path.relative_to(root))] = ("link", os.readlink(path))
            elif name in files:
                found[str(path.relative_to(root))] = path.read_bytes()
    return found


def temps(root: Path) -> list[Path]:
    return [path for path in root.rglob("*") if TEMP.search(path.name)]


def run(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# ---- signals -------------------------------------------------------------------------


def signal_at(monkeypatch, point: str, count: int, signum: int) -> list[str]:
    """Send ``signum`` to this process at the ``count``-th ``point`` of the write phase; returns the points seen."""
    seen: list[str] = []

    def hook(at: str, path: Path) -> None:
        seen.append(at)
        if at == point and seen.count(point) == count:
            os.kill(os.getpid(), signum)

    monkeypatch.setattr(transaction, "fault_hook", hook)
    return seen


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_signal_between_files_restores_every_file(tree, monkeypatch, capsys, signum):
    root = tree
    before = snapshot(root)
    signal_at(monkeypatch, "renamed", 3, signum)
    code, out, err = run(capsys, "apply", str(root))
    assert (code, out) == (128 + signum, "")
    assert err == f"interrupted ({signal.Signals(signum).name}): 3 files restored, nothing changed\n"
    assert snapshot(root) == before


def test_a_signal_while_a_file_is_written_waits_for_its_rename_then_restores(tree, monkeypatch, capsys):
    root = tree
    before = snapshot(root)
    seen = signal_at(monkeypatch, "temp written", 1, signal.SIGTERM)
    code, _out, err = run(capsys, "apply", str(root))
    assert (code, err) == (143, "interrupted (SIGTERM): 1 file restored, nothing changed\n")
    assert seen == ["temp written", "renamed", "restoring"]
    assert snapshot(root) == before


def test_without_hard_links_the_originals_are_written_back(tree, monkeypatch, capsys):
    """A filesystem without hard links: no original is kept aside; restoring writes the old bytes."""
    before = snapshot(tree)

    def no_link(source, dest, **kwargs):
        raise PermissionError(1, "Operation not permitted", str(source))

    monkeypatch.setattr(os, "link", no_link)
    signal_at(monkeypatch, "renamed", 2, signal.SIGTERM)
    code, _out, err = run(capsys, "apply", str(tree))
    assert (code, err) == (143, "interrupted (SIGTERM): 2 files restored, nothing changed\n")
    assert snapshot(tree) == before


def test_a_second_signal_does_not_stop_the_restore(tree, monkeypatch, capsys):
    root = tree
    before = snapshot(root)
    seen: list[str] = []

    def hook(at: str, path: Path) -> None:
        seen.append(at)
        if seen.count("renamed") == 4 and at == "renamed":
            os.kill(os.getpid(), signal.SIGTERM)
        if at == "restoring":  # every file put back gets another signal
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(transaction, "fault_hook", hook)
    code, _out, err = run(capsys, "apply", str(root))
    assert (code, err) == (143, "interrupted (SIGTERM): 4 files restored, nothing changed\n")
    assert seen.count("restoring") == 4
    assert snapshot(root) == before


def test_a_signal_after_the_last_rename_keeps_the_tree_patched(tree, clean, written, monkeypatch, capsys):
    root, files = tree, written
    signal_at(monkeypatch, "renamed", len(files), signal.SIGHUP)
    code, _out, err = run(capsys, "apply", str(root))
    assert (code, err) == (129, f"interrupted (SIGHUP): all {len(files)} files already patched\n")
    assert snapshot(root) == snapshot(clean)


def test_a_signal_while_planning_changes_nothing(tree, monkeypatch, capsys):
    root = tree
    before = snapshot(root)
    real_rendered = engine._rendered  # renders one file's new text while planning

    def rendered(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)
        return real_rendered(*args, **kwargs)

    monkeypatch.setattr(engine, "_rendered", rendered)
    code, _out, err = run(capsys, "apply", str(root))
    assert (code, err) == (130, "interrupted (SIGINT): nothing changed\n")
    assert snapshot(root) == before


CHILD = textwrap.dedent(
    """
    import os, signal, sys, time
    from sglang_draft_layout import cli, transaction

    point, count, action = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    seen = []

    def hook(at, path):
        seen.append(at)
        if at != point or seen.count(at) != count:
            return
        if action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        print("ready", flush=True)  # then wait for the parent's signal
        gate = signal.getsignal(signal.SIGTERM)
        for _ in range(3000):
            if gate.pending is not None:
                return
            time.sleep(0.01)

    transaction.fault_hook = hook
    sys.exit(cli.main(["apply", sys.argv[4]]))
"""
)


def child(root: Path, point: str, count: int, action: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, point, str(count), action, str(root)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_from_outside_restores_the_tree_in_one_line(tree, signum):
    """As a CI runner's timeout or ``docker stop`` sends it: from another process, mid-write."""
    root = tree
    before = snapshot(root)
    process = child(root, "renamed", 5, "wait")
    assert process.stdout.readline() == "ready\n"
    process.send_signal(signum)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 128 + signum, err
    assert err == f"interrupted ({signal.Signals(signum).name}): 5 files restored, nothing changed\n"
    assert snapshot(root) == before


def temp_items(report_json: str, root: Path) -> dict[Path, str]:
    """The leftover temp files a JSON report lists, each with its state."""
    sites = json.loads(report_json)["sites"]
    return {root / site["file"]: site["state"] for site in sites if site["kind"] == "temp file"}


def test_after_sigkill_check_names_the_leftovers_and_apply_finishes_and_removes_them(tree, clean, capsys):
    root = tree
    process = child(root, "temp written", 3, "kill")
    process.communicate(timeout=60)
    assert process.returncode == -signal.SIGKILL
    left = temps(root)
    assert len(left) == 4  # the originals of files 1 to 3 kept aside, and file 3's new text
    code, out, _err = run(capsys, "check", "--format", "json", str(root))
    assert code == 1
    assert temp_items(out, root) == {path: "to remove" for path in left}
    code, out, _err = run(capsys, "apply", "--format", "json", str(root))
    assert code == 0
    assert temp_items(out, root) == {path: "removed now" for path in left}
    assert snapshot(root) == snapshot(clean)
    assert run(capsys, "check", str(root))[0] == 0


def test_apply_keeps_a_file_of_the_pattern_that_is_no_version_of_its_neighbour(tree, capsys):
    root = tree
    folder = (root / SPEC_UTILS).parent
    foreign = folder / ".spec_utils.py.sglang-draft-layout-0a1b2c3d.tmp"
    foreign.write_text("my notes\n")
    old_pattern = folder / ".spec_utils.py.0a1b2c3d.tmp"  # not the tool's own pattern
    old_pattern.write_bytes((root / SPEC_UTILS).read_bytes())
    code, out, _err = run(capsys, "check", "--format", "json", str(root))
    assert code == 1
    assert temp_items(out, root) == {foreign: "to remove"}
    code, _out, err = run(capsys, "apply", str(root))
    assert code == 0
    assert err == f"warning: kept {foreign}: not a version of the file beside it; remove it yourself\n"
    assert foreign.read_text() == "my notes\n" and old_pattern.exists()


# ---- a full disk -----------------------------------------------------------------------


def page_rounded(size: int) -> int:
    return -(-size // 4096) * 4096


@pytest.fixture
def small_disk(tmp_path):
    """A folder on a tmpfs of its own (where this test may mount one: root), else None."""
    mount = tmp_path / "disk"
    mount.mkdir()
    mounted = (
        os.geteuid() == 0
        and subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount)], capture_output=True
        ).returncode
        == 0
    )
    yield mount if mounted else None
    if mounted:
        subprocess.run(["umount", str(mount)], check=True)


def test_a_full_disk_restores_every_file_and_names_the_file(tree, clean, written, small_disk):
    """On a tmpfs with room for three new files: the fourth fails, the three are put back by
    renames (which need no room). Without tmpfs (not root), a file-size limit stops the write."""
    files = written
    sizes = [len((clean / f).read_bytes()) for f in files]
    if small_disk is not None:
        root = small_disk / "tree"
        shutil.copytree(tree, root)
        stats = os.statvfs(small_disk)
        room = sum(page_rounded(size) for size in sizes[:3]) + page_rounded(sizes[3]) // 2
        (small_disk / "filler").write_bytes(b"\0" * (stats.f_bavail * stats.f_frsize - room))
        failing, reason, limit = 3, "No space left on device", None
    else:  # the first file larger than every one before it
        root = tree
        failing = next(i for i in range(1, len(sizes)) if sizes[i] > max(sizes[:i]))
        reason, limit = "File too large", max(sizes[:failing])
    before = snapshot(root)
    probe = (
        "import resource, signal, sys\n"
        "from sglang_draft_layout import cli\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        f"if {limit!r}: resource.setrlimit(resource.RLIMIT_FSIZE, ({limit!r}, resource.RLIM_INFINITY))\n"
        f"sys.exit(cli.main(['apply', {str(root)!r}]))\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    restored = f"{failing} file{'s' if failing > 1 else ''} restored"
    assert (result.returncode, result.stderr) == (
        2,
        f"error: {root / files[failing]}: writing: {reason}; {restored}, nothing changed\n",
    )
    assert snapshot(root) == before


# ---- unusual files: byte for byte against the clean result ------------------------------


def kept_lines(old: bytes, new: bytes) -> set[bytes]:
    """Every fifth non-blank line found once in the original and once in the patched file (a line the patch keeps)."""
    old_count, new_count = Counter(old.splitlines(keepends=True)), Counter(new.splitlines(keepends=True))
    once = [line for line in old.splitlines(keepends=True) if line.strip() and old_count[line] == new_count[line] == 1]
    return set(once[::5])


def on_lines(change: Callable[[bytes], bytes]) -> Callable[[bytes, set[bytes]], bytes]:
    return lambda data, chosen: b"".join(
        change(line) if line in chosen else line for line in data.splitlines(keepends=True)
    )


def before_first_definition(data: bytes, _chosen: set[bytes]) -> bytes:
    """A form feed line (a page break) above the first top-level definition: not a line end to Python."""
    at = re.search(rb"\n(class|def|@)", data).start() + 1
    return data[:at] + b"\x0c\n" + data[at:]


COOKIE = "# -*- coding: latin-1 -*-\n# café\n".encode("latin-1")
#: (form, how a file's bytes are put in it); the same is done to the clean result's file
FORMS: dict[str, Callable[[bytes, set[bytes]], bytes]] = {
    "crlf": lambda data, chosen: data.replace(b"\n", b"\r\n"),
    "mixed line ends": on_lines(lambda line: line[:-1] + b"\r\n"),
    "trailing whitespace": on_lines(lambda line: line[:-1] + b" \t \n"),
    "no final newline": lambda data, chosen: data.removesuffix(b"\n"),
    "utf-8 bom": lambda data, chosen: codecs.BOM_UTF8 + data,
    "latin-1 cookie": lambda data, chosen: COOKIE + data,
    "form feed line": before_first_definition,
    "bom, crlf, no final newline": lambda data, chosen: codecs.BOM_UTF8 + data.replace(b"\n", b"\r\n")[:-2],
}


@pytest.mark.parametrize("first", [0, len(FORMS) // 2])
def test_every_byte_outside_the_rewritten_lines_is_kept(tree, clean, written, capsys, first):
    """Each file the patch writes is put in one of FORMS (round robin from ``first``: every form
    on two files over the two runs), patched, and compared with its clean result in that form."""
    root = tree
    forms = list(FORMS)
    expected = snapshot(root)
    for index, relative in enumerate(written):
        into_form = FORMS[forms[(first + index) % len(forms)]]
        old, new = (root / relative).read_bytes(), (clean / relative).read_bytes()
        chosen = kept_lines(old, new)
        (root / relative).write_bytes(into_form(old, chosen))
        expected[relative] = into_form(new, chosen)
        assert expected[relative] != new  # the form shows in every file the patch writes
    code, _out, err = run(capsys, "apply", str(root))
    assert (code, err) == (0, "")
    got = snapshot(root)
    assert [(f, forms[(first + i) % len(forms)]) for i, f in enumerate(written) if got[f] != expected[f]] == []
    assert got == expected
    assert run(capsys, "check", str(root))[0] == 0


def test_an_undecodable_byte_in_a_target_file_is_one_line_and_nothing_written(tree, capsys):
    root = tree
    path = root / FLASHINFER
    lines = path.read_bytes().splitlines(keepends=True)
    lines.insert(5, b"# caf\xe9 (latin-1, in a UTF-8 file)\n")
    path.write_bytes(b"".join(lines))
    before = snapshot(root)
    for command in ("check", "diff", "apply"):
        code, out, err = run(capsys, command, str(root))
        assert (code, out, err) == (2, "", f"error: {path}:6: not valid utf-8 (byte 0xe9); nothing written\n")
    assert snapshot(root) == before


def test_an_undecodable_file_only_the_structural_guard_reads_is_named_too(tree, capsys):
    root = tree
    rule_files = {rule.file for rule in RULES}
    folder = root / "sglang/srt/layers/attention"
    other = next(
        p
        for p in sorted(folder.glob("*.py"))
        if p.relative_to(root / "sglang").as_posix() not in rule_files and p.stat().st_size > 1000
    )
    other.write_bytes(other.read_bytes() + b"\n# \xff\n")
    line = other.read_bytes().count(b"\n")
    before = snapshot(root)
    code, out, err = run(capsys, "apply", str(root))
    assert (code, out, err) == (2, "", f"error: {other}:{line}: not valid utf-8 (byte 0xff); nothing written\n")
    assert snapshot(root) == before


# ---- read-only folders, symlinks -------------------------------------------------------


def test_a_read_only_folder_is_named_as_a_folder(tree, capsys):
    root = tree
    folder = (root / SPEC_UTILS).parent
    folder.chmod(0o555)
    try:
        before = snapshot(root)
        code, out, err = run(capsys, "apply", str(root))
        assert (code, out, err) == (
            2,
            "",
            f"error: {folder}/: read-only folder (holds spec_utils.py); nothing written\n",
        )
        assert snapshot(root) == before
    finally:
        folder.chmod(0o755)


def test_a_failed_rename_and_a_failed_restore_are_named(tree, written, monkeypatch, capsys):
    """The second file's place turns into a folder while its temp file is written: renaming
    fails, and so does putting its original back; the line says the tree is mixed."""
    root = tree
    second = root / written[1]

    def hook(at: str, path: Path) -> None:
        if at == "temp written" and path == second:
            path.unlink()
            (path / "in_the_way").mkdir(parents=True)

    monkeypatch.setattr(transaction, "fault_hook", hook)
    code, _out, err = run(capsys, "apply", str(root))
    assert code == 2
    assert err == (
        f"error: {second}: renaming: Is a directory; then {second}: restoring: Is a directory: "
        "the tree is mixed; fix that and re-run apply\n"
    )


def test_a_symlinked_file_is_patched_where_it_leads_and_stays_a_link(tree, clean, capsys):
    root = tree
    link = root / FLASHINFER
    real = root / "shared" / "flashinfer_backend.py"
    real.parent.mkdir()
    os.replace(link, real)
    link.symlink_to(os.path.relpath(real, link.parent))
    code, _out, err = run(capsys, "apply", str(root))
    assert (code, err) == (0, "")
    assert link.is_symlink() and real.read_bytes() == (clean / FLASHINFER).read_bytes()
    assert temps(root) == []


def test_a_symlinked_folder_is_patched_where_it_leads(tree, clean, capsys):
    root = tree
    folder = root / "sglang/srt/speculative"
    real = root / "elsewhere" / "speculative"
    real.parent.mkdir()
    os.replace(folder, real)
    folder.symlink_to(real, target_is_directory=True)
    code, _out, err = run(capsys, "apply", str(root))
    assert (code, err) == (0, "")
    assert folder.is_symlink()
    assert (real / "spec_utils.py").read_bytes() == (clean / SPEC_UTILS).read_bytes()
    assert temps(root) == []


def test_a_symlink_out_of_the_tree_is_refused(tree, capsys, tmp_path):
    root = tree
    link = root / FLASHINFER
    outside = tmp_path / "outside" / "flashinfer_backend.py"
    outside.parent.mkdir()
    os.replace(link, outside)
    link.symlink_to(outside)
    before, outside_before = snapshot(root), outside.read_bytes()
    code, out, err = run(capsys, "apply", str(root))
    assert (code, out) == (2, "")
    assert err == f"error: {link}: a symlink to {outside}, outside the tree {root}; nothing written\n"
    assert snapshot(root) == before and outside.read_bytes() == outside_before


def test_a_rendered_file_its_rule_finds_unpatched_is_one_line_and_nothing_written(tree, monkeypatch, capsys):
    """The check of the rendered files (``engine._check_rendered``, made while the rewritten tree is judged) finds
    a rule bug: raised once the verdicts are in, the tree untouched."""
    before = snapshot(tree)

    def unsafe(target, rendered, sources, keep=()):
        raise engine.PatchError(f"{rendered[0][0]}: a site is to patch after rewriting (a rule bug); nothing written")

    monkeypatch.setattr(engine, "_check_rendered", unsafe)
    code, out, err = run(capsys, "apply", str(tree))
    assert code == 2 and "after rewriting (a rule bug); nothing written" in err and len(err.splitlines()) == 1
    assert snapshot(tree) == before and not temps(tree)

"""Bad input: a clear one-line error (exit 2) and an untouched tree, or a correct finish."""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from sglang_draft_layout import cli, engine, transaction
from sglang_draft_layout.rules import RULES
from sglang_draft_layout.target import TargetError, resolve
from test_regressed_trees import OWN_SUBCLASS

pytestmark = pytest.mark.releases

FLASHINFER = "sglang/srt/layers/attention/flashinfer_backend.py"


def digest(root: Path) -> str:
    sha = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        sha.update(str(path.relative_to(root)).encode() + path.read_bytes())
    return sha.hexdigest()


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    return err


def test_not_an_sglang_tree(tmp_path, capsys):
    (tmp_path / "setup.py").write_text("")
    assert cli.main(["apply", str(tmp_path)]) == 2
    assert f"{tmp_path}: not in an SGLang tree" in one_line_error(capsys)


def test_no_such_path(tmp_path, capsys):
    assert cli.main(["check", str(tmp_path / "nope")]) == 2
    assert one_line_error(capsys) == f"error: {tmp_path / 'nope'}: no such path"


def test_syntax_error_in_a_target_file(scratch, capsys):
    root = scratch("0.5.12")
    path = root / FLASHINFER
    path.write_text(path.read_text() + "\ndef broken(:\n")
    before = digest(root)
    assert cli.main(["apply", str(root)]) == 2
    assert f"{path}:" in one_line_error(capsys)
    assert digest(root) == before


def test_syntax_error_where_no_draft_path_runs_in_a_file_apply_writes(scratch, capsys):
    """A function no path calls is compiled only when ``apply`` compiles the file it would write whole: the error
    names the tree's line, not the rewrite's."""
    root = scratch("0.5.12")
    path = root / FLASHINFER
    text = path.read_text()
    path.write_text(text + "\n\ndef _fork_helper():\n    return 1 +\n")
    assert cli.main(["check", str(root)]) == 1  # no path runs it
    capsys.readouterr()
    before = digest(root)
    assert cli.main(["apply", str(root)]) == 2
    line = text.count("\n") + 4
    assert one_line_error(capsys) == f"error: {path}:{line}: not valid Python (invalid syntax); nothing written"
    assert digest(root) == before


def test_a_file_that_is_not_valid_python_is_named_before_a_draft_path_refused_in_another(scratch, capsys):
    """A syntax error no path runs into (found compiling the file ``apply`` would write) is what the error names, as
    it was when ``apply`` compiled each file before rendering it, though another file's draft path is refused."""
    root = scratch("0.5.12")
    flashinfer = root / FLASHINFER
    text = flashinfer.read_text()
    flashinfer.write_text(text + "\n\ndef _fork_helper():\n    return 1 +\n")
    triton = root / "sglang/srt/layers/attention/triton_backend.py"
    triton.write_text(triton.read_text() + OWN_SUBCLASS)  # refused: its rows stay one branch wide
    before = digest(root)
    assert cli.main(["apply", str(root)]) == 2
    line = text.count("\n") + 4
    assert one_line_error(capsys) == f"error: {flashinfer}:{line}: not valid Python (invalid syntax); nothing written"
    assert digest(root) == before


def test_a_rewrite_that_does_not_compile_is_a_rule_bug(scratch, capsys, monkeypatch):
    root = scratch("0.5.12")
    real = engine.render
    monkeypatch.setattr(engine, "render", lambda *args: real(*args) + "\nx = (\n")
    before = digest(root)
    assert cli.main(["apply", str(root)]) == 2
    assert "rewriting made invalid Python (" in one_line_error(capsys)
    assert digest(root) == before


def test_read_only_file(scratch, capsys):
    root = scratch("0.5.12")
    path = root / FLASHINFER
    path.chmod(stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
    before = digest(root)
    assert cli.main(["apply", str(root)]) == 2
    assert one_line_error(capsys) == f"error: {path}: read-only; nothing written"
    assert digest(root) == before


def test_unrecognised_site_in_a_real_tree_writes_nothing(scratch, capsys):
    root = scratch("0.5.12")
    path = root / FLASHINFER
    path.write_text(
        path.read_text().replace(
            "(self.speculative_num_steps, max_bs * self.max_context_len)",
            "(self.speculative_num_steps, max_bs * 2 * self.max_context_len)",
        )
    )
    before = digest(root)
    assert cli.main(["apply", str(root)]) == 2
    error = one_line_error(capsys)
    assert FLASHINFER.removeprefix("sglang/") in error
    assert "FlashInferMultiStepDraftBackend.init_cuda_graph_state" in error
    assert digest(root) == before


def test_half_patched_tree_ends_like_a_fully_patched_one(scratch, patched):
    root = scratch("0.5.12")
    target = resolve(str(root))
    half = [rule for index, rule in enumerate(RULES) if index % 2]
    engine.write(engine.plan(target, rules=half).changes)
    assert digest(root) != digest(patched("0.5.12"))
    engine.apply(target)
    assert digest(root) == digest(patched("0.5.12"))


def test_two_applies_at_once_patch_once(scratch, patched):
    root = scratch("0.5.12")
    command = [sys.executable, "-m", "sglang_draft_layout", "apply", str(root)]
    runs = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [run.communicate(timeout=300) + (run.returncode,) for run in runs]
    assert [code for _out, _err, code in results] == [0, 0], results
    assert sorted("nothing to do" in out for out, _err, _code in results) == [False, True]
    assert digest(root) == digest(patched("0.5.12"))


def test_an_apply_holds_its_tree_and_leaves_no_lock_file(scratch, tmp_path, monkeypatch):
    root = scratch("0.5.12")
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))  # where a lock file would go
    target = resolve(str(root))
    with engine.tree_lock(target):
        other = os.open(target.package, os.O_RDONLY)  # what another apply locks
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(other)
    assert list(temp.iterdir()) == []
    assert not list(root.rglob("*.lock"))


def test_failure_while_writing_restores_every_file(scratch, monkeypatch):
    root = scratch("0.5.12")
    before = digest(root)
    real_replace, calls = transaction._replace, []

    def failing_replace(path, data):
        calls.append(path)
        if len(calls) == 4:
            raise OSError(28, "No space left on device", str(path))
        real_replace(path, data)

    monkeypatch.setattr(transaction, "_replace", failing_replace)
    fourth = engine.plan(resolve(str(root))).changes[3].path
    with pytest.raises(
        TargetError,
        match=f"^{re.escape(str(fourth))}: writing: No space left on device; " "3 files restored, nothing changed$",
    ):
        engine.apply(resolve(str(root)))
    assert len(calls) == 4  # three files written, then put back by renaming their originals (kept aside)
    assert digest(root) == before
    assert not list(root.rglob("*.tmp"))


def test_fork_checkout_layout_is_found(scratch):
    root = scratch("0.5.12")
    fork = root.parent / "fork"
    (fork / "python").mkdir(parents=True)
    os.rename(root / "sglang", fork / "python" / "sglang")
    assert resolve(str(fork)).package == fork / "python" / "sglang"
    assert resolve(str(fork)).version == "0.5.12"
    assert resolve(str(fork)).root == fork

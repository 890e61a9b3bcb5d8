"""A fork checkout states no release: it is patched by its code, and `diff` applies at its root."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_draft_layout import __version__, cli
from sglang_draft_layout.target import resolve

#: upstream's test/run_suite.py of the 0.5.12 era (test/fork_ci/fixtures/run_suite/v0.5.12.py says its source)
RUN_SUITE_0_5_12 = Path(__file__).resolve().parents[1] / "fork_ci" / "fixtures" / "run_suite" / "v0.5.12.py"

pytestmark = pytest.mark.releases

#: python/pyproject.toml of a fork since 0.5.7: setuptools-scm decides the version at build time
FORK_PYPROJECT = """[project]
name = "sglang"
dynamic = ["version"]

[tool.setuptools_scm]
root = ".."
"""


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=fork", "-c", "user.email=fork@example.com", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        text=True,
    ).stdout


@pytest.fixture
def fork(pristine, tmp_path) -> Path:
    """A fork checkout of 0.5.12: python/sglang/ without _version.py, a dynamic-version pyproject."""
    root = tmp_path / "my-sglang-fork"
    shutil.copytree(pristine("0.5.12") / "sglang", root / "python" / "sglang")
    (root / "python" / "sglang" / "_version.py").unlink()
    (root / "python" / "pyproject.toml").write_text(FORK_PYPROJECT)
    return root


def sources(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*.py"))}


def run_cli(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sglang_draft_layout", *args], cwd=cwd, capture_output=True, text=True)


def test_fork_without_a_release_is_patched_by_its_code(fork, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")
    assert cli.main(["check", str(fork)]) == 1
    header = capsys.readouterr().out.splitlines()[0]
    assert header == f"SGLang, release not stated, at {fork}"
    assert cli.main(["apply", str(fork)]) == 0
    capsys.readouterr()
    assert cli.main(["check", str(fork)]) == 0


@pytest.mark.parametrize("stated", ["0.0.0.dev0", "0.5.15.post2.dev614+g2e00587c8"])
def test_setuptools_scm_builds_state_no_release(fork, capsys, stated):
    (fork / "python" / "sglang" / "_version.py").write_text(f"__version__ = version = {stated!r}\n")
    target = resolve(str(fork))
    assert target.version is None and stated in target.version_source
    assert cli.main(["check", str(fork)]) == 1
    assert cli.main(["apply", str(fork)]) == 0


@pytest.mark.parametrize("tag", ["v0.5.12", "v0.5.15"])
def test_git_tag_is_shown_not_obeyed(fork, capsys, tag):
    """A 0.5.12-based branch whose nearest tag is newer still needs (and gets) the patch."""
    git(fork, "init", "-q")
    git(fork, "add", "-A")
    git(fork, "commit", "-qm", "fork")
    git(fork, "tag", tag)
    git(fork, "commit", "-q", "--allow-empty", "-m", "fork's own change")
    target = resolve(str(fork))
    assert target.version is None and target.git_describe.startswith(f"{tag}-1-g")  # beside, never the release
    assert cli.main(["check", str(fork)]) == 1
    assert capsys.readouterr().out.startswith(f"SGLang, release not stated (git describe: {target.git_describe}), at ")
    assert cli.main(["apply", str(fork)]) == 0


def test_diff_applies_with_git_apply_at_the_fork_root(fork, tmp_path):
    git(fork, "init", "-q")
    git(fork, "add", "-A")
    git(fork, "commit", "-qm", "fork")
    diff = run_cli(fork, "diff", ".")
    assert diff.returncode == 0, diff.stderr
    assert diff.stdout.startswith("diff --git a/python/sglang/srt/")
    (tmp_path / "p.diff").write_text(diff.stdout)
    git(fork, "apply", "--check", str(tmp_path / "p.diff"))
    git(fork, "apply", str(tmp_path / "p.diff"))
    by_git_apply = sources(fork)
    git(fork, "checkout", "-q", "--", ".")
    assert run_cli(fork, "apply", ".").returncode == 0
    assert sources(fork) == by_git_apply
    assert run_cli(fork, "check", ".").returncode == 0


def test_diff_of_a_package_folder_is_relative_to_it(pristine):
    diff = run_cli(pristine("0.5.12"), "diff", ".")
    assert diff.stdout.startswith("diff --git a/sglang/srt/"), diff.stdout[:200]


def test_black_line_length_of_the_fork(fork):
    assert resolve(str(fork)).line_length == 88
    (fork / "python" / "pyproject.toml").write_text(FORK_PYPROJECT + "\n[tool.black]\nline-length = 120\n")
    assert resolve(str(fork)).line_length == 120


def test_version_flag_prints_the_package_version():
    result = run_cli(Path.cwd(), "--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"sglang-draft-layout {__version__}"


def test_found_from_any_folder_of_the_checkout(fork, capsys, monkeypatch):
    """Like git and black: from a subfolder, the checkout root (tests included) is the target (the
    command run as a user runs it at the root; in this process from the subfolders)."""
    (fork / "test" / "registered").mkdir(parents=True)
    shutil.copy(RUN_SUITE_0_5_12, fork / "test" / "run_suite.py")  # the suite the written test registers to
    from_root = run_cli(fork, "diff", ".")
    assert "+++ b/test/registered/unit/speculative/test_draft_layout.py" in from_root.stdout
    for sub in ("python", "python/sglang/srt/layers", "test/registered"):
        monkeypatch.chdir(fork / sub)
        capsys.readouterr()
        assert cli.main(["diff", "."]) == 0
        assert capsys.readouterr().out == from_root.stdout, sub
        assert cli.main(["check", "--format", "json", "."]) == 1
        assert json.loads(capsys.readouterr().out)["target"]["root"] == str(fork), sub


@pytest.mark.parametrize("columns", [80, 120, 200])
def test_output_on_a_real_fork_fits_the_terminal(fork, capsys, monkeypatch, columns):
    (fork / "test" / "registered").mkdir(parents=True)
    shutil.copy(RUN_SUITE_0_5_12, fork / "test" / "run_suite.py")
    monkeypatch.setenv("COLUMNS", str(columns))
    monkeypatch.chdir(fork / "python")
    for argv in (["check", "."], ["check", "-v", "."], ["apply", "-v", "--gpu-test", "."], ["check", "-v", "."]):
        cli.main(argv)
        lines = capsys.readouterr().out.splitlines()
        assert max(map(len, lines)) <= columns, (argv, [line for line in lines if len(line) > columns])
        if "-v" in argv:  # the full table: every site named, however narrow
            assert all(
                site in "\n".join(lines)
                for site in (
                    "kv_indices capacity check",
                    "per-step kv_indices slice",
                    "CUDA-graph kv_indices row width",
                    "helper definition",
                )
            )
    summary = "3 helpers patched; 17 call sites patched; 3 test files present; 3 call sites not in this release"
    at = max(i for i, line in enumerate(lines) if not line.startswith("  "))  # the summary, wrapped where narrow
    assert " ".join(line.strip() for line in lines[at:]) == summary


#: upstream main's test/run_suite.py (its per-commit CPU suite base-a-test-cpu is 0.5.13's too)
RUN_SUITE_MAIN = RUN_SUITE_0_5_12.with_name("main.py")
CPU_TEST = "test/registered/unit/speculative/test_draft_layout.py"


def test_an_up_to_date_fork_has_nothing_to_write(pristine, tmp_path, capsys):
    """A fork checkout of upstream's fixed code: `check` exits 0 and `apply` writes nothing, the
    written tests included, unless asked for (--tests); once written they are kept up to date."""
    root = tmp_path / "up-to-date-fork"
    shutil.copytree(pristine("0.5.13") / "sglang", root / "python" / "sglang")
    (root / "python" / "pyproject.toml").write_text(FORK_PYPROJECT)
    (root / "test" / "registered").mkdir(parents=True)
    shutil.copy(RUN_SUITE_MAIN, root / "test" / "run_suite.py")
    before = sources(root)
    assert cli.main(["check", "--format", "json", str(root)]) == 0
    assert [s for s in json.loads(capsys.readouterr().out)["sites"] if s["file"].startswith("test/")] == []
    assert cli.main(["apply", str(root)]) == 0
    assert "nothing to do" in capsys.readouterr().out and sources(root) == before
    assert run_cli(root, "diff", "--exit-code", ".").returncode == 0

    assert cli.main(["check", "--tests", str(root)]) == 1
    assert "; 2 test files to write" in capsys.readouterr().out
    assert cli.main(["apply", "--tests", str(root)]) == 0
    assert (root / CPU_TEST).is_file() and capsys.readouterr()
    assert cli.main(["check", "--format", "json", str(root)]) == 0
    assert [s["state"] for s in json.loads(capsys.readouterr().out)["sites"] if s["file"] == CPU_TEST] == ["present"]
    (root / CPU_TEST).write_text((root / CPU_TEST).read_text().replace("est_time=25", "est_time=26"))
    assert cli.main(["check", str(root)]) == 1  # a test written earlier is still refreshed
    assert cli.main(["apply", str(root)]) == 0 and cli.main(["check", str(root)]) == 0

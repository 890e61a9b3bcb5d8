"""cli.py and api.py on hand-made trees (rule_test_support's mimics): output that fits the
terminal, one count, the next step, -v/-q, colour, JSON and GitHub forms, exit codes,
new files with their ``git add``, discovery from subfolders."""

from __future__ import annotations

import dataclasses
import json
import os
import pty
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Optional

import pytest

from rule_test_support import (
    BACKEND_DOC, FLASHINFER, FLASHINFER_MLA, INIT, Tree, backend_header, backend_module, write_bystanders,
)
from sglang_draft_layout import api, cli

ANSI = re.compile(r"\033\[[0-9;]*m")
#: upstream's test/run_suite.py of the 0.5.12 era (test/fork_ci/fixtures/run_suite/v0.5.12.py says its source)
RUN_SUITE_0_5_12 = Path(__file__).resolve().parents[1] / "fork_ci" / "fixtures" / "run_suite" / "v0.5.12.py"
MLA_CLASS = "FlashInferMLAMultiStepDraftBackend"


@pytest.fixture(autouse=True)
def wide_terminal(monkeypatch):
    """A terminal wide enough for tmp paths whole; tests of the width set their own."""
    monkeypatch.setenv("COLUMNS", "300")


@pytest.fixture
def tree(sglang_tree: Tree) -> Tree:
    """Helper modules (to patch), a worker and two draft backends with every site in 0.5.12's form."""
    write_bystanders(sglang_tree, besides="")
    sglang_tree.write(FLASHINFER_MLA, backend_module(MLA_CLASS))
    return sglang_tree


def run(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def report_json(capsys, *argv: str) -> dict:
    code, out, _err = run(capsys, *argv, "--format", "json")
    data = json.loads(out)
    assert data["exit_code"] == code
    return data


@pytest.mark.parametrize("columns", [80, 120, 200])
def test_check_fits_the_terminal_and_ends_with_the_next_step(tree, capsys, monkeypatch, columns):
    monkeypatch.setenv("COLUMNS", str(columns))
    monkeypatch.chdir(tree.root)
    code, out, err = run(capsys, "check", ".")
    lines = out.splitlines()
    assert (code, err) == (1, "")
    assert max(map(len, lines)) <= columns, [line for line in lines if len(line) > columns]
    assert lines[0] == "SGLang 0.5.12 (_version.py), at ."
    assert lines[-2:] == ["next: run", "  sglang-draft-layout apply ."]
    to_do = [site for site in report_json(capsys, "check", str(tree.root))["sites"] if site["needs_action"]]
    assert sum(" to patch " in line or line.endswith(" to patch") for line in lines) == len(to_do) > 5


def test_header_keeps_the_end_of_a_long_root(tree, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "45")
    header = run(capsys, "check", str(tree.root))[1].splitlines()[0]
    assert header == "SGLang 0.5.12 (_version.py), at …" + str(tree.root)[-12:] and len(header) == 45


def test_verbose_lists_every_item_and_quiet_only_the_summary(tree, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    sites = report_json(capsys, "check", str(tree.root))["sites"]
    absent = [s for s in sites if s["state"] == "not in this release"]
    assert absent and len(absent) < len(sites)
    default = run(capsys, "check", str(tree.root))[1]
    verbose = run(capsys, "check", "-v", str(tree.root))[1]
    for site in absent:
        assert f"not in this release  {site['class_method']} " in verbose
        assert site["class_method"] not in default
    assert "helper definition" in verbose and "per-step kv_indices slice" in verbose
    code, quiet, _ = run(capsys, "check", "-q", str(tree.root))
    assert code == 1
    assert quiet.splitlines() == [cli.summary(api.check(tree.root)), "next: run",
                                  f"  sglang-draft-layout apply {tree.root}"]


def test_one_count_in_check_apply_and_after(tree, capsys):
    before = report_json(capsys, "check", str(tree.root))
    applied = report_json(capsys, "apply", str(tree.root))
    after = report_json(capsys, "check", str(tree.root))
    kinds = before["summary"]["kinds"]
    assert kinds == applied["summary"]["kinds"] == after["summary"]["kinds"]
    assert set(kinds) == {"helper", "call site"} and sum(kinds.values()) == len(before["sites"])
    to_patch = before["summary"]["states"]["to patch"]
    assert applied["summary"]["states"]["patched now"] == to_patch
    assert after["summary"]["states"]["patched"] == to_patch + before["summary"]["states"].get("patched", 0)
    states = ", ".join(f"{count} {state}" for state, count in after["summary"]["states"].items())
    assert run(capsys, "check", str(tree.root))[1].splitlines()[-1] == \
        f"3 helpers, {kinds['call site']} call sites: {states}"


def test_summary_wording_is_the_report_counts(tree):
    report = api.check(tree.root)
    kinds, states = report.kinds(), report.states()
    text = cli.summary(report)
    for kind, count in kinds.items():
        assert f"{count} {kind if count == 1 else kind + 's'}" in text
    assert text.endswith(", ".join(f"{count} {state}" for state, count in states.items()))


def test_json_schema(tree, capsys):
    data = report_json(capsys, "check", str(tree.root))
    assert data["schema_version"] == api.SCHEMA_VERSION == 1
    assert data["command"] == "check" and data["exit_code"] == 1
    assert data["next"] == f"sglang-draft-layout apply {tree.root}"
    assert data["target"] == {"root": str(tree.root), "package": str(tree.package), "release": "0.5.12",
                              "release_source": "_version.py", "release_note": "sglang/_version.py"}
    assert data["summary"]["total"] == len(data["sites"]) == sum(data["summary"]["states"].values())
    keys = {"file": str, "line": (int, type(None)), "class_method": str, "kind": str, "site": str, "state": str,
            "detail": str, "upstream": str, "rule": str, "needs_action": bool, "error": bool}
    for site in data["sites"]:
        assert set(site) == set(keys)
        assert all(isinstance(site[key], kind) for key, kind in keys.items()), site
        assert site["upstream"].startswith("PR ")
        assert (tree.root / site["file"]).is_file() or site["state"] == "not in this release"
    [slice_site] = [s for s in data["sites"] if s["rule"] == "step-slice:flashinfer"]
    assert (slice_site["class_method"], slice_site["kind"], slice_site["state"]) == \
        ("FlashInferMultiStepDraftBackend.common_template", "call site", "to patch")


def test_github_annotations(tree, capsys):
    code, out, _ = run(capsys, "check", "--format", "github", str(tree.root))
    sites = api.check(tree.root).to_do
    annotations = [line for line in out.splitlines() if line.startswith("::")]
    assert code == 1 and len(annotations) == len(sites)
    for line, site in zip(annotations, sites):
        assert line.startswith(f"::error file=sglang/{site.file.removeprefix('sglang/')},line={site.line},"
                               "title=sglang-draft-layout::")
        assert f"{site.scope} ({site.site}): to patch; upstream {site.upstream}; run `sglang-draft-layout apply" in line
    assert out.splitlines()[-2:] == [cli.summary(api.check(tree.root)), f"next: sglang-draft-layout apply {tree.root}"]


def test_github_escapes_newlines_and_property_separators():
    assert cli.github_escape("a%b\nc") == "a%25b%0Ac"
    assert cli.github_escape("x:y,z", property_value=True) == "x%3Ay%2Cz"


def test_diff_exits_0_and_exit_code_gives_1_like_git(tree, capsys):
    code, patch, _ = run(capsys, "diff", str(tree.root))
    assert code == 0 and patch.startswith("diff --git a/sglang/srt/")
    assert run(capsys, "diff", "--exit-code", str(tree.root))[:2] == (1, patch)
    assert run(capsys, "apply", "-q", str(tree.root))[0] == 0
    assert run(capsys, "diff", "--exit-code", str(tree.root))[:2] == (0, "")


def test_diff_under_set_e(tree):
    script = f"set -e\n{sys.executable} -m sglang_draft_layout diff {tree.root} > {tree.root}/p.patch\necho done\n"
    result = subprocess.run(["bash", "-c", script], capture_output=True, text=True)
    assert (result.returncode, result.stdout) == (0, "done\n"), result.stderr
    assert (tree.root / "p.patch").read_text().startswith("diff --git ")


def test_apply_lists_files_and_the_fixing_hook_flag(tree, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.chdir(tree.root)
    expected = {f.path for f in api.diff(tree.root).files}
    code, out, _ = run(capsys, "apply", "--exit-non-zero-on-fix", ".")
    assert code == 1
    assert {line.split()[1] for line in out.splitlines() if line.startswith("patched  ")} == expected
    assert out.splitlines()[-1] == f"wrote {len(expected)} files"
    assert run(capsys, "apply", "--exit-non-zero-on-fix", ".")[:2] == \
        (0, f"SGLang 0.5.12 (_version.py), at .\n{cli.summary(api.check(tree.root))}\n"
            "nothing to do: every site already follows upstream\n")


def fork_layout(tmp_path: Path, capsys) -> Tree:
    """A fork checkout: root/python/sglang with the sites, root/test/registered, a git repository."""
    root = tmp_path / "fork"
    fork = Tree(root / "python", capsys)
    write_bystanders(fork, besides="")
    fork.write("test/ci/ci_register.py", '"""Stands in for SGLang\'s register_cpu_ci / register_cuda_ci."""\n')
    (root / "test" / "registered").mkdir(parents=True)
    shutil.copy(RUN_SUITE_0_5_12, root / "test" / "run_suite.py")  # the suites the written tests register to
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    return fork


def test_apply_names_new_files_with_their_git_add(tmp_path, capsys, monkeypatch):
    fork = fork_layout(tmp_path, capsys)
    root = tmp_path / "fork"
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.chdir(root / "python" / "sglang" / "srt")
    code, out, _ = run(capsys, "apply", "--gpu-test", ".")
    lines = out.splitlines()
    new = [line.split()[1] for line in lines if line.startswith("new ")]
    assert code == 0 and len(new) == 2 and all(path.startswith("test/registered/") for path in new)
    assert lines[0] == "SGLang 0.5.12 (_version.py), at ../../.."
    assert max(map(len, lines)) <= 80
    at = lines.index("next: the new files are untracked; add them")
    command = " ".join(line.strip().rstrip("\\").strip() for line in lines[at + 1:])
    assert command == f"git -C ../../.. add {new[0]} {new[1]}"
    subprocess.run(command.split(), check=True)
    staged = subprocess.run(["git", "-C", str(root), "diff", "--cached", "--name-only"], capture_output=True,
                            text=True, check=True).stdout.split()
    assert sorted(staged) == sorted(new)
    assert fork.path("srt/speculative/eagle_worker_v2.py").read_text() != ""


def test_found_upward_from_a_subfolder(tree, capsys, monkeypatch):
    monkeypatch.chdir(tree.package / "srt" / "layers" / "attention")
    data = report_json(capsys, "check", ".")
    assert data["target"]["root"] == str(tree.root) and data["exit_code"] == 1
    assert data["next"] == "sglang-draft-layout apply ."
    assert run(capsys, "check", "-q", "--no-tests", ".")[1].splitlines()[-1] == \
        "  sglang-draft-layout apply --no-tests ."


def test_no_such_path_and_not_a_tree(tmp_path, capsys):
    assert run(capsys, "check", str(tmp_path / "nope")) == (2, "", f"error: {tmp_path / 'nope'}: no such path\n")
    code, _out, err = run(capsys, "check", str(tmp_path))
    assert code == 2 and err.startswith(f"error: {tmp_path}: not in an SGLang tree")


def test_unrecognised_site_exits_2_with_what_to_do(tree, capsys):
    tree.write(FLASHINFER, BACKEND_DOC + backend_header() + f"class FlashInferMultiStepDraftBackend:\n{INIT}")
    code, out, err = run(capsys, "check", str(tree.root))
    assert code == 2
    assert "error: " in err and "FlashInferMultiStepDraftBackend.common_template" in err
    assert out.splitlines()[-2:] == ["next: bring the site(s) above to a form docs/sites.md lists, then run",
                                     f"  sglang-draft-layout check {tree.root}"]
    assert report_json(capsys, "check", str(tree.root))["next"] == f"sglang-draft-layout check {tree.root}"


def test_clean_tree_is_two_lines(tree, capsys):
    api.apply(tree.root)
    code, out, _ = run(capsys, "check", str(tree.root))
    assert code == 0 and len(out.splitlines()) == 2
    assert run(capsys, "check", "-q", str(tree.root))[1].count("\n") == 1


def test_colour_only_on_a_terminal_and_never_with_no_color():
    class Terminal:
        def __init__(self, tty: bool) -> None:
            self.tty = tty

        def isatty(self) -> bool:
            return self.tty

    assert cli.color_wanted(Terminal(True), {}) is True
    assert cli.color_wanted(Terminal(True), {"NO_COLOR": "1"}) is False
    assert cli.color_wanted(Terminal(True), {"NO_COLOR": ""}) is True  # no-color.org: set and not empty
    assert cli.color_wanted(Terminal(False), {}) is False


def _on_a_terminal(argv: list[str], env: dict[str, str]) -> str:
    """Run the CLI with its stdout on a pseudo-terminal; what it printed."""
    primary, secondary = pty.openpty()
    process = subprocess.Popen([sys.executable, "-m", "sglang_draft_layout", *argv], stdout=secondary,
                               stderr=subprocess.DEVNULL, env=env)
    os.close(secondary)
    chunks = []
    while True:
        try:
            chunk = os.read(primary, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    process.wait(timeout=60)
    os.close(primary)
    return b"".join(chunks).decode()


def test_colour_on_a_real_terminal(tree):
    env = dict(os.environ, COLUMNS="120")
    env.pop("NO_COLOR", None)
    coloured = _on_a_terminal(["check", str(tree.root)], env)
    assert "\033[33mto patch" in coloured
    plain = _on_a_terminal(["check", str(tree.root)], dict(env, NO_COLOR="1"))
    assert not ANSI.search(plain) and "to patch" in plain
    assert ANSI.sub("", coloured) == plain


def test_api_options_and_overrides(tmp_path, capsys):
    fork = fork_layout(tmp_path, capsys)
    root = tmp_path / "fork"
    assert api.check(root / "python").kinds()["test"] == 1  # the CPU test; the GPU test only when asked for
    with_tests = api.check(root / "python", gpu_test=True)
    assert with_tests.kinds()["test"] == 2 and with_tests.exit_code == 1
    assert api.check(root, api.Options(gpu_test=True)).kinds() == with_tests.kinds()
    assert "test" not in api.check(root, tests=False).kinds()
    assert api.check(root, api.Options(tests=False)).kinds() == api.check(root, tests=False).kinds()
    applied = api.apply(root, tests=False)
    assert applied.command == "apply" and all(not f.new for f in applied.files) and applied.exit_code == 0
    assert api.check(fork.root.parent, tests=False).exit_code == 0
    with pytest.raises(api.TargetError, match="no such path"):
        api.check(tmp_path / "nope")


def test_summary_and_next_step_wrap_but_are_never_cut(tree, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "40")
    monkeypatch.chdir(tree.root)
    out = run(capsys, "check", "-q", ".")[1]
    summary = cli.summary(api.check(tree.root))
    assert len(summary) > 40 and max(map(len, out.splitlines())) <= 40
    assert " ".join(line.strip() for line in out.splitlines()[:-2]) == summary


def test_a_command_wraps_at_its_arguments_and_still_runs(tmp_path):
    folder = tmp_path / "a folder with spaces"
    command = f"git -C {cli.shlex.quote(str(folder))} add test/registered/unit/speculative/test_draft_layout.py"
    wrapped = cli.wrap_command(command, 30)
    assert len(wrapped.splitlines()) > 1
    assert cli.shlex.split(wrapped.replace("\\\n", "")) == cli.shlex.split(command)


def test_options_give_the_flags_of_the_next_command():
    @dataclasses.dataclass(frozen=True)
    class Grown(api.Options):  # a field of many values, as other options may add
        more: tuple[str, ...] = ()

    assert api.Options().cli_flags() == [] and api.Options(tests=False).cli_flags() == ["--no-tests"]
    assert api.Options(gpu_test=True, cpu_suite="stage-a-test-cpu").cli_flags() == \
        ["--cpu-suite", "stage-a-test-cpu", "--gpu-test"]
    assert Grown(more=("a.py:C.m", "b.py:D.n")).cli_flags() == ["--more", "a.py:C.m", "--more", "b.py:D.n"]
    assert cli._options(cli.parser().parse_args(["apply", "--no-tests", "x"])) == api.Options(tests=False)
    assert cli._options(cli.parser().parse_args(["check", "--tests", "x"])) == api.Options(tests=True)
    assert api.Options(tests=True).cli_flags() == ["--tests"]

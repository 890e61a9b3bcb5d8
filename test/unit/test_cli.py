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
    COMMON_TEMPLATE,
    DRAFT_FORWARD,
    EAGER,
    FLASHINFER,
    FLASHINFER_MLA,
    GRAPH,
    INIT,
    WORKER_V2,
    Tree,
    backend_module,
    worker_module,
    write_bystanders,
)
from sglang_draft_layout import api, cli
from sglang_draft_layout.fork_tests import FORK_TESTS, HARNESS

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
    assert quiet.splitlines() == [
        cli.summary(api.check(tree.root)),
        "next: run",
        f"  sglang-draft-layout apply {tree.root}",
    ]


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
    absent = after["summary"]["by_kind"]["call site"]["not in this release"]
    assert after["summary"]["by_kind"] == {
        "helper": {"patched": 3},
        "call site": {"patched": kinds["call site"] - absent, "not in this release": absent},
    }
    assert run(capsys, "check", str(tree.root))[1].splitlines()[-1] == (
        f"3 helpers patched; {kinds['call site'] - absent} call sites patched; "
        f"{absent} call sites not in this release"
    )


def test_summary_counts_each_kind_apart_and_each_kinds_states_add_up(tree):
    """Helpers and call sites counted apart, each kind's states adding up to its count; the sites a
    release does not have (the rules of other releases) counted last, apart from those it has."""
    report = api.check(tree.root)
    by_kind = report.counts()
    assert {kind: sum(states.values()) for kind, states in by_kind.items()} == report.kinds()
    sites = by_kind["call site"]
    absent = sites["not in this release"]
    assert absent and set(sites) == {"to patch", "not in this release"}
    assert cli.summary(report) == (
        f"3 helpers to patch; {sites['to patch']} call sites to patch; {absent} call sites not in this release"
    )
    kept = cli.summary(
        api.check(tree.root, keep=(f"srt/layers/attention/flashinfer_mla_backend.py:{MLA_CLASS}.common_template",))
    )
    # each kind's states add up to its count (the keep names a method of two sites)
    assert f"; {sites['to patch']} call sites: {sites['to patch'] - 2} to patch, 2 kept by the fork; " in kept
    for part in kept.split("; "):
        count, rest = part.split(" ", 1)
        if ": " in rest:
            assert int(count) == sum(int(each.split(" ", 1)[0]) for each in rest.split(": ", 1)[1].split(", "))


def test_json_schema(tree, capsys):
    data = report_json(capsys, "check", str(tree.root))
    assert data["schema_version"] == api.SCHEMA_VERSION == 1
    assert data["command"] == "check" and data["exit_code"] == 1
    assert data["next"] == f"sglang-draft-layout apply {tree.root}"
    assert data["target"] == {
        "root": str(tree.root),
        "package": str(tree.package),
        "release": "0.5.12",
        "release_source": "_version.py",
        "release_note": "sglang/_version.py",
        "git_describe": None,
    }
    assert data["summary"]["total"] == len(data["sites"]) == sum(data["summary"]["states"].values())
    keys = {
        "file": str,
        "line": (int, type(None)),
        "class_method": str,
        "kind": str,
        "site": str,
        "state": str,
        "detail": str,
        "upstream": str,
        "rule": str,
        "needs_action": bool,
        "error": bool,
        "judged": str,
    }
    for site in data["sites"]:
        assert set(site) == set(keys)
        assert all(isinstance(site[key], kind) for key, kind in keys.items()), site
        assert site["upstream"].startswith("PR ")
        assert (tree.root / site["file"]).is_file() or site["state"] == "not in this release"
    [slice_site] = [s for s in data["sites"] if s["rule"] == "step-slice:flashinfer"]
    assert (slice_site["class_method"], slice_site["kind"], slice_site["state"]) == (
        "FlashInferMultiStepDraftBackend.common_template",
        "call site",
        "to patch",
    )


def annotations_of(out: str) -> tuple[list[str], list[str]]:
    """The ``::error`` and the ``::notice`` lines of ``--format github``'s output."""
    lines = out.splitlines()
    return [line for line in lines if line.startswith("::error ")], [
        line for line in lines if line.startswith("::notice ")
    ]


def test_github_annotations(tree, capsys):
    """One ``::error`` per item to act on, at most 10 (GitHub drops a step's 11th on), the rest
    named in one ``::notice``."""
    code, out, _ = run(capsys, "check", "--format", "github", str(tree.root))
    sites = api.check(tree.root).to_do
    errors, notices = annotations_of(out)
    assert code == 1 and len(sites) > cli.GITHUB_ERRORS == 10 and len(errors) == 10
    for line, site in zip(errors, sites):
        assert line.startswith(
            f"::error file=sglang/{site.file.removeprefix('sglang/')},line={site.line}," "title=sglang-draft-layout::"
        )
        assert f"{site.scope} ({site.site}): to patch; upstream {site.upstream}; run `sglang-draft-layout apply" in line
    rest = sites[10:]
    assert notices == [
        f"::notice title=sglang-draft-layout::{len(rest)} more items to act on, not annotated (GitHub shows 10 "
        "errors a step): " + ", ".join(f"{site.file}:{site.line} {site.scope} (to patch)" for site in rest)
    ]
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


def test_diff_on_a_refused_tree_exits_2_printing_no_patch(refused, capsys):
    """As ``diff --help`` says: nothing on stdout (no partial patch to apply), the errors on stderr."""
    code, out, err = run(capsys, "diff", str(refused.root))
    assert (code, out) == (2, "") and err.count("error: ") == len(api.check(refused.root).errors) == 2
    assert run(capsys, "diff", "--exit-code", str(refused.root))[:2] == (2, "")
    diff_help = cli.parser()._subparsers._group_actions[0].choices["diff"].format_help()
    assert "2 with nothing printed when a site no rule knows" in " ".join(diff_help.split())


def test_apply_lists_files_and_the_fixing_hook_flag(tree, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.chdir(tree.root)
    expected = {f.path for f in api.diff(tree.root).files}
    code, out, _ = run(capsys, "apply", "--exit-non-zero-on-fix", ".")
    assert code == 1
    assert {line.split()[1] for line in out.splitlines() if line.startswith("patched  ")} == expected
    assert out.splitlines()[-1] == f"wrote {len(expected)} files"
    assert run(capsys, "apply", "--exit-non-zero-on-fix", ".")[:2] == (
        0,
        f"SGLang 0.5.12 (_version.py), at .\n{cli.summary(api.check(tree.root))}\n"
        "nothing to do: every site already follows upstream\n",
    )


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


def git(root: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def test_apply_prints_the_git_add_of_every_file_it_wrote(tmp_path, capsys, monkeypatch):
    """The printed command stages the patched files and the new ones, and nothing else (the
    README's recipe commits what it stages)."""
    fork_layout(tmp_path, capsys)
    root = tmp_path / "fork"
    git(root, "add", "-A")
    git(root, "commit", "-qm", "fork")
    (root / "notes.txt").write_text("the maintainer's own untracked file\n")
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.chdir(root / "python" / "sglang" / "srt")
    code, out, _ = run(capsys, "apply", "--gpu-test", ".")
    lines = out.splitlines()
    new = [line.split()[1] for line in lines if line.startswith("new ")]
    patched = [line.split()[1] for line in lines if line.startswith("patched ")]
    assert code == 0 and new == [HARNESS[0], *(path for path, _template, _what in FORK_TESTS)]
    assert len(patched) == 4 and f"wrote {len(patched) + 3} files (3 new)" in lines
    lead = "SGLang 0.5.12 (_version.py), at "  # the root above: absolute (cut from the left to fit), not ../../..
    assert lines[0] == lead + cli.fit_left(str(root), 80 - len(lead)) and lines[0].endswith(f"/{root.name}")
    assert max(map(len, lines)) <= 80
    at = lines.index("next: review, then stage exactly the files written, and commit")
    command = " ".join(line.strip().rstrip("\\").strip() for line in lines[at + 1 :])
    assert command == f"git -C ../../.. add {' '.join(patched + new)}"  # a command to run from here: short
    subprocess.run(command.split(), check=True)
    assert sorted(git(root, "diff", "--cached", "--name-only").split()) == sorted(patched + new)
    assert git(root, "diff", "--name-only") == ""  # nothing written is left unstaged
    assert git(root, "status", "--porcelain").splitlines()[-1] == "?? notes.txt"  # and nothing else staged


def test_apply_outside_git_prints_no_git_add(tree, capsys):
    code, out, _ = run(capsys, "apply", str(tree.root))
    assert code == 0 and "git add" not in out and out.splitlines()[-1].startswith("wrote ")


def test_header_states_the_release_from_the_forks_own_files(tmp_path, capsys, monkeypatch):
    """python/pyproject.toml's version, then _version.py (here a stale build's); git describe only
    beside it, and never as the release (a fork's main may be thousands of commits past that tag)."""
    fork_layout(tmp_path, capsys)
    root = tmp_path / "fork"
    monkeypatch.chdir(root)
    (root / "python" / "sglang" / "_version.py").write_text("__version__ = version = '0.5.9'\n")
    (root / "python" / "pyproject.toml").write_text(
        '[project]\nname = "sglang"\nversion = "0.5.12.post1"\n\n' '[tool.other]\nversion = "9.9"\n'
    )
    git(root, "add", "-A")
    git(root, "commit", "-qm", "fork")
    git(root, "tag", "v0.5.6.post2")
    git(root, "commit", "-q", "--allow-empty", "-m", "the fork's own change")
    described = git(root, "describe", "--tags").strip()
    assert described.startswith("v0.5.6.post2-1-g")
    assert run(capsys, "check", ".")[1].splitlines()[0] == "SGLang 0.5.12.post1 (pyproject), at ."
    assert (
        run(capsys, "check", "-v", ".")[1].splitlines()[1]
        == f"  release read from python/pyproject.toml; git describe: {described}"
    )
    (root / "python" / "pyproject.toml").write_text('[project]\nname = "sglang"\ndynamic = ["version"]\n')
    assert run(capsys, "check", ".")[1].splitlines()[0] == "SGLang 0.5.9 (_version.py), at ."
    (root / "python" / "sglang" / "_version.py").unlink()
    assert (
        run(capsys, "check", ".")[1].splitlines()[0] == f"SGLang, release not stated (git describe: {described}), at ."
    )
    target = report_json(capsys, "check", ".")["target"]
    assert (target["release"], target["release_source"], target["git_describe"]) == (None, "none", described)


def test_found_upward_from_a_subfolder(tree, capsys, monkeypatch):
    monkeypatch.chdir(tree.package / "srt" / "layers" / "attention")
    assert run(capsys, "check", ".")[1].splitlines()[0] == f"SGLang 0.5.12 (_version.py), at {tree.root}"
    monkeypatch.chdir(tree.root.parent)  # the root below the working folder: as the user would name it
    assert (
        run(capsys, "check", tree.root.name)[1].splitlines()[0] == f"SGLang 0.5.12 (_version.py), at {tree.root.name}"
    )
    monkeypatch.chdir(tree.package / "srt" / "layers" / "attention")
    data = report_json(capsys, "check", ".")
    assert data["target"]["root"] == str(tree.root) and data["exit_code"] == 1
    assert data["next"] == "sglang-draft-layout apply ."
    assert (
        run(capsys, "check", "-q", "--no-tests", ".")[1].splitlines()[-1] == "  sglang-draft-layout apply --no-tests ."
    )


def test_a_tree_inside_a_fork_checkouts_folder_is_its_own(tree, capsys, monkeypatch):
    """A copy of a tree kept in a fork checkout's folder (or a vendored one) is the tree named, not the checkout's."""
    checkout = tree.root.parent / "checkout"
    (checkout / "python").mkdir(parents=True)
    shutil.copytree(tree.package, checkout / "python" / "sglang")
    copy = checkout / "scratch" / "sglang"
    shutil.copytree(tree.package, copy)
    monkeypatch.chdir(checkout)
    for named in ("scratch", "scratch/sglang", "scratch/sglang/srt/layers"):
        assert report_json(capsys, "check", named)["target"]["package"] == str(copy), named
    for named in (".", "python", "python/sglang/srt"):
        assert report_json(capsys, "check", named)["target"]["package"] == str(checkout / "python" / "sglang"), named


def test_no_such_path_and_not_a_tree(tmp_path, capsys):
    assert run(capsys, "check", str(tmp_path / "nope")) == (2, "", f"error: {tmp_path / 'nope'}: no such path\n")
    code, _out, err = run(capsys, "check", str(tmp_path))
    assert code == 2 and err.startswith(f"error: {tmp_path}: not in an SGLang tree")


@pytest.mark.parametrize("command", ["check", "diff", "apply"])
def test_a_file_as_target_is_refused_in_one_line(tree, capsys, command):
    before = tree.snapshot()
    named = tree.path("srt/speculative/spec_utils.py")
    assert run(capsys, command, str(named)) == (
        2,
        "",
        f"error: {named}: a file, not a folder (TARGET names the tree, which is patched whole: "
        f"e.g. {named.parent})\n",
    )
    assert tree.snapshot() == before
    with pytest.raises(api.TargetError, match="a file, not a folder"):
        api.check(named)


@pytest.mark.parametrize("below", ["vendor", "third_party/sglang"])
def test_a_tree_vendored_below_the_folder_is_named_with_the_command_to_run(tmp_path, capsys, monkeypatch, below):
    repository = tmp_path / "product"
    Tree(repository / below / "python", capsys)  # a fork checkout at product/<below>/ (its python/sglang)
    (repository / "docs").mkdir()
    monkeypatch.chdir(repository)
    code, out, err = run(capsys, "apply", "--no-tests", ".")
    assert (code, out) == (2, "")
    assert (
        err == f"error: {repository}: not in an SGLang tree; one is below it: {below}; run: "
        f"sglang-draft-layout apply --no-tests {below}\n"
    )
    command = err.split("run: ", 1)[1].split()
    assert run(capsys, *command[1:])[0] == 0  # the command as printed patches the vendored tree
    assert run(capsys, "check", below)[0] == 0


def test_two_vendored_trees_are_both_named(tmp_path, capsys):
    for name in ("a", "b"):
        Tree(tmp_path / name, capsys)
    err = run(capsys, "check", str(tmp_path))[2]
    assert (
        err == f"error: {tmp_path}: not in an SGLang tree; these are below it: a, b; run: "
        f"sglang-draft-layout check {tmp_path / 'a'}\n"
    )


@pytest.fixture
def refused(tree: Tree) -> Tree:
    """The tree with FlashInfer's per-step slice in a form no rule knows (and so its capacity check,
    anchored there): two refused sites of one method; its other sites to patch."""
    foreign = COMMON_TEMPLATE.replace("seq_lens_sum * self.topk + bs", "seq_lens_sum * self.topk * 2 + bs")
    tree.write(FLASHINFER, backend_module("FlashInferMultiStepDraftBackend", INIT, foreign, EAGER, GRAPH))
    return tree


KEEP_ADVICE = re.compile(
    r"keep the fork's code \(`# sglang-draft-layout: keep` at the end of (that|each|this) line or alone on the line before it, or "
    r"`--keep srt/layers/attention/flashinfer_backend.py:FlashInferMultiStepDraftBackend\."
    r"common_template`\) or rewrite it to a form docs/sites.md lists"
)


def joined(text: str) -> list[str]:
    """Wrapped lines joined back: each line starting with no indent begins an entry."""
    entries: list[str] = []
    for line in text.splitlines():
        if line.startswith("  ") and entries:
            entries[-1] += " " + line.strip()
        else:
            entries.append(line)
    return entries


@pytest.mark.parametrize("quiet", [False, True])
def test_refused_tree_has_one_next_step_on_stdout_and_stderr(refused, capsys, quiet):
    errors = api.check(refused.root).errors
    code, out, err = run(capsys, "check", *(["-q"] if quiet else []), str(refused.root))
    assert code == 2 and len(errors) == 2
    lines = [line for line in joined(err)]
    assert len(lines) == len(errors)
    for line, item in zip(lines, errors):
        assert line.startswith(f"error: {refused.root / item.file}:{item.line}: {item.scope}: {item.site}: ")
        assert KEEP_ADVICE.search(line) and KEEP_ADVICE.search(line).group(1) == "that"
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("next: "))
    advice, command = " ".join(line.strip() for line in lines[at:-1]), lines[-1].strip()
    assert advice.startswith("next: " + ", ".join(f"{item.file}:{item.line}" for item in errors) + ": ")
    assert KEEP_ADVICE.search(advice).group(1) == "each" and advice.endswith("; then run")
    assert "above" not in out and "bring" not in out + err
    assert command == f"sglang-draft-layout check {refused.root}"
    assert report_json(capsys, "check", str(refused.root))["next"] == f"sglang-draft-layout check {refused.root}"


def test_the_keep_the_advice_names_works_and_apply_then_patches_the_rest(refused, capsys):
    [keep] = set(re.findall(r"`(--keep \S+)`", run(capsys, "check", str(refused.root))[2]))
    code, out, err = run(capsys, "check", *keep.split(), str(refused.root))
    assert (code, err) == (1, "")
    assert out.splitlines()[-2:] == ["next: run", f"  sglang-draft-layout apply {keep} {refused.root}"]
    assert sum(line.startswith("  ") and "kept by the fork" in line for line in out.splitlines()) == 2  # without -v
    assert run(capsys, "apply", *keep.split(), str(refused.root))[0] == 0
    code, out, err = run(capsys, "check", *keep.split(), str(refused.root))
    assert (code, err) == (0, "") and "next:" not in out and "kept by the fork" in out


def test_apply_on_a_refused_tree_names_every_site_as_check_does(refused, capsys):
    before = refused.snapshot()
    check_err = run(capsys, "check", str(refused.root))[2]
    code, out, err = run(capsys, "apply", str(refused.root))
    assert (code, out) == (2, "")
    assert joined(err) == [line + "; nothing written" for line in joined(check_err)]
    data = report_json(capsys, "apply", str(refused.root))
    assert (data["exit_code"], data["files"], data["next"]) == (2, [], f"sglang-draft-layout check {refused.root}")
    assert [s["line"] for s in data["sites"] if s["error"]] == [item.line for item in api.check(refused.root).errors]
    assert refused.snapshot() == before
    with pytest.raises(api.TargetError, match="nothing written"):
        api.apply(refused.root)


def test_stderr_is_wrapped_to_the_terminal_only(refused, capsys, monkeypatch):
    """On a terminal (``COLUMNS`` wins) each error is wrapped, a `quoted` span whole; off one (a CI
    log, a pipe, a file) each error is one line however wide ``COLUMNS`` says the screen is."""
    monkeypatch.setenv("COLUMNS", "70")
    unwrapped = run(capsys, "check", str(refused.root))[2]
    assert len(unwrapped.splitlines()) == len(api.check(refused.root).errors) == 2
    assert all(line.startswith("error: ") and len(line) > 70 for line in unwrapped.splitlines())
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    err = run(capsys, "check", str(refused.root))[2]
    for line in err.splitlines():  # wider only where one word (a path, a `--keep ...` to copy) is wider
        assert len(line) <= 70 or " " not in re.sub(r"`[^`]*`", "word", line.strip()), line
    assert len(err.splitlines()) > 2 * 2
    assert "`# sglang-draft-layout: keep`" in err  # the comment to copy is never broken
    assert joined(err) == unwrapped.splitlines()


def _stderr_of(argv: list[str], env: dict[str, str], terminal: bool) -> str:
    """What the CLI printed on stderr, that being a pseudo-terminal or a pipe."""
    if not terminal:
        command = [sys.executable, "-m", "sglang_draft_layout", *argv]
        return subprocess.run(command, capture_output=True, text=True, env=env, timeout=120).stderr
    return _on_a_terminal(argv, env, stream="stderr").replace("\r\n", "\n")


def test_the_program_prints_what_main_prints_and_exits_with_its_code(tree):
    """``python -m sglang_draft_layout`` (``cli.console``, as the console script) ends the process without
    tearing it down: its output is flushed first, whole, and a reader that leaves early costs no traceback."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    main = f"import sys; from sglang_draft_layout import cli; sys.exit(cli.main(['check', {str(tree.root)!r}]))"
    by_main = subprocess.run([sys.executable, "-c", main], capture_output=True, text=True, env=env, timeout=120)
    command = [sys.executable, "-m", "sglang_draft_layout", "check", str(tree.root)]
    program = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    assert (program.returncode, program.stdout, program.stderr) == (by_main.returncode, by_main.stdout, by_main.stderr)
    assert program.returncode == 2 and program.stdout.count("\n") > 10 and program.stderr.startswith("error: ")
    reader = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    reader.stdout.close()  # gone before the first line
    assert reader.wait(timeout=120) == 1 and b"Traceback" not in reader.stderr.read()  # main's BrokenPipeError


def test_errors_on_a_real_terminal_are_wrapped_and_in_a_pipe_are_one_line_each(refused):
    env = dict(os.environ, COLUMNS="80", PYTHONPATH=os.pathsep.join(sys.path))
    piped = _stderr_of(["check", str(refused.root)], env, terminal=False).splitlines()
    # one line per error (the separate process judges the mimic's draft paths too: more errors)
    assert len(piped) >= 2 and all(line.startswith("error: ") and len(line) > 80 for line in piped)
    on_terminal = _stderr_of(["check", str(refused.root)], env, terminal=True)
    assert len(on_terminal.splitlines()) > len(piped) and joined(on_terminal) == piped
    assert all(len(line) <= 80 or " " not in re.sub(r"`[^`]*`", "w", line.strip()) for line in on_terminal.splitlines())


def test_github_annotations_on_a_refused_tree_name_the_refusal(refused, capsys):
    code, out, _ = run(capsys, "check", "--format", "github", str(refused.root))
    report = api.check(refused.root)
    annotations, notices = annotations_of(out)
    acted_on = [item for item in report.items if item.needs_action or item.error]
    assert code == 2 and len(acted_on) > 10 and len(annotations) == 10 and len(notices) == 1
    assert not [line for line in annotations if "run `" in line]
    where = ", ".join(f"{item.file}:{item.line}" for item in report.errors)
    for line in annotations:
        if "unrecognised" in line:
            assert "; no rule knows this form: " in line and KEEP_ADVICE.search(line).group(1) == "this"
        else:
            assert line.endswith(
                f"; `sglang-draft-layout apply {refused.root}` refuses the tree until the 2 sites "
                f"no rule knows ({where}) are kept or rewritten"
            )
    assert out.splitlines()[-1].startswith(f"next: {where}: keep the fork's code")
    assert out.splitlines()[-1].endswith(f"; then run `sglang-draft-layout check {refused.root}`")


def test_github_annotates_the_refusals_first_however_many_sites_come_before_them(tree, capsys):
    """The site that blocks ``apply`` is the first ``::error`` line, even where the report lists
    more than 10 items to act on before it (the V2 worker, listed last); the others past the 10th
    are named in the one notice."""
    foreign = DRAFT_FORWARD.replace("permute((2, 0, 1))", "permute((1, 0, 2))")
    tree.write(WORKER_V2, worker_module("EagleDraftWorker", foreign))
    report = api.check(tree.root)
    acted_on = [item for item in report.items if item.needs_action or item.error]
    [refusal] = report.errors
    assert acted_on.index(refusal) >= 10  # a report-ordered cut at 10 would hide it
    out = run(capsys, "check", "--format", "github", str(tree.root))[1]
    errors, [notice] = annotations_of(out)
    assert len(errors) == 10 and errors[0].startswith(
        f"::error file=sglang/srt/speculative/eagle_worker_v2.py,line={refusal.line},"
    )
    assert "no rule knows this form" in errors[0] and not any("no rule knows this form" in e for e in errors[1:])
    shown = cli.github_annotated(report)
    assert shown[0] == refusal and set(shown) == set(acted_on)
    assert notice.startswith(f"::notice title=sglang-draft-layout::{len(acted_on) - 10} more items to act on, ")
    assert all(f"{item.file}:{item.line} {item.scope} (to patch)" in notice for item in shown[10:])


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


def _on_a_terminal(argv: list[str], env: dict[str, str], stream: str = "stdout") -> str:
    """Run the CLI with its ``stream`` (stdout or stderr) on a pseudo-terminal, the other discarded; what it printed."""
    primary, secondary = pty.openpty()
    streams = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, stream: secondary}
    process = subprocess.Popen([sys.executable, "-m", "sglang_draft_layout", *argv], env=env, **streams)
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
    process.wait(timeout=120)
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
    assert api.check(root / "python").kinds()["test"] == 2  # the CPU test, its harness; the GPU test when asked for
    with_tests = api.check(root / "python", gpu_test=True)
    assert with_tests.kinds()["test"] == 3 and with_tests.exit_code == 1
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
    assert api.Options(gpu_test=True, cpu_suite="stage-a-test-cpu").cli_flags() == [
        "--cpu-suite",
        "stage-a-test-cpu",
        "--gpu-test",
    ]
    assert Grown(more=("a.py:C.m", "b.py:D.n")).cli_flags() == ["--more", "a.py:C.m", "--more", "b.py:D.n"]
    assert cli._options(cli.parser().parse_args(["apply", "--no-tests", "x"])) == api.Options(tests=False)
    assert cli._options(cli.parser().parse_args(["check", "--tests", "x"])) == api.Options(tests=True)
    assert api.Options(tests=True).cli_flags() == ["--tests"]

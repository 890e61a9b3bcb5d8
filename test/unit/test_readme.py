"""README.md stays true to the code: at most 150 lines in the order a maintainer reads them, its
first two commands (the install-and-demo and the test run .ci/run calls), the exit codes it gives,
the summary and site count it quotes for 0.5.12 (the tool's own, on the release), the pre-commit
snippet's hook ids and rev (a commit; the snippet itself runs in
test/fork_ci/test_precommit_hook.py), and every option it names; docs/reference.md's Python API
snippet (run on a refused tree and on one to patch) and options too."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from rule_test_support import COMMON_TEMPLATE, EAGER, FLASHINFER, GRAPH, INIT, backend_module, write_bystanders
from sglang_draft_layout import api, cli

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
REFERENCE = (REPO / "docs" / "reference.md").read_text()


def commands(text: str = README) -> list[str]:
    """The indented command lines (4 spaces, outside fenced blocks), in order."""
    found, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("    ") and line.strip() and not line.startswith("     "):
            found.append(line.strip())
    return found


def test_readme_is_short_and_in_the_order_a_maintainer_reads():
    assert len(README.splitlines()) <= 150
    sections = [line[3:] for line in README.splitlines() if line.startswith("## ")]
    assert sections == [
        "What it fixes",
        "Do I need it?",
        "Install and run",
        "Keeping a fork patched",
        "Upgrading to upstream 0.5.13 or later",
        "Reverting",
        "Limits",
        "More",
    ]
    fixes = README[README.index("## What it fixes") : README.index("## Do I need it?")]
    assert "```diff\n" in fixes and len(fixes.split("```diff\n")[1].split("```")[0].splitlines()) <= 10
    assert commands()[2:5] == [
        "sglang-draft-layout check .                         # each site to patch, a summary, the next command",
        "sglang-draft-layout diff . > ../draft-layout.patch  # the patch as a git diff; writes nothing",
        "sglang-draft-layout apply .                         # every file or none; prints the `git add` to run",
    ]


@pytest.mark.releases
def test_the_before_and_after_is_a_real_site_as_apply_writes_it(tmp_path):
    """The README's diff is lines of 0.5.12's FlashInfer CUDA-graph row and of the patch of it."""
    from support.sglang_release import require_release, scratch_tree

    require_release("0.5.12")
    fixes = README[README.index("```diff\n") + len("```diff\n") :]
    shown = fixes[: fixes.index("```")].splitlines()
    patch = api.diff(scratch_tree("0.5.12", tmp_path)).patch.splitlines()
    assert any(patch[start : start + len(shown)] == shown for start in range(len(patch))), shown
    assert "-            (self.speculative_num_steps, max_bs * self.max_context_len)," in shown


@pytest.mark.releases
def test_the_summary_and_site_count_it_quotes_are_the_tools_on_0_5_12():
    from support.sglang_release import pristine_tree, require_release

    require_release("0.5.12")
    report = api.check(pristine_tree("0.5.12"))
    assert f"`{cli.summary(report)}`" in README
    sites = sum(item.state != "not in this release" for item in report.items if item.kind == api.CALL_SITE)
    assert re.search(r"On 0\.5\.12 that is 3 helpers inserted and (\d+) call sites", README).group(1) == str(sites)


def test_the_exit_codes_it_gives_are_the_commands():
    """check 0/1/2, diff 0 (1 with --exit-code), 2 printing nothing on a refused tree, apply 0/2
    (test_cli.py runs each); the help says the same for diff."""
    said = " ".join(README[README.index("`check` exits 0") :].split("\n\n")[0].split())
    assert said.startswith("`check` exits 0 when nothing is left, 1 when something is, 2 when a site is in a form")
    assert "`diff` exits 0 (1 with `--exit-code` when there is a patch), or 2 with nothing printed" in said
    assert "`apply` exits 0, or 2 writing nothing." in said
    assert "writes nothing; exit 0" + "\n" not in README


def test_first_two_commands_install_demo_and_run_the_tests():
    assert commands()[:2] == [
        "pip install . && sglang-draft-layout demo",
        "pip install torch==2.13.0 triton==3.9.0 -e '.[test]' && python -m pytest -n auto --dist worksteal",
    ]
    assert commands()[1] in (REPO / ".ci" / "run").read_text()


def pre_commit_snippet() -> str:
    """The README's ``.pre-commit-config.yaml`` (test/fork_ci/test_precommit_hook.py runs it)."""
    snippet = README[README.index("```yaml\nrepos:\n") + len("```yaml\n") :]
    return snippet[: snippet.index("```")]


def test_pre_commit_snippet_is_a_whole_config_in_yaml():
    """Pasted at column 0 into an empty file, or its entry under a ``repos:`` that indents its list."""
    import yaml

    config = yaml.safe_load(pre_commit_snippet())
    assert list(config) == ["repos"] and [sorted(entry) for entry in config["repos"]] == [["hooks", "repo", "rev"]]
    entry = pre_commit_snippet().split("\n", 1)[1]
    assert yaml.safe_load("repos:\n  - repo: https://example.com/other\n    rev: v1\n    hooks: []\n" + entry)["repos"][
        1
    ] == (config["repos"][0])


def test_pre_commit_snippet_names_real_hooks_and_a_commit_not_a_tag():
    hooks = set(re.findall(r"^- id: (\S+)$", (REPO / ".pre-commit-hooks.yaml").read_text(), re.MULTILINE))
    snippet = pre_commit_snippet()
    assert set(re.findall(r"id: ([\w-]+)", snippet)) == hooks == {"sglang-draft-layout", "sglang-draft-layout-apply"}
    assert re.search(r"^    rev: <a commit hash of it, from git rev-parse HEAD in your clone>$", snippet, re.MULTILINE)
    assert "@v" not in README and "rev: v" not in README  # no tag is kept in this repository


def python_snippet() -> str:
    """docs/reference.md's Python API example."""
    snippet = REFERENCE[REFERENCE.index("```python\n") + len("```python\n") :]
    return snippet[: snippet.index("```")]


def run_snippet(root: Path, capsys) -> str:
    capsys.readouterr()
    exec(compile(python_snippet().replace('"path/to/sglang-fork"', repr(str(root))), "docs/reference.md", "exec"), {})
    return capsys.readouterr().out


def test_api_snippet_reports_a_refused_tree_and_writes_nothing(sglang_tree, capsys):
    write_bystanders(sglang_tree, besides=FLASHINFER)
    foreign = COMMON_TEMPLATE.replace("seq_lens_sum * self.topk + bs", "seq_lens_sum * self.topk * 2 + bs")
    sglang_tree.write(FLASHINFER, backend_module("FlashInferMultiStepDraftBackend", INIT, foreign, EAGER, GRAPH))
    before = sglang_tree.snapshot()
    report = api.check(sglang_tree.root)
    assert report.exit_code == 2 and report.errors and not set(report.errors) & set(report.to_do)
    printed = run_snippet(sglang_tree.root, capsys).splitlines()
    assert [line for line in printed if line.startswith("refused: ")] == [
        f"refused: {item.file}:{item.line}: {item.scope}: {item.detail}" for item in report.errors
    ]
    assert sglang_tree.snapshot() == before


def test_api_snippet_patches_a_tree_to_patch(sglang_tree, capsys):
    write_bystanders(sglang_tree, besides="")
    to_do = api.check(sglang_tree.root).to_do
    printed = run_snippet(sglang_tree.root, capsys).splitlines()
    assert printed == [f"{item.file} {item.line} {item.scope} {item.state}" for item in to_do] and to_do
    assert api.check(sglang_tree.root).exit_code == 0


def test_every_option_the_readme_names_exists():
    subparsers = cli.parser()._subparsers._group_actions[0].choices
    known = {option for sub in subparsers.values() for action in sub._actions for option in action.option_strings}
    text = README + REFERENCE
    named = set(re.findall(r"`(--[a-z-]+)", text)) | set(re.findall(r"`(-[vq])`", text))
    server_flags = {
        "--speculative-num-steps",
        "--speculative-eagle-topk",
        "--disable-cuda-graph",
        "--tags",
        "--theirs",
        "--force-reinstall",
        "--no-deps",
    }
    assert named - server_flags <= known, named - server_flags - known
    assert {"--format", "--exit-code", "--exit-non-zero-on-fix", "--no-tests", "-v", "-q"} <= known


def test_the_package_description_names_the_releases_the_readme_does():
    """pyproject's description: the releases the tool patches (the README's first line says them),
    and that later ones are left as they are; not one family of them."""
    import tomllib

    description = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["description"]
    patched = re.search(r"\b(\d+\.\d+\.\d+) to (\d+\.\d+\.\d+)\b", description).groups()
    assert patched == ("0.4.8", "0.5.12") and patched == re.search(r"(\d\.\d\.\d+) to (\d\.\d\.\d+)", README).groups()
    assert "0.5.13 and later are left as they are" in description

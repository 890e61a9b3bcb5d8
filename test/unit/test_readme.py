"""README.md stays true to the code: its first two commands (the install-and-demo and the test
run .ci/run calls), the pre-commit snippet's hook ids and rev, and every option it names."""

from __future__ import annotations

import re
from pathlib import Path

from sglang_draft_layout import __version__, cli

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()


def commands() -> list[str]:
    """The README's indented command lines (4 spaces, outside fenced blocks), in order."""
    return [line.strip() for line in README.splitlines() if line.startswith("    ") and line.strip()
            and not line.startswith("     ")]


def test_first_two_commands_install_demo_and_run_the_tests():
    assert commands()[:2] == ["pip install . && sglang-draft-layout demo",
                              "pip install torch==2.13.0 triton==3.9.0 -e '.[test]' && python -m pytest"]
    assert commands()[1] in (REPO / ".ci" / "run").read_text()


def test_pre_commit_snippet_names_real_hooks_and_the_current_tag():
    hooks = set(re.findall(r"^- id: (\S+)$", (REPO / ".pre-commit-hooks.yaml").read_text(), re.MULTILINE))
    snippet = README[README.index("```yaml\n- repo:"):]
    snippet = snippet[:snippet.index("```", 3)]
    assert f"  rev: v{__version__}\n" in snippet
    assert set(re.findall(r"id: ([\w-]+)", snippet)) == hooks == {"sglang-draft-layout", "sglang-draft-layout-apply"}
    assert f"\n## v{__version__} (" in (REPO / "CHANGELOG.md").read_text()


def test_every_option_the_readme_names_exists():
    subparsers = cli.parser()._subparsers._group_actions[0].choices
    known = {option for sub in subparsers.values() for action in sub._actions for option in action.option_strings}
    named = set(re.findall(r"`(--[a-z-]+)", README)) | set(re.findall(r"`(-[vq])`", README))
    server_flags = {"--speculative-num-steps", "--speculative-eagle-topk", "--disable-cuda-graph", "--tags",
                    "--theirs", "--force-reinstall", "--no-deps"}
    assert named - server_flags <= known, named - server_flags - known
    assert {"--format", "--exit-code", "--exit-non-zero-on-fix", "--no-tests", "-v", "-q"} <= known

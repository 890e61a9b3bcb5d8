"""Rendering the fork's tests needs no libcst, so `check` on a fork never imports it.

The templates import what the modules they embed import; `embed` only checks that, naming
the import a template lacks.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sglang_draft_layout import cli, fork_templates
from sglang_draft_layout.fork_tests import FORK_TESTS, embed, render

pytestmark = pytest.mark.releases
TEMPLATES = Path(fork_templates.__file__).parent


def check_importtime(fork: Path) -> tuple[int, str]:
    """`check`'s exit status as a fresh process, and its -X importtime report."""
    result = subprocess.run([sys.executable, "-X", "importtime", "-m", "sglang_draft_layout", "check", str(fork)],
                            capture_output=True, text=True, timeout=120)
    return result.returncode, result.stderr


def test_check_on_a_fork_imports_no_libcst(fork):
    status, imports = check_importtime(fork)
    assert status == 1 and " sglang_draft_layout.fork_tests\n" in imports
    assert "libcst" not in imports
    assert cli.main(["apply", str(fork)]) == 0
    status, imports = check_importtime(fork)
    assert status == 0 and "libcst" not in imports


@pytest.mark.parametrize("template, needed", [("registered_gpu", "import numpy as np"),
                                              ("registered_cpu", "from __future__ import annotations")])
def test_a_template_lacking_an_embedded_import_is_refused(template, needed):
    text = (TEMPLATES / f"{template}.py").read_text()
    assert needed in text
    with pytest.raises(ValueError, match=f"{template}: the embedded sglang_draft_layout.\\w+ needs `{needed}"):
        embed(text.replace(needed, "from x import y"), template)


def test_every_template_renders():
    for _path, template, _what in FORK_TESTS:
        assert "# sglang-draft-layout: embed" not in render(template)

"""Rendering the fork's tests needs no libcst, so `check` on a fork never imports it.

The templates import what the modules they embed import; `embed` only checks that, naming
the import a template lacks. Modules of one package are embedded in order: a relative import is
met by a module embedded above (or by the template's own import of the same names), never by
one below; two embedded modules, or one and the template, never define the same name. The CPU
test embeds the split-once verdict (proof.split_once and what it imports), verbatim.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sglang_draft_layout import cli, fork_templates
from sglang_draft_layout.fork_tests import FORK_TESTS, _module_source, _split_imports, embed, render

pytestmark = pytest.mark.releases
TEMPLATES = Path(fork_templates.__file__).parent


def check_importtime(fork: Path) -> tuple[int, str]:
    """`check`'s exit status as a fresh process, and its -X importtime report."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "sglang_draft_layout", "check", str(fork)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return result.returncode, result.stderr


def test_check_on_a_fork_imports_no_libcst(fork):
    status, imports = check_importtime(fork)
    assert status == 1 and " sglang_draft_layout.fork_tests\n" in imports
    assert "libcst" not in imports
    assert cli.main(["apply", str(fork)]) == 0
    status, imports = check_importtime(fork)
    assert status == 0 and "libcst" not in imports


@pytest.mark.parametrize(
    "template, needed",
    [("registered_gpu", "import numpy as np"), ("registered_cpu", "from __future__ import annotations")],
)
def test_a_template_lacking_an_embedded_import_is_refused(template, needed):
    text = (TEMPLATES / f"{template}.py").read_text()
    assert needed in text
    with pytest.raises(ValueError, match=f"{template}: the embedded sglang_draft_layout[.\\w]+ needs `{needed}"):
        embed(text.replace(needed, "from x import y"), template)


def test_every_template_renders():
    for _path, template, _what in FORK_TESTS:
        assert "# sglang-draft-layout: embed" not in render(template)


PROOF = [f"sglang_draft_layout.proof.{name}" for name in ("arrays", "interpret", "world", "paths", "split_once")]
CPU_TEMPLATE = (TEMPLATES / "registered_cpu.py").read_text()


def test_the_cpu_test_embeds_the_split_verdict_verbatim():
    rendered = render("registered_cpu")
    for module in PROOF:
        assert f"# {module} (sglang-draft-layout), verbatim\n" in rendered
        assert _split_imports(_module_source(module))[1] in rendered
    assert rendered.count("arrays = sys.modules[__name__]") == 1
    assert "from ..speculative" not in rendered and "from .arrays" not in rendered
    assert "layout_patterns" not in rendered


def marker(module: str) -> str:
    return f"# sglang-draft-layout: embed {module}\n"


def test_a_relative_import_met_only_below_is_refused():
    reordered = CPU_TEMPLATE.replace(marker(PROOF[2]), "").replace(
        marker(PROOF[3]), marker(PROOF[3]) + marker(PROOF[2])
    )
    with pytest.raises(ValueError, match="embedded sglang_draft_layout.proof.paths needs `from .world import "):
        embed(reordered, "registered_cpu")


def test_a_relative_import_of_a_module_not_embedded_needs_the_templates_own():
    text = CPU_TEMPLATE.replace("from sglang.srt.speculative import eagle_utils, spec_utils\n", "")
    with pytest.raises(
        ValueError,
        match="embedded sglang_draft_layout.proof.world needs `from ..speculative import "
        "eagle_utils` in the template",
    ):
        embed(text, "registered_cpu")
    wrong_module = CPU_TEMPLATE.replace("from sglang.srt.speculative import", "from sglang.srt.speculation import")
    with pytest.raises(ValueError, match="needs `from ..speculative import eagle_utils`"):
        embed(wrong_module, "registered_cpu")


def test_a_module_imported_whole_needs_sys_and_a_name_defined_twice_is_refused():
    with pytest.raises(ValueError, match="embedded sglang_draft_layout.proof.interpret needs `import sys`"):
        embed(CPU_TEMPLATE.replace("import sys\n", ""), "registered_cpu")
    twice = CPU_TEMPLATE.replace("\n\ndef module(", "\n\ndef split_verdict():\n    pass\n\n\ndef module(")
    with pytest.raises(
        ValueError,
        match="embedded sglang_draft_layout.proof.split_once and registered_cpu both " "define split_verdict",
    ):
        embed(twice, "registered_cpu")

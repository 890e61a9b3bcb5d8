"""Rendering the fork's tests needs no libcst, so `check` on a fork never imports it.

The templates import what the modules they embed import; `embed` only checks that, naming
the import a template lacks. Modules of one package are embedded in order: a relative import is
met by a module embedded above (or by the template's own import of the same names), never by
one below; two embedded modules, or one and the template, never define the same name. The CPU
test's harness module embeds the harness (its modules but the torch stand-in), verbatim; the test
imports it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from sglang_draft_layout import cli, fork_templates
from sglang_draft_layout.fork_tests import FORK_TESTS, HARNESS, _module_source, _split_imports, embed, render

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
    [("registered_gpu", "import numpy as np"), (HARNESS[1], "from __future__ import annotations")],
)
def test_a_template_lacking_an_embedded_import_is_refused(template, needed):
    text = (TEMPLATES / f"{template}.py").read_text()
    assert needed in text
    with pytest.raises(ValueError, match=f"{template}: the embedded sglang_draft_layout[.\\w]+ needs `{needed}"):
        embed(text.replace(needed, "from x import y"), template)


def test_every_template_renders():
    for _path, template, _what in (*FORK_TESTS, HARNESS):
        assert "# sglang-draft-layout: embed" not in render(template)


EMBEDDED = [
    f"sglang_draft_layout.harness.{name}"
    for name in ("unknown", "branches", "world", "paths", "invariant", "torch_backend")
]
HARNESS_TEMPLATE = (TEMPLATES / f"{HARNESS[1]}.py").read_text()


def test_the_harness_module_embeds_the_harness_verbatim_and_the_cpu_test_imports_it():
    rendered = render(HARNESS[1])
    for module in EMBEDDED:
        assert f"# {module} (sglang-draft-layout), verbatim\n" in rendered
        assert _split_imports(_module_source(module))[1] in rendered
    assert "from ..speculative" not in rendered and "from .unknown" not in rendered
    assert "layout_patterns" not in rendered and "harness.tensors" not in rendered
    cpu_test = render("registered_cpu")
    assert "from sglang.test.draft_layout_harness import (\n    FACADE,\n    Tree,\n    eagle_utils,\n" in cpu_test
    assert "from sglang.srt" not in cpu_test  # the helpers too come from the harness, compiled from their text
    assert HARNESS[0] == "python/sglang/test/draft_layout_harness.py"


def marker(module: str) -> str:
    return f"# sglang-draft-layout: embed {module}\n"


def test_a_relative_import_met_only_below_is_refused():
    reordered = HARNESS_TEMPLATE.replace(marker(EMBEDDED[2]), "").replace(
        marker(EMBEDDED[3]), marker(EMBEDDED[3]) + marker(EMBEDDED[2])
    )
    with pytest.raises(ValueError, match="embedded sglang_draft_layout.harness.paths needs `from .world import "):
        embed(reordered, HARNESS[1])


def test_a_relative_import_of_a_module_not_embedded_needs_the_templates_own():
    """The harness binds the helper modules itself (``tree_helpers``): without that binding, or under another
    name, the embedded modules' ``from ..speculative import eagle_utils`` is unmet."""
    binding = "eagle_utils, spec_utils = tree_helpers("
    assert binding in HARNESS_TEMPLATE
    with pytest.raises(
        ValueError,
        match="embedded sglang_draft_layout.harness.paths needs `from ..speculative import "
        "eagle_utils` in the template",
    ):
        embed(HARNESS_TEMPLATE.replace(binding, "_unused = tree_helpers("), HARNESS[1])
    with pytest.raises(ValueError, match="needs `from ..speculative import eagle_utils`"):
        embed(HARNESS_TEMPLATE.replace(binding, "eagle_util, spec_utils = tree_helpers("), HARNESS[1])
    imported_instead = HARNESS_TEMPLATE.replace(binding, "_unused = tree_helpers(").replace(
        "import torch\n", "import torch\n\nfrom sglang.srt.speculation import eagle_utils, spec_utils\n", 1
    )
    with pytest.raises(ValueError, match="needs `from ..speculative import eagle_utils`"):
        embed(imported_instead, HARNESS[1])  # imported from another module: not what the modules import
    rendered = embed(HARNESS_TEMPLATE, HARNESS[1])
    assert "from sglang.srt.speculative import" not in rendered  # the fork's CI never imports them


def test_an_import_an_embedded_module_needs_and_a_name_defined_twice_are_refused():
    with pytest.raises(ValueError, match="embedded sglang_draft_layout.harness.unknown needs `import dis`"):
        embed(HARNESS_TEMPLATE.replace("import dis\n", ""), HARNESS[1])
    twice = HARNESS_TEMPLATE.replace("\n# fmt: off\n", "\n\ndef judge():\n    pass\n\n\n# fmt: off\n")
    with pytest.raises(
        ValueError,
        match=f"embedded sglang_draft_layout.harness.invariant and {HARNESS[1]} both define judge",
    ):
        embed(twice, HARNESS[1])

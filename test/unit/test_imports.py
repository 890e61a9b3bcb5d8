"""add_imports: imports written where isort (5.13.2, profile black) and black (24.10.0) put them.

Every case is a small hand-made module header, clean under SGLang's isort and black before;
the output must equal the expected text and stay unchanged by both tools.
"""

from __future__ import annotations

import ast

import black
import isort
import pytest

from sglang_draft_layout.imports import add_imports

SPEC_UTILS = "sglang.srt.speculative.spec_utils"
EAGLE_UTILS = "sglang.srt.speculative.eagle_utils"
WIDTH = (SPEC_UTILS, "draft_kv_indices_buffer_width")
USED_LEN = (SPEC_UTILS, "draft_kv_indices_used_len")
PER_STEP = (EAGLE_UTILS, "per_step_draft_out_cache_loc")

HEADER = """\
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch

from sglang.srt.layers.radix_attention import AttentionType
{first_party}from sglang.srt.utils import is_cuda

logger = logging.getLogger(__name__)
"""


def header(first_party: str = "") -> str:
    return HEADER.format(first_party=first_party)


def lint(code: str, line_length: int) -> tuple[str, str]:
    """What SGLang's isort and black make of ``code``."""
    sorted_code = isort.code(code, profile="black", known_first_party=["sglang"], line_length=line_length)
    return sorted_code, black.format_str(code, mode=black.Mode(line_length=line_length))


CASES = {
    "existing parenthesised list: name in sorted place": (
        header(
            "from sglang.srt.speculative.spec_utils import (\n"
            "    assign_draft_cache_locs,\n"
            "    generate_draft_decode_kv_indices,\n"
            "    get_src_tgt_cache_loc,\n"
            ")\n"
        ),
        [WIDTH],
        88,
        header(
            "from sglang.srt.speculative.spec_utils import (\n"
            "    assign_draft_cache_locs,\n"
            "    draft_kv_indices_buffer_width,\n"
            "    generate_draft_decode_kv_indices,\n"
            "    get_src_tgt_cache_loc,\n"
            ")\n"
        ),
    ),
    "existing one-line import that still fits": (
        header("from sglang.srt.speculative.spec_utils import fast\n"),
        [(SPEC_UTILS, "bar")],
        88,
        header("from sglang.srt.speculative.spec_utils import bar, fast\n"),
    ),
    "existing one-line import that no longer fits": (
        header("from sglang.srt.speculative.spec_utils import generate_draft_decode_kv_indices\n"),
        [WIDTH, USED_LEN],
        88,
        header(
            "from sglang.srt.speculative.spec_utils import (\n"
            "    draft_kv_indices_buffer_width,\n"
            "    draft_kv_indices_used_len,\n"
            "    generate_draft_decode_kv_indices,\n"
            ")\n"
        ),
    ),
    "no import of the module yet: between its sorted neighbours": (
        header("from sglang.srt.speculative.spec_info import SpecInput\n"),
        [WIDTH, USED_LEN],
        88,
        header(
            "from sglang.srt.speculative.spec_info import SpecInput\n"
            "from sglang.srt.speculative.spec_utils import (\n"
            "    draft_kv_indices_buffer_width,\n"
            "    draft_kv_indices_used_len,\n"
            ")\n"
        ),
    ),
    "no import of the module yet: a short one on one line": (
        header(),
        [(SPEC_UTILS, "width")],
        88,
        header("from sglang.srt.speculative.spec_utils import width\n"),
    ),
    "fork line length of 120: fits on one line": (
        header("from sglang.srt.speculative.spec_utils import generate_draft_decode_kv_indices\n"),
        [WIDTH],
        120,
        header(
            "from sglang.srt.speculative.spec_utils import draft_kv_indices_buffer_width, "
            "generate_draft_decode_kv_indices\n"
        ),
    ),
    "order_by_type: CONSTANTS, then Classes, then functions": (
        header(
            "from sglang.srt.speculative.spec_utils import (\n"
            "    TREE_SPEC_KERNEL_AVAILABLE,\n"
            "    SpecInput,\n"
            "    assign_draft_cache_locs,\n"
            ")\n"
        ),
        [(SPEC_UTILS, "DraftLayout"), (SPEC_UTILS, "MAX_TOPK"), (SPEC_UTILS, "b_helper")],
        88,
        header(
            "from sglang.srt.speculative.spec_utils import (\n"
            "    MAX_TOPK,\n"
            "    TREE_SPEC_KERNEL_AVAILABLE,\n"
            "    DraftLayout,\n"
            "    SpecInput,\n"
            "    assign_draft_cache_locs,\n"
            "    b_helper,\n"
            ")\n"
        ),
    ),
    "comment in an existing parenthesised import kept": (
        header(
            "from sglang.srt.speculative.spec_utils import (  # noqa: F401\n"
            "    assign_draft_cache_locs,\n"
            "    get_src_tgt_cache_loc,\n"
            ")\n"
        ),
        [WIDTH],
        88,
        header(
            "from sglang.srt.speculative.spec_utils import (  # noqa: F401\n"
            "    assign_draft_cache_locs,\n"
            "    draft_kv_indices_buffer_width,\n"
            "    get_src_tgt_cache_loc,\n"
            ")\n"
        ),
    ),
    "name already imported: nothing changes": (
        header("from sglang.srt.speculative.spec_utils import draft_kv_indices_buffer_width\n"),
        [WIDTH],
        88,
        header("from sglang.srt.speculative.spec_utils import draft_kv_indices_buffer_width\n"),
    ),
    "import torch when present: nothing changes": (
        header(),
        [("torch", "")],
        88,
        header(),
    ),
    "two modules at once, each in its place": (
        header("from sglang.srt.speculative.spec_info import SpecInput\n"),
        [PER_STEP, WIDTH],
        88,
        header(
            "from sglang.srt.speculative.eagle_utils import per_step_draft_out_cache_loc\n"
            "from sglang.srt.speculative.spec_info import SpecInput\n"
            "from sglang.srt.speculative.spec_utils import draft_kv_indices_buffer_width\n"
        ),
    ),
    "module opening string after from __future__ import annotations": (
        "from __future__ import annotations\n"
        "\n"
        '"""\n'
        "Opening string of the module.\n"
        '"""\n'
        "\n"
        "import os\n"
        "\n"
        "import torch\n"
        "\n"
        "from sglang.srt.layers.radix_attention import AttentionType\n"
        "from sglang.srt.utils import is_cuda\n"
        "\n"
        "\n"
        "class Backend:\n"
        "    pass\n",
        [WIDTH, USED_LEN],
        88,
        "from __future__ import annotations\n"
        "\n"
        '"""\n'
        "Opening string of the module.\n"
        '"""\n'
        "\n"
        "import os\n"
        "\n"
        "import torch\n"
        "\n"
        "from sglang.srt.layers.radix_attention import AttentionType\n"
        "from sglang.srt.speculative.spec_utils import (\n"
        "    draft_kv_indices_buffer_width,\n"
        "    draft_kv_indices_used_len,\n"
        ")\n"
        "from sglang.srt.utils import is_cuda\n"
        "\n"
        "\n"
        "class Backend:\n"
        "    pass\n",
    ),
    "import only inside if TYPE_CHECKING: a module-level one is added, the block untouched": (
        header() + "\n" "if TYPE_CHECKING:\n" "    from sglang.srt.speculative.spec_utils import SpecInput\n",
        [WIDTH],
        88,
        header("from sglang.srt.speculative.spec_utils import draft_kv_indices_buffer_width\n") + "\n"
        "if TYPE_CHECKING:\n"
        "    from sglang.srt.speculative.spec_utils import SpecInput\n",
    ),
    "import torch when missing: its own third-party section": (
        '"""Helpers."""\n'
        "\n"
        "import logging\n"
        "\n"
        "from sglang.srt.utils import is_cuda\n"
        "\n"
        "\n"
        "def helper():\n"
        "    return torch.int32\n",
        [("torch", "")],
        88,
        '"""Helpers."""\n'
        "\n"
        "import logging\n"
        "\n"
        "import torch\n"
        "\n"
        "from sglang.srt.utils import is_cuda\n"
        "\n"
        "\n"
        "def helper():\n"
        "    return torch.int32\n",
    ),
    "first-party imports split by an if block: into the run its neighbours are in": (
        "import torch\n"
        "\n"
        "from sglang.srt.environ import envs\n"
        "from sglang.srt.layers.attention.base_attn_backend import AttentionBackend\n"
        "\n"
        "if envs.USE_V2.get():\n"
        "    from sglang.srt.layers.attention.compressor_v2 import Compressor\n"
        "else:\n"
        "    from sglang.srt.layers.attention.compressor import Compressor\n"
        "\n"
        "from sglang.srt.layers.dp_attention import get_attention_cp_rank\n"
        "from sglang.srt.model_executor.forward_batch_info import ForwardBatch\n"
        "from sglang.srt.utils import ceil_align\n",
        [PER_STEP],
        88,
        "import torch\n"
        "\n"
        "from sglang.srt.environ import envs\n"
        "from sglang.srt.layers.attention.base_attn_backend import AttentionBackend\n"
        "\n"
        "if envs.USE_V2.get():\n"
        "    from sglang.srt.layers.attention.compressor_v2 import Compressor\n"
        "else:\n"
        "    from sglang.srt.layers.attention.compressor import Compressor\n"
        "\n"
        "from sglang.srt.layers.dp_attention import get_attention_cp_rank\n"
        "from sglang.srt.model_executor.forward_batch_info import ForwardBatch\n"
        "from sglang.srt.speculative.eagle_utils import per_step_draft_out_cache_loc\n"
        "from sglang.srt.utils import ceil_align\n",
    ),
    "an import below the first definition is not the header's": (
        "import torch\n"
        "\n"
        "from sglang.srt.utils import is_cuda\n"
        "\n"
        "\n"
        "def helper():\n"
        "    pass\n"
        "\n"
        "\n"
        "from sglang.srt.layers.late import Late  # noqa: E402\n",
        [WIDTH],
        88,
        "import torch\n"
        "\n"
        "from sglang.srt.speculative.spec_utils import draft_kv_indices_buffer_width\n"
        "from sglang.srt.utils import is_cuda\n"
        "\n"
        "\n"
        "def helper():\n"
        "    pass\n"
        "\n"
        "\n"
        "from sglang.srt.layers.late import Late  # noqa: E402\n",
    ),
    "no first-party block yet: a new block after the last import": (
        '"""A module."""\n' "\n" "import logging\n" "\n" "import torch\n" "\n" "logger = logging.getLogger(__name__)\n",
        [WIDTH],
        88,
        '"""A module."""\n'
        "\n"
        "import logging\n"
        "\n"
        "import torch\n"
        "\n"
        "from sglang.srt.speculative.spec_utils import draft_kv_indices_buffer_width\n"
        "\n"
        "logger = logging.getLogger(__name__)\n",
    ),
}


@pytest.mark.parametrize("before, imports, line_length, after", CASES.values(), ids=CASES.keys())
def test_imports_placed_as_isort_and_black_write_them(before, imports, line_length, after):
    assert lint(before, line_length) == (before, before)
    result = add_imports(before, imports, line_length)
    assert result == after
    assert lint(result, line_length) == (result, result)


def test_adding_twice_changes_nothing_more():
    once = add_imports(header("from sglang.srt.speculative.spec_utils import fast\n"), [WIDTH, USED_LEN])
    assert add_imports(once, [WIDTH, USED_LEN]) == once


def test_crlf_file_keeps_its_line_ends():
    before = header("from sglang.srt.speculative.spec_info import SpecInput\n").replace("\n", "\r\n")
    result = add_imports(before, [WIDTH, USED_LEN])
    assert result.count("\r\n") == result.count("\n") == before.count("\n") + 4


def test_other_lines_are_untouched():
    """Code isort and black would change elsewhere in the file stays as it is: only the import is written."""
    before = header("from sglang.srt.speculative.spec_info import SpecInput\n") + "x = [1,2]\n"
    result = add_imports(before, [WIDTH])
    assert result == before.replace(
        "SpecInput\n", "SpecInput\nfrom sglang.srt.speculative.spec_utils import draft_kv_indices_buffer_width\n"
    )


BODY = "\n\nclass Backend:\n    def width(self):\n        return 1\n"
#: modules whose header is parsed alone, and modules read whole: a statement below the first definition may import
#: the module (at the margin, after ``;``, over a backslash), or the cut at a margin ``class`` line is inside a string
HEADER_ALONE_OR_NOT = {
    "header alone": (header() + BODY, True),
    "decorated first class": (header() + "\n\n@dataclass" + BODY, True),
    "a method imports it": (header() + BODY + "        from sglang.srt.speculative.spec_utils import fast\n", True),
    "extendable import below a class": (
        header() + BODY + "\nfrom sglang.srt.speculative.spec_utils import fast\n",
        False,
    ),
    "another import below a class": (header() + BODY + "\nimport os\n", False),
    "after a semicolon": (header() + BODY + "\nx = 1; import sglang.srt.speculative.spec_utils\n", False),
    "over a backslash": (header() + BODY + "\nfrom \\\n    sglang.srt.speculative.spec_utils import fast\n", False),
    "class line in a string": ('X = """\nclass Doc:\n"""\n' + header() + BODY, False),
}


@pytest.mark.parametrize("code, alone", HEADER_ALONE_OR_NOT.values(), ids=HEADER_ALONE_OR_NOT.keys())
def test_imports_read_the_header_alone_only_where_the_module_says_the_same(code, alone, monkeypatch):
    """The header parsed alone (``_top_level``) gives the import the whole module gives, and is parsed alone only where
    no statement below it may import the module."""
    from sglang_draft_layout import imports

    read_whole = []
    monkeypatch.setattr(imports, "parse", lambda text, *args: read_whole.append(text) or ast.parse(text))
    result = add_imports(code, [WIDTH, USED_LEN])
    assert (read_whole == []) is alone
    monkeypatch.setattr(imports, "_top_level", lambda text, module: ast.parse(text))
    assert result == add_imports(code, [WIDTH, USED_LEN])

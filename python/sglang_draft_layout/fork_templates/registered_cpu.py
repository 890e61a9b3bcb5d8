"""Multi-step EAGLE draft layout: upstream's helpers, and every draft backend using them.

Written by sglang-draft-layout (``apply``); ``sglang-draft-layout check`` reports it stale
when it differs from what the tool would write. Needs nothing but this tree: the checks on
the source read it with ``ast`` (the pattern code below is the tool's, embedded verbatim).
A site the fork keeps as it wrote it (``# sglang-draft-layout: keep`` on its def line or
statement) is left out of the checks; a path that splits twice or never, only when kept on
its per-step backend's method or statement (a caller's keep keeps its own layout only).
"""

from __future__ import annotations

import ast
import unittest
from pathlib import Path
from typing import Dict, FrozenSet, Iterator, List, NamedTuple, Optional, Tuple

import torch

import sglang
from sglang.srt.speculative import eagle_utils, spec_utils
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase

register_cpu_ci(est_time=15, suite="stage-a-test-cpu")

# sglang-draft-layout: embed sglang_draft_layout.layout_patterns

#: the draft backends every 0.5.8+ tree defines, each with draft layout arithmetic
UPSTREAM_DRAFT_BACKENDS = (
    "FlashInferMultiStepDraftBackend",
    "FlashInferMLAMultiStepDraftBackend",
    "TritonMultiStepDraftBackend",
    "AiterMultiStepDraftBackend",
)
#: folders (under the sglang package) whose modules compute draft layouts
DRAFT_LAYOUT_FOLDERS = ("srt/layers/attention", "srt/speculative")


def draft_layout_modules():
    """(path relative to the package, parsed module, its lines) of every module in those folders."""
    package = Path(sglang.__file__).resolve().parent
    for folder in DRAFT_LAYOUT_FOLDERS:
        for path in sorted((package / folder).rglob("*.py")):
            source = path.read_text(encoding="utf-8")
            relative = path.relative_to(package).as_posix()
            yield relative, ast.parse(source, str(path)), source.splitlines()


class TestDraftLayoutHelpers(CustomTestCase):
    def test_buffer_width(self):
        self.assertEqual(spec_utils.draft_kv_indices_buffer_width(2, 4, 100), 800)
        self.assertEqual(spec_utils.draft_kv_indices_buffer_width(8, 8, 2048), 131072)
        self.assertEqual(spec_utils.draft_kv_indices_buffer_width(3, 1, 10), 30)

    def test_buffer_width_int32_guard(self):
        with self.assertRaises(AssertionError):
            spec_utils.draft_kv_indices_buffer_width(10_000, 10_000, 10_000)

    def test_used_len(self):
        # 3 sequences of lengths 5, 9, 4 (sum 18), topk 2: bs = 6 branches
        used = [spec_utils.draft_kv_indices_used_len(18, 2, 6, i + 1) for i in range(3)]
        self.assertEqual(used, [42, 48, 54])
        self.assertLessEqual(
            spec_utils.draft_kv_indices_used_len(18, 2, 6, 3),
            spec_utils.draft_kv_indices_buffer_width(3, 2, 9 + 3),
        )

    def test_per_step_out_cache_loc(self):
        out_cache_loc = torch.arange(2 * 3 * 4)  # [bs=2, topk=3, num_steps=4]
        rows = eagle_utils.per_step_draft_out_cache_loc(out_cache_loc, 2, 3, 4)
        self.assertEqual(tuple(rows.shape), (4, 6))
        self.assertEqual(rows[0].tolist(), [0, 4, 8, 12, 16, 20])
        self.assertEqual(rows[3].tolist(), [3, 7, 11, 15, 19, 23])

    def test_per_step_out_cache_loc_wrong_length(self):
        with self.assertRaises(AssertionError):
            eagle_utils.per_step_draft_out_cache_loc(torch.arange(23), 2, 3, 4)


class TestDraftLayoutCallSites(CustomTestCase):
    def test_no_inline_draft_layout(self):
        inline = [
            f"sglang/{path}:{line}: {cls}.{method}: {what}"
            for path, tree, lines in draft_layout_modules()
            for cls, method, line, what in inline_draft_layout(tree, lines)
        ]
        message = "draft layouts computed without the helpers:\n" + "\n".join(inline)
        self.assertFalse(inline, message)

    def test_per_step_layout_split_once(self):
        # multi-step backend -> per-step backend that bakes out_cache_loc: one split,
        # an EAGLE worker's per-step rows (in its own module) counted; a keep counts on
        # the per-step backend's method or statement, not on a caller
        modules = {path: (tree, lines) for path, tree, lines in draft_layout_modules()}
        trees = {path: tree for path, (tree, _lines) in modules.items()}
        worker_rows = worker_step_rows(trees)
        problems = [
            f"sglang/{path}:{line}: {scope}: {what}"
            for path, (tree, lines) in modules.items()
            for scope, line, what in split_path_problems(tree, lines, worker_rows)
        ]
        message = "per-step out_cache_loc split twice or never:\n" + "\n".join(problems)
        self.assertFalse(problems, message)

    def test_known_draft_backends_found(self):
        defined, found = set(), set()
        for _path, tree, _lines in draft_layout_modules():
            defined.update(
                n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)
            )
            found.update(draft_layout_classes(tree))
        expected = set(UPSTREAM_DRAFT_BACKENDS) & defined
        self.assertTrue(expected, "none of the upstream draft backends is defined")
        self.assertLessEqual(expected, found)


if __name__ == "__main__":
    unittest.main()

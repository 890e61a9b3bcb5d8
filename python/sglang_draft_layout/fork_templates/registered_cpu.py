"""Multi-step EAGLE draft layout: upstream's helpers, and the draft code using them.

Written by sglang-draft-layout (``apply``); ``sglang-draft-layout check`` reports it
stale when it differs from what the tool would write. Needs nothing but this tree:

* TestDraftLayoutHelpers: the values and asserts of upstream's helpers, the fork's own.
* test_draft_layout_calls_the_helpers: each method the tool patches (in the four
  *MultiStepDraftBackend classes and the EAGLE workers) calls the helper it needs.
* test_per_step_out_cache_loc_split_once: each per-step backend baking out_cache_loc at
  init (DeepSeek-V4) gets its step's row, split exactly once, by ``check``'s verdict:
  the tool's proof modules, embedded below verbatim (``fmt: off``: the tool's line
  length), so this CI and the tool agree. They read the path's code with ``ast`` and
  run it on probe values (numpy for torch); a worker handing each step its row splits.

``# sglang-draft-layout: keep`` on a checked method (def line or body) leaves it out;
a path splitting twice or never, only where kept on its per-step backend's
init_forward_metadata (or a method there handing out_cache_loc= on, or that statement).
"""

from __future__ import annotations

import ast
import builtins
import functools
import operator
import sys
import unittest
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence

import numpy as np
import torch

import sglang
from sglang.srt.speculative import eagle_utils, spec_utils
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase

register_cpu_ci(est_time=15, suite="stage-a-test-cpu")

PACKAGE = Path(sglang.__file__).resolve().parent
WIDTH, USED_LEN = "draft_kv_indices_buffer_width", "draft_kv_indices_used_len"
ROWS = "per_step_draft_out_cache_loc"
MISSING = [h for h in (WIDTH, USED_LEN, ROWS) if not hasattr(spec_utils, h)]
MISSING = [h for h in MISSING if not hasattr(eagle_utils, h)]
if MISSING:  # the proof below runs them too: nothing here runs without them
    raise ImportError(f"sglang.srt.speculative has no {', '.join(MISSING)}: run apply")
#: the methods the tool patches, each with the helper it must call, by module and class
BACKEND = {"common_template": USED_LEN, "init_forward_metadata": WIDTH}
BACKEND["init_cuda_graph_state"] = WIDTH
SITES = {
    "layers/attention/flashinfer_backend": "FlashInferMultiStepDraftBackend",
    "layers/attention/flashinfer_mla_backend": "FlashInferMLAMultiStepDraftBackend",
    "layers/attention/triton_backend": "TritonMultiStepDraftBackend",
    "layers/attention/aiter_backend": "AiterMultiStepDraftBackend",
    "speculative/eagle_worker_v2": "EagleDraftWorker",
    "speculative/eagle_worker": "EAGLEWorker",
}
#: DeepSeek-V4's per-step backend: the search below finds it where the tree has it
DSV4 = ("srt/layers/attention/deepseek_v4_backend.py", "DeepseekV4AttnBackend")

# fmt: off
# sglang-draft-layout: embed sglang_draft_layout.proof.arrays
# sglang-draft-layout: embed sglang_draft_layout.proof.interpret
# sglang-draft-layout: embed sglang_draft_layout.proof.world
# sglang-draft-layout: embed sglang_draft_layout.proof.paths
# sglang-draft-layout: embed sglang_draft_layout.proof.baking
# sglang-draft-layout: embed sglang_draft_layout.proof.split_once
# fmt: on


def module(path):
    """The tree and lines of a module under the package (empty where there is none)."""
    file = PACKAGE / path
    source = file.read_text(encoding="utf-8") if file.is_file() else ""
    return ast.parse(source), source.splitlines()


def class_in(tree, name):
    return next((c for c in tree.body if getattr(c, "name", "") == name), None)


def marked(lines, numbers):
    return any(KEEP in lines[number - 1] for number in numbers)


class TestDraftLayoutHelpers(CustomTestCase):
    def test_buffer_width(self):
        self.assertEqual(spec_utils.draft_kv_indices_buffer_width(2, 4, 100), 800)
        self.assertEqual(spec_utils.draft_kv_indices_buffer_width(8, 8, 2048), 131072)
        self.assertEqual(spec_utils.draft_kv_indices_buffer_width(3, 1, 10), 30)
        with self.assertRaises(AssertionError):  # the int32 guard
            spec_utils.draft_kv_indices_buffer_width(10_000, 10_000, 10_000)

    def test_used_len(self):
        # 3 sequences of lengths 5, 9, 4 (sum 18), topk 2: bs = 6 branches
        used = [spec_utils.draft_kv_indices_used_len(18, 2, 6, i + 1) for i in range(3)]
        self.assertEqual(used, [42, 48, 54])
        width = spec_utils.draft_kv_indices_buffer_width(3, 2, 9 + 3)
        self.assertLessEqual(used[2], width)

    def test_per_step_out_cache_loc(self):
        out_cache_loc = torch.arange(2 * 3 * 4)  # [bs=2, topk=3, num_steps=4]
        rows = eagle_utils.per_step_draft_out_cache_loc(out_cache_loc, 2, 3, 4)
        self.assertEqual(tuple(rows.shape), (4, 6))
        self.assertEqual(rows[0].tolist(), [0, 4, 8, 12, 16, 20])
        self.assertEqual(rows[3].tolist(), [3, 7, 11, 15, 19, 23])
        with self.assertRaises(AssertionError):  # not bs * topk * num_steps slots
            eagle_utils.per_step_draft_out_cache_loc(torch.arange(23), 2, 3, 4)


class TestDraftLayoutCallSites(CustomTestCase):
    def test_draft_layout_calls_the_helpers(self):
        problems, found = [], []
        for path, name in SITES.items():
            tree, lines = module(f"srt/{path}.py")
            cls = class_in(tree, name)
            sites = BACKEND if "layers" in path else {"draft_forward": ROWS}
            found += [name] if cls else []
            for method_name, helper in sites.items() if cls else ():
                method = methods(cls).get(method_name)
                where = f"sglang/srt/{path}.py: {name}.{method_name}"
                if method is None:
                    problems.append(f"{where}: not defined (the tool patches it)")
                elif not marked(lines, range(method.lineno, method.end_lineno + 1)):
                    calls = [ast.unparse(c.func) for c in nodes(method, ast.Call)]
                    if helper not in [call.split(".")[-1] for call in calls]:
                        problems.append(f"{where} (line {method.lineno}): not {helper}")
        self.assertTrue(found, "none of the classes the tool patches is defined")
        self.assertFalse(problems, "draft layouts by hand:\n" + "\n".join(problems))

    def test_per_step_out_cache_loc_split_once(self):
        files = sorted((PACKAGE / ATTENTION).rglob("*.py"))
        paths = [f.relative_to(PACKAGE).as_posix() for f in files]
        modules = {path: module(path) for path in paths + [p for p, _ in WORKERS]}
        found, problems = split_once_problems(PACKAGE, modules)
        dsv4 = class_in(module(DSV4[0])[0], DSV4[1])
        self.assertTrue(dsv4 is None or DSV4[1] in found, "DeepSeek-V4 not judged")
        lines = []
        for path, line, scope, verdict in problems:
            never = f"never split per step: {verdict.why}"
            why = never if verdict.who == NEVER else verdict.why
            lines.append(f"sglang/{path}:{line}: {scope}: {why}")
        message = "per-step out_cache_loc not split once:\n" + "\n".join(lines)
        self.assertFalse(problems, message)


if __name__ == "__main__":
    unittest.main()

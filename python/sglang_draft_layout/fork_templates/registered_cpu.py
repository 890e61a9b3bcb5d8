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
KEEP = "# sglang-draft-layout: keep"
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
# sglang-draft-layout: embed sglang_draft_layout.proof.split_once
# fmt: on


def nodes(tree, kind):
    return [n for n in ast.walk(tree) if isinstance(n, kind)]


def module(path):
    """The tree and lines of a module under the package (empty where there is none)."""
    file = PACKAGE / path
    source = file.read_text(encoding="utf-8") if file.is_file() else ""
    return ast.parse(source), source.splitlines()


def methods(cls):
    return {m.name: m for m in cls.body if isinstance(m, ast.FunctionDef)}


def class_in(tree, name):
    return next((c for c in tree.body if getattr(c, "name", "") == name), None)


def marked(lines, numbers):
    return any(KEEP in lines[number - 1] for number in numbers)


def baking(cls):
    """init_forward_metadata and what it reaches (``self.m(...)``) if they hand
    ``out_cache_loc=`` on (baking it at init) and the class knows its step; else []."""
    own, todo, seen = methods(cls), ["init_forward_metadata"], []
    while todo:
        method = own.get(todo.pop())
        if method is not None and method not in seen:
            seen.append(method)
            names = [getattr(c.func, "attr", "") for c in nodes(method, ast.Call)]
            todo += [n for n in names if f"self.{n}(" in ast.unparse(method)]
    hands = [k for m in seen for k in nodes(m, ast.keyword) if k.arg == "out_cache_loc"]
    return seen if hands and "speculative_step_id" in ast.unparse(cls) else []


def keeps_path(lines, path):
    """KEEP on a def line of the path's methods, or a statement handing it on."""
    headers = [n for m in path for n in range(m.lineno, m.body[0].lineno)]
    handing = [s for m in path for s in nodes(m, ast.stmt)]
    handing = [s.lineno for s in handing if "out_cache_loc=" in ast.unparse(s)]
    return marked(lines, headers + handing)


def worker_rows():
    """EAGLE workers whose draft_forward sets ``<batch>.out_cache_loc = <rows>[...]``
    in a loop, then ``<...>.init_forward_metadata(<batch>)``: each step gets its row."""
    found = []
    for path, name in list(SITES.items())[4:]:
        worker = class_in(module(f"srt/{path}.py")[0], name)
        own = methods(worker) if worker else {}
        loops = nodes(own["draft_forward"], ast.For) if "draft_forward" in own else []
        for loop, row in [(lp, a) for lp in loops for a in nodes(lp, ast.Assign)]:
            batch = ast.unparse(row.targets[0]).rpartition(".out_cache_loc")[0]
            calls = [c for c in nodes(loop, ast.Call) if c.lineno > row.lineno]
            calls = [ast.unparse(c) for c in calls]
            inits = [c for c in calls if c.endswith(f".init_forward_metadata({batch})")]
            if batch and isinstance(row.value, ast.Subscript) and inits:
                where = f"sglang/srt/{path}.py:{row.lineno}"
                found.append(f"{name}.draft_forward ({where})")
    return found


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
        workers = worker_rows()  # they split on every path: the backend must not, then
        once = (CALLER, NEVER) if workers else (CALLER, PER_STEP)
        found, problems = set(), []
        for file in sorted((PACKAGE / "srt/layers/attention").rglob("*.py")):
            path = file.relative_to(PACKAGE).as_posix()
            tree, lines = module(path)
            for cls in [c for c in tree.body if isinstance(c, ast.ClassDef)]:
                path_methods = baking(cls)
                found |= {(path, cls.name)} if path_methods else set()
                if not path_methods or keeps_path(lines, path_methods):
                    continue
                verdict = split_verdict(world_of(tree, PACKAGE), cls.name)
                twice = f"split by the {verdict.who} {verdict.caller}".rstrip()
                twice += f", and by {', '.join(workers)}: twice"
                what = {WRONG: verdict.why, NEVER: f"never split: {verdict.why}"}
                where = f"sglang/{path}:{path_methods[0].lineno}: {cls.name}"
                where += ".init_forward_metadata"
                if verdict.who not in once:
                    problems.append(f"{where}: {what.get(verdict.who, twice)}")
        self.assertTrue(class_in(module(DSV4[0])[0], DSV4[1]) is None or DSV4 in found)
        message = "per-step out_cache_loc not split once:\n" + "\n".join(problems)
        self.assertFalse(problems, message)


if __name__ == "__main__":
    unittest.main()

"""Multi-step EAGLE draft layout: upstream's helpers, and this tree's draft paths run.

Written by sglang-draft-layout (``apply``); ``sglang-draft-layout check`` reports it
stale when it differs from what the tool would write. Needs nothing but this tree:

* TestDraftLayoutHelpers: the values and asserts of upstream's helpers, the fork's own.
* TestDraftPaths: every draft path of this tree (the EAGLE workers' draft_forward, the
  multi-step kv_indices backends, DeepSeek-V4-like per-step backends), found and run
  with this tree's own code and real torch by the harness ``check`` runs (written with
  this test as python/sglang/test/draft_layout_harness.py), must give upstream's values
  on every probe where it shows a draft layout: each step writes and bakes its own row
  of out_cache_loc, split once; kv_indices rows are num_seqs * topk * max_context_len
  wide and step i reads draft_kv_indices_used_len(..., i + 1) of row i; FlashInfer's and
  FlashInfer-MLA's common_template refuse rows narrower than they fill.

A path the fork keeps (``# sglang-draft-layout: keep``, or ``apply --keep``) is listed in
``KEPT`` and not judged.
"""

from __future__ import annotations

import itertools
import unittest
from pathlib import Path

import torch

import sglang
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.draft_layout_harness import (
    FACADE,
    Tree,
    eagle_utils,
    guarded_modules,
    judge_paths,
    spec_utils,
)
from sglang.test.test_utils import CustomTestCase

register_cpu_ci(est_time=25, suite="stage-a-test-cpu")

PACKAGE = Path(sglang.__file__).resolve().parent
HELPERS = ("draft_kv_indices_buffer_width", "draft_kv_indices_used_len")
MISSING = [h for h in HELPERS if not hasattr(spec_utils, h)]
if not hasattr(eagle_utils, "per_step_draft_out_cache_loc"):
    MISSING.append("per_step_draft_out_cache_loc")
if MISSING:  # upstream's values below come from them: nothing here runs without them
    raise ImportError(f"sglang.srt.speculative has no {', '.join(MISSING)}: run apply")

KEPT = ()  # sglang-draft-layout: the paths the fork keeps


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

    def test_upstreams_values_wherever_the_paths_are_judged(self):
        # the draft paths are held against these helpers on probes of up to 512
        # sequences, topk 128 and 16 steps: there each must be upstream's formula
        sizes = itertools.product((1, 2, 3, 5, 64, 512), (1, 2, 4, 8, 128), (1, 3, 16))
        for n, topk, steps in sizes:
            branches = n * topk
            slots = torch.arange(branches * steps)
            rows = eagle_utils.per_step_draft_out_cache_loc(slots, n, topk, steps)
            # row i: the i-th slot of each branch
            self.assertTrue(torch.equal(rows, slots.view(branches, steps).t()))
            for context_len in (64, 4096):
                width = spec_utils.draft_kv_indices_buffer_width(n, topk, context_len)
                self.assertEqual(width, branches * context_len)
            for i in range(steps):
                used = spec_utils.draft_kv_indices_used_len(
                    7 * n, topk, branches, i + 1
                )
                self.assertEqual(used, 7 * n * topk + branches * (i + 1))
        width = spec_utils.draft_kv_indices_buffer_width(1, 1, 2**31 - 1)
        self.assertEqual(width, 2**31 - 1)  # the widest int32 offsets hold
        with self.assertRaises(AssertionError):
            spec_utils.draft_kv_indices_buffer_width(1, 1, 2**31)


class TestDraftPaths(CustomTestCase):
    def test_draft_paths_give_upstreams_values(self):
        modules = guarded_modules(PACKAGE)
        verdicts = {
            f"{path.module}: {path.cls}": verdict
            for path, verdict in judge_paths(Tree(PACKAGE, FACADE), modules).items()
            if f"{path.module}:{path.cls}" not in KEPT
        }
        shown = [name for name, verdict in verdicts.items() if verdict.judged]
        self.assertTrue(shown, "no draft path shows a draft layout on the probes")
        problems = [
            f"sglang/{name}: {verdict.problems[0]}"
            for name, verdict in verdicts.items()
            if verdict.problems
        ]
        self.assertFalse(
            problems, "not upstream's draft layout:\n" + "\n".join(problems)
        )


if __name__ == "__main__":
    unittest.main()

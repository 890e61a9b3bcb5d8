"""The harness test/registered/unit/speculative/test_draft_layout.py runs.

Written by sglang-draft-layout (``apply``) beside that test; ``sglang-draft-layout check``
reports it stale when it differs from what the tool would write. It finds every draft path
of this tree (the EAGLE workers' draft_forward, the multi-step kv_indices backends,
DeepSeek-V4-like per-step backends), runs each with this tree's own code and real torch on
probes, and holds what it does against upstream's values: ``judge_paths``. Its modules are
the tool's, those ``check`` runs, verbatim (``fmt: off``: the tool's line length; the
tool's caches and the tracing of its own rewrites left out); upstream's values are those of
this tree's helpers, compiled from their text as the draft paths are (``tree_helpers``).
"""

from __future__ import annotations

import ast
import bisect
import builtins
import contextlib
import copy
import dis
import functools
import inspect
import operator
import os
import re
import sys
import types
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Collection, Iterable, Iterator, Optional, Sequence

import torch

# fmt: off
# sglang-draft-layout: embed sglang_draft_layout.harness.unknown
# sglang-draft-layout: embed sglang_draft_layout.harness.branches
# sglang-draft-layout: embed sglang_draft_layout.harness.world
# sglang-draft-layout: embed sglang_draft_layout.harness.paths
# sglang-draft-layout: embed sglang_draft_layout.harness.invariant
# sglang-draft-layout: embed sglang_draft_layout.harness.torch_backend
# fmt: on


def tree_helpers(package: Path) -> list[types.SimpleNamespace]:
    """This tree's ``eagle_utils`` and ``spec_utils`` as the harness runs its code:
    compiled from their text, not imported (importing them imports the model layers, and
    with them kernel packages a CPU machine may lack)."""
    tree = Tree(package, FACADE)
    relatives = ("srt/speculative/eagle_utils.py", "srt/speculative/spec_utils.py")
    return [
        types.SimpleNamespace(**(tree.module(relative) if tree.has(relative) else {}))
        for relative in relatives
    ]


# upstream's values: those of this tree's own helpers (the test pins their values)
eagle_utils, spec_utils = tree_helpers(Path(__file__).resolve().parents[1])

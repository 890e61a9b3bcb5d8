"""Fixtures for the per-rule tests (test_rule_*.py).

``sglang_tree`` is an empty tree laid out like an SGLang 0.5.12 install
(``sglang/_version.py``, ``sglang/srt/speculative/``, ``sglang/srt/layers/attention/``)
under pytest's tmp_path. Tests write small hand-made snippets into it, which mimic one
site each (a class with the method and the statements a rule looks for; no SGLang code),
then run the real engine restricted to the rule under test, or the real CLI.

The snippets are the rules' fixtures, not runnable programs: the rewritten tree's judgement
(``judgement.path_findings``, every draft path run on the probes) is tested on runnable code, the real
releases and forks (test/releases, test/unit/test_judgement.py), and left out here
(``rules_alone``) unless a test is marked ``judged``. What each path gave before is still computed.

The test modules import the helpers below from ``rule_test_support``: pytest imports
this file before any test module of this folder, and it registers itself under that
name, which no other ``conftest.py`` (test/proof/ has one) can shadow the way it can
shadow the plain module name ``conftest``.
"""

from __future__ import annotations

import ast
import inspect
import sys
from pathlib import Path
from typing import Sequence

import pytest
from sglang_draft_layout import cli, engine
from sglang_draft_layout.rules import RULES
from sglang_draft_layout.rules.base import Rule, State
from sglang_draft_layout.speculative import eagle_utils, spec_utils
from sglang_draft_layout.target import Target, resolve

VERSION_FILE = "__version__ = version = '0.5.12'\n"

FLASHINFER = "srt/layers/attention/flashinfer_backend.py"
FLASHINFER_MLA = "srt/layers/attention/flashinfer_mla_backend.py"
TRITON = "srt/layers/attention/triton_backend.py"
AITER = "srt/layers/attention/aiter_backend.py"
DSV4 = "srt/layers/attention/deepseek_v4_backend.py"
SPEC_UTILS = "srt/speculative/spec_utils.py"
EAGLE_UTILS = "srt/speculative/eagle_utils.py"
WORKER_V2 = "srt/speculative/eagle_worker_v2.py"
WORKER_V1 = "srt/speculative/eagle_worker.py"


def rule(rule_id: str) -> Rule:
    """The rule of RULES with this id (e.g. ``step-slice:flashinfer``)."""
    found = [r for r in RULES if r.id == rule_id]
    assert len(found) == 1, f"no single rule {rule_id!r}: {[r.id for r in RULES]}"
    return found[0]


def method_source(text: str, scope: str) -> str:
    """The lines of ``Class.method`` in ``text``: decorators and def through its last line."""
    class_name, method_name = scope.split(".")
    tree = ast.parse(text)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name)
    func = next(n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == method_name)
    start = min([func.lineno, *(d.lineno for d in func.decorator_list)]) - 1
    return "".join(text.splitlines(keepends=True)[start : func.end_lineno])


def line_of(text: str, needle: str) -> int:
    """1-based line of the only line of ``text`` containing ``needle``."""
    hits = [number for number, line in enumerate(text.splitlines(), 1) if needle in line]
    assert len(hits) == 1, f"{needle!r} is on lines {hits}"
    return hits[0]


class Tree:
    """A tmp SGLang tree: ``root/sglang/...``."""

    def __init__(self, root: Path, capsys: pytest.CaptureFixture) -> None:
        self.root = root
        self.package = root / "sglang"
        (self.package / "srt" / "speculative").mkdir(parents=True)
        (self.package / "srt" / "layers" / "attention").mkdir(parents=True)
        (self.package / "_version.py").write_text(VERSION_FILE)
        for helpers in (spec_utils, eagle_utils):  # the modules call sites import the helpers from, defining them
            (self.package / "srt" / "speculative" / Path(helpers.__file__).name).write_text(inspect.getsource(helpers))
        self._capsys = capsys

    def path(self, relative: str) -> Path:
        return self.package / relative

    def write(self, relative: str, text: str) -> Path:
        """Write ``text`` (exactly as given) to ``sglang/<relative>``."""
        path = self.path(relative)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        return path

    def read(self, relative: str) -> str:
        return self.path(relative).read_text(encoding="utf-8")

    def target(self) -> Target:
        return resolve(str(self.root))

    def plan(self, rules: Sequence[Rule]) -> engine.Plan:
        return engine.plan(self.target(), rules=list(rules))

    def apply(self, rules: Sequence[Rule]) -> engine.Plan:
        """Plan with ``rules`` only and write the changes (the engine's apply runs every rule)."""
        plan = self.plan(rules)
        assert not plan.unrecognised, [engine.describe(f, plan.target) for f in plan.unrecognised]
        engine.write(plan.changes)
        return plan

    def assert_idempotent(self, rules: Sequence[Rule]) -> None:
        """A second plan finds every site patched (or absent) and changes nothing."""
        again = self.plan(rules)
        assert [f.state for f in again.findings] == [
            State.ABSENT if f.state is State.ABSENT else State.PATCHED for f in again.findings
        ]
        assert any(f.state is State.PATCHED for f in again.findings)
        assert again.changes == ()

    def snapshot(self) -> dict[str, bytes]:
        """Every file of the tree, by path relative to the root, as bytes."""
        return {
            str(path.relative_to(self.root)): path.read_bytes()
            for path in sorted(self.root.rglob("*"))
            if path.is_file()
        }

    def cli(self, *argv: str) -> tuple[int, str, str]:
        """Run ``sglang-draft-layout <argv...> <root>``; (exit code, stdout, stderr)."""
        self._capsys.readouterr()
        code = cli.main([*argv, str(self.root)])
        out, err = self._capsys.readouterr()
        return code, out, err


def keep_hint(relative: str, scope: str) -> str:
    """What a refusal adds: keep the site as the fork wrote it (how), or rewrite it."""
    return (
        f"; keep the fork's code (`# sglang-draft-layout: keep` at the end of that line or alone on the line before it, "
        f"or `--keep {relative}:{scope}`) "
        "or rewrite it to a form docs/sites.md lists"
    )


def assert_refused(tree: Tree, relative: str, line: int, scope: str, site: str, detail: str) -> None:
    """``sglang-draft-layout apply`` exits 2 naming file:line and Class.method, and writes nothing.

    The tree also holds patchable files (see ``write_bystanders``): the full plan would
    change them, so an unchanged tree shows that the refusal stopped every write.
    """
    full = engine.plan(tree.target())
    assert {str(c.path.relative_to(tree.package)) for c in full.changes} == set(BYSTANDERS) - {relative}
    before = tree.snapshot()
    code, out, err = tree.cli("apply")
    assert code == 2
    assert out == ""
    assert (
        err
        == f"error: {tree.path(relative)}:{line}: {scope}: {site}: {detail}{keep_hint(relative, scope)}; nothing written\n"
    )
    assert tree.snapshot() == before


# ---- hand-made snippets shaped like SGLang 0.5.12's sites -------------------------
# None of this is SGLang code: each is the smallest class that has the method and the
# statements a rule looks for, written for these tests.

BACKEND_DOC = '"""A multi-step draft attention backend (hand-made mimic of the site)."""\n'


def backend_header(*spec_utils_names: str) -> str:
    """The module header of the backend snippets; with ``spec_utils_names``, as the rules leave it
    (isort's place: ``sglang.srt.speculative`` sorts before ``sglang.srt.utils``)."""
    added = f"from sglang.srt.speculative.spec_utils import {', '.join(spec_utils_names)}\n" if spec_utils_names else ""
    return (
        f"{BACKEND_DOC}\n"
        "from __future__ import annotations\n\n"
        "import torch\n\n"
        f"{added}"
        "from sglang.srt.utils import next_power_of_2\n\n\n"
        "def helper_above_the_class(x):\n"
        "    return x\n\n\n"
    )


INIT = """\
    def __init__(self, topk, speculative_num_steps):
        self.topk = topk
        self.speculative_num_steps = speculative_num_steps
"""

COMMON_TEMPLATE = """\
    def common_template(self, forward_batch, kv_indices_buffer, call_fn):
        num_seqs = forward_batch.batch_size
        bs = self.topk * num_seqs
        seq_lens_sum = forward_batch.seq_lens_sum

        # One launch fills the rows of every draft step.
        self.generate_draft_decode_kv_indices[
            (self.speculative_num_steps, num_seqs, self.topk)
        ](
            kv_indices_buffer,
            self.kv_indptr,
            kv_indices_buffer.shape[1],
            next_power_of_2(bs),
        )

        for i in range(self.speculative_num_steps - 1):
            forward_batch.spec_info.kv_indptr = self.kv_indptr[i, : bs + 1]
            # Step i reads the front of its row.
            forward_batch.spec_info.kv_indices = kv_indices_buffer[i][
                : seq_lens_sum * self.topk + bs * (i + 1)
            ]
            call_fn(i, forward_batch)
"""

#: the slice end of COMMON_TEMPLATE as the step-slice rule leaves it
AFTER_STEP_SLICE_END = "draft_kv_indices_used_len(seq_lens_sum, self.topk, bs, i + 1)"

EAGER = """\
    def init_forward_metadata(self, forward_batch):
        # One kv_indices row per draft step.
        kv_indices = torch.empty(
            (
                self.speculative_num_steps,
                forward_batch.batch_size * self.topk * self.max_context_len,
            ),
            dtype=torch.int32,
            device="cuda",
        )

        def call_fn(i, forward_batch):
            self.attn_backends[i].init_forward_metadata(forward_batch)

        self.common_template(forward_batch, kv_indices, call_fn)
"""

GRAPH = """\
    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int):
        self.cuda_graph_kv_indices = torch.zeros(
            (self.speculative_num_steps, max_bs * self.max_context_len),
            dtype=torch.int32,
            device="cuda",
        )

        for i in range(self.speculative_num_steps - 1):
            self.attn_backends[i].init_cuda_graph_state(
                max_bs, max_num_tokens, kv_indices_buf=self.cuda_graph_kv_indices[i]
            )
"""


def backend_module(cls: str, *methods: str, header: str | None = None) -> str:
    """A backend file: the header, then ``class cls`` holding ``methods`` (default: all four, 0.5.12-like)."""
    methods = methods or (INIT, COMMON_TEMPLATE, EAGER, GRAPH)
    return (backend_header() if header is None else header) + f"class {cls}:\n" + "\n".join(methods)


SPEC_UTILS_MODULE = """\
\"\"\"Speculative decoding utilities (hand-made mimic).\"\"\"

from __future__ import annotations

import triton
import triton.language as tl

TREE_TRAVERSE_TIME_THRESHOLD = 1


@triton.jit
def generate_draft_decode_kv_indices(req_pool_indices, kv_indices, num_seqs: tl.constexpr):
    pid = tl.program_id(0)


def select_top_k_tokens(i, topk_p, topk_index):
    return topk_p, topk_index
"""

EAGLE_UTILS_MODULE = """\
\"\"\"EAGLE utilities (hand-made mimic).\"\"\"

import logging

import torch

logger = logging.getLogger(__name__)


def organize_draft_results(score_list, token_list, parents_list, num_draft_token):
    return score_list, token_list, parents_list
"""

DRAFT_FORWARD = """\
    def draft_forward(self, forward_batch):
        spec_info = forward_batch.spec_info
        out_cache_loc = forward_batch.out_cache_loc
        topk_p, topk_index = spec_info.topk_p, spec_info.topk_index

        out_cache_loc = out_cache_loc.reshape(
            forward_batch.batch_size, self.topk, self.speculative_num_steps
        )
        out_cache_loc = out_cache_loc.permute((2, 0, 1)).reshape(
            self.speculative_num_steps, -1
        )

        for i in range(self.speculative_num_steps):
            forward_batch.out_cache_loc = out_cache_loc[i]
            self.draft_runner.forward(forward_batch)
        return topk_p, topk_index
"""

WORKER_HEADER = '"""The EAGLE draft worker (hand-made mimic)."""\n\nimport torch\n\nfrom sglang.srt.speculative.eagle_utils import organize_draft_results\n\n\n'


def worker_module(cls: str, *methods: str, header: str = WORKER_HEADER) -> str:
    return header + f"class {cls}:\n" + "\n".join(methods or (DRAFT_FORWARD,))


#: patchable files a refusal test puts beside the refused one: nothing may be written
BYSTANDERS = {
    SPEC_UTILS: SPEC_UTILS_MODULE,
    EAGLE_UTILS: EAGLE_UTILS_MODULE,
    WORKER_V2: worker_module("EagleDraftWorker"),
    FLASHINFER: backend_module("FlashInferMultiStepDraftBackend"),
}


def write_bystanders(tree: Tree, *, besides: str) -> None:
    """Write every BYSTANDERS file except ``besides`` (the file under test)."""
    for relative, text in BYSTANDERS.items():
        if relative != besides:
            tree.write(relative, text)


@pytest.fixture
def sglang_tree(tmp_path: Path, capsys: pytest.CaptureFixture) -> Tree:
    return Tree(tmp_path, capsys)


@pytest.fixture(autouse=True)
def rules_alone(request, monkeypatch):
    """The rules' verdicts and edits alone: no refusal by the rewritten tree's judgement (see the module)."""
    if request.node.get_closest_marker("judged") is None:
        from sglang_draft_layout import judgement

        monkeypatch.setattr(judgement, "path_findings", lambda *_args: [])


sys.modules.setdefault("rule_test_support", sys.modules[__name__])

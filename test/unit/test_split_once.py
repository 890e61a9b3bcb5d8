"""The split-once verdict (``proof.split_once.once_verdict``) on multi-step -> per-step paths, the classes
it is asked about (``proof.baking.baking_methods``), the keeps (``keeps_path``) and the EAGLE workers'
rows (``worker_rows``); the structural guard's finding agrees with the verdict on each."""

from __future__ import annotations

import ast

import pytest

from sglang_draft_layout.proof.baking import BAKING_STARTS, KEEP, baking_methods, keeps_path, worker_rows
from sglang_draft_layout.proof.split_once import (
    CALLER,
    NEVER,
    PATHS,
    PER_STEP,
    TWICE,
    WRONG,
    SplitVerdict,
    once_verdict,
)
from sglang_draft_layout.proof.world import world_of
from sglang_draft_layout.rules.base import Source, State
from sglang_draft_layout.rules.structural_guard import guard_rules

PER_STEP_CODE = """
class StepBackend:
    def __init__(self, speculative_step_id=0):
        self.speculative_step_id = speculative_step_id

    def init_forward_metadata(self, forward_batch):
        if forward_batch.forward_mode.is_decode_or_idle():
{split}            self.metadata = self.build(out_cache_loc={loc})
"""
PER_STEP_SPLIT = (
    "            loc = per_step_draft_out_cache_loc(\n"
    "                forward_batch.out_cache_loc, forward_batch.batch_size, self.topk, self.speculative_num_steps\n"
    "            )[self.speculative_step_id]\n"
)
MULTI_STEP = """
class MultiStepBackend(StepBackend):
    def __init__(self, steps):
        self.attn_backends = [StepBackend() for _ in range(steps)]

    def init_forward_metadata(self, forward_batch):
{rows}        for i in range(self.speculative_num_steps - 1):
{set_row}            self.attn_backends[i].init_forward_metadata(forward_batch)
"""
CALLER_ROWS = (
    "        rows = forward_batch.out_cache_loc.view(\n"
    "            forward_batch.batch_size, self.topk, self.speculative_num_steps\n"
    "        ).movedim(-1, 0).flatten(1)\n"
)
SET_ROW = "            forward_batch.out_cache_loc = rows[i]\n"


def path_module(per_step_splits: bool, caller_splits: bool) -> str:
    return PER_STEP_CODE.format(
        split=PER_STEP_SPLIT if per_step_splits else "", loc="loc" if per_step_splits else "forward_batch.out_cache_loc"
    ) + MULTI_STEP.format(rows=CALLER_ROWS if caller_splits else "", set_row=SET_ROW if caller_splits else "")


def kept_at(code: str, index: int) -> tuple:
    """(tree, lines) of ``code`` with the keep comment on its line ``index`` (from 0)."""
    lines = code.splitlines()
    lines[index] += "  " + KEEP
    return ast.parse("\n".join(lines)), lines


def verdict(code: str, workers: tuple = ()) -> SplitVerdict:
    return once_verdict(world_of(ast.parse(code), None), "StepBackend", workers)


def kept(lines: list) -> bool:
    return keeps_path(lines, baking_methods(step_backend(ast.parse("\n".join(lines)))))


def guard(code: str):
    """The structural guard's split-once finding for StepBackend (what `check` reports)."""
    source = Source("srt/layers/attention/fork_backend.py", code)
    [rule] = [r for r in guard_rules(source.path, source, ()) if r.id.startswith("guard:split-once:")]
    return rule.find(rule, source)


def agree(code: str, workers: tuple = ()) -> SplitVerdict:
    """The verdict, after checking the guard reports it so (once: patched; else unrecognised)."""
    found = verdict(code, workers)
    if not workers:  # the guard reads the workers from the tree's other modules
        assert guard(code).state is (State.PATCHED if found.who in (CALLER, PER_STEP) else State.UNRECOGNISED)
    return found


@pytest.mark.parametrize(
    "per_step_splits, caller_splits, who",
    [
        (True, False, PER_STEP),
        (False, True, CALLER),
        (True, True, TWICE),
        (False, False, NEVER),
    ],
    ids=["per-step backend splits", "caller splits", "both split", "nobody splits"],
)
def test_the_verdict_says_who_splits_on_the_path(per_step_splits, caller_splits, who):
    code = path_module(per_step_splits, caller_splits)
    found = agree(code)
    assert found.who == who
    if who in (CALLER, TWICE):  # the caller, and the line where it sets each step's row
        assert found.caller == "MultiStepBackend.init_forward_metadata"
        assert code.splitlines()[found.line - 1] == SET_ROW.rstrip("\n")
    if who in (TWICE, NEVER):  # kept on the per-step backend's def line: left out; on the caller's: still found
        per_step_def, caller_def = [
            i for i, line in enumerate(code.splitlines()) if "def init_forward_metadata" in line
        ]
        assert not kept(kept_at(code, caller_def)[1])
        assert kept(kept_at(code, per_step_def)[1])
        assert guard("\n".join(kept_at(code, per_step_def)[1])).state is State.KEPT


def test_only_a_keep_on_the_per_step_backends_def_or_handoff_keeps_the_path():
    """keeps_path: the per-step method's def line or its statement handing out_cache_loc= on; not its
    own split's statement, not the caller's def line or rows (they keep their own layouts)."""
    code = path_module(True, True)
    lines = code.splitlines()
    where = {
        "per-step def": next(i for i, line in enumerate(lines) if "def init_forward_metadata" in line),
        "handoff": next(i for i, line in enumerate(lines) if "out_cache_loc=loc" in line),
        "per-step split": next(i for i, line in enumerate(lines) if "loc = per_step_draft_out_cache_loc(" in line),
        "caller def": [i for i, line in enumerate(lines) if "def init_forward_metadata" in line][1],
        "caller rows": next(i for i, line in enumerate(lines) if "forward_batch.out_cache_loc = rows[i]" in line),
        "caller split": next(i for i, line in enumerate(lines) if "rows = forward_batch.out_cache_loc.view(" in line),
    }
    found = {name: kept(kept_at(code, index)[1]) for name, index in where.items()}
    assert found == {
        "per-step def": True,
        "handoff": True,
        "per-step split": False,
        "caller def": False,
        "caller rows": False,
        "caller split": False,
    }
    for name, index in where.items():  # the guard agrees
        assert (guard("\n".join(kept_at(code, index)[1])).state is State.KEPT) is found[name], name
    assert not kept(lines)


def test_a_keep_in_a_compound_statement_holding_the_handoff_is_not_on_it():
    code = path_module(True, False).replace(
        "            self.metadata = self.build(", "            with ctx:\n                self.metadata = self.build("
    )
    lines = code.splitlines()
    with_line = next(i for i, line in enumerate(lines) if "with ctx:" in line)
    handoff = next(i for i, line in enumerate(lines) if "out_cache_loc=loc" in line)
    assert not kept(kept_at(code, with_line)[1]) and kept(kept_at(code, handoff)[1])


def test_a_caller_that_sets_a_row_after_init_does_not_split_for_it():
    code = (
        path_module(False, True)
        .replace(SET_ROW, "")
        .replace(
            "            self.attn_backends[i].init_forward_metadata(forward_batch)\n",
            "            self.attn_backends[i].init_forward_metadata(forward_batch)\n" + SET_ROW,
        )
    )
    assert agree(code).who == WRONG  # step 0 bakes the whole buffer, the next steps the row of the step before


def test_a_per_step_backend_that_does_not_bake_out_cache_loc_is_not_judged():
    code = path_module(False, False).replace(
        "out_cache_loc=forward_batch.out_cache_loc", "seq_lens=forward_batch.seq_lens"
    )
    assert baking_methods(step_backend(ast.parse(code))) == []
    source = Source("srt/layers/attention/fork_backend.py", code)
    assert [r for r in guard_rules(source.path, source, ()) if ":split-once:" in r.id] == []


def test_keep_pragma_on_the_per_step_backends_site_statement_keeps_the_path():
    code = path_module(False, False).replace(
        "self.metadata = self.build(out_cache_loc=forward_batch.out_cache_loc)",
        "self.metadata = self.build(out_cache_loc=forward_batch.out_cache_loc)  " + KEEP,
    )
    assert verdict(code).who == NEVER and kept(code.splitlines()) and guard(code).state is State.KEPT


WORKER_V2 = "srt/speculative/eagle_worker_v2.py"
#: an EAGLE worker (its own module) that sets each step's row, then inits that step's backend
WORKER = """
class EagleDraftWorker:
    def draft_forward(self, forward_batch):
        rows = forward_batch.out_cache_loc.view(
            forward_batch.batch_size, self.topk, self.speculative_num_steps
        ).movedim(-1, 0).flatten(1)
        for i in range(self.speculative_num_steps - 1):
            forward_batch.out_cache_loc = rows[i]
            forward_batch.attn_backend = self.draft_attn_backend.attn_backends[i]
            forward_batch.attn_backend.init_forward_metadata(forward_batch)
"""


def worker_modules(worker: str = WORKER) -> dict:
    return {WORKER_V2: ast.parse(worker)}


@pytest.mark.parametrize(
    "per_step_splits, who",
    [(False, CALLER), (True, TWICE)],
    ids=["only the worker splits", "the per-step backend splits too"],
)
def test_a_workers_rows_in_another_module_split_on_the_path(per_step_splits, who):
    code = path_module(per_step_splits, False)
    workers = worker_rows(worker_modules())
    assert WORKER.splitlines()[8 - 1] == "            forward_batch.out_cache_loc = rows[i]"
    assert workers == [(WORKER_V2, "EagleDraftWorker.draft_forward", 8)]
    assert verdict(code).who == (PER_STEP if per_step_splits else NEVER)  # without the worker
    found = verdict(code, workers)
    assert (found.who, found.caller, found.path, found.line) == (who, "EagleDraftWorker.draft_forward", WORKER_V2, 8)
    if who == TWICE:
        assert found.why == (
            f"split by the per-step backend, and by EagleDraftWorker.draft_forward " f"({WORKER_V2}:8): twice"
        )
    # a keep on the worker's draft_forward keeps the worker's own split, not the path
    keep = WORKER.replace("draft_forward(self, forward_batch):", "draft_forward(self, forward_batch):  " + KEEP)
    assert keep != WORKER and verdict(code, worker_rows(worker_modules(keep))) == found


def test_a_worker_that_inits_before_setting_the_row_or_another_class_is_no_caller():
    after = (
        WORKER.replace("            forward_batch.out_cache_loc = rows[i]\n", "")
        + "            forward_batch.out_cache_loc = rows[i]\n"
    )
    assert worker_rows(worker_modules(after)) == []
    assert worker_rows(worker_modules(WORKER.replace("EagleDraftWorker", "OtherWorker"))) == []
    assert worker_rows({"srt/speculative/other.py": worker_modules()[WORKER_V2]}) == []


# ---- the per-step handoff moved into a method init_forward_metadata calls ----------------

#: the per-step backend's init_forward_metadata calling a method of its own that holds its decode branch
MOVED_HANDOFF = (
    "    def init_forward_metadata(self, forward_batch):\n"
    "        self._build_metadata(forward_batch)\n"
    "\n"
    "    def _build_metadata(self, forward_batch):\n"
    "        if forward_batch"
)


def moved_path_module(per_step_splits: bool, caller_splits: bool, depth: int = 1) -> str:
    """``path_module`` with the per-step backend's decode branch ``depth`` ``self.`` calls below its
    init_forward_metadata (``_build_metadata``, then ``_build_metadata_2``, ...)."""
    code = path_module(per_step_splits, caller_splits)
    code = code.replace(
        "    def init_forward_metadata(self, forward_batch):\n        if forward_batch", MOVED_HANDOFF, 1
    )
    for level in range(2, depth + 1):
        below = f"_build_metadata_{level}"
        code = code.replace(
            "        if forward_batch",
            (f"        self.{below}(forward_batch)\n\n    def {below}(self, forward_batch):\n        if forward_batch"),
            1,
        )
    return code


def step_backend(tree: ast.Module) -> ast.ClassDef:
    """The per-step backend class of a ``path_module`` tree."""
    return next(c for c in tree.body if isinstance(c, ast.ClassDef) and c.name == "StepBackend")


@pytest.mark.parametrize("depth", [1, 2, 3], ids=["one call deep", "two calls deep", "three calls deep"])
@pytest.mark.parametrize(
    "per_step_splits, caller_splits",
    [(True, False), (False, True), (True, True), (False, False)],
    ids=["per-step backend splits", "caller splits", "both split", "nobody splits"],
)
def test_a_moved_handoff_is_on_the_path_as_if_in_init_forward_metadata(per_step_splits, caller_splits, depth):
    """The verdict runs init_forward_metadata through the methods of its class it calls as ``self.<name>(...)``,
    at any depth, to the one that hands out_cache_loc= on: the same verdict as unmoved; the guard agrees and
    reports it at the handoff; a keep on any method of the path keeps it."""
    code = moved_path_module(per_step_splits, caller_splits, depth)
    assert code.count("    def _build_metadata") == depth
    handoff = "_build_metadata" + (f"_{depth}" if depth > 1 else "")
    assert [m.name for m in baking_methods(step_backend(ast.parse(code)))][-1] == handoff
    assert agree(code).who == verdict(path_module(per_step_splits, caller_splits)).who
    assert code.splitlines()[guard(code).line - 1].strip().startswith("self.metadata = self.build(out_cache_loc=")
    lines = code.splitlines()
    for name in ("init_forward_metadata", "_build_metadata", handoff):
        assert kept(kept_at(code, next(i for i, line in enumerate(lines) if f"def {name}(" in line))[1])


def deep_split_module(depth: int, caller_splits: bool) -> str:
    """``path_module`` whose per-step backend hands on ``self._row_1(forward_batch)``, its split ``depth``
    ``self.`` calls below the handoff (``_row_1`` returning ``self._row_2(...)``, ...)."""
    code = path_module(False, caller_splits).replace(
        "out_cache_loc=forward_batch.out_cache_loc", "out_cache_loc=self._row_1(forward_batch)"
    )
    rows = [
        f"\n    def _row_{level}(self, forward_batch):\n        return self._row_{level + 1}(forward_batch)\n"
        for level in range(1, depth)
    ]
    rows.append(
        f"\n    def _row_{depth}(self, forward_batch):\n"
        "        return forward_batch.out_cache_loc.view(\n"
        "            forward_batch.batch_size, self.topk, self.speculative_num_steps\n"
        "        ).movedim(-1, 0).flatten(1)[self.speculative_step_id]\n"
    )
    return code.replace("\nclass MultiStepBackend", "".join(rows) + "\nclass MultiStepBackend", 1)


@pytest.mark.parametrize("depth", [1, 2, 3])
@pytest.mark.parametrize("caller_splits", [False, True], ids=["per-step backend splits", "both split"])
def test_a_split_calls_below_the_handoff_is_on_the_path(depth, caller_splits):
    """The per-step backend's row split in a method ``depth`` self. calls below its handoff: run there."""
    code = deep_split_module(depth, caller_splits)
    assert code.count("    def _row_") == depth
    assert agree(code).who == (TWICE if caller_splits else PER_STEP)


def test_methods_calling_each_other_are_followed_once():
    """Recursion and two methods calling each other end: each method of the class is reached once."""
    code = moved_path_module(True, True, 2).replace(
        "    def _build_metadata_2(self, forward_batch):\n",
        "    def _build_metadata_2(self, forward_batch):\n"
        "        if forward_batch.again:\n"
        "            self._build_metadata(forward_batch)\n"
        "            self._build_metadata_2(forward_batch)\n",
    )
    step = step_backend(ast.parse(code))
    assert [m.name for m in baking_methods(step)] == ["init_forward_metadata", "_build_metadata", "_build_metadata_2"]
    no_handoff = code.replace("out_cache_loc=loc", "seq_lens=loc")
    assert baking_methods(step_backend(ast.parse(no_handoff))) == []


def test_a_method_handing_on_its_own_parameter_is_on_the_path():
    """0.5.12's init_forward_metadata_decode hands its parameter on (``out_cache_loc=out_cache_loc``): run
    through, the row the caller set is what it bakes."""
    code = path_module(False, True).replace(
        "            self.metadata = self.build(out_cache_loc=forward_batch.out_cache_loc)\n",
        "            self.metadata = self.decode(out_cache_loc=forward_batch.out_cache_loc)\n"
        "\n"
        "    def decode(self, out_cache_loc):\n"
        "        return self.build(out_cache_loc=out_cache_loc)\n",
    )
    assert [m.name for m in baking_methods(step_backend(ast.parse(code)))] == ["init_forward_metadata", "decode"]
    assert agree(code).who == CALLER


def test_a_per_step_backend_that_does_not_know_its_step_is_not_judged():
    """0.5.23's QwenSparseAttnBackend: no speculative_step_id (its caller hands each step a batch of its
    own): it cannot split for itself, so no path into it is judged, as the written test judges none;
    with the handoff in init_forward_metadata or moved out of it."""
    code = path_module(False, False).replace(
        "    def __init__(self, speculative_step_id=0):\n        self.speculative_step_id = speculative_step_id\n\n", ""
    )
    assert "speculative_step_id" not in code
    for each in (
        code,
        code.replace("    def init_forward_metadata(self, forward_batch):\n        if forward_batch", MOVED_HANDOFF, 1),
    ):
        assert baking_methods(step_backend(ast.parse(each))) == []
    assert baking_methods(step_backend(ast.parse(path_module(False, False))))


def test_a_driver_whose_backends_the_verdict_cannot_name_is_refused():
    """A multi-step caller building its per-step backends some other way (a factory): never assumed."""
    code = path_module(False, True).replace("[StepBackend() for _ in range(steps)]", "make_backends(steps)")
    found = agree(code)
    assert found.who == WRONG and found.why.startswith("cannot tell who splits it: MultiStepBackend")


def test_the_verdict_judges_each_path_the_guard_finds():
    """The structural guard finds per-step paths from ``BAKING_STARTS``; the verdict has a way to run each."""
    assert tuple(PATHS) == BAKING_STARTS

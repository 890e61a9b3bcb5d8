"""The structural guard (rules/structural_guard.py) on the real trees and on forks built from 0.5.12.

Real 0.5.8-0.5.12: the classes holding a draft layout are exactly those the rules name (no
false positive). Forks, built here by editing the real 0.5.12 tree: (a) the FlashInfer draft
backend copied into a new file under a new name, (b) a subclass overriding
init_cuda_graph_state with 0.5.12's width, (c) a form no rule knows, (d) a class that
delegates per step, (e) a patched tree whose width local is reverted to 0.5.12's product,
(f) the DeepSeek-V4 pair copied under new names (issue 39: judged by running it against upstream's
invariant): never split per step (the bug: patched as DeepSeek-V4 is, unless kept on the per-step
backend, not on the caller), split in the caller (left as written: handled by the fork's caller, its
split correct by hand; also spelt through a bound 3-d view and movedim), split by the EAGLE worker's
rows (handled by that caller, split once), split in both after merging upstream (the fork's split taken
out; refused when kept on the caller; the written CPU test's split-once check agrees).
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from sglang_draft_layout import cli, engine
from sglang_draft_layout.harness.invariant import guarded_modules
from sglang_draft_layout.layout_patterns.forms import draft_layout_classes
from sglang_draft_layout.rules import RULES
from sglang_draft_layout.target import resolve
from support.written_split_once import not_split_once
from test_lint import LINTERS, lint_changes
from test_releases import OLD_RELEASES, tree_digest

pytestmark = pytest.mark.releases

FLASHINFER = "sglang/srt/layers/attention/flashinfer_backend.py"
FORK_FILE = "srt/layers/attention/fork_draft_backend.py"
UPSTREAM_CLASS = "FlashInferMultiStepDraftBackend"
#: the classes with draft layout arithmetic in 0.5.8-0.5.12, all named by a rule
KNOWN = {
    "FlashInferMultiStepDraftBackend",
    "FlashInferMLAMultiStepDraftBackend",
    "TritonMultiStepDraftBackend",
    "AiterMultiStepDraftBackend",
    "EAGLEWorker",
    "EagleDraftWorker",
}
DELEGATING = '''

class ForkDelegatingDraftBackend:
    """Runs one attention backend per draft step; the layout is theirs."""

    def __init__(self, backends, speculative_num_steps, max_context_len):
        self.attn_backends = backends
        self.speculative_num_steps = speculative_num_steps
        self.max_context_len = max_context_len

    def init_forward_metadata(self, forward_batch):
        for i in range(self.speculative_num_steps - 1):
            self.attn_backends[i].init_forward_metadata(forward_batch)
'''


def guarded_classes(root: Path) -> set[str]:
    """Every class with a draft layout in the guarded folders, each file parsed whole."""
    return {
        name
        for relative in guarded_modules(root / "sglang")
        for name in draft_layout_classes(ast.parse((root / "sglang" / relative).read_text()))
    }


def guard_findings(root: Path) -> list:
    rule_ids = {rule.id for rule in RULES}
    plan = engine.plan(resolve(str(root)), render_changes=False)
    return [f for f in plan.findings if f.rule.id not in rule_ids]


def class_source(path: Path, name: str) -> tuple[str, ast.ClassDef]:
    text = path.read_text()
    cls = next(n for n in ast.parse(text).body if isinstance(n, ast.ClassDef) and n.name == name)
    return "".join(text.splitlines(keepends=True)[cls.lineno - 1 : cls.end_lineno]), cls


def method_source(path: Path, cls_name: str, method: str) -> str:
    text, cls = class_source(path, cls_name)
    func = next(f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == method)
    lines = path.read_text().splitlines(keepends=True)
    return "".join(lines[func.lineno - 1 : func.end_lineno])


def copied_backend(root: Path) -> str:
    """(a) flashinfer_backend.py's imports and its draft backend class, renamed, as a fork's new file: what the
    class uses of the module's own definitions (FlashInferAttnBackend, ...) imported from it, as a fork's file
    would (it runs as Python runs it)."""
    text = (root / FLASHINFER).read_text()
    header = text[: text.index("\nclass ") + 1]  # through the two blank lines before the first class
    body, cls = class_source(root / FLASHINFER, UPSTREAM_CLASS)
    used = {node.id for node in ast.walk(cls) if isinstance(node, ast.Name)}
    own = sorted(
        name
        for node in ast.parse(text).body
        if node.lineno > header.count("\n")
        for name in (
            [node.name] if isinstance(node, (ast.ClassDef, ast.FunctionDef)) else
            [t.id for t in getattr(node, "targets", []) if isinstance(t, ast.Name)]
        )
        if name in used and name != UPSTREAM_CLASS
    )  # fmt: skip
    assert "FlashInferAttnBackend" in own
    module = FLASHINFER.removesuffix(".py").replace("/", ".")
    after = min(  # isort's place for it: before the first `from sglang...` import sorting after it
        n.lineno
        for n in ast.parse(header).body
        if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("sglang.") and n.module > module
    )
    lines = header.splitlines(keepends=True)
    imported = f"from {module} import (\n" + "".join(f"    {name},\n" for name in own) + ")\n"
    header = "".join(lines[: after - 1]) + imported + "".join(lines[after - 1 :])
    return header + body.replace(f"class {UPSTREAM_CLASS}:", "class ForkMultiStepDraftBackend:", 1)


def subclass_module(root: Path) -> str:
    """(b) a subclass overriding init_cuda_graph_state with 0.5.12's own method (width without topk)."""
    method = method_source(root / FLASHINFER, UPSTREAM_CLASS, "init_cuda_graph_state")
    return (
        "import torch\n\nfrom sglang.srt.layers.attention.flashinfer_backend import (\n"
        f"    {UPSTREAM_CLASS},\n)\n\n\nclass ForkDraftBackend({UPSTREAM_CLASS}):\n{method}"
    )


def assert_lint_clean(code: str) -> None:
    for name in LINTERS:
        assert not lint_changes(name, code), name


def rows(capsys, cls: str) -> list[dict]:
    """The sites of class ``cls`` in the JSON report just printed (check --format json)."""
    return [site for site in json.loads(capsys.readouterr().out)["sites"] if site["class_method"].startswith(f"{cls}.")]


@pytest.mark.parametrize("version", OLD_RELEASES)
def test_real_releases_hold_only_known_classes(pristine, patched, version):
    assert guarded_classes(pristine(version)) == KNOWN
    assert guarded_classes(patched(version)) - {"DeepseekV4AttnBackend"} == KNOWN
    assert guard_findings(pristine(version)) == []
    assert guard_findings(patched(version)) == []


def test_copied_backend_is_flagged_then_patched_lint_clean(scratch, capsys):
    """(a) The copy runs as Python runs it (it imports FlashInferAttnBackend, ...): its three sites are to
    patch, and the patched copy gives upstream's rows and slice ends on the probes."""
    root = scratch("0.5.12")
    fork = root / "sglang" / FORK_FILE
    fork.write_text(copied_backend(root))
    assert_lint_clean(fork.read_text())
    assert cli.main(["check", "--format", "json", str(root)]) == 1
    flagged = rows(capsys, "ForkMultiStepDraftBackend")
    text = fork.read_text()
    graph = next(site for site in flagged if site["class_method"].endswith(".init_cuda_graph_state"))
    line = text.splitlines().index("        self.cuda_graph_kv_indices = torch.zeros(") + 1
    assert (graph["file"], graph["line"]) == (f"sglang/{FORK_FILE}", line)
    assert (graph["state"], graph["detail"]) == ("to patch", "found by structure: use draft_kv_indices_buffer_width")
    assert {site["class_method"].split(".")[1] for site in flagged} == {
        "common_template",
        "init_forward_metadata",
        "init_cuda_graph_state",
    }

    assert cli.main(["apply", str(root)]) == 0
    capsys.readouterr()
    assert cli.main(["check", "--no-tests", "--format", "json", str(root)]) == 0
    after = rows(capsys, "ForkMultiStepDraftBackend")
    assert len(after) == 3 and {site["state"] for site in after} == {"patched"}
    assert all(site["judged"].startswith("upstream's values on ") for site in after)
    patched_text = fork.read_text()
    assert "draft_kv_indices_buffer_width(\n            max_bs, self.topk, self.max_context_len\n" in patched_text
    assert "draft_kv_indices_used_len(seq_lens_sum, self.topk, bs, i + 1)" in patched_text
    assert_lint_clean(patched_text)


def test_copied_backend_missing_the_modules_definitions_is_refused_naming_the_error(scratch, capsys):
    """The copy without the import of flashinfer_backend's own definitions raises NameError when Python runs it:
    its draft path cannot be judged, so apply refuses in one line naming the path, the probe and the exception,
    and writes nothing."""
    root = scratch("0.5.12")
    fork = root / "sglang" / FORK_FILE
    text = copied_backend(root)
    start = text.index("from sglang.srt.layers.attention.flashinfer_backend import (\n")
    fork.write_text(text[:start] + text[text.index(")\n", start) + 2 :])
    before = tree_digest(root)
    assert cli.main(["apply", str(root)]) == 2
    [error] = capsys.readouterr().err.splitlines()
    assert f"{fork}: ForkMultiStepDraftBackend.<kv_indices rows>: draft path, run on the probes: " in error
    assert "bs 1, topk 1, 2 steps: NameError at srt/layers/attention/fork_draft_backend.py:" in error
    assert "name 'FlashInferAttnBackend' is not defined" in error and error.endswith("nothing written")
    assert tree_digest(root) == before


def test_subclass_overriding_graph_state_is_flagged_then_patched(scratch, capsys):
    """(b) The subclass runs FlashInfer's common_template on the rows its own init_cuda_graph_state sizes: a
    draft path of its own (narrow CUDA-graph rows, the bug), patched to upstream's width."""
    root = scratch("0.5.12")
    fork = root / "sglang" / FORK_FILE
    fork.write_text(subclass_module(root))
    assert_lint_clean(fork.read_text())
    assert cli.main(["check", "--no-tests", "--format", "json", str(root)]) == 1
    [flagged] = rows(capsys, "ForkDraftBackend")
    assert (flagged["class_method"], flagged["state"]) == ("ForkDraftBackend.init_cuda_graph_state", "to patch")
    assert flagged["detail"] == "found by structure: use draft_kv_indices_buffer_width"
    assert flagged["judged"] and not flagged["judged"].startswith("upstream's values")  # the narrow rows
    assert cli.main(["apply", "--no-tests", str(root)]) == 0
    capsys.readouterr()
    assert cli.main(["check", "--no-tests", "--format", "json", str(root)]) == 0
    [patched_site] = rows(capsys, "ForkDraftBackend")
    assert patched_site["state"] == "patched" and patched_site["judged"].startswith("upstream's values on ")
    after = fork.read_text()
    assert "(self.speculative_num_steps, kv_indices_width)" in after
    assert_lint_clean(after)


def test_unknown_form_is_refused_and_nothing_written(scratch, capsys):
    root = scratch("0.5.12")
    fork = root / "sglang" / FORK_FILE
    unknown = subclass_module(root).replace(
        "max_bs * self.max_context_len", "max_num_tokens * 2 * self.max_context_len"
    )
    fork.write_text(unknown)
    before = tree_digest(root)
    assert cli.main(["apply", str(root)]) == 2
    err = capsys.readouterr().err.strip()
    line = unknown.splitlines().index("        self.cuda_graph_kv_indices = torch.zeros(") + 1
    assert len(err.splitlines()) == 1
    assert f"{fork}:{line}: ForkDraftBackend.init_cuda_graph_state:" in err and "nothing written" in err
    assert tree_digest(root) == before


def test_delegating_class_is_not_flagged(scratch, capsys):
    root = scratch("0.5.12")
    assert cli.main(["apply", "--no-tests", str(root)]) == 0
    fork = root / "sglang" / FORK_FILE
    fork.write_text('"""A fork\'s own draft backend."""\n' + DELEGATING)
    capsys.readouterr()
    assert cli.main(["check", "--no-tests", "--format", "json", str(root)]) == 0
    assert rows(capsys, "ForkDelegatingDraftBackend") == []
    assert guard_findings(root) == []


def test_width_reverted_through_its_local_is_flagged_and_restored(scratch, capsys):
    root = scratch("0.5.12")
    assert cli.main(["apply", "--no-tests", str(root)]) == 0
    backend = root / FLASHINFER
    patched_text = backend.read_text()
    helper = "draft_kv_indices_buffer_width(\n            max_bs, self.topk, self.max_context_len\n        )"
    assert patched_text.count("kv_indices_width = " + helper) == 1
    backend.write_text(
        patched_text.replace("kv_indices_width = " + helper, "kv_indices_width = max_bs * self.max_context_len")
    )
    capsys.readouterr()
    assert cli.main(["check", "--no-tests", "--format", "json", str(root)]) == 1
    [flagged] = [site for site in rows(capsys, UPSTREAM_CLASS) if site["state"] == "to patch"]
    assert flagged["class_method"] == f"{UPSTREAM_CLASS}.init_cuda_graph_state"
    assert cli.main(["apply", "--no-tests", str(root)]) == 0
    assert backend.read_text() == patched_text


# ---- split once: a fork's own copy of the DeepSeek-V4 pair under new names ---------------

DSV4 = "sglang/srt/layers/attention/deepseek_v4_backend.py"
V4_FILE = "srt/layers/attention/fork_v4_backend.py"
V4_RENAMES = {"DeepseekV4AttnBackend": "ForkV4AttnBackend", "DeepseekV4MultiStepBackend": "ForkV4MultiStepBackend"}


#: the caller's split (fork_edits.CALLER_SPLIT) through a bound 3-d view and movedim: no `permute` in the class
CALLER_SPLIT_BOUND_VIEW = (
    """\
        return (
            out_cache_loc.reshape(num_reqs, topk, steps)
            .permute(2, 0, 1)
            .reshape(steps, -1)
        )
""",
    """\
        rows = out_cache_loc.reshape(num_reqs, topk, steps)
        return rows.movedim(-1, 0).flatten(1)
""",
)


def copied_v4_pair(root: Path, caller_split: bool, bound_view: bool = False) -> str:
    """deepseek_v4_backend.py's imports and its two backends, renamed, as a fork's new file
    (``caller_split``: the multi-step backend splitting per step itself, test/support/fork_edits.py;
    ``bound_view``: that split spelt through a bound 3-d view)."""
    from support import fork_edits

    text = (root / DSV4).read_text()
    header = text[: text.index("\nclass ") + 1]
    own = sorted(  # what the two classes use of the module's own definitions, imported from it as a fork would
        name
        for node in ast.parse(text).body
        for name in (
            [node.name] if isinstance(node, (ast.ClassDef, ast.FunctionDef)) else
            [t.id for t in getattr(node, "targets", []) if isinstance(t, ast.Name)]
        )
        if name not in V4_RENAMES
    )  # fmt: skip
    module = DSV4.removesuffix(".py").replace("/", ".")
    last_import = max(n.end_lineno for n in ast.parse(text).body if isinstance(n, (ast.Import, ast.ImportFrom)))
    lines = header.splitlines(keepends=True)
    imported = f"from {module} import (  # isort: skip\n" + "".join(f"    {name},\n" for name in own) + ")\n"
    header = "".join(lines[:last_import]) + imported + "".join(lines[last_import:])
    body = "".join(class_source(root / DSV4, name)[0] + "\n\n" for name in V4_RENAMES)
    if caller_split:
        assert body.count(fork_edits.DSV4_MULTI_STEP) == 1
        body = body.replace(fork_edits.DSV4_MULTI_STEP, fork_edits.CALLER_SPLIT)
    if bound_view:
        assert body.count(CALLER_SPLIT_BOUND_VIEW[0]) == 1
        body = body.replace(*CALLER_SPLIT_BOUND_VIEW)
    for old, new in V4_RENAMES.items():
        body = body.replace(old, new)
    return header + body.rstrip("\n") + "\n"


def v4_sites(capsys) -> list[dict]:
    """The sites of the copied pair's classes in the JSON report just printed (check --format json)."""
    return [site for site in json.loads(capsys.readouterr().out)["sites"] if site["class_method"].startswith("ForkV4")]


def assert_as_clean_as(before: str, after: str) -> None:
    """No lint finding the fork's text did not have (deepseek_v4_backend.py's imports already fail isort)."""
    for name in LINTERS:
        assert lint_changes(name, after) == lint_changes(name, before), name
    assert not lint_changes("black", after)


def test_copied_v4_pair_that_never_splits_is_patched_like_deepseek_v4_unless_kept(scratch, capsys):
    """A DeepSeek-V4 port in a file of its own whose decode hands the whole buffer has the bug: it is patched as
    DeepSeek-V4 is (upstream's slice in the per-step backend), not refused (issue 39), and the tree then splits
    once. Kept on the per-step backend's site (--keep or the comment on its def line): left as written; the
    caller's keep comment keeps its own layout only (the site stays to patch), and the caller is no site for
    --keep."""
    root = scratch("0.5.12")
    fork = root / "sglang" / V4_FILE
    forked = copied_v4_pair(root, caller_split=False)
    fork.write_text(forked)
    assert cli.main(["check", "--no-tests", "--format", "json", str(root)]) == 1
    [guard] = [site for site in v4_sites(capsys) if site["site"].endswith("split once (structural guard)")]
    assert (guard["class_method"], guard["state"]) == ("ForkV4AttnBackend.init_forward_metadata", "to patch")
    assert guard["detail"] == "found by structure: use per_step_draft_out_cache_loc"
    assert "raises AssertionError at srt/layers/attention/fork_v4_backend.py:" in guard["judged"]  # upstream 26239
    keep = f"{V4_FILE}:ForkV4AttnBackend.init_forward_metadata"
    assert cli.main(["apply", "--keep", keep, str(root)]) == 0
    assert fork.read_text() == forked
    capsys.readouterr()
    assert cli.main(["check", "--keep", keep, str(root)]) == 0
    assert "kept by the fork" in capsys.readouterr().out
    caller = f"{V4_FILE}:ForkV4MultiStepBackend.init_forward_metadata"
    assert cli.main(["check", "--keep", caller, str(root)]) == 2
    assert f"--keep {caller}: no site of " in capsys.readouterr().err
    for cls, kept in (("ForkV4MultiStepBackend", False), ("ForkV4AttnBackend", True)):
        fork.write_text(keep_def(forked, cls, "init_forward_metadata"))
        assert cli.main(["check", "--no-tests", str(root)]) == (0 if kept else 1), cls
        out = capsys.readouterr().out
        assert ("kept by the fork" in out, "to patch  ForkV4AttnBackend.init_forward_metadata" in out) == (
            kept,
            not kept,
        ), cls

    fork.write_text(forked)  # no longer kept: patched, split once, lint no worse than the fork's
    assert cli.main(["apply", str(root)]) == 0
    after = fork.read_text()
    assert after.count("per_step_draft_out_cache_loc(") == 1
    assert "                out_cache_loc=out_cache_loc,\n" in after
    assert "                )[self.speculative_step_id]\n" in after
    capsys.readouterr()
    assert cli.main(["check", "--no-tests", "--format", "json", str(root)]) == 0
    [guard] = [site for site in v4_sites(capsys) if site["site"].endswith("split once (structural guard)")]
    assert guard["state"] == "patched" and guard["judged"].startswith("upstream's values on ")
    assert not_split_once(root / "sglang") == []  # the written test: split once, by the per-step backend
    assert_as_clean_as(forked, after)


def keep_def(text: str, cls: str, method: str) -> str:
    """``text`` with the keep comment on the def line of ``cls.method``."""
    start = text.index(f"class {cls}(")
    at = text.index(f"    def {method}(", start)
    end = text.index(":\n", at)
    return text[: end + 1] + "  # sglang-draft-layout: keep" + text[end + 1 :]


@pytest.mark.parametrize("bound_view", [False, True], ids=["permute chain", "bound view, movedim"])
def test_copied_v4_pair_splitting_in_the_caller_is_left_split_once(scratch, capsys, bound_view):
    """The caller hands each step upstream's row with a split of its own: the per-step backend is handled by the
    fork's caller (named at the line setting the step's row), the caller's split is correct, by hand (its values
    are upstream's), and apply leaves the file as written: split once (issue 39)."""
    root = scratch("0.5.12")
    fork = root / "sglang" / V4_FILE
    fork.write_text(copied_v4_pair(root, caller_split=True, bound_view=bound_view))
    forked = fork.read_text()
    row_line = forked.splitlines().index("                    forward_batch.out_cache_loc = step_out_cache_loc[i]") + 1
    assert cli.main(["check", "--no-tests", "--format", "json", str(root)]) == 1  # the release's own sites
    sites = {site["class_method"]: site for site in v4_sites(capsys)}
    assert set(sites) == {
        "ForkV4AttnBackend.init_forward_metadata",
        "ForkV4MultiStepBackend._split_out_cache_loc_per_step",
    }
    guard, split = (
        sites["ForkV4AttnBackend.init_forward_metadata"],
        sites["ForkV4MultiStepBackend._split_out_cache_loc_per_step"],
    )
    assert guard["site"].endswith("split once (structural guard)")
    assert (guard["state"], guard["detail"]) == (
        "handled by the fork's caller",
        f"ForkV4MultiStepBackend.init_forward_metadata at srt/layers/attention/fork_v4_backend.py:{row_line}",
    )
    assert split["state"] == "correct, by hand" and split["detail"].endswith(": left as it is")
    assert cli.main(["apply", "--no-tests", str(root)]) == 0
    assert fork.read_text() == forked
    assert cli.main(["check", "--no-tests", str(root)]) == 0
    assert not_split_once(root / "sglang") == []


def test_copied_v4_pair_driven_by_the_workers_rows_is_split_once(scratch, capsys):
    """The V2 worker inits each step with its row (fork_edits.dsv4_worker_split): on the copied pair's path too,
    that is the one split: the guard row is handled by the fork's caller (the worker, at the line setting the
    step's row), the copy is left as written, and the tree splits once for `check` and the written test alike."""
    from support import fork_edits

    root = scratch("0.5.12")
    fork_edits.dsv4_worker_split(root)
    fork = root / "sglang" / V4_FILE
    fork.write_text(copied_v4_pair(root, caller_split=False))
    forked = fork.read_text()
    capsys.readouterr()
    assert cli.main(["check", "--no-tests", "--format", "json", str(root)]) == 1  # the release's sites to patch
    [guard] = [site for site in v4_sites(capsys) if site["site"].endswith("split once (structural guard)")]
    assert (guard["class_method"], guard["state"]) == (
        "ForkV4AttnBackend.init_forward_metadata",
        "handled by the fork's caller",
    )
    assert guard["detail"].startswith("EagleDraftWorker.draft_forward at srt/speculative/eagle_worker_v2.py:")
    assert not_split_once(root / "sglang") == []  # the written test: split once, by the worker
    assert cli.main(["apply", "--no-tests", str(root)]) == 0
    assert fork.read_text() == forked
    assert cli.main(["check", "--no-tests", str(root)]) == 0
    assert not_split_once(root / "sglang") == []


def test_copied_v4_pair_splitting_twice_has_the_forks_split_taken_out(patched, tmp_path, capsys):
    """A fork whose caller splits, after merging upstream (its DeepSeek-V4 copy splits per step already): the
    fork's extra split can be taken out, so it is (upstream's kept) and the tree splits once (issue 39). Kept on
    the caller: refused (twice); kept on the per-step backend: the caller's split to patch, and the written CPU
    test's split-once check leaves the kept path alone."""
    import shutil

    root = tmp_path / "fork"
    shutil.copytree(patched("0.5.12"), root)  # its DeepSeek-V4 backend splits per step already
    fork = root / "sglang" / V4_FILE
    fork.write_text(copied_v4_pair(root, caller_split=True))
    forked = fork.read_text()
    assert not_split_once(root / "sglang") == [("ForkV4AttnBackend", "twice")]
    capsys.readouterr()
    assert cli.main(["check", "--no-tests", "--format", "json", str(root)]) == 1
    sites = v4_sites(capsys)
    [guard] = [site for site in sites if site["site"].endswith("split once (structural guard)")]
    assert (guard["class_method"], guard["state"]) == ("ForkV4AttnBackend.init_forward_metadata", "to patch")
    assert guard["detail"] == (
        "ForkV4MultiStepBackend.init_forward_metadata splits it again after upstream's split in "
        "ForkV4AttnBackend.init_forward_metadata: the fork's split taken out, upstream's kept"
    )
    [helper] = [
        site for site in sites if site["class_method"] == "ForkV4MultiStepBackend._split_out_cache_loc_per_step"
    ]
    assert (helper["state"], helper["detail"]) == ("not affected", "taken out with the split it belongs to")
    assert cli.main(["apply", "--no-tests", str(root)]) == 0
    after = fork.read_text()
    assert "_split_out_cache_loc_per_step" not in after and after.count("per_step_draft_out_cache_loc(") == 1
    assert (
        "    def init_forward_metadata(self, forward_batch: ForwardBatch):\n"
        "        for i in range(self.speculative_num_steps - 1):\n"
        "            self.attn_backends[i].init_forward_metadata(forward_batch)\n" in after
    )
    assert cli.main(["check", "--no-tests", str(root)]) == 0
    assert not_split_once(root / "sglang") == []

    for cls, kept in (("ForkV4MultiStepBackend", False), ("ForkV4AttnBackend", True)):
        fork.write_text(keep_def(forked, cls, "init_forward_metadata"))
        capsys.readouterr()
        assert cli.main(["check", "--no-tests", str(root)]) == (
            1 if kept else 2
        ), cls  # kept: the caller's split to patch
        err = capsys.readouterr().err
        assert ("splits the per-step out_cache_loc twice: here (in init_forward_metadata) and in its caller "
                "ForkV4MultiStepBackend.init_forward_metadata (line " in err) is not kept, cls  # fmt: skip
        assert ("); keep one of them" in err) is not kept, cls
        assert (not_split_once(root / "sglang") == []) is kept, cls  # the written CPU test's split-once check

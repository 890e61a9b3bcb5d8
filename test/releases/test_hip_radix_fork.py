"""The ROCm DeepSeek-V4 backend of a fork copied from May-2026 main, and every helper call of 0.5.13 a site.

Forks of main between 0.5.12 and 0.5.13 carry ``srt/layers/attention/deepseek_v4_backend_hip_radix.py``
from before upstream's fix (read: bytedance-iaas/sglang@38a6a0f7b24eb30d8a562ce1d9b0e16b48e10325): its
decode branch passes ``out_cache_loc=forward_batch.out_cache_loc`` and its ``DeepseekV4MultiStepBackend``
hands the whole draft batch on. The fixture is 0.5.13's real file edited back that way (the helper's
slices and import removed) inside a 0.5.12 tree: ``apply`` gives back 0.5.13's file byte for byte, each
rewrite proven, and ``check`` exits 0 after.
"""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest
from sglang_draft_layout import cli, engine
from sglang_draft_layout.harness.invariant import guarded_modules
from sglang_draft_layout.layout_patterns.ast_walk import called_name
from sglang_draft_layout.layout_patterns.helper_names import HELPERS
from sglang_draft_layout.rules import RULES
from sglang_draft_layout.rules.base import MODULE_SCOPE, State
from sglang_draft_layout.target import resolve

pytestmark = pytest.mark.releases

HIP = "srt/layers/attention/deepseek_v4_backend_hip_radix.py"
IMPORT = "from sglang.srt.speculative.eagle_utils import per_step_draft_out_cache_loc\n"
#: 0.5.13's decode branch -> the May-2026 one (no slice, the whole buffer handed on)
DECODE_FIXED = """\
        if forward_batch.forward_mode.is_decode_or_idle():
            # DSv4 bakes this step's KV write target (c4/c128) into metadata,
            # so slice the shared multi-step out_cache_loc now, not at forward time.
            out_cache_loc = forward_batch.out_cache_loc
            if self.topk > 0 and self.speculative_num_steps > 1:
                out_cache_loc = per_step_draft_out_cache_loc(
                    out_cache_loc,
                    forward_batch.batch_size,
                    self.topk,
                    self.speculative_num_steps,
                )[self.speculative_step_id]
            metadata = self.init_forward_metadata_decode(
                max_seq_len=max_seq_len,
                req_pool_indices=req_pool_indices,
                seq_lens=seq_lens,
                out_cache_loc=out_cache_loc,
            )
"""
DECODE_BEFORE = """\
        if forward_batch.forward_mode.is_decode_or_idle():
            metadata = self.init_forward_metadata_decode(
                max_seq_len=max_seq_len,
                req_pool_indices=req_pool_indices,
                seq_lens=seq_lens,
                out_cache_loc=forward_batch.out_cache_loc,
            )
"""
#: 0.5.13's in-graph write target -> the whole buffer translated
IN_GRAPH_FIXED = """\
            out_cache_loc = forward_batch.out_cache_loc
            if (
                forward_batch.forward_mode.is_decode_or_idle()
                and self.topk > 0
                and self.speculative_num_steps > 1
            ):
                # Multi-step draft decode shares one out_cache_loc buffer across
                # steps; mirror the eager init's per-step slice.
                out_cache_loc = per_step_draft_out_cache_loc(
                    out_cache_loc,
                    forward_batch.batch_size,
                    self.topk,
                    self.speculative_num_steps,
                )[self.speculative_step_id]
"""
IN_GRAPH_BEFORE = "            out_cache_loc = forward_batch.out_cache_loc\n"


def had_the_bug(finding) -> bool:
    """The site's path, run on the probes before the rewrite, did not give upstream's values."""
    return bool(finding.judged) and not finding.judged.startswith("upstream's values")


def edited_back(text: str, in_graph: bool) -> str:
    """0.5.13's file with its decode slice (and, ``in_graph``, its in-graph slice) and the import removed."""
    edits = [(DECODE_FIXED, DECODE_BEFORE), (IMPORT, "")] + ([(IN_GRAPH_FIXED, IN_GRAPH_BEFORE)] if in_graph else [])
    for fixed, before in edits:
        assert text.count(fixed) == 1, fixed[:60]
        text = text.replace(fixed, before)
    assert "per_step_draft_out_cache_loc" not in text or not in_graph
    return text


@pytest.fixture
def may_fork(pristine, tmp_path):
    """may_fork(in_graph) -> a 0.5.12 tree holding 0.5.13's ROCm DSv4 backend edited back to May-2026 main's form."""

    def get(in_graph: bool) -> Path:
        root = tmp_path / "may-2026-fork"
        shutil.copytree(pristine("0.5.12"), root)
        upstream = (pristine("0.5.13") / "sglang" / HIP).read_text()
        (root / "sglang" / HIP).write_text(edited_back(upstream, in_graph))
        return root

    return get


@pytest.mark.parametrize("in_graph", [True, False], ids=["decode and in-graph unsplit", "decode unsplit"])
def test_may_2026_fork_is_patched_to_0_5_13s_file(may_fork, pristine, capsys, in_graph):
    root = may_fork(in_graph)
    plan = engine.plan(resolve(str(root)), render_changes=False)
    hip = {f.rule.id: f for f in plan.findings if f.rule.file == HIP}
    to_patch = {"dsv4-hip-out-cache-loc"} | (
        {"dsv4-in-graph-out-cache-loc:DeepseekV4HipRadixBackend"} if in_graph else set()
    )
    assert {rule for rule, f in hip.items() if f.state is State.TO_PATCH} == to_patch
    assert all(f.state is State.PATCHED for rule, f in hip.items() if rule not in to_patch)
    for rule in to_patch:
        assert had_the_bug(hip[rule])

    assert cli.main(["check", "-v", str(root)]) == 1
    out = capsys.readouterr().out
    assert "cannot prove" not in out and "unrecognised" not in out
    assert cli.main(["apply", str(root)]) == 0
    assert (root / "sglang" / HIP).read_bytes() == (pristine("0.5.13") / "sglang" / HIP).read_bytes()
    capsys.readouterr()
    assert cli.main(["check", str(root)]) == 0


def helper_calls(package: Path) -> set[tuple[str, str, str, int]]:
    """(file, class, method, line) of each call of a helper in a method of the guarded folders."""
    found = set()
    for relative in guarded_modules(package):
        tree = ast.parse((package / relative).read_text())
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
            for method in (n for n in cls.body if isinstance(n, ast.FunctionDef)):
                found |= {
                    (relative, cls.name, method.name, call.lineno)
                    for call in ast.walk(method)
                    if isinstance(call, ast.Call) and called_name(call) in HELPERS
                }
    return found


def method_at(package: Path, relative: str, cls: str, line: int) -> str:
    tree = ast.parse((package / relative).read_text())
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    return next(m.name for m in node.body if isinstance(m, ast.FunctionDef) and m.lineno <= line <= m.end_lineno)


def test_every_helper_call_of_0_5_13_is_a_site(pristine):
    """Each call of the three helpers in 0.5.13 lies in the method where a rule reports its site patched,
    and each call site rule present in 0.5.13 reports one such call (the helper definitions aside)."""
    package = pristine("0.5.13") / "sglang"
    plan = engine.plan(resolve(str(package)), render_changes=False)
    sites = [
        f
        for f in plan.findings
        if f.rule.counts_as_site and f.rule.scope != MODULE_SCOPE and f.state is not State.ABSENT
    ]
    assert {f.rule.id for f in plan.findings if f.state is State.ABSENT} == {"draft-forward:EAGLEWorker"}
    assert all(f.state is State.PATCHED for f in sites)
    assert {f.rule.id for f in sites} == {r.id for r in RULES if r.counts_as_site and r.scope != MODULE_SCOPE} - {
        "draft-forward:EAGLEWorker"
    }
    reported = {
        (
            f.rule.file,
            f.rule.scope.split(".")[0],
            method_at(package, f.rule.file, f.rule.scope.split(".")[0], f.line),
        ): f.rule.id
        for f in sites
    }
    calls = helper_calls(package)
    assert calls, "0.5.13 calls the helpers"
    unmapped = sorted(c for c in calls if c[:3] not in reported)
    assert unmapped == []
    without_call = sorted(rule for where, rule in reported.items() if not any(c[:3] == where for c in calls))
    assert without_call == []

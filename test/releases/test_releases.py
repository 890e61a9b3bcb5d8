"""apply/check on the real release trees from PyPI."""

from __future__ import annotations

import ast
import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from sglang_draft_layout import cli, engine
from sglang_draft_layout.harness.invariant import guarded_modules
from sglang_draft_layout.layout_patterns.forms import wrong_draft_layout
from sglang_draft_layout.rules import RULES
from sglang_draft_layout.rules.base import State
from sglang_draft_layout.target import resolve

pytestmark = pytest.mark.releases

#: upstream main's test/run_suite.py (its source: the fixture's own header)
RUN_SUITE_MAIN = Path(__file__).resolve().parents[1] / "fork_ci" / "fixtures" / "run_suite" / "main.py"

#: releases without the helpers (0.5.12: 17 sites; 0.5.8 to 0.5.11: no DeepSeek-V4, 16)
OLD_RELEASES = ("0.5.8", "0.5.9", "0.5.10", "0.5.11", "0.5.12")
#: releases that call the helpers themselves: every one on PyPI from 0.5.13 to 0.5.23 (`pip index versions sglang`, 2026-12-02)
UPSTREAM_RELEASES = (
    "0.5.13",
    "0.5.13.post1",
    "0.5.14",
    "0.5.15",
    "0.5.15.post1",
    "0.5.16",
    "0.5.17",
    "0.5.18",
    "0.5.19",
    "0.5.20",
    "0.5.21",
    "0.5.22",
    "0.5.23",
)
#: the sites 0.5.13 added (the ROCm DeepSeek-V4 backend's decode branch, both DeepSeek-V4 backends' in-graph method)
SITES_SINCE_0_5_13 = {
    "dsv4-hip-out-cache-loc",
    "dsv4-in-graph-out-cache-loc:DeepseekV4AttnBackend",
    "dsv4-in-graph-out-cache-loc:DeepseekV4HipRadixBackend",
}


def tree_digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*.py"))}


def every_file(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def states(root: Path) -> dict[str, State]:
    plan = engine.plan(resolve(str(root)), render_changes=False)
    return {f.rule.id: f.state for f in plan.findings}


def expected_absent(version: str) -> set[str]:
    absent = set(SITES_SINCE_0_5_13) if version in OLD_RELEASES else set()
    if version != "0.5.12" and version in OLD_RELEASES:
        absent.add("dsv4-out-cache-loc")  # DeepSeek-V4 first appears in 0.5.12
    if version in UPSTREAM_RELEASES:
        absent.add("draft-forward:EAGLEWorker")  # the v1 worker was removed in 0.5.13
    return absent


@pytest.mark.parametrize("version", OLD_RELEASES)
def test_unpatched_release_has_every_site_to_patch(pristine, version):
    found = states(pristine(version))
    absent = expected_absent(version)
    assert {rule for rule, state in found.items() if state is State.ABSENT} == absent
    assert all(state is State.TO_PATCH for rule, state in found.items() if rule not in absent)
    sites = [r for r in RULES if r.counts_as_site and r.id not in absent]
    assert len(sites) == (17 if version == "0.5.12" else 16)


@pytest.mark.parametrize("version", OLD_RELEASES)
def test_apply_patches_every_site_and_second_apply_is_a_no_op(scratch, version, capsys):
    root = scratch(version)
    before = tree_digest(root)
    assert cli.main(["check", str(root)]) == 1
    assert cli.main(["apply", str(root)]) == 0
    after = tree_digest(root)
    changed = {name for name in after if after[name] != before[name]}
    assert changed == {
        rule.file.replace("srt/", "sglang/srt/", 1) for rule in RULES if rule.id not in expected_absent(version)
    }
    for name in changed:
        compile((root / name).read_text(), name, "exec")
    found = states(root)
    assert all(state is State.PATCHED for rule, state in found.items() if rule not in expected_absent(version))
    assert cli.main(["check", str(root)]) == 0
    assert cli.main(["apply", str(root)]) == 0
    assert tree_digest(root) == after
    assert "nothing to do" in capsys.readouterr().out


#: upstream's own hand-written per-step out_cache_loc split (0.5.20 to 0.5.23's Qwen sparse-attention MTP
#: backend, `steps` a local), in a class no rule names: proven to give upstream's rows, left as it is
QWEN_SPARSE_BY_HAND = (
    "guard:draft-forward:srt/layers/attention/qwen_sparse_attn_backend.py:"
    "QwenSparseMultiStepDraftBackend._step_out_cache_loc"
)


def by_hand(version: str) -> set[str]:
    return {QWEN_SPARSE_BY_HAND} if UPSTREAM_RELEASES.index(version) >= UPSTREAM_RELEASES.index("0.5.20") else set()


def fork_checkout(package: Path, root: Path) -> Path:
    """A fork checkout of the release's code: python/sglang (no _version.py), a dynamic-version pyproject,
    upstream main's test/run_suite.py (test/fork_ci/fixtures/run_suite/main.py) and test/registered/."""
    shutil.copytree(package, root / "python" / "sglang")
    (root / "python" / "sglang" / "_version.py").unlink(missing_ok=True)
    (root / "python" / "pyproject.toml").write_text(
        '[project]\nname = "sglang"\ndynamic = ["version"]\n\n[tool.setuptools_scm]\nroot = ".."\n'
    )
    (root / "test" / "registered").mkdir(parents=True)
    shutil.copy(RUN_SUITE_MAIN, root / "test" / "run_suite.py")
    return root


_WRONG: dict[str, list] = {}  # sha256 of a module's text -> its wrong_draft_layout


def wrong_layouts(code: str) -> list:
    """``wrong_draft_layout`` of a module's text, once a process per text (releases share most files)."""
    key = hashlib.sha256(code.encode()).hexdigest()
    if key not in _WRONG:
        _WRONG[key] = wrong_draft_layout(ast.parse(code), code.splitlines())
    return _WRONG[key]


@pytest.mark.parametrize("layout", ["install", "fork checkout"])
@pytest.mark.parametrize("version", UPSTREAM_RELEASES)
def test_upstream_release_reports_patched_and_stays_byte_identical(pristine, tmp_path, capsys, version, layout):
    """Every site patched (0.5.20 on: QwenSparse's own split correct, by hand), `check` exits 0, and `apply`
    writes nothing: the unpacked wheel and a fork checkout of it alike."""
    root = tmp_path / version
    if layout == "install":
        shutil.copytree(pristine(version), root)
    else:
        fork_checkout(pristine(version) / "sglang", root)
    before = every_file(root)
    found = states(root)
    assert {rule: state for rule, state in found.items() if state is not State.PATCHED} == {
        **{rule: State.ABSENT for rule in expected_absent(version)},
        **{rule: State.BY_HAND for rule in by_hand(version)},
    }
    assert SITES_SINCE_0_5_13 <= {rule for rule, state in found.items() if state is State.PATCHED}
    assert cli.main(["check", str(root)]) == 0
    out = capsys.readouterr().out
    assert ("correct, by hand" in out) == bool(by_hand(version)) and "to patch" not in out
    assert cli.main(["apply", str(root)]) == 0
    assert "nothing to do" in capsys.readouterr().out
    assert every_file(root) == before
    if layout == "install":  # what the written CPU test checks (layout_patterns.forms.wrong_draft_layout): nothing
        package = root / "sglang"
        assert [
            hit for relative in guarded_modules(package) for hit in wrong_layouts((package / relative).read_text())
        ] == []


# ---- the patched 0.5.12 follows 0.5.13 exactly -------------------------------------

NAMES = {
    "draft_kv_indices_buffer_width",
    "draft_kv_indices_used_len",
    "per_step_draft_out_cache_loc",
    "kv_indices_width",
    "required_kv_indices_len",
}


def method_of(root: Path, relative: str, class_name: str, method: str) -> ast.FunctionDef:
    tree = ast.parse((root / "sglang" / relative).read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name)
    return next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == method)


def helper_statements(method: ast.FunctionDef) -> list[str]:
    """Every simple statement naming a helper or its locals, capacity checks left out (see below)."""
    found = []
    for node in ast.walk(method):
        if isinstance(node, (ast.Assign, ast.Expr)):
            names = {getattr(n, "id", None) for n in ast.walk(node)}
            if names & NAMES and "assert_buffer_fits" not in names:
                found.append(ast.dump(node))
    return found


SITES_IN_BOTH = [
    (rule.file, *rule.scope.split("."))
    for rule in RULES
    if rule.id.split(":")[0] in {"step-slice", "eager-width", "graph-width", "capacity-check"}
] + [("srt/speculative/eagle_worker_v2.py", "EagleDraftWorker", "draft_forward")]


@pytest.mark.parametrize("relative,class_name,method", sorted(set(SITES_IN_BOTH)))
def test_patched_0_5_12_site_equals_0_5_13(patched, pristine, relative, class_name, method):
    ours = helper_statements(method_of(patched("0.5.12"), relative, class_name, method))
    upstream = helper_statements(method_of(pristine("0.5.13"), relative, class_name, method))
    assert ours and ours == upstream


@pytest.mark.parametrize(
    "relative,class_name",
    [
        ("srt/layers/attention/flashinfer_backend.py", "FlashInferMultiStepDraftBackend"),
        ("srt/layers/attention/flashinfer_mla_backend.py", "FlashInferMLAMultiStepDraftBackend"),
    ],
)
def test_capacity_check_asserts_what_upstream_asserts(patched, relative, class_name):
    """0.5.13 checks through assert_buffer_fits (absent from older trees); ours is the same comparison."""
    method = method_of(patched("0.5.12"), relative, class_name, "common_template")
    checks = [
        n for n in ast.walk(method) if isinstance(n, ast.Assert) and "required_kv_indices_len" in ast.unparse(n.test)
    ]
    assert [ast.unparse(c.test) for c in checks] == ["required_kv_indices_len <= kv_indices_buffer.shape[1]"]


def decode_branch(root: Path) -> str:
    tree = ast.parse((root / "sglang/srt/layers/attention/deepseek_v4_backend.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "DeepseekV4AttnBackend")
    for node in ast.walk(cls):
        if (
            isinstance(node, ast.If)
            and ast.unparse(node.test).endswith("forward_mode.is_decode_or_idle()")
            and "init_forward_metadata_decode" in ast.unparse(node)
        ):
            return "\n".join(ast.dump(stmt) for stmt in node.body)
    raise AssertionError("no decode branch")


def test_patched_0_5_12_dsv4_decode_branch_equals_0_5_13(patched, pristine):
    assert decode_branch(patched("0.5.12")) == decode_branch(pristine("0.5.13"))


def helper_functions(root: Path, relative: str) -> dict[str, ast.FunctionDef]:
    tree = ast.parse((root / "sglang" / relative).read_text())
    return {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}


@pytest.mark.parametrize(
    "name,relative",
    [
        ("draft_kv_indices_buffer_width", "srt/speculative/spec_utils.py"),
        ("draft_kv_indices_used_len", "srt/speculative/spec_utils.py"),
        ("per_step_draft_out_cache_loc", "srt/speculative/eagle_utils.py"),
    ],
)
def test_inserted_helper_behaves_as_0_5_13s(patched, pristine, name, relative):
    torch = pytest.importorskip("torch")
    ours = helper_functions(patched("0.5.12"), relative)[name]
    upstream = helper_functions(pristine("0.5.13"), relative)[name]
    assert [a.arg for a in ours.args.args] == [a.arg for a in upstream.args.args]

    def load(node):
        namespace = {"torch": torch}
        exec(compile(ast.Module([node], []), name, "exec"), namespace)
        return namespace[name]

    mine, theirs = load(ours), load(upstream)
    for a in (1, 3):
        for b in (1, 2, 4):
            for c in (1, 3, 5):
                if name == "per_step_draft_out_cache_loc":
                    buffer = torch.randperm(a * b * c)
                    assert torch.equal(mine(buffer, a, b, c), theirs(buffer, a, b, c))
                elif name == "draft_kv_indices_used_len":
                    assert mine(17 * a, b, a * b, c) == theirs(17 * a, b, a * b, c)
                else:
                    assert mine(a, b, 1024 * c) == theirs(a, b, 1024 * c)


def test_demo_patches_a_scratch_copy_of_0_5_12(capsys):
    assert cli.main(["demo"]) == 0
    out = capsys.readouterr().out
    assert "SGLang 0.5.12 (_version.py), at " in out
    assert "\n3 helpers patched now; 17 call sites patched now; 3 call sites not in this release\n" in out
    assert "\ncheck after apply: 3 helpers patched; 17 call sites patched; 3 call sites not in this release\n" in out


def test_tree_older_than_0_4_6_post5_is_not_affected(pristine, capsys):
    """0.4.5 has the one-parameter init_cuda_graph_state (rows per branch) too: every site it
    has is reported not affected, check exits 0 and apply writes nothing."""
    root = pristine("0.4.5")
    before = tree_digest(root)
    found = states(root)
    assert found["graph-width:flashinfer"] is State.NOT_AFFECTED
    assert set(found.values()) == {State.NOT_AFFECTED, State.ABSENT}
    assert cli.main(["check", str(root)]) == 0
    assert "not affected" in capsys.readouterr().out
    assert cli.main(["apply", str(root)]) == 0
    assert tree_digest(root) == before


def test_diff_under_set_e(scratch):
    """``diff`` exits 0 with the patch on stdout, so a ``set -e`` script goes on (the tree is real 0.5.12: the
    patched tree is judged by running it, which the unit tests' mimics are not written for)."""
    root = scratch("0.5.12")
    script = f"set -e\n{sys.executable} -m sglang_draft_layout diff {root} > {root}/p.patch\necho done\n"
    result = subprocess.run(["bash", "-c", script], capture_output=True, text=True)
    assert (result.returncode, result.stdout) == (0, "done\n"), result.stderr
    assert (root / "p.patch").read_text().startswith("diff --git ")

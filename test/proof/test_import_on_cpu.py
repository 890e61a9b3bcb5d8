"""SGLang 0.5.12's real modules import on CPU, unpatched and patched by this project's CLI.

A venv built once (test/support/sglang_venv.py: sglang==0.5.12 with --no-deps, torch 2.13.0
CPU, triton 3.9.0 and the pure-Python packages those modules import, all from PyPI) runs
test/support/import_probe.py with a tree first on PYTHONPATH:

* the unpacked, unpatched wheel: the baseline; every target module imports;
* a copy patched with ``python -m sglang_draft_layout apply DIR`` (``check DIR`` then exits 0):
  every target module imports in one interpreter, AND each entry module imports as the first
  SGLang module of its process (import cycles show only then; the patch adds module-level
  ``from sglang.srt.speculative.spec_utils import ...`` to four backends and
  ``from sglang.srt.speculative.eagle_utils import ...`` to DSv4 and the V2 worker).

What cannot import on CPU, unpatched or patched: the EAGLE workers (eagle_worker_v2,
eagle_worker) stop at ``sgl_kernel`` (scheduler -> memory_pool_host), a CUDA-only package;
they are checked to stop at the same place in both trees, and their new import of
``per_step_draft_out_cache_loc`` to resolve against the patched eagle_utils.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from support.sglang_release import pristine_tree, require_release, scratch_tree

pytestmark = pytest.mark.releases

VERSION = "0.5.12"
ATTN = "sglang.srt.layers.attention."
SPEC = "sglang.srt.speculative."
BACKENDS = [ATTN + m for m in ("flashinfer_backend", "flashinfer_mla_backend", "triton_backend", "aiter_backend")]
DSV4 = ATTN + "deepseek_v4_backend"
TARGETS = BACKENDS + [DSV4, SPEC + "spec_utils", SPEC + "eagle_utils"]
ENTRIES = TARGETS + [
    "sglang.srt.layers.attention.attention_registry",
    "sglang.srt.model_executor.model_runner",
    "sglang.srt.managers.schedule_batch",
]
WORKERS = [SPEC + "eagle_worker_v2", SPEC + "eagle_worker"]
WIDTH_HELPERS = ["draft_kv_indices_buffer_width", "draft_kv_indices_used_len"]
OUT_CACHE_HELPER = ["per_step_draft_out_cache_loc"]
REPO = Path(__file__).resolve().parents[2]


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "python")] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return subprocess.run(
        [sys.executable, "-m", "sglang_draft_layout", *args], capture_output=True, text=True, env=env, timeout=300
    )


@pytest.fixture(scope="module")
def venv(warm_python):
    """The proof venv's python, warm (conftest's warm_python: third-party modules imported once; the probe
    imports SGLang in its own child all the same)."""
    from support.sglang_venv import proof_venv_or_skip

    return warm_python(proof_venv_or_skip(VERSION))


@pytest.fixture(scope="module")
def patched(tmp_path_factory):
    if _cli("--help").returncode != 0:
        pytest.skip("patch engine not available")
    require_release(VERSION)
    tree = scratch_tree(VERSION, tmp_path_factory.mktemp("patched"))
    applied = _cli("apply", str(tree))
    assert applied.returncode == 0, applied.stdout + applied.stderr
    checked = _cli("check", str(tree))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    return tree


@pytest.fixture(scope="module")
def unpatched_report(venv):
    from support.sglang_venv import probe_imports

    return probe_imports(venv, pristine_tree(VERSION), TARGETS + WORKERS)


@pytest.fixture(scope="module")
def patched_report(venv, patched):
    from support.sglang_venv import probe_imports

    return probe_imports(venv, patched, TARGETS + WORKERS)


def _assert_imported(report: dict, tree: Path, modules: list[str]) -> None:
    assert report["torch"].startswith("2.13.0"), report["torch"]
    failed = {
        m: r["error"] + " at " + " <- ".join(reversed(r["frames"]))
        for m, r in report["modules"].items()
        if m in modules and not r["ok"]
    }
    assert not failed, failed
    for m in modules:
        assert Path(report["modules"][m]["file"]).is_relative_to(tree), (m, report["modules"][m])


def test_unpatched_release_imports_on_cpu(unpatched_report):
    tree = pristine_tree(VERSION)
    _assert_imported(unpatched_report, tree, TARGETS)
    for m in TARGETS:  # 0.5.12 has none of the helpers
        assert unpatched_report["modules"][m]["helpers"] == [], m


def test_patch_cli_applies_and_check_passes(patched):
    for rel in ("sglang/srt/speculative/spec_utils.py", "sglang/srt/speculative/eagle_utils.py"):
        assert (patched / rel).read_text() != (pristine_tree(VERSION) / rel).read_text()


def test_patched_release_imports_on_cpu(patched_report, patched):
    _assert_imported(patched_report, patched, TARGETS)
    helpers = {m: patched_report["modules"][m]["helpers"] for m in TARGETS}
    assert helpers == {
        **{m: WIDTH_HELPERS for m in BACKENDS},  # module-level import from spec_utils
        DSV4: OUT_CACHE_HELPER,  # module-level import from eagle_utils
        SPEC + "spec_utils": WIDTH_HELPERS,
        SPEC + "eagle_utils": OUT_CACHE_HELPER,
    }


def test_patched_entry_points_import_first_no_cycle(venv, patched):
    """Each entry module as the first SGLang module of its process (see import_probe.py)."""
    from support.sglang_venv import probe_imports

    report = probe_imports(venv, patched, ENTRIES, mode="first")
    failed = [m for m, r in report["modules"].items() if not r["ok"]]
    if failed:  # say whether the release itself fails the same way
        baseline = probe_imports(venv, pristine_tree(VERSION), failed, mode="first")
        pytest.fail(
            "\n".join(
                f"{m}: patched {report['modules'][m]['error']} {report['modules'][m]['frames']}; "
                f"unpatched {'ok' if baseline['modules'][m]['ok'] else baseline['modules'][m]['error']}"
                for m in failed
            )
        )
    for m in ENTRIES:
        assert Path(report["modules"][m]["file"]).is_relative_to(patched)


def test_workers_stop_at_sgl_kernel_in_both_trees(unpatched_report, patched_report, patched):
    """The EAGLE workers need sgl_kernel (CUDA only) before their own code runs: recorded,
    and the patch changes nothing about where they stop."""
    for m in WORKERS:
        before, after = unpatched_report["modules"][m], patched_report["modules"][m]
        if before["ok"]:  # an environment with sgl_kernel: then the patched one must import too
            assert after["ok"], after
            continue
        assert before["missing"] == "sgl_kernel", before
        assert (after["ok"], after["error"], after["missing"]) == (False, before["error"], "sgl_kernel")
        assert [f.split("/sglang/", 1)[1] for f in after["frames"]] == [
            f.split("/sglang/", 1)[1] for f in before["frames"]
        ]


def test_patched_worker_imports_resolve(patched_report, patched):
    """What the patched workers import from eagle_utils exists in the patched eagle_utils
    (the part of their import that the patch changed and CPU can check)."""
    names = set(patched_report["modules"][SPEC + "eagle_utils"]["names"])
    for m in WORKERS:
        file = patched / (m.replace(".", "/") + ".py")
        wanted = {
            alias.name
            for node in ast.walk(ast.parse(file.read_text()))
            if isinstance(node, ast.ImportFrom) and node.module == SPEC + "eagle_utils"
            for alias in node.names
        }
        assert "per_step_draft_out_cache_loc" in wanted, m
        assert wanted <= names, (m, sorted(wanted - names))

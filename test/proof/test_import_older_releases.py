"""Patched modules of releases before 0.5.8 import on CPU, where the release installs here.

One venv for the dependency set of 0.5.3 to 0.5.4.post3 (test/support/sglang_venv.py,
PACKAGES["0.5.3"]) runs test/support/import_probe.py on a patched copy of one release of each
family there: 0.5.3 (eagle_utils.py created by apply), 0.5.3.post2 (the V2 worker's first
form) and 0.5.4 (0.5.8's forms). Every draft backend, spec_utils and eagle_utils imports
with the helpers bound, from the patched tree; on 0.5.3 each as the first SGLang module of
its process (import cycles show only then), the others in one interpreter.

Where no release of a family installs on this CPU machine (0.4.8 to 0.5.2, 0.5.5 to 0.5.7),
docs/sites.md says why; 0.5.8 to 0.5.12: test_import_on_cpu.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from support.sglang_release import require_release, scratch_tree

from sglang_draft_layout import engine
from sglang_draft_layout.target import resolve

pytestmark = pytest.mark.releases

DEPENDENCY_SET = "0.5.3"
RELEASES = ("0.5.3.post2", "0.5.4")
ATTN = "sglang.srt.layers.attention."
BACKENDS = [ATTN + m for m in ("flashinfer_backend", "flashinfer_mla_backend", "triton_backend", "aiter_backend")]
SPEC_UTILS, EAGLE_UTILS = "sglang.srt.speculative.spec_utils", "sglang.srt.speculative.eagle_utils"
WIDTH_HELPERS = ["draft_kv_indices_buffer_width", "draft_kv_indices_used_len"]
EXPECTED_HELPERS = {
    **{m: WIDTH_HELPERS for m in BACKENDS},
    SPEC_UTILS: WIDTH_HELPERS,
    EAGLE_UTILS: ["per_step_draft_out_cache_loc"],
}


@pytest.fixture(scope="module")
def venv(warm_python):
    """The venv's python, warm (conftest's warm_python; the probe imports SGLang in its own child)."""
    from support.sglang_venv import proof_venv_or_skip

    return warm_python(proof_venv_or_skip(DEPENDENCY_SET))


def patched_tree(version: str, dest: Path) -> Path:
    require_release(version)
    tree = scratch_tree(version, dest)
    engine.apply(resolve(str(tree)))
    return tree


def failures(report: dict, tree: Path) -> dict[str, str]:
    found = {}
    for module, result in report["modules"].items():
        if not result["ok"]:
            found[module] = result["error"] + " at " + " <- ".join(reversed(result["frames"]))
        elif not Path(result["file"]).is_relative_to(tree):
            found[module] = f"loaded from {result['file']}, not the patched tree"
    return found


@pytest.mark.parametrize("version", RELEASES)
def test_patched_release_imports_on_cpu(venv, version, tmp_path):
    from support.sglang_venv import probe_imports

    tree = patched_tree(version, tmp_path)
    report = probe_imports(venv, tree, list(EXPECTED_HELPERS))
    assert report["torch"].startswith("2.13.0"), report["torch"]
    assert not failures(report, tree)
    assert {m: r["helpers"] for m, r in report["modules"].items()} == EXPECTED_HELPERS


def test_patched_0_5_3_and_its_created_module_import_first_no_cycle(venv, tmp_path):
    from support.sglang_venv import probe_imports

    tree = patched_tree("0.5.3", tmp_path)
    assert "Created by sglang-draft-layout" in (tree / "sglang/srt/speculative/eagle_utils.py").read_text()
    report = probe_imports(venv, tree, list(EXPECTED_HELPERS), mode="first")
    assert not failures(report, tree)
    assert {m: r["helpers"] for m, r in report["modules"].items()} == EXPECTED_HELPERS

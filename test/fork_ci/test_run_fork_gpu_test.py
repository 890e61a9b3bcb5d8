"""benchmark/gpu/run_fork_gpu_test.sh end to end on CPU, with stand-in servers (standin/).

The script renders the generated GPU test and runs it with `python3` (the proof venv's) on a
patched fork tree and on 0.5.12 as released. The stand-in answers `sglang.launch_server` as
the H200 did (exact everywhere, except the unpatched tree's FlashInfer CUDA graphs topk 8 on
a batch of 8: accept length about 3.6), so the generated test's servers, requests, asserts
and messages, and the script's verdict are what run here; only the model is not.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from sglang_draft_layout import cli

from scratch_fork import VERSION
from support.sglang_release import pristine_tree

pytestmark = pytest.mark.releases
HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SCRIPT = REPO / "benchmark/gpu/run_fork_gpu_test.sh"


def run_script(proof_python: Path, site_sglang: Path, patched_python: Path, tmp: Path,
               **extra_env: str) -> tuple[subprocess.CompletedProcess, Path]:
    """The script with GPU_WORK holding site/ (site_sglang and the stand-in) and patched/."""
    work, out = tmp / "sgl_dl", tmp / "out"
    (work / "site").mkdir(parents=True)
    (work / "site" / "sglang").symlink_to(site_sglang)
    for name in ("sitecustomize.py", "server.py"):
        shutil.copy(HERE / "standin" / name, work / "site" / name)
    (work / "patched").symlink_to(patched_python)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env.update(PATH=f"{proof_python.parent}:{env['PATH']}", GPU_WORK=str(work), OUT=str(out),
               DRAFT_LAYOUT_TEST_SUPPORT=str(REPO / "test/support"), TREE_TIMEOUT_S="400", **extra_env)
    result = subprocess.run(["bash", str(SCRIPT)], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=1200)
    return result, out


def test_patched_passes_and_unpatched_fails_in_the_known_case(fork, proof_python, tmp_path):
    assert cli.main(["apply", "--no-tests", str(fork)]) == 0
    result, out = run_script(proof_python, pristine_tree(VERSION) / "sglang", fork / "python", tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "VERDICT: as expected" in result.stdout
    patched = (out / "patched.log").read_text()
    assert "Ran 6 tests" in patched and "\nOK" in patched
    unpatched = (out / "unpatched.log").read_text()
    assert "Ran 6 tests" in unpatched
    assert set(re.findall(r"^(?:FAIL|ERROR): (test_\w+)", unpatched, re.M)) == {"test_flashinfer_cg_k8s5"}
    failures = re.findall(r"^flashinfer_cg_k8s5 (\w+)\[(\d)\]: accept length 3\.667 != 6 "
                          r"\(66 tokens in 18 verifies\)$", unpatched, re.M)
    assert set(failures) == {(f"near_context_batch{b}", str(i)) for b in (0, 1) for i in range(8)}
    summary = (out / "summary.md").read_text()
    assert "| patched |" in summary and "| unpatched |" in summary and "test_flashinfer_cg_k8s5" in summary
    assert (out / "test_draft_layout_exact.py").is_file()


#: a `python3` first on PATH that renders with the real one and answers every run of the
#: generated file as unittest does when all six configurations pass
PASSING_PYTHON3 = """#!/bin/bash
case "$1" in
  *.py) echo "Ran 6 tests in 1.000s"; echo; echo "OK"; exit 0 ;;
  *) exec "$REAL_PYTHON3" "$@" ;;
esac
"""


def test_an_unpatched_tree_that_passes_is_not_as_expected(fork, tmp_path):
    """The verdict: both trees passing (an unpatched tree that does not fail) is exit 1."""
    assert cli.main(["apply", "--no-tests", str(fork)]) == 0
    stub = tmp_path / "bin" / "python3"
    stub.parent.mkdir()
    stub.write_text(PASSING_PYTHON3)
    stub.chmod(0o755)
    real = shutil.which("python3")
    result, out = run_script(stub, pristine_tree(VERSION) / "sglang", fork / "python", tmp_path,
                             REAL_PYTHON3=real)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "VERDICT: NOT as expected (patched rc=0, unpatched rc=0" in result.stdout
    for tree in ("patched", "unpatched"):
        assert (out / f"{tree}.log").read_text().endswith("OK\n")
    assert (out / "test_draft_layout_exact.py").read_text().startswith('"""')

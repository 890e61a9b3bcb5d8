"""benchmark/gpu/run_fork_gpu_test.sh end to end on CPU, with stand-in servers (standin/).

The script lays out two fork checkouts with the v0.5.12-era test/run_suite.py, writes the GPU
test with `apply --gpu-test` and runs the fork's CI command (`python3 run_suite.py --hw cuda
--suite SUITE`, python3 the proof venv's) on a patched tree and on 0.5.12 as released; with
FORK= on a fork checkout of the user's (a copy patched, the original not). The stand-in answers
`sglang.launch_server` as
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
from typing import Optional

import pytest

from sglang_draft_layout import cli

from scratch_fork import GPU_TEST, VERSION, git, make_fork
from support.sglang_release import pristine_tree

pytestmark = pytest.mark.releases
HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SCRIPT = REPO / "benchmark/gpu/run_fork_gpu_test.sh"


def run_script(
    proof_python: Path, site_sglang: Path, patched_python: Optional[Path], tmp: Path, **extra_env: str
) -> tuple[subprocess.CompletedProcess, Path]:
    """The script with GPU_WORK holding site/ (site_sglang and the stand-in) and patched/."""
    work, out = tmp / "sgl_dl", tmp / "out"
    (work / "site").mkdir(parents=True)
    (work / "site" / "sglang").symlink_to(site_sglang)
    for name in ("sitecustomize.py", "server.py"):
        shutil.copy(HERE / "standin" / name, work / "site" / name)
    if patched_python is not None:
        (work / "patched").symlink_to(patched_python)
        (patched_python / ".patched").touch()  # made by apply already: run_on_h200.sh's marker
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env.update(
        PATH=f"{proof_python.parent}:{env['PATH']}",
        GPU_WORK=str(work),
        OUT=str(out),
        DRAFT_LAYOUT_TEST_SUPPORT=str(REPO / "test/support"),
        TREE_TIMEOUT_S="400",
        **extra_env,
    )
    result = subprocess.run(["bash", str(SCRIPT)], cwd=REPO, env=env, capture_output=True, text=True, timeout=1200)
    return result, out


def check_as_expected(result: subprocess.CompletedProcess, out: Path) -> None:
    """The verdict and logs of a run on 0.5.12's code: the fork's CI selected the written test
    in stage-b-test-1-gpu-small; patched all six configurations pass; unpatched (run with -f,
    failfast, as run_unittest_files runs it) the FlashInfer CUDA-graph topk 8 one fails."""
    assert result.returncode == 0, result.stdout + result.stderr
    assert "VERDICT: as expected (suite stage-b-test-1-gpu-small;" in result.stdout
    assert (out / "suite.txt").read_text() == "stage-b-test-1-gpu-small\n"
    patched = (out / "patched.log").read_text()
    assert "Enabled 1 test(s)" in patched and GPU_TEST.split("/")[-1] in patched
    assert "Ran 6 tests" in patched and "\nOK" in patched
    unpatched = (out / "unpatched.log").read_text()
    assert "Enabled 1 test(s)" in unpatched
    assert set(re.findall(r"^(?:FAIL|ERROR): (test_\w+)", unpatched, re.M)) == {"test_flashinfer_cg_k8s5"}
    failures = re.findall(
        r"^flashinfer_cg_k8s5 (\w+)\[(\d)\]: accept length 3\.667 != 6 " r"\(66 tokens in 18 verifies\)$",
        unpatched,
        re.M,
    )
    assert set(failures) == {(f"near_context_batch{b}", str(i)) for b in (0, 1) for i in range(8)}
    summary = (out / "summary.md").read_text()
    assert "| patched |" in summary and "| unpatched |" in summary and "test_flashinfer_cg_k8s5" in summary
    assert 'suite="stage-b-test-1-gpu-small"' in (out / "test_draft_layout_exact.py").read_text()


def test_patched_passes_and_unpatched_fails_in_the_known_case(fork, proof_python, tmp_path):
    assert cli.main(["apply", "--no-tests", str(fork)]) == 0
    result, out = run_script(proof_python, pristine_tree(VERSION) / "sglang", fork / "python", tmp_path)
    check_as_expected(result, out)


def test_a_users_own_fork(proof_python, tmp_path):
    """FORK=: the user's checkout (0.5.12 code, its own run_suite.py) is copied and patched there;
    the checkout itself is left as it was. Only the configuration that fails unpatched runs
    (the others are skipped by the written test itself), to keep the suite fast."""
    fork = make_fork(tmp_path / "users-fork")
    result, out = run_script(
        proof_python,
        pristine_tree(VERSION) / "sglang",
        None,
        tmp_path,
        FORK=str(fork),
        SGLANG_DRAFT_LAYOUT_CONFIGS="flashinfer_cg_k8s5",
    )
    check_as_expected(result, out)
    assert "apply" in (out / "patch.txt").read_text()
    assert git(fork, "status", "--porcelain", "--untracked-files=all") == ""


#: a `python3` first on PATH that runs everything else with the real one (run_suite.py among
#: them) and answers every run of the written file as unittest does when all six pass
PASSING_PYTHON3 = """#!/bin/bash
case "$1" in
  *test_draft_layout_exact.py) echo "Ran 6 tests in 1.000s"; echo; echo "OK"; exit 0 ;;
  *) exec "$REAL_PYTHON3" "$@" ;;
esac
"""


def test_an_unpatched_tree_that_passes_is_not_as_expected(fork, proof_python, tmp_path):
    """The verdict: both trees passing (an unpatched tree that does not fail) is exit 1."""
    assert cli.main(["apply", "--no-tests", str(fork)]) == 0
    stub = tmp_path / "bin" / "python3"
    stub.parent.mkdir()
    stub.write_text(PASSING_PYTHON3)
    stub.chmod(0o755)
    result, out = run_script(
        stub, pristine_tree(VERSION) / "sglang", fork / "python", tmp_path, REAL_PYTHON3=str(proof_python)
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "VERDICT: NOT as expected (suite stage-b-test-1-gpu-small; patched rc=0, unpatched rc=0" in result.stdout
    for tree in ("patched", "unpatched"):
        assert "Ran 6 tests in 1.000s\n\nOK\n" in (out / f"{tree}.log").read_text()
    assert (out / "test_draft_layout_exact.py").read_text().startswith('"""')

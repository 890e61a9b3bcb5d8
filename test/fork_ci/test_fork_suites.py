"""The written tests go to suites the fork itself runs (fork_suites, fork_tests).

For each era's test/run_suite.py (fixtures/run_suite/, read from real repositories) beside a
release tree of that era in a scratch fork checkout: the suites chosen by role, and after
`apply --gpu-test` the fork's own collect_tests + validate_all_suites accept every file and
its filter_tests for the chosen suite lists the written test (suite_probe.py). Also: names of
the fork's own (--cpu-suite/--cuda-suite), an unknown name refused where the fork validates,
a written test whose suite the fork no longer has (stale, rewritten), no run_suite.py (no
test, one line), the GPU test only with --gpu-test, and the registration line as black lays
it out.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_draft_layout import cli
from sglang_draft_layout.fork_suites import choose_suite, read_suites
from sglang_draft_layout.fork_tests import HARNESS, render, with_suite

from scratch_fork import CPU_TEST, GPU_TEST, RUN_SUITES, git, make_fork

pytestmark = pytest.mark.releases
PROBE = Path(__file__).with_name("suite_probe.py")
#: fixture -> (release tree, ci_register fixture, chosen CPU suite, chosen CUDA suite, validates)
ERAS = {
    "v0.5.8": ("0.5.8", None, "stage-a-cpu-only", "stage-b-test-small-1-gpu", False),
    "v0.5.9": ("0.5.9", None, "stage-a-cpu-only", "stage-b-test-small-1-gpu", False),
    "v0.5.10": ("0.5.10", None, "stage-a-test-cpu", "stage-b-test-1-gpu-small", True),
    "v0.5.12": ("0.5.12", None, "stage-a-test-cpu", "stage-b-test-1-gpu-small", True),
    "main": ("0.5.12", "main_ci_register", "base-a-test-cpu", "base-b-test-1-gpu-small", True),
}


def probe(fork: Path, hw: str, suite: str, ci_register=None) -> subprocess.CompletedProcess:
    extra = [str(RUN_SUITES / f"{ci_register}.py")] if ci_register else []
    return subprocess.run(
        [sys.executable, str(PROBE), str(fork), hw, suite, *extra], capture_output=True, text=True, timeout=120
    )


def selected(fork: Path, hw: str, suite: str, ci_register=None) -> dict:
    result = probe(fork, hw, suite, ci_register)
    assert result.returncode == 0, result.stdout + result.stderr
    [line] = [line for line in result.stdout.splitlines() if line.startswith("SUITE-PROBE ")]
    return json.loads(line.split(" ", 1)[1])


def write_run_suite(root: Path, text: str) -> Path:
    (root / "test").mkdir(parents=True, exist_ok=True)
    (root / "test" / "run_suite.py").write_text(text)
    return root


def written_tests(capsys) -> dict[str, tuple[str, str]]:
    """(what, state) of each test file a JSON report (the last command's output) lists."""
    sites = json.loads(capsys.readouterr().out)["sites"]
    return {site["file"]: (site["class_method"], site["state"]) for site in sites if site["kind"] == "test"}


@pytest.mark.parametrize("era", sorted(ERAS))
def test_chosen_by_role_in_every_era(era, tmp_path):
    _version, _register, cpu, cuda, validates = ERAS[era]
    (tmp_path / "test").mkdir()
    (tmp_path / "test" / "run_suite.py").write_text((RUN_SUITES / f"{era}.py").read_text())
    suites = read_suites(tmp_path)
    assert (choose_suite(suites, "CPU"), choose_suite(suites, "CUDA"), suites.validates) == (cpu, cuda, validates)


UNSEEN = """
PER_COMMIT_SUITES = {
    DeviceBackend.CPU: ["pr-test-cpu-arm64", "extra-cpu", "pr-test-cpu"],
    DeviceBackend.CUDA: ["per-commit-2-gpu", "per-commit-1-gpu-large", "per-commit-1gpu", "kernel-1-gpu"],
}
"""


def test_unseen_naming_schemes(tmp_path):
    suites = read_suites(write_run_suite(tmp_path, UNSEEN))
    assert (choose_suite(suites, "CPU"), choose_suite(suites, "CUDA"), suites.validates) == (
        "pr-test-cpu",
        "per-commit-1gpu",
        False,
    )


def test_no_fitting_suite(tmp_path):
    text = "PER_COMMIT_SUITES = {HWBackend.CPU: ['stage-a-test-cpu-intel'], HWBackend.CUDA: ['stage-b-test-1-gpu-large']}\n"
    suites = read_suites(write_run_suite(tmp_path, text))
    assert (choose_suite(suites, "CPU"), choose_suite(suites, "CUDA")) == (None, None)


@pytest.mark.parametrize("era", sorted(ERAS))
def test_the_forks_own_run_suite_accepts_and_selects_the_written_tests(era, tmp_path, capsys):
    version, register, cpu, cuda, validates = ERAS[era]
    fork = make_fork(tmp_path / "fork", version, era, register)
    assert cli.main(["apply", "--gpu-test", "--format", "json", str(fork)]) == 0
    assert written_tests(capsys) == {
        CPU_TEST: (f"registered CPU test (suite {cpu})", "written now"),
        GPU_TEST: (f"registered GPU test (suite {cuda})", "written now"),
        HARNESS[0]: (HARNESS[2], "written now"),
    }
    assert selected(fork, "cpu", cpu, register) == {"selected": [CPU_TEST], "validated": validates}
    assert selected(fork, "cuda", cuda, register) == {"selected": [GPU_TEST], "validated": validates}
    assert cli.main(["check", str(fork)]) == 0


def test_the_gpu_test_only_when_asked_for(tmp_path, capsys):
    fork = make_fork(tmp_path / "fork")
    assert cli.main(["apply", str(fork)]) == 0
    assert (fork / CPU_TEST).is_file() and not (fork / GPU_TEST).exists()
    assert cli.main(["check", str(fork)]) == 0
    capsys.readouterr()
    assert cli.main(["check", "--gpu-test", "--format", "json", str(fork)]) == 1
    assert written_tests(capsys)[GPU_TEST][1] == "to write"


def test_a_suite_of_the_forks_own_naming(tmp_path, capsys):
    fork = make_fork(tmp_path / "fork", run_suite=None)
    assert cli.main(["apply", "--cpu-suite", "my-cpu-suite", str(fork)]) == 0
    assert 'register_cpu_ci(est_time=25, suite="my-cpu-suite")' in (fork / CPU_TEST).read_text()
    assert cli.main(["check", str(fork)]) == 0  # the maintainer's name stays


def test_an_unknown_suite_is_refused_where_the_fork_validates(tmp_path, capsys):
    fork = make_fork(tmp_path / "fork")
    for option in ("--cpu-suite", "--cuda-suite"):
        assert cli.main(["apply", "--gpu-test", option, "no-such-suite", str(fork)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"{option} no-such-suite" in err and "nothing written" in err
    assert git(fork, "status", "--porcelain", "--untracked-files=all") == ""
    assert cli.main(["check", "--cpu-suite", "no-such-suite", str(fork)]) == 2
    assert cli.main(["apply", "--cpu-suite", "stage-b-test-cpu", str(fork)]) == 0  # one of the fork's
    assert 'suite="stage-b-test-cpu"' in (fork / CPU_TEST).read_text()


def test_a_suite_the_fork_no_longer_has_is_stale_and_rewritten(tmp_path, capsys):
    fork = make_fork(tmp_path / "fork")
    (fork / CPU_TEST).parent.mkdir(parents=True)
    (fork / CPU_TEST).write_text(with_suite(render("registered_cpu"), "stage-a-cpu-only"))
    assert "Tests registered to invalid suites" in probe(fork, "cpu", "stage-a-test-cpu").stderr
    assert cli.main(["check", "--no-tests", str(fork)]) == 1  # sites to patch
    capsys.readouterr()
    assert cli.main(["check", "--format", "json", str(fork)]) == 1
    what, state = written_tests(capsys)[CPU_TEST]
    assert "was stage-a-cpu-only, not a suite of the fork" in what and state == "stale"
    assert cli.main(["apply", str(fork)]) == 0
    assert selected(fork, "cpu", "stage-a-test-cpu")["selected"] == [CPU_TEST]
    assert cli.main(["check", str(fork)]) == 0


def test_no_run_suite_no_test_and_one_line(tmp_path, capsys):
    fork = make_fork(tmp_path / "fork", run_suite=None)
    assert cli.main(["check", "--gpu-test", "--format", "json", str(fork)]) == 1  # the sites, as without tests
    lines = json.loads(capsys.readouterr().out)["notes"]
    assert [line.split(":")[0] for line in lines] == [
        "no registered CPU test written",
        "no registered GPU test written",
    ]
    assert all("test/run_suite.py" in line and "-suite NAME" in line for line in lines)
    assert cli.main(["apply", "--gpu-test", str(fork)]) == 0
    assert "no registered CPU test written" in capsys.readouterr().out
    assert not (fork / CPU_TEST).exists() and not (fork / GPU_TEST).exists()
    assert cli.main(["check", str(fork)]) == 0


def test_a_run_suite_that_is_not_python_is_refused(tmp_path, capsys):
    fork = make_fork(tmp_path / "fork")
    (fork / "test" / "run_suite.py").write_text("PER_COMMIT_SUITES = {\n")
    assert cli.main(["apply", str(fork)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "run_suite.py:1: not valid Python" in err and "--no-tests" in err
    assert git(fork, "status", "--porcelain") == " M test/run_suite.py\n"
    assert cli.main(["apply", "--no-tests", str(fork)]) == 0


@pytest.mark.parametrize("suite", ["stage-b-test-1-gpu-small", "s" * 60, "s" * 90])
def test_registration_line_is_black_clean(tmp_path, suite):
    path = tmp_path / "test_written.py"
    path.write_text(with_suite(render("registered_gpu"), suite))
    result = subprocess.run(
        [sys.executable, "-m", "black", "--check", "-q", "-l", "88", str(path)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert f'suite="{suite}"' in path.read_text()


def test_a_fork_without_ci_register_gets_no_test_and_one_line(tmp_path, capsys):
    """Before 0.5.6 SGLang has no sglang/test/ci/ci_register.py: a written test could not register."""
    fork = make_fork(tmp_path / "fork")
    (fork / "python/sglang/test/ci/ci_register.py").unlink()
    assert cli.main(["check", "--gpu-test", "--format", "json", str(fork)]) == 1  # the sites
    report = json.loads(capsys.readouterr().out)
    assert report["notes"] == [
        "no tests written: the fork has no python/sglang/test/ci/ci_register.py to " "register them with"
    ]
    assert "test" not in report["summary"]["kinds"]
    assert cli.main(["apply", "--gpu-test", str(fork)]) == 0
    assert not (fork / CPU_TEST).exists() and not (fork / GPU_TEST).exists()

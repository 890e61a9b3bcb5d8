"""support/strict_skips.py in a pytest run of its own (pytester): with
SGLANG_DRAFT_LAYOUT_STRICT_SKIPS=1 a skip fails the run unless it is a gpu test that
``skip_without_cuda`` skipped; without the variable skips are allowed. Each run is made twice:
in one process, and with two pytest-xdist workers (as the README's test command runs), where
the skips happen in the workers and the controller must still fail the run."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.strict_skips import ENV

pytest_plugins = ["pytester"]

GPU_CONFTEST = """
from support.strict_skips import skip_without_cuda


def pytest_collection_modifyitems(config, items):
    # as test/gpu/conftest.py does on a machine without CUDA
    for item in items:
        if item.get_closest_marker("gpu"):
            skip_without_cuda(item)
"""

GPU_TESTS = """
import pytest

pytestmark = pytest.mark.gpu


def test_on_the_gpu():
    assert False, "never runs without CUDA"
"""

GPU_TEST_SKIPPED_OTHERWISE = """
import pytest


@pytest.mark.gpu
@pytest.mark.skipif(True, reason="a results file is missing")
def test_on_the_gpu_skipped_for_another_reason():
    pass
"""

GPU_MODULE_SKIPPED = """
import pytest

pytest.importorskip("no_such_gpu_module_here")


@pytest.mark.gpu
def test_on_the_gpu():
    pass
"""

#: as test/conftest.py registers the plugin (a worker process loads it the same way)
ROOT_CONFTEST = f"""
import sys

sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})
pytest_plugins = ["support.strict_skips"]
"""

CPU_TESTS = {
    "test_skip_mark": "import pytest\n\n@pytest.mark.skip(reason='not today')\ndef test_a():\n    pass\n",
    "test_skip_call": "import pytest\n\ndef test_a():\n    pytest.skip('numpy missing')\n",
    "test_importorskip": "import pytest\n\npytest.importorskip('no_such_module_here')\n\ndef test_a():\n    pass\n",
    "test_xfail": "import pytest\n\n@pytest.mark.xfail(reason='known')\ndef test_a():\n    assert False\n",
}


@pytest.fixture(params=[None, 2], ids=["in-process", "2-xdist-workers"])
def workers(request) -> list[str]:
    """The arguments of the run: none, or two pytest-xdist workers (``-n 2``)."""
    return [] if request.param is None else ["-n", str(request.param)]


@pytest.fixture
def project(pytester: pytest.Pytester, workers) -> pytest.Pytester:
    """A test tree with a passing test, gpu tests under gpu/ (skipped for lack of CUDA)."""
    pytester.makeini("[pytest]\nmarkers =\n    gpu: needs CUDA\n")
    pytester.makeconftest(ROOT_CONFTEST)
    pytester.workers = workers
    pytester.makepyfile(test_plain="def test_passes():\n    assert 1 + 1 == 2\n")
    gpu = pytester.mkpydir("gpu")
    (gpu / "conftest.py").write_text(GPU_CONFTEST)
    (gpu / "test_gpu.py").write_text(GPU_TESTS)
    return pytester


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    result = pytester.runpytest("-rs", *pytester.workers, *args)
    if pytester.workers:  # the tests ran in the workers, not in the controller
        result.stdout.fnmatch_lines(["created: 2/2 workers"])
    return result


def test_gpu_skip_without_cuda_is_allowed(project, monkeypatch):
    monkeypatch.setenv(ENV, "1")
    result = run(project)
    result.assert_outcomes(passed=1, skipped=1)
    assert result.ret == pytest.ExitCode.OK
    result.stdout.no_fnmatch_line("*NOT RUN*")


def test_any_other_skip_fails_the_run(project, monkeypatch):
    project.makepyfile(**CPU_TESTS)
    monkeypatch.setenv(ENV, "1")
    result = run(project)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        [
            "NOT RUN test_importorskip.py: Skipped: could not import 'no_such_module_here'*",
            "NOT RUN test_skip_call.py::test_a: Skipped: numpy missing",
            "NOT RUN test_skip_mark.py::test_a: Skipped: not today",
            "NOT RUN test_xfail.py::test_a: xfail: known",
            "the run fails: 4 test(s) or module(s) did not run",
        ]
    )
    result.stdout.no_fnmatch_line("NOT RUN gpu/*")
    result.stdout.no_fnmatch_line("NOT RUN test_plain.py*")


def test_gpu_test_skipped_for_another_reason_fails_the_run(project, monkeypatch):
    gpu = project.path / "gpu"
    (gpu / "test_gpu_other.py").write_text(GPU_TEST_SKIPPED_OTHERWISE)
    (gpu / "test_gpu_module.py").write_text(GPU_MODULE_SKIPPED)
    monkeypatch.setenv(ENV, "1")
    result = run(project)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        [
            "NOT RUN gpu/test_gpu_module.py: Skipped: could not import 'no_such_gpu_module_here'*",
            "NOT RUN gpu/test_gpu_other.py::test_on_the_gpu_skipped_for_another_reason: Skipped: a results file is missing",
            "the run fails: 2 test(s) or module(s) did not run",
        ]
    )
    result.stdout.no_fnmatch_line("NOT RUN gpu/test_gpu.py*")


@pytest.mark.parametrize("value", [None, "0"])
def test_skips_are_allowed_without_the_variable(project, monkeypatch, value):
    project.makepyfile(**CPU_TESTS)
    if value is None:
        monkeypatch.delenv(ENV, raising=False)
    else:
        monkeypatch.setenv(ENV, value)
    result = run(project)
    result.assert_outcomes(passed=1, skipped=4, xfailed=1)
    assert result.ret == pytest.ExitCode.OK
    result.stdout.no_fnmatch_line("*NOT RUN*")

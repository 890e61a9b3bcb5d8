"""Strict skips, a pytest plugin (registered by test/conftest.py).

With ``SGLANG_DRAFT_LAYOUT_STRICT_SKIPS=1`` in the environment (``.ci/run`` sets it), every
skipped test, skipped module and xfail/xpass makes the run fail: a line per offending test
in the summary and a non-zero exit, so a proof that did not run cannot pass as green. The one
exception is a test marked ``gpu`` that ``skip_without_cuda`` skipped (test/gpu/conftest.py
does that when torch has no CUDA device); a gpu test skipped for any other reason still fails.
Without the variable, skips are reported as usual.
"""

from __future__ import annotations

import os

import pytest

ENV = "SGLANG_DRAFT_LAYOUT_STRICT_SKIPS"
NO_CUDA_REASON = "needs a CUDA GPU (run through benchmark/gpu/, see its README)"

_STRICT = pytest.StashKey[bool]()
_OFFENDERS = pytest.StashKey[list]()
_SKIPPED_FOR_NO_CUDA = pytest.StashKey[bool]()


def skip_without_cuda(item: pytest.Item) -> None:
    """Skip ``item`` (a gpu test) for lack of CUDA: the only skip strict mode allows."""
    item.add_marker(pytest.mark.skip(reason=NO_CUDA_REASON))
    item.stash[_SKIPPED_FOR_NO_CUDA] = True


def skip_reason(report: pytest.CollectReport | pytest.TestReport) -> str:
    """The reason pytest shows for a skipped or xfail/xpass report."""
    if hasattr(report, "wasxfail"):
        return f"xfail: {report.wasxfail}" if report.skipped else f"xpass: {report.wasxfail}"
    if isinstance(report.longrepr, tuple):
        return str(report.longrepr[2])
    return str(report.longrepr)


def _allowed(item: pytest.Item, report: pytest.TestReport) -> bool:
    """Skipped at setup by skip_without_cuda, for exactly that reason, and marked gpu."""
    return (
        item.stash.get(_SKIPPED_FOR_NO_CUDA, False)
        and item.get_closest_marker("gpu") is not None
        and report.when == "setup"
        and not hasattr(report, "wasxfail")
        and skip_reason(report) == f"Skipped: {NO_CUDA_REASON}"
    )


def _offend(config: pytest.Config, nodeid: str, reason: str) -> None:
    config.stash[_OFFENDERS].append(f"{nodeid}: {reason}")


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_STRICT] = os.environ.get(ENV, "") not in ("", "0")
    config.stash[_OFFENDERS] = []


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):
    """A module skipped at collection (``pytest.importorskip``, ``allow_module_level``)."""
    report = yield
    if collector.config.stash[_STRICT] and report.skipped:
        _offend(collector.config, report.nodeid, skip_reason(report))
    return report


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    offending = report.skipped or hasattr(report, "wasxfail")
    if item.config.stash[_STRICT] and offending and not _allowed(item, report):
        _offend(item.config, item.nodeid, skip_reason(report))
    return report


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    offenders = config.stash[_OFFENDERS]
    if offenders:
        terminalreporter.section(f"{ENV}: skips are failures here", red=True)
        for line in offenders:
            terminalreporter.write_line(f"NOT RUN {line}", red=True)
        terminalreporter.write_line(f"the run fails: {len(offenders)} test(s) or module(s) did not run", red=True)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if session.config.stash[_OFFENDERS] and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED

"""Strict skips, a pytest plugin (registered by test/conftest.py).

With ``SGLANG_DRAFT_LAYOUT_STRICT_SKIPS=1`` in the environment (``.ci/run`` sets it), every
skipped test, skipped module and xfail/xpass makes the run fail: a line per offending test
in the summary and a non-zero exit, so a proof that did not run cannot pass as green. The one
exception is a test marked ``gpu`` that ``skip_without_cuda`` skipped (test/gpu/conftest.py
does that when torch has no CUDA device); a gpu test skipped for any other reason still fails.
Without the variable, skips are reported as usual.

Under pytest-xdist the tests run in worker processes, where only the reports are made: the
worker decides whether a report offends (it has the item, hence the gpu mark and
``skip_without_cuda``'s stamp) and writes the reason onto the report (``REPORT_ATTR``, which
travels with the report to the controller); the process that reports the run, the controller
or a run without workers, collects the offending reports from ``pytest_runtest_logreport`` and
``pytest_collectreport``, prints them and fails the run.
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


#: the attribute a strict run writes onto an offending report: why it counts as not run
REPORT_ATTR = "strict_skips_not_run"


def _is_worker(config: pytest.Config) -> bool:
    """A pytest-xdist worker: it sends its reports to the controller, which does the reporting."""
    return hasattr(config, "workerinput")


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_STRICT] = os.environ.get(ENV, "") not in ("", "0")
    config.stash[_OFFENDERS] = []
    if not _is_worker(config):
        config.pluginmanager.register(_Collector(config), "strict-skips-collector")


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):
    """A module skipped at collection (``pytest.importorskip``, ``allow_module_level``)."""
    report = yield
    if collector.config.stash[_STRICT] and report.skipped:
        setattr(report, REPORT_ATTR, skip_reason(report))
    return report


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    offending = report.skipped or hasattr(report, "wasxfail")
    if item.config.stash[_STRICT] and offending and not _allowed(item, report):
        setattr(report, REPORT_ATTR, skip_reason(report))
    return report


class _Collector:
    """Gathers the offending reports where the run is reported (not on an xdist worker)."""

    def __init__(self, config: pytest.Config) -> None:
        self.offenders = config.stash[_OFFENDERS]

    def _record(self, report) -> None:
        reason = getattr(report, REPORT_ATTR, None)
        if reason is not None:
            self.offenders.append(f"{report.nodeid}: {reason}")

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        self._record(report)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self._record(report)


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    offenders = config.stash[_OFFENDERS]
    if offenders:
        terminalreporter.section(f"{ENV}: skips are failures here", red=True)
        for line in sorted(offenders):  # workers finish in any order
            terminalreporter.write_line(f"NOT RUN {line}", red=True)
        terminalreporter.write_line(f"the run fails: {len(offenders)} test(s) or module(s) did not run", red=True)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if session.config.stash[_OFFENDERS] and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED

"""Session-wide options and checks for the whole suite."""

from __future__ import annotations

import pytest
from tests.support.node import leftovers

PHASES = ("all", "parallel", "serial")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--phase",
        choices=PHASES,
        default="all",
        help="all: every selected test; parallel: leave out the tests marked serial; "
        "serial: only those (tools/run_pytest.py runs parallel, then serial)",
    )


@pytest.hookimpl(trylast=True)  # after -m and -k, like any other deselection
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    phase = config.getoption("phase")
    if phase == "all":
        return
    want_serial = phase == "serial"
    keep = [
        item for item in items if (item.get_closest_marker("serial") is not None) == want_serial
    ]
    if len(keep) != len(items):
        kept = set(keep)
        config.hook.pytest_deselected(items=[item for item in items if item not in kept])
        items[:] = keep


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run if a throw-away broker node of this run survived its teardown.

    Runs after every session fixture is torn down (the fault, ops and cluster fixtures
    all start nodes, in whatever order the tests come), so a node still listed by epmd,
    a node process still running or a node directory still present is a real leak.
    Under pytest-xdist each worker checks the nodes it started.
    """
    problems = leftovers()
    if problems:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        message = "throw-away nodes were not cleaned up: " + "; ".join(problems)
        if reporter is not None:
            reporter.write_line(f"ERROR: {message}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED

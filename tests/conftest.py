"""Session-wide checks for the whole suite."""

from __future__ import annotations

import pytest
from tests.support.node import leftovers

# --rabbitmq4 (a RabbitMQ 4.x node for the session) and the broker_version fixture.
pytest_plugins = ("tests.support.rabbitmq4",)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run if a throw-away broker node of this run survived its teardown.

    Runs after every session fixture is torn down (the fault, ops and cluster fixtures
    all start nodes, in whatever order the tests come), so a node still listed by epmd,
    a node process still running or a node directory still present is a real leak.
    """
    problems = leftovers()
    if problems:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        message = "throw-away nodes were not cleaned up: " + "; ".join(problems)
        if reporter is not None:
            reporter.write_line(f"ERROR: {message}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED

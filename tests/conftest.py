"""Session-wide options and checks for the whole suite."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from tests.support.node import leftovers

# --rabbitmq4 (a RabbitMQ 4.x node for the session) and the broker_version fixture.
pytest_plugins = ("tests.support.rabbitmq4",)

if TYPE_CHECKING:
    from xdist.scheduler.protocol import Scheduling

PHASES = ("all", "parallel", "serial")

#: Tests that share a session fixture which must exist once per run, not once per
#: pytest-xdist worker, or broker entities with fixed names: each group runs on one
#: worker, so its tests never run at the same time (path prefix -> group).
XDIST_GROUPS = (
    # The documentation's programs, the README's quick start among them, declare, use
    # and delete fixed names on the shared broker ("hello", "jobs", ...).
    ("tests/integration/test_docs_snippets.py", "doc-programs"),
    ("tests/integration/test_install.py", "doc-programs"),
    ("tests/cluster/", "cluster"),  # the 3-node throw-away cluster
    ("tests/spark/test_spark_crash.py", "spark-crash"),  # Spark drivers in subprocesses
    ("tests/spark/test_spark_cluster.py", "spark-cluster"),  # a standalone cluster, drivers
    ("tests/spark/", "spark"),  # the SparkSession (one JVM)
    ("tests/ops/", "ops"),  # the node with the management plugin
)


def xdist_group(nodeid: str) -> str | None:
    """The group of the test ``nodeid`` (see :data:`XDIST_GROUPS`), if any."""
    for prefix, group in XDIST_GROUPS:
        if nodeid.startswith(prefix):
            return group
    return None


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--phase",
        choices=PHASES,
        default="all",
        help="all: every selected test; parallel: leave out the tests marked serial; "
        "serial: only those (tools/run_pytest.py runs parallel, then serial)",
    )
    parser.addoption(
        "--spark-cluster",
        action="store_true",
        default=False,
        help="also run the tests marked spark_cluster (a Spark standalone cluster, kills; "
        "the last pass of make test); deselected otherwise",
    )
    parser.addoption(
        "--fail-on-skip",
        action="store_true",
        default=False,
        help="a skipped test fails the run (make test: a missing prerequisite is an error)",
    )


class _SkipGuard:
    """``--fail-on-skip``: a skipped test or module fails the session, listed at the end.

    ``make test`` runs with it (tools/run_pytest.py): a prerequisite that is missing there
    (pyspark, a broker feature, an OS facility) would otherwise turn a tier's tests into
    skips that nobody reads. Tests that belong to another run are deselected instead
    (the ``rabbitmq4`` marker), never skipped.
    """

    def __init__(self) -> None:
        self.skipped: list[str] = []

    def _note(self, report: pytest.TestReport | pytest.CollectReport) -> None:
        if report.skipped and not hasattr(report, "wasxfail"):
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else ""
            self.skipped.append(f"{report.nodeid}: {reason}")

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self._note(report)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        self._note(report)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if not self.skipped:
            return
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(
                f"ERROR: --fail-on-skip: {len(self.skipped)} skipped: " + "; ".join(self.skipped),
                red=True,
            )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_configure(config: pytest.Config) -> None:
    # Under pytest-xdist the controller sees every report; the workers need no guard.
    if config.getoption("fail_on_skip") and not hasattr(config, "workerinput"):
        config.pluginmanager.register(_SkipGuard(), "rabbitry-skip-guard")


@pytest.hookimpl(trylast=True)  # after -m and -k, like any other deselection
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Tests of the RabbitMQ 4.x run (pytest --rabbitmq4) are not part of the main one, the
    # main run's tests marked main_pass_only are not part of the 4.x run, and the Spark
    # cluster tests run only when asked for (--spark-cluster).
    other_runs = ["main_pass_only" if config.getoption("rabbitmq4") else "rabbitmq4"]
    if not config.getoption("spark_cluster"):
        other_runs.append("spark_cluster")
    other = [item for item in items if any(item.get_closest_marker(m) for m in other_runs)]
    if other:
        config.hook.pytest_deselected(items=other)
        items[:] = [item for item in items if item not in other]
    phase = config.getoption("phase")
    if phase == "all":
        return
    if phase == "parallel":
        _check_serial_marks_are_in_their_modules(items)
    want_serial = phase == "serial"
    keep = [
        item for item in items if (item.get_closest_marker("serial") is not None) == want_serial
    ]
    if len(keep) != len(items):
        kept = set(keep)
        config.hook.pytest_deselected(items=[item for item in items if item not in kept])
        items[:] = keep


def names_serial(source: str) -> bool:
    """Whether a test module's source can mark a test ``serial``.

    The serial phase collects only such modules (:func:`pytest_ignore_collect`): every
    other module would be imported and collected by it just to be deselected, which
    costs seconds of CPU for nothing. A ``serial`` mark must therefore be written in the
    test's own module (``pytestmark = pytest.mark.serial`` or a decorator), never added
    from a conftest or a plugin: the parallel phase checks this and fails otherwise.
    """
    return re.search(r"\bserial\b", source) is not None


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if config.getoption("phase") != "serial" or collection_path.suffix != ".py":
        return None
    if not collection_path.name.startswith("test_"):
        return None
    return not names_serial(collection_path.read_text(encoding="utf-8"))


def _check_serial_marks_are_in_their_modules(items: list[pytest.Item]) -> None:
    """Fail the parallel phase on a serial test whose module the serial phase skips."""
    missed = sorted(
        {
            str(item.path)
            for item in items
            if item.get_closest_marker("serial") is not None
            and not names_serial(Path(item.path).read_text(encoding="utf-8"))
        }
    )
    if missed:
        raise pytest.UsageError(
            "tests marked serial in modules that do not name the mark (the serial phase "
            "collects only modules that do; mark them in the module itself): " + ", ".join(missed)
        )


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: unknown without the plugin
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Scheduling | None:
    """``--dist loadgroup`` with the groups of :data:`XDIST_GROUPS`.

    pytest-xdist's own loadgroup reads ``xdist_group`` markers by renaming each test's
    node id, which pytest 9 no longer lets a plugin do; the groups here are decided from
    the node ids as they are. Groups are handed out first, biggest first; every other
    test goes to whichever worker is free.
    """
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class PathGroupScheduling(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_group(nodeid) or super()._split_scope(nodeid)

    return PathGroupScheduling(config, log)


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

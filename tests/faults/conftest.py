"""Fixtures for the fault tests: every test breaks a throw-away RabbitMQ node of its own.

The nodes are :class:`tests.support.node.BrokerNode` instances (the recipe in
``docs/testing.md``): private ports, data, logs and cookie, started beside the shared
broker on 127.0.0.1:5672, which these tests never connect to, stop, alarm or reconfigure.

Every test in this directory gets the ``faults`` marker, so ``-m faults`` runs just these
and ``-m 'not faults'`` deselects them. When the RabbitMQ server package is missing the
tests *fail* with a message saying so (as the integration tests do without a broker): a
run that skipped its fault tests must not look green.

Fixtures:

* ``broker_node`` (session): one node for the whole session, started the first time a
  test asks for it. Use it for faults the node recovers from by itself (alarms, forced
  closes, a short ``pause()``).
* ``fresh_node`` (function): a node of the test's own, for tests that ``kill()``,
  ``stop()`` or ``restart()`` it. Costs a node start (about 5-7 s).

After each test an autouse guard resumes a paused session node, restarts it if a test
left it dead, and clears the alarms raised through ``set_alarm``. Every node is stopped
by its fixture's teardown (a try/finally, so also on KeyboardInterrupt during its boot),
with an ``atexit`` hook and a watchdog inside each node (it halts once this Python process
is gone) behind it; and the session fails if epmd still lists one of this run's nodes,
one of their processes still runs, or one of their directories still exists (checked in
``tests/conftest.py`` once every fixture of the session, the cluster's included, is torn
down).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from tests.support.leaks import leaked, snapshot
from tests.support.node import SCRIPTS_ENV, BrokerNode, find_scripts_dir

if TYPE_CHECKING:
    from collections.abc import Iterator

_HERE = Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.faults)


def _running_node() -> Iterator[BrokerNode]:
    if find_scripts_dir() is None:
        pytest.fail(
            "The fault tests start their own RabbitMQ nodes, but the unwrapped "
            "rabbitmq-server scripts were not found (/usr/lib/rabbitmq/bin, or set "
            f"${SCRIPTS_ENV}). Install the rabbitmq-server package (`make broker` does), "
            "or deselect these tests explicitly with -m 'not faults'.",
            pytrace=False,
        )
    node = BrokerNode()
    # try/finally rather than a finalizer: pytest does not tear down a fixture whose
    # setup was interrupted (Ctrl-C during the node's boot), but a finally still runs.
    try:
        node.start()
        yield node
    finally:
        node.stop()


@pytest.fixture(scope="session")
def broker_node() -> Iterator[BrokerNode]:
    """The session's throw-away node, already accepting AMQP connections.

    Useful members (see :class:`tests.support.node.BrokerNode`):

    * ``url`` -- ``amqp://guest:guest@127.0.0.1:<port>/``; ``port``, ``name``
      (``rabbitry-t<pid>-<n>@localhost``), ``pid``, ``base_dir``, ``log_tail()``;
    * ``set_alarm("memory" | "disk")`` / ``clear_alarm(...)`` / ``clear_alarms()`` --
      resource alarms through ``rabbit_alarm`` (publishers get ``connection.blocked`` at
      their next publish; ``connection.unblocked`` once no alarm is left);
    * ``close_connection_by_name(name, reason)`` (the client's ``connection_name``) and
      ``close_connections(reason)`` -- the client sees ``CONNECTION_FORCED - reason``;
      ``list_connections()``;
    * ``pause(max_seconds=20)`` / ``resume()`` / ``with paused():`` -- SIGSTOP/SIGCONT;
    * ``ctl(*args)`` / ``eval(expr)`` -- rabbitmqctl with ``-n`` and the node's private
      HOME (about 0.3-1 s per call: prefer one ``eval``).

    Shared by every test of the session: leave it running and unpaused (the autouse guard
    repairs it if not, at the cost of a restart) and delete what you declare, or use
    unique names. Tests that kill, stop or restart a node take ``fresh_node`` instead.
    """
    yield from _running_node()


@pytest.fixture
def fresh_node() -> Iterator[BrokerNode]:
    """A running throw-away node of this test's own, stopped and deleted after it.

    Same API as ``broker_node``, plus what only a private node can afford:
    ``kill()`` (SIGKILL, data kept), ``start()`` again (same port and data),
    ``restart()`` (graceful stop + start, data kept), ``stop(keep_data=...)``.
    """
    yield from _running_node()


@pytest.fixture(autouse=True)
def _session_node_guard(request: pytest.FixtureRequest) -> Iterator[None]:
    """After a test that used ``broker_node``: resume it, revive it, clear its alarms."""
    node = request.getfixturevalue("broker_node") if "broker_node" in request.fixturenames else None
    yield
    if node is None:
        return
    node.resume()
    if not node.is_running:
        node.start()
    node.clear_alarms()


@pytest.fixture(autouse=True)
def _no_leaks(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each fault test: no thread and no TCP socket of the test is left behind.

    Requested first (it is autouse, function scope) so its snapshot is taken before the
    test's own fixtures open anything, and checked after they are all torn down.
    """
    before = snapshot()
    yield
    problem = leaked(before)
    if problem is not None:
        pytest.fail(f"{request.node.name} leaked: {problem}", pytrace=False)

"""Fixtures for the operations tests: management API, policies, shovel, sharding plugin.

They need the management plugin (and the sharding tests ``rabbitmq_sharding``), which
the shared broker on 127.0.0.1:5672 does not have and must not get. So the session
starts one throw-away node of its own (:class:`tests.support.node.BrokerNode`) with
``rabbitmq_management`` and ``rabbitmq_sharding`` enabled before it boots, the API
listening on a port of the node's private block (never 15672), and
``collect_statistics_interval`` lowered so queue counts in the API follow quickly.
The node boots once (about 8-10 s) and is stopped at the end of the session.

Every test here gets the ``faults`` marker (it starts its own node), so
``-m 'not faults'`` deselects them like the fault tests.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from tests.support.node import SCRIPTS_ENV, BrokerNode, find_scripts_dir, leftovers

from rabbitry.exceptions import ManagementError
from rabbitry.management import AsyncManagementClient, ManagementClient

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

_HERE = Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.faults)


@pytest.fixture(scope="session")
def mgmt_node() -> Iterator[BrokerNode]:
    """A running node with the management and sharding plugins (``node.url``; the API on
    ``mgmt_url``)."""
    if find_scripts_dir() is None:
        pytest.fail(
            "The operations tests start their own RabbitMQ node with the management "
            "plugin, but the rabbitmq-server scripts were not found (/usr/lib/rabbitmq/bin, "
            f"or set ${SCRIPTS_ENV}). Install rabbitmq-server or deselect with -m 'not faults'.",
            pytrace=False,
        )
    node = BrokerNode(
        plugins=["rabbitmq_management", "rabbitmq_sharding"],
        config={"collect_statistics_interval": "500"},
    )
    try:
        node.start()
        _wait_for_api(f"http://127.0.0.1:{node.plugin_port('rabbitmq_management')}")
        yield node
    finally:
        node.stop()
    problems = leftovers(only=[node.short_name])
    if problems:
        pytest.fail("the management node was not cleaned up: " + "; ".join(problems))


def _wait_for_api(url: str, timeout: float = 30.0) -> None:
    # The AMQP listener opens before the management listener has finished booting.
    deadline = time.monotonic() + timeout
    with ManagementClient(url, timeout=2.0) as api:
        while True:
            try:
                api.overview()
                return
            except ManagementError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)


@pytest.fixture(scope="session")
def mgmt_url(mgmt_node: BrokerNode) -> str:
    """``http://127.0.0.1:<port>``: the node's management listener."""
    return f"http://127.0.0.1:{mgmt_node.plugin_port('rabbitmq_management')}"


@pytest.fixture
def api(mgmt_url: str) -> Iterator[ManagementClient]:
    """A sync management client of the node (guest/guest)."""
    with ManagementClient(mgmt_url, "guest", "guest") as client:
        yield client


@pytest.fixture
async def aapi(mgmt_url: str) -> AsyncIterator[AsyncManagementClient]:
    """An async management client of the node (guest/guest)."""
    async with AsyncManagementClient(mgmt_url, "guest", "guest") as client:
        yield client


@pytest.fixture
def uid(request: pytest.FixtureRequest) -> str:
    """A short unique prefix for this test's names."""
    return f"ops-{request.node.name[:40]}-{uuid.uuid4().hex[:8]}"
